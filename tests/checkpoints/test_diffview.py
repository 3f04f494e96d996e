"""Diff and state-tree presentation: classification, word diffs, list runs, escaping and bounds."""

from __future__ import annotations

from typing import Any

from django.template.loader import render_to_string

from checkpoints.presentation import diffview
from checkpoints.presentation.diffview import DiffItem, Segment, build_diff, pretty, word_diff
from checkpoints.storage.jsonpatch import make_patch

PLAN = (
    "Fly from Berlin to Lisbon on Monday morning, check in at a hotel near Alfama, spend two days "
    "on meetings, then take the train to Porto and fly home on Friday evening."
)


def diff(base: dict[str, Any], target: dict[str, Any]) -> diffview.DiffView:
    return build_diff(base, target, make_patch(base, target))


def word_diff_html(segments: list[Segment], side: str = "both") -> str:
    return render_to_string("checkpoints/_word_diff.html", {"segments": segments, "side": side})


def inline(item: DiffItem, side: str = "both") -> str:
    return word_diff_html(item.segments or [], side)


def render_tree(state: Any, **budget: int) -> str | None:
    nodes = diffview.state_tree(state, **budget)
    return None if nodes is None else render_to_string("checkpoints/_state_tree.html", {"nodes": nodes})


def test_added_removed_and_changed_paths_are_classified() -> None:
    view = diff(
        {"facts": {"city": "Paris", "travellers": 2}, "step": 1},
        {"facts": {"city": "Lyon", "budget": 900}, "step": 1},
    )

    kinds = {item.path: item.kind for item in view.items}
    assert kinds == {"/facts/travellers": "removed", "/facts/city": "changed", "/facts/budget": "added"}
    changed = next(item for item in view.items if item.kind == "changed")
    assert changed.base is not None and changed.base.text == '"Paris"'
    assert changed.target is not None and changed.target.text == '"Lyon"'
    removed = next(item for item in view.items if item.kind == "removed")
    assert removed.base is not None and removed.base.text == "2"
    assert (view.added, view.removed, view.changed) == (1, 1, 1)


def test_identical_states_give_an_empty_diff() -> None:
    state = {"messages": [{"role": "user", "content": "hi"}]}

    view = diff(state, {"messages": [{"role": "user", "content": "hi"}]})

    assert view.empty
    assert view.items == []


def test_long_strings_are_diffed_word_by_word() -> None:
    changed = PLAN.replace("Monday", "Tuesday").replace("Alfama", "Baixa")

    [item] = diff({"plan": PLAN}, {"plan": changed}).items

    assert item.kind == "changed" and item.segments is not None
    marked = [(segment.op, segment.text) for segment in item.segments if segment.op != "equal"]
    assert marked == [("delete", "Monday"), ("insert", "Tuesday"), ("delete", "Alfama"), ("insert", "Baixa")]
    assert "<del>Monday</del><ins>Tuesday</ins>" in inline(item)
    assert "<ins>" not in inline(item, "base") and "<del>Monday</del>" in inline(item, "base")
    assert "<del>" not in inline(item, "target") and "<ins>Tuesday</ins>" in inline(item, "target")


def test_short_strings_are_shown_whole_not_word_diffed() -> None:
    [item] = diff({"city": "Lisbon"}, {"city": "Porto"}).items

    assert item.segments is None
    assert item.base is not None and item.target is not None


def test_a_partly_changed_word_is_shown_whole() -> None:
    segments = word_diff("the hotel is booked " * 5 + "tomorrow", "the hotel is booked " * 5 + "tonight")

    changed = [segment for segment in segments if segment.op != "equal"]
    assert changed == [Segment("delete", "tomorrow"), Segment("insert", "tonight")]


def test_rewritten_phrases_are_one_deletion_and_one_insertion() -> None:
    old = "Searching for flights. " + "the quick brown fox jumps" + " over the lazy dog and then sleeps all day."
    new = "Searching for flights. " + "a slow red cat walks" + " over the lazy dog and then sleeps all day."

    changed = [segment for segment in word_diff(old, new) if segment.op != "equal"]

    assert changed == [Segment("delete", "the quick brown fox jumps"), Segment("insert", "a slow red cat walks")]


def test_long_unchanged_text_in_a_word_diff_is_elided() -> None:
    filler = "lorem ipsum dolor " * 200
    segments = word_diff(filler + "alpha " + filler, filler + "omega " + filler)

    elided = [segment for segment in segments if segment.op == "elided"]
    assert len(elided) == 2
    assert sum(len(segment.text) for segment in segments) < 1_000
    assert "characters not shown" in word_diff_html(segments)


def test_appends_to_a_list_collapse_into_one_summary() -> None:
    base = {"messages": [{"role": "user", "content": "hi"}]}
    target = {"messages": [*base["messages"], *({"role": "assistant", "content": f"m{i}"} for i in range(3))]}

    [item] = diff(base, target).items

    assert item.kind == "added" and item.path == "/messages" and item.grouped
    assert item.summary == "+3 messages"
    assert item.count == 3
    assert [listed.path for listed in item.values] == ["/messages/1", "/messages/2", "/messages/3"]
    assert '"content": "m0"' in item.values[0].value.text


def test_one_append_is_singular_and_removals_are_summarised_with_a_minus() -> None:
    one = diff({"messages": []}, {"messages": ["hi"]}).items[0]
    removed = diff({"messages": ["a", "b", "c"]}, {"messages": ["a"]}).items[0]

    assert one.summary == "+1 message"
    assert removed.kind == "removed" and removed.summary == "\u22122 messages"
    # make_patch removes from the end backwards; the page lists them in list order.
    assert [listed.path for listed in removed.values] == ["/messages/1", "/messages/2"]
    assert [listed.value.text for listed in removed.values] == ['"b"', '"c"']


def test_a_list_without_a_plural_name_gets_items() -> None:
    [item] = diff({"history": [1]}, {"history": [1, 2, 3]}).items

    assert item.summary == "+2 history items"


def test_appends_to_two_lists_are_two_summaries() -> None:
    view = diff({"messages": [], "facts": []}, {"messages": ["a", "b"], "facts": ["x"]})

    assert sorted(item.summary for item in view.items) == ["+1 fact", "+2 messages"]
    assert view.added == 3


def test_a_long_run_lists_its_first_values_and_counts_the_rest() -> None:
    [item] = diff({"messages": []}, {"messages": list(range(120))}).items

    assert item.count == 120
    assert len(item.values) == diffview.GROUP_VALUES
    assert item.more_values == 120 - diffview.GROUP_VALUES


def test_values_are_escaped_in_every_rendering() -> None:
    script = "<script>alert(1)</script>"
    view = diff({"note": "x" * 100, "bio": "a"}, {"note": "x" * 100 + " " + script, "bio": script})

    long_item = next(item for item in view.items if item.path == "/note")
    assert script not in inline(long_item)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in inline(long_item)
    tree = render_tree({"bio": script, script: 1})
    assert tree is not None
    assert "<script>" not in tree
    assert "&lt;script&gt;" in tree


def test_large_values_are_cut_for_display() -> None:
    shown = pretty({"blob": "x" * 10_000})

    assert shown.truncated
    assert len(shown.text) == diffview.VALUE_CHARS


def test_a_500_kb_state_diffs_with_output_bounded_by_the_budgets() -> None:
    def message(i: int) -> dict[str, str]:
        return {"role": "assistant", "content": f"message {i} " + "lorem ipsum " * 80}

    base = {"messages": [message(i) for i in range(10)], "step": 0, "plan": PLAN}
    target = {"messages": [message(i) for i in range(510)], "step": 500, "plan": PLAN.replace("Friday", "Sunday")}

    view = diff(base, target)

    assert view.added == 500 and view.changed == 2
    run = next(item for item in view.items if item.grouped)
    assert run.summary == "+500 messages"
    assert run.values[0].path == "/messages/10"
    shown = sum(len(listed.value.text) for listed in run.values)
    assert shown <= diffview.GROUP_VALUES * diffview.VALUE_CHARS


def test_replacing_the_whole_state_is_one_change() -> None:
    view = build_diff({"a": 1}, {"b": 2}, [{"op": "replace", "path": "", "value": {"b": 2}}])

    [item] = view.items
    assert item.kind == "changed" and item.path == ""


def test_ops_that_do_not_resolve_in_base_still_render() -> None:
    view = build_diff({}, {"x": [1]}, [{"op": "remove", "path": "/missing"}, {"op": "test", "path": "", "value": {}}])

    [item] = view.items
    assert item.kind == "removed" and item.base is None


def test_tree_opens_two_levels_and_collapses_long_arrays() -> None:
    state = {"facts": {"trip": {"legs": [{"from": "BER"}]}}, "messages": list(range(25))}

    tree = render_tree(state)

    assert tree is not None
    assert tree.count("<details open>") == 2  # /facts and /facts/trip
    assert '<span class="json-meta">[25 items]</span>' in tree
    assert 'data-path="/facts/trip/legs/0/from"' in tree
    assert 'data-path="/messages/24"' in tree


def test_tree_pointers_escape_slashes_and_tildes() -> None:
    tree = render_tree({"a/b": {"c~d": 1}})

    assert tree is not None
    assert 'data-path="/a~1b/c~0d"' in tree


def test_tree_gives_up_past_its_node_budget() -> None:
    assert render_tree({"items": list(range(5_000))}) is None
    assert render_tree({"items": list(range(10))}, max_nodes=20) is not None
