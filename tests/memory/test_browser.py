"""The memory browser: namespaces as a tree, items with search, an item's versions with what each
changed and where from; admins edit or roll back with a reason, audited, refused when stale."""

from __future__ import annotations

import html
import re
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import User

from audit.models import AuditEntry
from checkpoints import storage
from memory import selectors, store
from memory.access import EVERYTHING
from memory.models import Writer
from memory.texts import IndexText
from quicksave_agents.models import Agent
from tests.conftest import person, signed_in

pytestmark = pytest.mark.django_db

NS = ("users", "alice")


def put(value: Any, *, key: str = "prefs", namespace: tuple[str, ...] = NS, **kwargs: Any) -> store.Written:
    kwargs.setdefault("author", store.Author.system("tests"))
    return store.put_item(namespace=namespace, key=key, value=value, scope=EVERYTHING, **kwargs)


def item_url(key: str = "prefs", namespace: tuple[str, ...] = NS, **extra: Any) -> str:
    return "/memory/item/?" + urlencode([("ns", label) for label in namespace] + [("key", key), *extra.items()])


@pytest.fixture
def admin(db: Any) -> User:
    return person("ada", "admin")


def test_the_browser_lists_namespaces_as_a_tree_and_the_items_under_the_chosen_one() -> None:
    put({"theme": "dark"})
    put({"city": "Lisbon"}, key="home", namespace=("users", "bob"))
    put({"rule": "be brief"}, key="style", namespace=("instructions",))
    page = signed_in(person("val", "viewer"))

    everything = page.get("/memory/").content.decode()
    alice = page.get("/memory/?ns=users&ns=alice").content.decode()

    tree = re.findall(r'<li class="depth-(\d)"><a href="\?([^"]+)"[^>]*>([^<]+)</a>', everything)
    assert [(depth, label) for depth, _, label in tree] == [
        ("0", "instructions"), ("0", "users"), ("1", "alice"), ("1", "bob"),
    ]  # fmt: skip
    assert set(re.findall(r'<tr data-key="([^"]+)">', everything)) == {"prefs", "home", "style"}
    assert re.findall(r'<tr data-key="([^"]+)">', alice) == ["prefs"]


def test_a_search_finds_items_by_the_words_of_their_indexed_fields() -> None:
    put({"text": "prefers window seats"}, key="seat", index=[IndexText("text", "prefers window seats")])
    put({"text": "vegetarian meals"}, key="food", index=[IndexText("text", "vegetarian meals")])

    found = signed_in(person("val", "viewer")).get("/memory/?q=window").content.decode()

    assert re.findall(r'<tr data-key="([^"]+)">', found) == ["seat"]


def test_an_empty_memory_says_so() -> None:
    body = signed_in(person("val", "viewer")).get("/memory/").content.decode()

    assert "Nothing remembered yet" in body


def test_an_items_page_shows_each_version_with_its_writer_origin_and_changes(agent: Agent) -> None:
    thread = storage.create_thread(agent=agent)[0]
    head = storage.append_checkpoint(thread=thread, parent=None, state={})
    put({"theme": "dark", "lang": "en"}, author=store.Author.agent(agent.pk),
        origin=store.Origin(thread_id=thread.pk, checkpoint_id=head.pk))  # fmt: skip
    put({"theme": "light", "lang": "en", "font": "<b>big</b>"})

    body = signed_in(person("val", "viewer")).get(item_url()).content.decode()

    rows = re.findall(r'<tr data-version="(\d+)">(.*?)</tr>', body, re.S)
    assert [number for number, _ in rows] == ["2", "1"]
    newest, first = rows[0][1], rows[1][1]
    assert "replace</span> <code>/theme</code> <del>&quot;dark&quot;</del> <ins>&quot;light&quot;</ins>" in newest
    assert "add</span> <code>/font</code>" in newest and "&lt;b&gt;big&lt;/b&gt;" in newest
    assert f"agent {agent.name}" in first and f"/threads/{thread.pk}/" in first and f"/checkpoints/{head.pk}/" in first
    assert 'id="edit"' not in body  # a viewer cannot change memory


def test_an_admin_edit_is_a_new_version_by_that_person_with_the_reason_audited(admin: User) -> None:
    put({"theme": "dark"})

    saved = signed_in(admin).post(item_url(), {"value": '{"theme": "solarized"}', "reason": "user asked",
                                               "seen_version": 1})  # fmt: skip

    assert saved.status_code == 302
    versions = selectors.item_history(namespace=NS, key="prefs", scope=EVERYTHING)
    assert versions is not None and versions[0].value == {"theme": "solarized"}
    assert (versions[0].writer, versions[0].user_id) == (Writer.PERSON, admin.pk)
    entry = AuditEntry.objects.get(action="memory.item_edited")
    assert (entry.actor_name, entry.reason, entry.after["version"]) == ("ada", "user asked", 2)


@pytest.mark.parametrize(
    ("form", "message"),
    [
        ({"value": "{not json", "reason": "x", "seen_version": 1}, "Not JSON"),
        ({"value": "{}", "reason": "", "seen_version": 1}, "This field is required"),
        ({"value": "{}", "reason": "r" * 1001, "seen_version": 1}, "at most 1000 characters"),
    ],
)
def test_a_bad_edit_comes_back_with_the_field_named(admin: User, form: dict[str, Any], message: str) -> None:
    put({"theme": "dark"})

    answer = signed_in(admin).post(item_url(), form)

    assert answer.status_code == 400 and message in html.unescape(answer.content.decode())
    assert selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING).version == 1  # type: ignore[union-attr]


def test_an_edit_from_a_stale_page_is_refused_instead_of_overwriting(admin: User) -> None:
    put({"theme": "dark"})
    put({"theme": "light"})  # an agent wrote meanwhile

    answer = signed_in(admin).post(item_url(), {"value": '{"theme": "x"}', "reason": "fix", "seen_version": 1})

    assert answer.status_code == 400 and "Someone changed it meanwhile" in answer.content.decode()
    assert selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING).value == {"theme": "light"}  # type: ignore[union-attr]


def test_a_viewer_or_reviewer_cannot_edit() -> None:
    put({"theme": "dark"})

    for role in ("viewer", "reviewer"):
        answer = signed_in(person(f"{role}-1", role)).post(
            item_url(), {"value": "{}", "reason": "x", "seen_version": 1}
        )
        assert answer.status_code == 403
    assert not AuditEntry.objects.filter(action__startswith="memory.").exists()


def test_going_back_to_an_earlier_version_asks_first_then_writes_it_again_audited(admin: User) -> None:
    put({"theme": "dark"})
    put({"theme": "light"})
    page = signed_in(admin)

    confirm = page.get("/memory/item/rollback/?" + urlencode([("ns", "users"), ("ns", "alice"), ("key", "prefs"),
                                                               ("to", 1)]))  # fmt: skip
    assert confirm.status_code == 200 and "Go back to version 1" in confirm.content.decode()
    assert selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING).version == 2  # type: ignore[union-attr]

    done = page.post(confirm.request["PATH_INFO"] + "?" + confirm.request["QUERY_STRING"],
                     {"to_version": 1, "seen_version": 2, "reason": "light broke the contrast"})  # fmt: skip

    assert done.status_code == 302
    current = selectors.get_item(namespace=NS, key="prefs", scope=EVERYTHING)
    assert current is not None and (current.version, current.value) == (3, {"theme": "dark"})
    entry = AuditEntry.objects.get(action="memory.item_rolled_back")
    assert entry.after["restored_version"] == 1 and entry.reason == "light broke the contrast"


def test_a_deleted_version_cannot_be_gone_back_to(admin: User) -> None:
    put({"theme": "dark"})
    store.delete_item(namespace=NS, key="prefs", author=store.Author.system("tests"), scope=EVERYTHING)
    put({"theme": "light"})

    answer = signed_in(admin).post(item_url() .replace("/item/", "/item/rollback/") + "&to=2",
                                   {"to_version": 2, "seen_version": 3, "reason": "undo"})  # fmt: skip

    assert answer.status_code == 400 and "is a deletion" in answer.content.decode()


def test_an_admin_sees_one_edit_form_in_the_page_body(admin: User) -> None:
    put({"theme": "dark"})

    body = signed_in(admin).get(item_url()).content.decode()

    head, _, page = body.partition("</head>")
    assert 'id="edit"' not in head and page.count('id="edit"') == 1 and page.count('name="seen_version"') == 1
