"""Reads and layout for the thread page: branch summaries, one keyset page of a branch's
timeline, a sampled series for the state chart and the lanes and nodes of the branch tree.

Every read here costs the same for a thread of 10 checkpoints and one of 10,000: heads come
from one LATERAL probe per branch, pages are keyset ranges on the (thread, branch, seq)
index and the chart reads a fixed number of index probes, never the whole branch.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone

from checkpoints import selectors
from checkpoints.models import Branch, Checkpoint, CheckpointStatus, Thread

PAGE_SIZE = 50
CHART_POINTS = 120
# More lanes than this make the tree unreadable; the branch picker still lists every branch.
MAX_LANES = 12
# The largest seq PostgreSQL's integer column can hold: a bigger cursor is a bad link, not a query.
MAX_SEQ = 2**31 - 1
MAIN = "main"


@dataclass(frozen=True, slots=True)
class BranchSummary:
    """A branch as the thread page shows it. `offset` is the depth of its fork point in the tree
    (0 for `main`), so its checkpoint with seq s sits at depth offset + s."""

    id: int
    name: str
    fork_point_id: UUID | None
    fork_seq: int | None
    parent_id: int | None
    parent_name: str | None
    head_id: UUID | None
    head_seq: int
    offset: int

    @property
    def length(self) -> int:
        # Seqs run 1, 2, 3… without gaps (each is its parent's plus one), so the head's seq is the length.
        return self.head_seq

    @property
    def is_empty(self) -> bool:
        return self.head_id is None


def branch_summaries(thread: Thread) -> list[BranchSummary]:
    """Every branch of the thread in tree order (each branch right after its parent's lane,
    siblings oldest first, `main` on top), with its fork point and head. Two queries."""
    heads = selectors.branch_heads(thread)
    rows = list(
        Branch.objects.filter(thread=thread)
        .order_by("created_at", "id")
        .values_list("id", "name", "fork_point_id", "fork_point__seq", "fork_point__branch_id")
    )
    names = {branch_id: name for branch_id, name, *_ in rows}
    parents = {branch_id: parent for branch_id, _, _, _, parent in rows}
    fork_seqs = {branch_id: fork_seq for branch_id, _, _, fork_seq, _ in rows}
    offsets: dict[int, int] = {}

    def offset_of(branch_id: int, seen: frozenset[int] = frozenset()) -> int:
        if branch_id not in offsets:
            parent = parents.get(branch_id)
            if parent is None or parent in seen or parent not in parents:
                offsets[branch_id] = 0
            else:
                offsets[branch_id] = offset_of(parent, seen | {branch_id}) + (fork_seqs[branch_id] or 0)
        return offsets[branch_id]

    summaries = {
        branch_id: BranchSummary(
            id=branch_id,
            name=name,
            fork_point_id=fork_id,
            fork_seq=fork_seq,
            parent_id=parent,
            parent_name=names.get(parent) if parent is not None else None,
            head_id=heads[branch_id][0] if branch_id in heads else None,
            head_seq=heads[branch_id][1] if branch_id in heads else 0,
            offset=offset_of(branch_id),
        )
        for branch_id, name, fork_id, fork_seq, parent in rows
    }
    children: dict[int | None, list[int]] = {}
    for branch_id, *_ in rows:
        parent = parents[branch_id]
        children.setdefault(parent if parent in summaries else None, []).append(branch_id)
    # `main` first among the roots, whatever order the rows came in.
    children.setdefault(None, []).sort(key=lambda branch_id: names[branch_id] != MAIN)
    ordered: list[BranchSummary] = []
    stack = list(reversed(children[None]))
    while stack:
        branch_id = stack.pop()
        ordered.append(summaries[branch_id])
        stack.extend(reversed(children.get(branch_id, [])))
    return ordered


def pick_branch(thread: Thread, branches: list[BranchSummary], name: str | None) -> BranchSummary | None:
    """The branch named `name`, or without a name the thread's active branch (None: no such branch)."""
    if name:
        return next((branch for branch in branches if branch.name == name), None)
    for branch in branches:
        if branch.id == thread.active_branch_id:
            return branch
    return next((branch for branch in branches if branch.name == MAIN), branches[0] if branches else None)


@dataclass(frozen=True, slots=True)
class Entry:
    """A checkpoint's summary columns as the timeline shows them; the state payload and its MAC
    stay on disk, and plain rows cost a fraction of model instances on a page of fifty."""

    id: UUID
    branch_id: int
    parent_id: UUID | None
    seq: int
    step: int | None
    label: str
    status: str
    model_name: str
    model_version: str
    state_bytes: int
    created_at: datetime


ENTRY_FIELDS = tuple(Entry.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class TimelinePage:
    """One page of a branch's checkpoints, newest first, and the cursors of its neighbours."""

    rows: list[Entry]
    older_before_seq: int | None
    newer_after_seq: int | None
    is_newest: bool
    # When the branch's next newer checkpoint after this page was written (None on the newest
    # page): where the span of time the page covers ends, for the events shown among its rows.
    newer_created_at: datetime | None = None

    @property
    def seqs(self) -> tuple[int, int] | None:
        return (self.rows[-1].seq, self.rows[0].seq) if self.rows else None


def timeline_page(
    *,
    thread: Thread,
    branch: BranchSummary,
    before_seq: int | None = None,
    after_seq: int | None = None,
    size: int = PAGE_SIZE,
) -> TimelinePage:
    """The newest `size` checkpoints of a branch, or those just before `before_seq` or just after
    `after_seq`: a keyset range on (thread, branch, seq), so page 200 costs what page 1 costs."""
    checkpoints = Checkpoint.objects.filter(thread_id=thread.pk, branch_id=branch.id)
    # The same range scan also reads the page's newer neighbour (one row more), whose time ends
    # the span of the page's events.
    neighbour: Entry | None = None
    if after_seq is not None:
        checkpoints = checkpoints.filter(seq__gt=after_seq).order_by("seq")
        rows = [Entry(*values) for values in checkpoints.values_list(*ENTRY_FIELDS)[: size + 1]]
        if len(rows) > size:
            neighbour = rows.pop()
        rows.reverse()
    else:
        if before_seq is not None:
            checkpoints = checkpoints.filter(seq__lte=before_seq)
        checkpoints = checkpoints.order_by("-seq")
        rows = [Entry(*values) for values in checkpoints.values_list(*ENTRY_FIELDS)[: size + 1]]
        if rows and before_seq is not None and rows[0].seq == before_seq:
            neighbour = rows.pop(0)
        rows = rows[:size]
    # The head's seq is known and seqs start at 1 without gaps, so neither neighbour needs a query.
    newer = rows[0].seq if rows and rows[0].seq < branch.head_seq else None
    older = rows[-1].seq if rows and rows[-1].seq > 1 else None
    is_newest = bool(rows) and rows[0].seq >= branch.head_seq
    return TimelinePage(rows=rows, older_before_seq=older, newer_after_seq=newer, is_newest=is_newest,
                        newer_created_at=neighbour.created_at if neighbour and not is_newest else None)  # fmt: skip


def url_maker(name: str) -> Callable[[Any], str]:
    """A function giving the URL `name` for a checkpoint id. A page of fifty rows needs over a
    hundred URLs and reverse() costs tens of microseconds each, so reverse once with a
    placeholder id and substitute."""
    placeholder = str(UUID(int=0))
    prefix, _, suffix = reverse(name, args=[placeholder]).partition(placeholder)
    return lambda checkpoint_id: f"{prefix}{checkpoint_id}{suffix}"


_SIZE_UNITS = (("KB", 1 << 10), ("MB", 1 << 20), ("GB", 1 << 30), ("TB", 1 << 40))


def human_bytes(size: float) -> str:
    """The same text as Django's filesizeformat ("512 bytes", "1.5 KB"), without its per-call
    localisation machinery, which a page with 50 rows and a 120-point chart calls 170 times."""
    size = int(size)
    if size < 1024:
        return f"{size}\xa0byte{'' if size == 1 else 's'}"
    unit, scale = next((unit, scale) for unit, scale in _SIZE_UNITS if size < scale * 1024 or unit == "TB")
    return f"{size / scale:.1f}\xa0{unit}"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def approval_marks(page: TimelinePage) -> dict[UUID, dict[str, str]]:
    """{checkpoint id: the approval asked at it, as its timeline row tells it} for one page: who or
    what decided it (a person, an auto-approve rule, the deadline), in one query."""
    return approval_facts(page, approval_ids=[])[0]


def approval_facts(page: TimelinePage, *, approval_ids: list[str]) -> tuple[dict[UUID, dict[str, str]], dict[str, str]]:
    """`approval_marks` of the page's checkpoints, and {approval id: the decision's comment} of the
    approvals the page's events name (`approval_ids`), in one query."""
    from approvals.models import ApprovalRequest, ApprovalStatus

    ids = [entry.id for entry in page.rows]
    wanted: list[UUID] = []
    for raw in approval_ids:
        try:
            wanted.append(UUID(raw))
        except ValueError:
            continue
    if not ids and not wanted:
        return {}, {}
    rows = ApprovalRequest.objects.filter(Q(checkpoint_id__in=ids) | Q(pk__in=wanted)).order_by("created_at")
    approval_url = url_maker("inbox:approval")
    marks = {}
    comments: dict[str, str] = {}
    page_ids = set(ids)
    for approval_id, checkpoint_id, status, person, rule, comment in rows.values_list(
        "id", "checkpoint_id", "status", "decided_by__username", "rule__name", "comment"
    ):
        if comment:
            comments[str(approval_id)] = _short(comment, 500)
        if checkpoint_id not in page_ids:
            continue
        if status == ApprovalStatus.PENDING:
            text = "waiting for a decision"
        elif rule:
            text = f"approved by rule “{_short(rule, 40)}”"
        elif person:
            text = f"{status} by {person}"
        else:
            text = str(status)
        marks[checkpoint_id] = {"url": approval_url(approval_id), "text": text, "status": status,
                                "by_rule": "yes" if rule else ""}  # fmt: skip
    return marks, comments


# A checkpoint's pill says what happened at that checkpoint, not what the thread is doing now: the
# agent writes `running` on every ordinary step, which is a step saved, not a step still running.
CHECKPOINT_PILLS: dict[str, tuple[str, str]] = {
    CheckpointStatus.RUNNING: ("saved", "Saved"),
    CheckpointStatus.WAITING_FOR_APPROVAL: ("waiting_for_approval", "Asked for approval"),
    CheckpointStatus.PAUSED: ("paused", "Paused here"),
    CheckpointStatus.COMPLETED: ("completed", "Finished here"),
    CheckpointStatus.FAILED: ("failed", "Failed here"),
    CheckpointStatus.CANCELLED: ("cancelled", "Cancelled here"),
}


def checkpoint_pill(status: str) -> tuple[str, str]:
    """(CSS status class, words) of a checkpoint's pill."""
    return CHECKPOINT_PILLS.get(status, (status, status))


def timeline_rows(
    page: TimelinePage,
    *,
    head_id: UUID | None,
    approvals: dict[UUID, dict[str, str]] | None = None,
    can_fork: bool = False,
) -> list[dict[str, Any]]:
    """What each row of the timeline table shows (templates/checkpoints/_timeline_rows.html draws
    it), as plain text, with the approval asked at a row's checkpoint (`approvals`, from
    `approval_marks`). Dicts rather than dataclasses: the template engine tries a key lookup
    before an attribute, and with fifty rows of a dozen cells that failed lookup would be most of
    the table's cost; the page must cost the same for 10,000 checkpoints as for 10."""
    approvals = approvals or {}
    checkpoint_url, diff_url = url_maker("dashboard:checkpoint"), url_maker("dashboard:diff")
    fork_url = url_maker("dashboard:fork")
    zone = timezone.get_current_timezone()
    rows = []
    for entry in page.rows:
        created = entry.created_at.astimezone(zone)
        pill, pill_label = checkpoint_pill(entry.status)
        rows.append(
            {
                "event": None,  # not an event row (the template asks every row)
                "seq": str(entry.seq),
                "url": checkpoint_url(entry.id),
                "head": entry.id == head_id,
                "label": _short(entry.label or "checkpoint", 60),
                "status": pill,
                "status_label": pill_label,
                # Only for those who may fork: the link would end on a 403 for anyone else.
                "rewind_url": fork_url(entry.id) if can_fork else "",
                "created_iso": created.isoformat(),
                "created_exact": created.strftime("%Y-%m-%d %H:%M:%S.%f %Z"),
                "created": created.strftime("%Y-%m-%d %H:%M:%S"),
                "model": _short(entry.model_name, 40),
                "model_version": _short(entry.model_version, 20) if entry.model_name else "",
                "size": human_bytes(entry.state_bytes),
                # The first checkpoint of main has nothing before it to compare with.
                "diff_url": diff_url(entry.id) if entry.parent_id is not None else "",
                "approval": approvals.get(entry.id),
            }
        )
    return rows


@dataclass(frozen=True, slots=True)
class ChartPoint:
    seq: int
    state_bytes: int
    created_at: datetime
    # Mean seconds between checkpoints from the previous point to this one (None for the first).
    gap_seconds: float | None


def sampled_seqs(length: int, points: int = CHART_POINTS) -> list[int]:
    """At most `points` seqs spread evenly over 1..length, always with both ends."""
    if length <= points:
        return list(range(1, length + 1))
    stride = (length - 1) / (points - 1)
    return sorted({1 + round(i * stride) for i in range(points)})


def chart_series(*, thread: Thread, branch: BranchSummary, points: int = CHART_POINTS) -> list[ChartPoint]:
    """State size and time between checkpoints along a branch, from at most `points` index probes."""
    if branch.is_empty:
        return []
    # One probe of the (thread, branch, seq) index per sampled seq. A plain `seq IN (...)` lets the
    # planner walk the whole branch and filter when its statistics are stale or when it wants the
    # index order; the LATERAL join with LIMIT 1 leaves it no choice.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.seq, c.state_bytes, c.created_at FROM unnest(%s::integer[]) s(seq) CROSS JOIN LATERAL ("
            "  SELECT x.seq, x.state_bytes, x.created_at FROM checkpoints_checkpoint x"
            "  WHERE x.thread_id = %s AND x.branch_id = %s AND x.seq = s.seq LIMIT 1"
            ") c",
            [sampled_seqs(branch.length, points), thread.pk, branch.id],
        )
        rows = sorted(cursor.fetchall())
    series: list[ChartPoint] = []
    previous: tuple[int, datetime] | None = None
    for seq, state_bytes, created_at in rows:
        gap = None
        if previous is not None:
            # Between two samples k checkpoints apart, the mean interval is the elapsed time over k:
            # exact when every checkpoint is sampled, a fair average over a long branch.
            gap = max(0.0, (created_at - previous[1]).total_seconds() / (seq - previous[0]))
        series.append(ChartPoint(seq=seq, state_bytes=state_bytes, created_at=created_at, gap_seconds=gap))
        previous = (seq, created_at)
    return series


# --------------------------------------------------------------------------- branch tree


@dataclass(frozen=True, slots=True)
class TreeNode:
    """A checkpoint drawn in the tree; `kinds` says why (first, head, fork, page, thread-head)."""

    id: UUID
    branch_id: int
    seq: int
    depth: int
    label: str
    kinds: frozenset[str]


@dataclass(frozen=True, slots=True)
class Lane:
    """A branch's horizontal line, from its first checkpoint's depth to its head's."""

    branch: BranchSummary
    index: int
    selected: bool
    parent_index: int | None
    start_depth: int
    end_depth: int | None  # None while the branch has no checkpoint yet

    @property
    def fork_depth(self) -> int | None:
        return self.branch.offset if self.branch.fork_point_id is not None else None


@dataclass(frozen=True, slots=True)
class BranchTree:
    lanes: list[Lane]
    nodes: list[TreeNode]
    # Depths that get a column, ascending; where two neighbours differ by more than one the
    # checkpoints between them are folded into a gap marker.
    columns: list[int]
    hidden_branches: int
    selected_name: str
    landmarks: dict[UUID, TreeNode] = field(default_factory=dict)

    def node(self, checkpoint_id: UUID | None) -> TreeNode | None:
        return self.landmarks.get(checkpoint_id) if checkpoint_id is not None else None


def _drawn_branches(branches: list[BranchSummary], selected: BranchSummary) -> list[BranchSummary]:
    """The branches that get a lane: the selected one and its ancestors, then others in tree
    order while there is room, each only if its parent's lane is drawn (a fork needs both ends)."""
    by_id = {branch.id: branch for branch in branches}
    keep: set[int] = set()
    current: BranchSummary | None = selected
    while current is not None and current.id not in keep:
        keep.add(current.id)
        current = by_id.get(current.parent_id) if current.parent_id is not None else None
    for branch in branches:
        if len(keep) >= MAX_LANES:
            break
        if branch.parent_id is None or branch.parent_id in keep:
            keep.add(branch.id)
    return [branch for branch in branches if branch.id in keep]


def branch_tree(
    *, thread: Thread, branches: list[BranchSummary], selected: BranchSummary, page: TimelinePage
) -> BranchTree:
    """Lanes and nodes of the tree: each drawn branch's first checkpoint, head and fork point,
    and the current page's checkpoints on the selected branch. At most a few hundred nodes,
    however long the branches; one query for the landmarks' labels."""
    drawn = _drawn_branches(branches, selected)
    lane_of = {branch.id: index for index, branch in enumerate(drawn)}
    wanted = [branch.head_id for branch in drawn if branch.head_id is not None]
    wanted += [branch.fork_point_id for branch in drawn if branch.fork_point_id is not None]
    with_checkpoints = [branch.id for branch in drawn if not branch.is_empty]
    landmark_rows: list[tuple[UUID, int, int, str]] = []
    if with_checkpoints:
        landmark_rows = list(
            Checkpoint.objects.filter(thread_id=thread.pk)
            .filter(Q(branch_id__in=with_checkpoints, seq=1) | Q(pk__in=wanted))
            # No ordering: the model's default one sorts by the thread's and branch's own orderings (two joins).
            .order_by()
            .values_list("id", "branch_id", "seq", "label")
        )
    by_id = {branch.id: branch for branch in branches}
    kinds: dict[UUID, set[str]] = {}
    facts: dict[UUID, tuple[int, int, str]] = {}
    for checkpoint_id, branch_id, seq, label in landmark_rows:
        facts[checkpoint_id] = (branch_id, seq, label)
        found = kinds.setdefault(checkpoint_id, set())
        branch = by_id.get(branch_id)
        if seq == 1:
            found.add("first")
        if branch is not None and branch.head_id == checkpoint_id:
            found.add("head")
        if any(other.fork_point_id == checkpoint_id for other in drawn):
            found.add("fork")
    for entry in page.rows:
        facts[entry.id] = (entry.branch_id, entry.seq, entry.label)
        kinds.setdefault(entry.id, set()).add("page")
    if thread.head_id in kinds:
        kinds[thread.head_id].add("thread-head")

    nodes = []
    for checkpoint_id, found in kinds.items():
        branch_id, seq, label = facts[checkpoint_id]
        branch = by_id.get(branch_id)
        if branch is None or branch_id not in lane_of:
            continue
        nodes.append(
            TreeNode(id=checkpoint_id, branch_id=branch_id, seq=seq, depth=branch.offset + seq, label=label,
                     kinds=frozenset(found))
        )  # fmt: skip
    nodes.sort(key=lambda node: (lane_of[node.branch_id], node.depth))

    lanes = []
    for index, branch in enumerate(drawn):
        lanes.append(
            Lane(branch=branch, index=index, selected=branch.id == selected.id,
                 parent_index=lane_of.get(branch.parent_id) if branch.parent_id is not None else None,
                 start_depth=branch.offset + 1,
                 end_depth=branch.offset + branch.head_seq if not branch.is_empty else None)
        )  # fmt: skip
    # An empty branch still gets a column where its first checkpoint will go, for its stub.
    columns = sorted({node.depth for node in nodes} | {lane.start_depth for lane in lanes})
    return BranchTree(
        lanes=lanes, nodes=nodes, columns=columns, hidden_branches=len(branches) - len(drawn),
        selected_name=selected.name, landmarks={node.id: node for node in nodes},
    )  # fmt: skip


def compact_metadata(metadata: Any, *, limit: int = 8, width: int = 60) -> tuple[list[tuple[str, str]], int]:
    """The first `limit` metadata entries as (key, short JSON value), and how many more there are."""
    if not isinstance(metadata, dict):
        return [], 0
    items = []
    for key, value in list(metadata.items())[:limit]:
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
        items.append((str(key), text if len(text) <= width else text[: width - 1] + "…"))
    return items, max(0, len(metadata) - limit)
