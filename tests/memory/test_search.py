"""Searching sealed values: filters (decided by keyed tokens in SQL where they can be), full-text
search over indexed fields, pagination, namespace prefixes, and listing namespaces."""

from __future__ import annotations

from typing import Any

import pytest

from memory import selectors, store
from memory.access import EVERYTHING
from memory.errors import InvalidFilter
from memory.texts import index_texts

pytestmark = pytest.mark.django_db

SYSTEM = store.Author.system("tests")


def put(namespace: tuple[str, ...], key: str, value: Any, *, index: list[str] | None = None) -> None:
    texts = index_texts(value, index) if index else None
    store.put_item(namespace=namespace, key=key, value=value, author=SYSTEM, scope=EVERYTHING, index=texts)


def keys(**kwargs: Any) -> list[str]:
    return [found.key for found in selectors.search_items(scope=EVERYTHING, **kwargs)]


@pytest.fixture
def fruit() -> None:
    put(("shop", "fruit"), "apple", {"color": "red", "price": 3, "origin": {"country": "fr", "farm": "a"}})
    put(("shop", "fruit"), "cherry", {"color": "red", "price": 8.5, "origin": {"country": "es", "farm": "b"}})
    put(("shop", "fruit"), "lime", {"color": "green", "price": 1.0, "origin": {"country": "mx"}})
    put(("shop", "veg"), "pepper", {"color": "red", "price": 2, "tags": ["hot"]})


def test_search_lists_newest_first_under_a_prefix(fruit: None) -> None:
    assert keys(prefix=("shop",)) == ["pepper", "lime", "cherry", "apple"]
    assert keys(prefix=("shop", "fruit")) == ["lime", "cherry", "apple"]
    assert keys(prefix=("shop",), limit=2, offset=1) == ["lime", "cherry"]


def test_an_equality_filter_finds_sealed_values(fruit: None) -> None:
    assert keys(prefix=("shop",), filter={"color": "red"}) == ["pepper", "cherry", "apple"]
    assert keys(prefix=("shop",), filter={"color": {"$eq": "green"}}) == ["lime"]
    assert keys(prefix=("shop",), filter={"price": 1}) == ["lime"]  # 1 and 1.0 are one JSON number
    assert keys(prefix=("shop",), filter={"tags": ["hot"]}) == ["pepper"]
    assert keys(prefix=("shop",), filter={"origin": {"country": "fr"}}) == ["apple"]
    assert keys(prefix=("shop",), filter={"color": "red"}, limit=1, offset=1) == ["cherry"]


def test_an_item_carries_the_tokens_of_its_own_namespace_as_sql_masks_them(fruit: None) -> None:
    from django.db import connection

    from memory import filters
    from memory.models import Item

    apple = Item.objects.select_related("namespace").get(key="apple")
    pepper = Item.objects.select_related("namespace").get(key="pepper")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {filters.MASK_SQL.format('%s')}", [apple.namespace_id])
        assert cursor.fetchone()[0] == filters.namespace_mask(apple.namespace_id)
    red = filters.token(("color",), "red")
    assert red ^ filters.namespace_mask(apple.namespace_id) in (apple.tokens or [])
    assert red ^ filters.namespace_mask(pepper.namespace_id) in (pepper.tokens or [])
    assert red ^ filters.namespace_mask(apple.namespace_id) not in (pepper.tokens or [])


def test_comparisons_and_not_equal_are_decided_on_the_opened_values(fruit: None) -> None:
    assert keys(prefix=("shop",), filter={"price": {"$gt": 2}}) == ["cherry", "apple"]
    assert keys(prefix=("shop",), filter={"price": {"$gte": 2, "$lt": 8}}) == ["pepper", "apple"]
    assert keys(prefix=("shop",), filter={"color": {"$ne": "red"}}) == ["lime"]
    assert keys(prefix=("shop",), filter={"color": "red", "price": {"$lte": 3}}, limit=1, offset=1) == ["apple"]
    assert keys(prefix=("shop",), filter={"origin": {}}) == ["lime", "cherry", "apple"]


@pytest.mark.parametrize(
    "bad", [{"$or": []}, {"price": {"$between": [1, 2]}}, {"price": {"$gt": [1]}}, ["color", "red"]]
)
def test_a_filter_that_means_nothing_is_refused(bad: Any) -> None:
    with pytest.raises(InvalidFilter):
        selectors.search_items(scope=EVERYTHING, filter=bad)


def test_a_prefix_stops_at_label_boundaries() -> None:
    for namespace in [("foo",), ("foo", "child"), ("foobar",), ("user_1",), ("userX1",)]:
        put(namespace, "k", {"v": 1})

    def namespaces(prefix: tuple[str, ...]) -> set[tuple[str, ...]]:
        return {found.namespace for found in selectors.search_items(scope=EVERYTHING, prefix=prefix, limit=50)}

    assert namespaces(("foo",)) == {("foo",), ("foo", "child")}
    assert namespaces(("fo",)) == set()
    assert namespaces(("user_1",)) == {("user_1",)}
    assert len(namespaces(())) == 5


def test_a_text_query_ranks_items_whose_indexed_fields_have_its_words_first() -> None:
    put(("notes",), "a", {"text": "the cat sat on the mat"}, index=["text"])
    put(("notes",), "b", {"text": "a dog and a cat"}, index=["text"])
    put(("notes",), "c", {"text": "nothing relevant"}, index=["text"])
    put(("notes",), "d", {"text": "dog dog cat", "secret": "zebra"}, index=["secret"])

    found = selectors.search_items(scope=EVERYTHING, prefix=("notes",), query="dog cat")
    assert [item.key for item in found][:2] == ["b", "a"]
    first, second = found[0].score, found[1].score
    assert first is not None and second is not None
    assert first > second > 0
    assert {item.key for item in found if item.score == 0} == {"c", "d"}
    assert keys(prefix=("notes",), query="zebra")[0] == "d"


def test_a_text_query_ignores_punctuation_and_empty_queries_list_everything() -> None:
    put(("notes",), "a", {"text": "test document"}, index=["text"])

    assert keys(prefix=("notes",), query="test!@#$%^&*()") == ["a"]
    assert keys(prefix=("notes",), query="") == ["a"]
    assert keys(prefix=("notes",), query='-"test" or') == ["a"]


def test_rewriting_an_item_replaces_what_is_indexed() -> None:
    put(("notes",), "a", {"text": "zany zebra"}, index=["text"])
    put(("notes",), "b", {"text": "plain"}, index=["text"])
    put(("notes",), "a", {"text": "dull dog"}, index=["text"])

    found = selectors.search_items(scope=EVERYTHING, prefix=("notes",), query="zebra")
    assert all(item.score == 0 for item in found)


def test_list_namespaces_by_prefix_suffix_wildcard_and_depth() -> None:
    for namespace in [
        ("test", "documents", "public"),
        ("test", "documents", "private"),
        ("test", "images", "public"),
        ("prod", "documents", "public"),
        ("uid", "users", "alice"),
        ("uid", "users", "malice"),
    ]:
        put(namespace, "k", {"v": 1})

    def listed(**kwargs: Any) -> list[tuple[str, ...]]:
        return selectors.list_namespaces(scope=EVERYTHING, **kwargs)

    assert len(listed()) == 6
    assert listed(prefix=("test",)) == [
        ("test", "documents", "private"),
        ("test", "documents", "public"),
        ("test", "images", "public"),
    ]
    assert listed(suffix=("public",)) == [
        ("prod", "documents", "public"),
        ("test", "documents", "public"),
        ("test", "images", "public"),
    ]
    assert listed(suffix=("alice",)) == [("uid", "users", "alice")]
    assert listed(prefix=("test", "*", "public")) == [("test", "documents", "public"), ("test", "images", "public")]
    assert listed(max_depth=2) == [("prod", "documents"), ("test", "documents"), ("test", "images"), ("uid", "users")]
    assert listed(limit=2, offset=1) == [("test", "documents", "private"), ("test", "documents", "public")]


def test_a_namespace_whose_items_are_all_deleted_is_no_longer_listed() -> None:
    put(("a",), "k", {"v": 1})
    store.delete_item(namespace=("a",), key="k", author=SYSTEM, scope=EVERYTHING)

    assert selectors.list_namespaces(scope=EVERYTHING) == []
    assert keys(prefix=("a",)) == []
