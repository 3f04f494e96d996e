"""The thread page's two drawings, the branch tree and the state chart, as plain data: every
coordinate, class and label the SVG templates (templates/checkpoints/branch_tree.svg and
state_chart.svg) place, with the templates doing all markup and escaping. Colours come from CSS
classes (static/css/thread.css) that read the dashboard's variables, so the drawings follow the
light and dark themes; `currentColor` is only the fallback before the stylesheet loads.

Items are dicts because the template engine tries a key lookup before an attribute: for a
120-point chart, that failed lookup would cost more than the rest of the drawing.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from itertools import pairwise
from typing import Any
from urllib.parse import urlencode

from checkpoints.presentation.timeline import (
    BranchTree,
    ChartPoint,
    Lane,
    TimelinePage,
    TreeNode,
    human_bytes,
    url_maker,
)

# Branch tree geometry, in pixels. The tree aims at the width of the page's cards; neighbouring
# checkpoints sit STEP apart, closer (down to MIN_STEP) when a full page of them would not fit.
TARGET_WIDTH = 1190
LABEL_WIDTH = 196
TOP = 30
LANE_HEIGHT = 46
STEP = 18
MIN_STEP = 11
GAP = 56  # where a run of checkpoints is folded into a marker
RIGHT = 30
# Seq labels closer than this on one lane would overlap; the later one is left out.
LABEL_SPACING = 34


def _n(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def _plural(count: int, word: str, plural: str | None = None) -> str:
    return f"{count:,} {word if count == 1 else plural or word + 's'}"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# --------------------------------------------------------------------------- branch tree


def branch_tree(tree: BranchTree) -> dict[str, Any]:
    """One lane per branch (main on top), forks as elbows from the fork point down to the child's
    lane, folded runs as dashed segments with a count, every checkpoint node a link."""
    pairs = list(pairwise(tree.columns))
    neighbours = sum(1 for left, right in pairs if right - left == 1)
    room = TARGET_WIDTH - LABEL_WIDTH - 20 - RIGHT - GAP * (len(pairs) - neighbours)
    step = max(MIN_STEP, min(STEP, room / neighbours)) if neighbours else STEP
    column_x: dict[int, float] = {}
    x = LABEL_WIDTH + 20.0
    previous: int | None = None
    for depth in tree.columns:
        if previous is not None:
            x += step if depth - previous == 1 else GAP
        column_x[depth] = x
        previous = depth
    width = x + RIGHT
    height = TOP + LANE_HEIGHT * max(1, len(tree.lanes)) + (18 if tree.hidden_branches else 0)

    def lane_y(index: int) -> float:
        return TOP + LANE_HEIGHT * index + 12

    lanes = [_lane(lane, tree.columns, column_x, lane_y(lane.index)) for lane in tree.lanes]
    connectors = [
        _connector(lane, column_x, lane_y(lane.parent_index), lane_y(lane.index))
        for lane in tree.lanes
        if lane.parent_index is not None and lane.fork_depth is not None and lane.fork_depth in column_x
    ]
    empty = [
        {"name": lane.branch.name, "x": _n(column_x[lane.start_depth]), "y": _n(lane_y(lane.index))}
        for lane in tree.lanes
        if lane.end_depth is None
    ]
    lane_of = {lane.branch.id: lane for lane in tree.lanes}
    page_seqs = [node.seq for node in tree.nodes if "page" in node.kinds]
    page_ends = {min(page_seqs), max(page_seqs)} if page_seqs else set()
    checkpoint_url = url_maker("dashboard:checkpoint")
    last_label_x: dict[int, float] = {}
    nodes = []
    for node in tree.nodes:
        lane = lane_of[node.branch_id]
        labelled = bool(node.kinds & {"first", "head", "fork"}) or ("page" in node.kinds and node.seq in page_ends)
        nodes.append(
            _node(node, lane, column_x[node.depth], lane_y(lane.index), labelled, last_label_x, checkpoint_url)
        )
    note = ""
    if tree.hidden_branches:
        note = (
            f"{_plural(tree.hidden_branches, 'more branch', 'more branches')} not drawn; pick one from the branch list."
        )

    total = sum(lane.branch.length for lane in tree.lanes)
    summary = (
        f"Branch tree: {_plural(len(tree.lanes), 'branch', 'branches')} with {_plural(total, 'checkpoint')}; "
        f"branch {tree.selected_name} is selected. Each node links to its checkpoint."
    )
    return {
        "summary": summary, "width": _n(width), "height": _n(height), "lanes": lanes, "connectors": connectors,
        "empty": empty, "nodes": nodes, "note": note, "note_y": _n(height - 6),
    }  # fmt: skip


def _lane(lane: Lane, columns: list[int], column_x: dict[int, float], y: float) -> dict[str, Any]:
    branch = lane.branch
    meta = _plural(branch.length, "checkpoint") if not branch.is_empty else "empty"
    if branch.parent_name is not None and branch.fork_seq is not None:
        meta += f" · from {branch.parent_name} #{branch.fork_seq}"
    segments: list[dict[str, Any]] = []
    if lane.end_depth is not None:
        inside = [depth for depth in columns if lane.start_depth <= depth <= lane.end_depth]
        for left, right in pairwise(inside):
            segment = {"x1": _n(column_x[left]), "x2": _n(column_x[right]), "folded": ""}
            if right - left > 1:
                folded = right - left - 1
                segment["folded"] = _plural(folded, "checkpoint")
                segment["count"] = f"{folded:,}"
                segment["middle"] = _n((column_x[left] + column_x[right]) / 2)
            segments.append(segment)
        if len(inside) == 1:
            # A one-checkpoint branch still gets a stub of lane, so it reads as a line, not a dot.
            x = column_x[inside[0]]
            segments.append({"x1": _n(x - 6), "x2": _n(x + 6), "folded": ""})
    return {
        "name": branch.name, "selected": lane.selected, "href": "?" + urlencode({"branch": branch.name}),
        "short_name": _short(branch.name, 22), "meta": _short(meta, 36), "y": _n(y), "name_y": _n(y - 1),
        "meta_y": _n(y + 14), "gap_y": _n(y - 8), "segments": segments,
    }  # fmt: skip


def _connector(lane: Lane, column_x: dict[int, float], parent_y: float, y: float) -> dict[str, Any]:
    assert lane.fork_depth is not None
    x_fork, x_first = column_x[lane.fork_depth], column_x[lane.start_depth]
    radius = min(10.0, x_first - x_fork, y - parent_y)
    return {
        "selected": lane.selected,
        "path": f"M {_n(x_fork)} {_n(parent_y)} V {_n(y - radius)} "
        f"Q {_n(x_fork)} {_n(y)} {_n(x_fork + radius)} {_n(y)} H {_n(x_first)}",
        "title": f"{lane.branch.name} forks from {lane.branch.parent_name} #{lane.branch.fork_seq}",
    }


_NODE_WORDS = (("first", "first"), ("fork", "fork point"), ("head", "branch head"), ("thread-head", "thread head"))


def _node(
    node: TreeNode,
    lane: Lane,
    x: float,
    y: float,
    labelled: bool,
    last_label_x: dict[int, float],
    checkpoint_url: Callable[[Any], str],
) -> dict[str, Any]:
    classes = " ".join(["node", *(f"node-{kind}" for kind in sorted(node.kinds)),
                        *(["on-selected"] if lane.selected else [])])  # fmt: skip
    what = [word for kind, word in _NODE_WORDS if kind in node.kinds]
    tooltip = f"#{node.seq} · {node.label or 'checkpoint'} · {lane.branch.name}"
    if what:
        tooltip += f" ({', '.join(what)})"
    label = False
    if labelled:
        previous = last_label_x.get(lane.index)
        if previous is None or x - previous >= LABEL_SPACING:
            label = True
            last_label_x[lane.index] = x
    return {
        "classes": classes, "href": checkpoint_url(node.id), "seq": str(node.seq), "tooltip": tooltip,
        "ring": "thread-head" in node.kinds, "x": _n(x), "y": _n(y), "label_y": _n(y + 20), "label": label,
        "radius": "6" if node.kinds & {"first", "head", "fork"} else "4.5",
    }  # fmt: skip


# --------------------------------------------------------------------------- chart

CHART_WIDTH = 1160
CHART_HEIGHT = 250
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 76, 76, 40, 36


def duration(seconds: float) -> str:
    """A short human duration: 0 s, 850 ms, 4.2 s, 3.5 min, 2.1 h."""
    if seconds == 0:
        return "0 s"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s".replace(".0 s", " s")
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def state_chart(points: list[ChartPoint], *, branch_name: str, length: int, page: TimelinePage) -> dict[str, Any]:
    """State size as a line (left axis) and mean time between checkpoints as bars (right axis)
    along seq, with the current timeline page shaded."""
    plot_w = CHART_WIDTH - PAD_LEFT - PAD_RIGHT
    plot_h = CHART_HEIGHT - PAD_TOP - PAD_BOTTOM
    bottom = PAD_TOP + plot_h
    first_seq, last_seq = (points[0].seq, points[-1].seq) if points else (1, 1)
    span = max(1, last_seq - first_seq)
    max_size = max((point.state_bytes for point in points), default=0) or 1
    gaps = [point.gap_seconds for point in points if point.gap_seconds is not None]
    max_gap = max(gaps, default=0.0) or 1.0

    def x_of(seq: float) -> float:
        return PAD_LEFT + (seq - first_seq) / span * plot_w

    def y_size(value: float) -> float:
        return bottom - value / max_size * plot_h

    # Grid and both value axes: 0, half and the maximum.
    grid = [
        {"y": _n(bottom - fraction * plot_h), "size": human_bytes(max_size * fraction),
         "gap": duration(max_gap * fraction) if gaps else ""}
        for fraction in (0.0, 0.5, 1.0)
    ]  # fmt: skip
    # Seq axis: both ends and the middle.
    ticks = [
        {"x": _n(x_of(seq)), "label": f"#{seq:,}"}
        for seq in sorted({first_seq, last_seq, round((first_seq + last_seq) / 2)})
    ]
    # Shade the shown page, unless it is the whole branch (then the shading would say nothing).
    shaded: dict[str, Any] | None = None
    if page.seqs is not None and len(points) > 1 and page.seqs != (first_seq, last_seq):
        low, high = page.seqs
        x1, x2 = x_of(max(low, first_seq)), x_of(min(high, last_seq))
        shaded = {"x": _n(min(x1, x2 - 2)), "width": _n(max(2.0, x2 - x1)), "low": low, "high": high}

    # Each bar spans the interval it averages; the template draws bars first so the size line stays on top.
    bars = []
    dots = []
    previous_x: float | None = None
    for point in points:
        x, y = x_of(point.seq), y_size(point.state_bytes)
        if point.gap_seconds is not None and previous_x is not None:
            bar_w = max(1.0, x - previous_x - 1)
            top = bottom - point.gap_seconds / max_gap * plot_h
            bars.append(
                {"x": _n(x - bar_w), "y": _n(top), "width": _n(bar_w), "height": _n(max(0.5, bottom - top)),
                 "title": f"#{point.seq}: {duration(point.gap_seconds)} between checkpoints"}
            )  # fmt: skip
        previous_x = x
        dots.append({"x": _n(x), "y": _n(y), "title": f"#{point.seq}: {human_bytes(point.state_bytes)}"})

    if points:
        summary = (
            f"State size along branch {branch_name}: {human_bytes(points[0].state_bytes)} at #{points[0].seq}, "
            f"{human_bytes(points[-1].state_bytes)} at #{points[-1].seq}, largest {human_bytes(max_size)}. "
        )
        if gaps:
            summary += (
                f"Time between checkpoints: median {duration(statistics.median(gaps))}, longest {duration(max(gaps))}. "
            )
        summary += f"{_plural(len(points), 'point')} sampled from {_plural(length, 'checkpoint')}."
    else:
        summary = f"No checkpoints on branch {branch_name} yet."
    return {
        "summary": summary, "points": len(points), "width": CHART_WIDTH, "height": CHART_HEIGHT,
        "left": PAD_LEFT, "right": PAD_LEFT + plot_w, "top": PAD_TOP, "bottom": bottom, "plot_height": plot_h,
        "size_label_x": PAD_LEFT - 8, "gap_label_x": PAD_LEFT + plot_w + 8, "tick_end": bottom + 4,
        "tick_label_y": bottom + 18, "title_x": _n(PAD_LEFT + plot_w / 2), "title_y": CHART_HEIGHT - 2,
        "branch_name": branch_name, "grid": grid, "ticks": ticks, "shaded": shaded, "bars": bars, "dots": dots,
        "line": " ".join(f"{dot['x']},{dot['y']}" for dot in dots),
    }  # fmt: skip
