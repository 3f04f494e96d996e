"""How the dashboard shows a state and the change between two states: the checkpoint page's
collapsible tree, the diff page's items and its picker, a value's history, as plain data for the
templates (templates/checkpoints/_state_tree.html, _word_diff.html, _fold_value.html,
_picker_options.html, value_history.html, which do all markup and escaping). Pure functions over
JSON values, no database.

Everything here is bounded by what it displays, not by the size of the state: a diff
costs O(size of the change) and a page never renders more than its budgets allow.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from checkpoints.storage import ABSENT, ValueChange
from checkpoints.storage.jsonpatch import PatchError, format_pointer, parse_pointer

Kind = Literal["added", "removed", "changed"]
SegmentOp = Literal["equal", "insert", "delete", "elided"]

# A changed string longer than this is diffed word by word instead of shown twice.
LONG_STRING = 80
# One value (or one run of inserted/deleted text) is cut to this many characters.
VALUE_CHARS = 2_000
# Values listed under a "+N messages" summary.
GROUP_VALUES = 50
# Items (paths) shown on one diff page; the counts still cover every change.
MAX_ITEMS = 500
# Characters of values a whole diff page shows, so a huge change still renders quickly.
PAGE_CHARS = 400_000
# Unchanged text longer than this inside a word diff is shown as its two ends.
EQUAL_CONTEXT = 160
# SequenceMatcher is quadratic in the worst case; above this many tokens on the two sides
# of the changed middle, the middle is shown as one deletion and one insertion.
WORD_DIFF_TOKENS = 3_000

# A value whose indented JSON is longer than this, or has more lines, is folded behind a preview.
FOLD_CHARS = 800
FOLD_LINES = 16
# Characters of a folded value's one-line preview.
PREVIEW_CHARS = 140
# A run of list appends (or removals) this long or shorter is shown open; longer ones start folded.
RUN_OPEN = 20

# The checkpoint page's tree: more nodes than this and the page offers raw JSON only.
TREE_NODES = 2_000
# Containers this deep or shallower start open (the state object itself is level 0).
TREE_OPEN_DEPTH = 2
# Arrays longer than this start collapsed whatever their depth.
TREE_LONG_ARRAY = 20
# A string in the tree is cut to this many characters (raw JSON has it in full).
TREE_STRING_CHARS = 1_000

_PRETTY = json.JSONEncoder(indent=2, ensure_ascii=False)
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(", ", ": "))
# Words, runs of whitespace and single punctuation marks: the units a word diff keeps or changes.
_TOKEN = re.compile(r"\w+|\s+|[^\w\s]")
_MISSING: Any = object()


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class Shown:
    """A JSON value as pretty text, cut short for display."""

    text: str
    truncated: bool = False
    # Not shown at all: the page's display budget ran out before this value.
    omitted: bool = False

    @property
    def folded(self) -> bool:
        """Long enough to fold behind its preview: the page stays readable, the value one click away."""
        return len(self.text) > FOLD_CHARS or self.text.count("\n") >= FOLD_LINES

    @property
    def preview(self) -> str:
        """The value's start on one line, whitespace runs collapsed."""
        line = " ".join(self.text[: PREVIEW_CHARS * 4].split())
        return line if len(line) <= PREVIEW_CHARS else line[: PREVIEW_CHARS - 1] + "…"

    @property
    def lines(self) -> str:
        return f"{self.text.count(chr(10)) + 1:,}"


def pretty(value: Any, *, limit: int = VALUE_CHARS) -> Shown:
    """`value` as indented JSON, at most `limit` characters.

    Encodes lazily and stops once past the limit, so showing the start of a large
    value costs what is shown, not the whole value.
    """
    if limit <= 0:
        return Shown("", omitted=True)
    parts: list[str] = []
    size = 0
    for chunk in _PRETTY.iterencode(value):
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            break
    text = "".join(parts)
    if len(text) > limit:
        return Shown(text[:limit], truncated=True)
    return Shown(text)


def short(value: Any, *, limit: int = 300) -> str:
    """A one-line rendering for definition lists: strings as they are, anything else as JSON."""
    text = value if isinstance(value, str) else _COMPACT.encode(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Budget:
    """Characters of values a page may still show."""

    __slots__ = ("left",)

    def __init__(self, chars: int) -> None:
        self.left = chars

    def show(self, value: Any) -> Shown:
        shown = pretty(value, limit=min(VALUE_CHARS, self.left))
        self.left -= len(shown.text)
        return shown


# --------------------------------------------------------------------------- word diff


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of a word diff: kept, inserted or deleted text, or unchanged text left out."""

    op: SegmentOp
    text: str = ""
    # For "elided": how many characters were left out.
    skipped: int = 0

    @property
    def skipped_text(self) -> str:
        return f"{self.skipped:,}"


def word_diff(old: str, new: str) -> list[Segment]:
    """Word-level diff of two strings, as alternating unchanged and changed runs.

    The common start and end are found by comparing slices (C speed, no tokens), so
    only the changed middle is tokenised and matched; long unchanged runs and long
    inserted or deleted runs are cut for display.
    """
    start = _common_prefix(old, new)
    # Back up to a word boundary so a partly changed word is shown whole.
    while start and _is_word_char(old[start - 1]):
        start -= 1
    end = _common_suffix(old, new, start)
    while end and _is_word_char(old[len(old) - end]):
        end -= 1
    old_mid, new_mid = old[start : len(old) - end], new[start : len(new) - end]

    runs: list[tuple[SegmentOp, str]] = [("equal", old[:start])]
    a, b = _TOKEN.findall(old_mid), _TOKEN.findall(new_mid)
    if len(a) + len(b) > WORD_DIFF_TOKENS:
        runs += [("delete", old_mid), ("insert", new_mid)]
    else:
        runs += _matched(a, b)
    runs.append(("equal", old[len(old) - end :] if end else ""))
    return _segments(runs)


def _is_word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


def _common_prefix(a: str, b: str) -> int:
    # Binary search on slice equality: O(n log n) bytes compared in C instead of a Python loop per character.
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def _common_suffix(a: str, b: str, prefix: int) -> int:
    low, high = 0, min(len(a), len(b)) - prefix
    while low < high:
        middle = (low + high + 1) // 2
        if a[len(a) - middle :] == b[len(b) - middle :]:
            low = middle
        else:
            high = middle - 1
    return low


def _matched(a: list[str], b: list[str]) -> list[tuple[SegmentOp, str]]:
    """Token runs from SequenceMatcher, with whitespace-only matches between changes absorbed.

    Matching the single spaces between two rewritten phrases would show them as
    confetti ("<del>a</del> <del>b</del>"); absorbing them gives one deletion and one
    insertion per changed phrase.
    """
    opcodes = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    runs: list[tuple[SegmentOp, str]] = []
    pending_delete: list[str] = []
    pending_insert: list[str] = []
    for index, (tag, a1, a2, b1, b2) in enumerate(opcodes):
        if tag == "equal":
            text = "".join(a[a1:a2])
            between_changes = 0 < index < len(opcodes) - 1
            if between_changes and (not text.strip() or len(text) <= 2):
                pending_delete.append(text)
                pending_insert.append(text)
                continue
            _flush(runs, pending_delete, pending_insert)
            runs.append(("equal", text))
        else:
            pending_delete.append("".join(a[a1:a2]))
            pending_insert.append("".join(b[b1:b2]))
    _flush(runs, pending_delete, pending_insert)
    return runs


def _flush(runs: list[tuple[SegmentOp, str]], deleted: list[str], inserted: list[str]) -> None:
    if deleted or inserted:
        runs.append(("delete", "".join(deleted)))
        runs.append(("insert", "".join(inserted)))
        deleted.clear()
        inserted.clear()


def _segments(runs: list[tuple[SegmentOp, str]]) -> list[Segment]:
    """Merge, drop empty runs and cut long ones for display."""
    merged: list[tuple[SegmentOp, str]] = []
    for op, text in runs:
        if not text:
            continue
        if merged and merged[-1][0] == op:
            merged[-1] = (op, merged[-1][1] + text)
        else:
            merged.append((op, text))
    segments: list[Segment] = []
    for index, (op, text) in enumerate(merged):
        if op == "equal":
            first, last = index == 0, index == len(merged) - 1
            keep_head = 0 if first else EQUAL_CONTEXT
            keep_tail = 0 if last else EQUAL_CONTEXT
            if len(text) > max(keep_head + keep_tail, EQUAL_CONTEXT) + 40:
                if first:
                    keep_tail = EQUAL_CONTEXT
                if last:
                    keep_head = EQUAL_CONTEXT
                skipped = len(text) - keep_head - keep_tail
                if keep_head:
                    segments.append(Segment("equal", text[:keep_head]))
                segments.append(Segment("elided", skipped=skipped))
                if keep_tail:
                    segments.append(Segment("equal", text[len(text) - keep_tail :]))
                continue
            segments.append(Segment("equal", text))
        elif len(text) > VALUE_CHARS:
            segments.append(Segment(op, text[:VALUE_CHARS]))
            segments.append(Segment("elided", skipped=len(text) - VALUE_CHARS))
        else:
            segments.append(Segment(op, text))
    return segments


# --------------------------------------------------------------------------- diff items


@dataclass(frozen=True, slots=True)
class Listed:
    """One element of a run of appends to (or removals from) a list."""

    path: str
    value: Shown


@dataclass(slots=True)
class DiffItem:
    """One block of the diff page: a path that was added, removed or changed.

    A run of appends to one list (or removals from it) is one item whose `noun`
    names the list, summarised as "+3 messages" with the elements in `values`.
    """

    kind: Kind
    path: str
    count: int = 1
    base: Shown | None = None
    target: Shown | None = None
    segments: list[Segment] | None = None
    noun: str = ""
    values: list[Listed] = field(default_factory=list)
    # Only for a run of list appends/removals: where each element sits, kept to order them.
    _indices: list[int] = field(default_factory=list, repr=False)

    @property
    def grouped(self) -> bool:
        return bool(self.noun)

    @property
    def summary(self) -> str:
        """The run's one-line summary ("+3 messages"; removals get a minus sign), "" for other items."""
        if not self.noun:
            return ""
        sign = "+" if self.kind == "added" else "\u2212"
        return f"{sign}{self.count:,} {_plural(self.noun, self.count)}"

    @property
    def more_values(self) -> int:
        return self.count - len(self.values)

    @property
    def open(self) -> bool:
        """Whether a run starts open: short runs show their values at once."""
        return self.count <= RUN_OPEN

    @property
    def folded(self) -> bool:
        """Whether either side of a changed or added value is long enough to fold."""
        return bool((self.base and self.base.folded) or (self.target and self.target.folded))


@dataclass(slots=True)
class DiffView:
    """What the diff page shows: the items in patch order and counts over the whole change."""

    items: list[DiffItem]
    added: int = 0
    removed: int = 0
    changed: int = 0
    # Items past MAX_ITEMS, counted but not shown.
    hidden_items: int = 0

    @property
    def empty(self) -> bool:
        return not self.items and not self.hidden_items


def build_diff(base: Any, target: Any, patch: list[dict[str, Any]]) -> DiffView:
    """Turn an RFC 6902 patch (as `make_patch(base, target)` writes it) into display items.

    Old values are looked up in `base` by each op's pointer (O(depth)), new values
    come from the ops, so the cost follows the patch, not the states. Ops from
    another source work too: a pointer that does not resolve just shows no old value.
    """
    builder = _Builder(base, target)
    for op in patch:
        builder.add(op)
    builder.close_run()
    return builder.view


class _Builder:
    """Walks a patch once, keeping the open run of appends to (or removals from) one list."""

    def __init__(self, base: Any, target: Any) -> None:
        self.base, self.target = base, target
        self.view = DiffView(items=[])
        self.budget = _Budget(PAGE_CHARS)
        # The open run: its kind and list, and its item (None once MAX_ITEMS is reached).
        self.run_key: tuple[Kind, tuple[str, ...]] | None = None
        self.run: DiffItem | None = None

    def start(self, item: DiffItem) -> DiffItem | None:
        if len(self.view.items) >= MAX_ITEMS:
            self.view.hidden_items += 1
            return None
        self.view.items.append(item)
        return item

    def show(self, value: Any) -> Shown | None:
        return None if value is _MISSING else self.budget.show(value)

    def add(self, op: dict[str, Any]) -> None:
        name = op.get("op")
        try:
            tokens = parse_pointer(op.get("path", ""))
        except PatchError:
            return
        if name == "move" or name == "copy":
            try:
                source = parse_pointer(op.get("from", ""))
            except PatchError:
                return
            value = _lookup(self.base, source)
            if name == "move":
                self.close_run()
                self.view.removed += 1
                self.start(DiffItem("removed", op["from"], base=self.show(value)))
            op, name = {"op": "add", "path": op["path"], "value": None if value is _MISSING else value}, "add"
        elif name not in ("add", "remove", "replace"):
            return  # "test" changes nothing

        if tokens and name != "replace":
            parent_tokens = tokens[:-1]
            parent = _lookup(self.base, parent_tokens)
            if parent is _MISSING:
                parent = _lookup(self.target, parent_tokens)
            if isinstance(parent, list):
                self.add_to_run("added" if name == "add" else "removed", parent_tokens, tokens[-1], op)
                return

        self.close_run()
        old = _lookup(self.base, tokens)
        if name == "remove":
            self.view.removed += 1
            self.start(DiffItem("removed", op["path"], base=self.show(old)))
            return
        new = op.get("value")
        if old is _MISSING and name == "add":
            self.view.added += 1
            self.start(DiffItem("added", op["path"], target=self.show(new)))
            return
        self.view.changed += 1
        item = self.start(DiffItem("changed", op["path"]))
        if item is None:
            return
        if (
            isinstance(old, str)
            and isinstance(new, str)
            and max(len(old), len(new)) > LONG_STRING
            and self.budget.left > 0
        ):
            item.segments = word_diff(old, new)
            self.budget.left -= sum(len(segment.text) for segment in item.segments)
        else:
            item.base = self.show(old)
            item.target = self.budget.show(new)

    def add_to_run(self, kind: Kind, parent_tokens: list[str], last: str, op: dict[str, Any]) -> None:
        if kind == "added":
            self.view.added += 1
            value = op.get("value")
        else:
            self.view.removed += 1
            value = _lookup(self.base, [*parent_tokens, last])
        key = (kind, tuple(parent_tokens))
        if key != self.run_key:
            self.close_run()
            self.run_key = key
            self.run = self.start(DiffItem(kind, format_pointer(parent_tokens), count=0, noun=_noun(parent_tokens)))
        run = self.run
        if run is None:
            return
        run.count += 1
        if len(run.values) < GROUP_VALUES:
            shown = self.show(value) or Shown("", omitted=True)
            run.values.append(Listed(format_pointer([*parent_tokens, last]), shown))
            run._indices.append(int(last) if last.isdigit() else -1)

    def close_run(self) -> None:
        """Finish the open run: number appends made with "-" and put elements in list order."""
        run, key = self.run, self.run_key
        self.run, self.run_key = None, None
        if run is None or key is None:
            return
        if run.kind == "added" and -1 in run._indices:
            # "-" appends: the run's elements are the last `count` elements of the target's list.
            target_list = _lookup(self.target, list(key[1]))
            if isinstance(target_list, list) and len(target_list) >= run.count:
                first = len(target_list) - run.count
                run.values = [
                    Listed(format_pointer([*key[1], first + offset]), listed.value)
                    for offset, listed in enumerate(run.values)
                ]
            return
        if len(run._indices) > 1 and run._indices[0] > run._indices[-1]:
            # make_patch removes from the end backwards; show the elements in list order.
            run.values.reverse()
            run._indices.reverse()


def _lookup(document: Any, tokens: list[str]) -> Any:
    node = document
    for token in tokens:
        if isinstance(node, dict):
            node = node.get(token, _MISSING)
            if node is _MISSING:
                return _MISSING
        elif isinstance(node, list):
            if not (token.isdigit() and token.isascii()) or int(token) >= len(node):
                return _MISSING
            node = node[int(token)]
        else:
            return _MISSING
    return node


def _noun(parent_tokens: list[str]) -> str:
    """What a list's elements are called: its key ("messages"), or "items" for a nameless list."""
    name = parent_tokens[-1] if parent_tokens else ""
    if not name or name.isdigit():
        return "items"
    return name


def _plural(noun: str, count: int) -> str:
    if noun.endswith("s") and not noun.endswith("ss"):
        return noun if count != 1 else noun[:-1]
    return f"{noun} items" if count != 1 else f"{noun} item"


# --------------------------------------------------------------------------- a value's history


@dataclass(frozen=True, slots=True)
class HistoryRow:
    """One change of a value's history page: its checkpoint, and the value before and after
    (None where the path did not exist), or a word diff of a long string changed."""

    change: ValueChange
    old: Shown | None
    new: Shown | None
    segments: list[Segment] | None = None


def history_rows(changes: list[ValueChange]) -> list[HistoryRow]:
    """The changes as the history page shows them, within the page's display budget."""
    budget = _Budget(PAGE_CHARS)
    rows: list[HistoryRow] = []
    for change in changes:
        old, new = change.old, change.new
        if isinstance(old, str) and isinstance(new, str) and max(len(old), len(new)) > LONG_STRING and budget.left > 0:
            segments = word_diff(old, new)
            budget.left -= sum(len(segment.text) for segment in segments)
            rows.append(HistoryRow(change, None, None, segments))
            continue
        rows.append(HistoryRow(
            change, None if old is ABSENT else budget.show(old), None if new is ABSENT else budget.show(new)
        ))  # fmt: skip
    return rows


# --------------------------------------------------------------------------- picker


@dataclass(frozen=True, slots=True)
class PickerOption:
    """A checkpoint offered by the diff page's picker."""

    id: Any
    seq: int
    text: str


def picker_groups(groups: list[tuple[str, list[PickerOption]]]) -> list[dict[str, Any]]:
    """The pickers' <datalist> options (templates/checkpoints/_picker_options.html), branch by
    branch, each as "<branch> #<seq> <label>": what a person searches by, and what the page reads
    back (views/diff.py). Dicts, not the dataclass: the template engine tries a key before an
    attribute, and a list may offer hundreds of options."""
    return [
        {"branch": branch, "options": [{"value": str(option.id), "text": option.text} for option in options]}
        for branch, options in groups
    ]


# --------------------------------------------------------------------------- state tree


class _TooLarge(Exception):
    """Internal: the tree passed its node budget."""


def state_tree(state: Any, *, max_nodes: int = TREE_NODES) -> list[dict[str, Any]] | None:
    """The state as the checkpoint page's collapsible tree (templates/checkpoints/_state_tree.html),
    flattened in document order: a container opens (`children`), its nodes follow, and a `close`
    entry ends it, so one template loop draws any depth without a recursive include per node.

    Returns None when the state has more than `max_nodes` nodes: the page then shows
    raw JSON only, so a huge state never costs a huge render.
    """
    nodes: list[dict[str, Any]] = []
    counter = [0]
    try:
        if isinstance(state, dict):
            for key, value in state.items():
                _tree_node(nodes, counter, max_nodes, key, "/" + _escape_token(key), value, 1, False)
        elif isinstance(state, list):
            for index, value in enumerate(state):
                _tree_node(nodes, counter, max_nodes, str(index), f"/{index}", value, 1, True)
        else:
            nodes.append({"root": True, **_scalar(state)})
    except _TooLarge:
        return None
    return nodes


_CLOSE = {"close": True}


def _tree_node(
    nodes: list[dict[str, Any]],
    counter: list[int],
    max_nodes: int,
    key: str,
    path: str,
    value: Any,
    depth: int,
    index: bool,
) -> None:
    counter[0] += 1
    if counter[0] > max_nodes:
        raise _TooLarge
    node: dict[str, Any] = {"key": key, "key_class": "json-index" if index else "json-key", "path": path}
    is_dict, is_list = isinstance(value, dict), isinstance(value, list)
    if (is_dict or is_list) and value:
        if is_dict:
            node["meta"] = f"{{{len(value):,} {'key' if len(value) == 1 else 'keys'}}}"
        else:
            node["meta"] = f"[{len(value):,} {'item' if len(value) == 1 else 'items'}]"
        node["children"] = True
        node["open"] = depth <= TREE_OPEN_DEPTH and not (is_list and len(value) > TREE_LONG_ARRAY)
        nodes.append(node)
        if is_dict:
            for child_key, child in value.items():
                _tree_node(
                    nodes, counter, max_nodes, child_key, f"{path}/{_escape_token(child_key)}", child, depth + 1, False
                )
        else:
            for child_index, child in enumerate(value):
                _tree_node(nodes, counter, max_nodes, str(child_index), f"{path}/{child_index}", child, depth + 1, True)
        nodes.append(_CLOSE)
    else:
        node.update(_scalar(value))
        nodes.append(node)


def _scalar(value: Any) -> dict[str, Any]:
    """How a leaf shows: its CSS class and text; a string's quotes are the template's, and a cut
    string has no closing quote but a count of the characters left out."""
    if isinstance(value, str):
        if len(value) > TREE_STRING_CHARS:
            return {
                "kind": "json-string",
                "text": value[:TREE_STRING_CHARS],
                "more": f"{len(value) - TREE_STRING_CHARS:,}",
            }
        return {"kind": "json-string", "text": value, "closed": True}
    if value is None:
        return {"kind": "json-null", "text": "null"}
    if isinstance(value, bool):
        return {"kind": "json-boolean", "text": "true" if value else "false"}
    if isinstance(value, (int, float)):
        return {"kind": "json-number", "text": json.dumps(value)}
    if isinstance(value, dict):
        return {"kind": "json-meta", "text": "{}"}
    if isinstance(value, list):
        return {"kind": "json-meta", "text": "[]"}
    return {"kind": "", "text": repr(value)}


def _escape_token(token: str) -> str:
    return format_pointer([token])[1:]
