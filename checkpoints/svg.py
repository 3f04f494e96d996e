"""Server-rendered SVG for the thread page: the branch tree and the state chart.

Both return safe markup: every label, branch name and tooltip goes through `html.escape` (what
Django's escape calls) or `format_html`, and everything else is a number computed here. Colours
come from CSS classes (static/css/thread.css) that read the dashboard's variables, so the
drawings follow the light and dark themes; `currentColor` is only the fallback before the
stylesheet loads.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from html import escape
from itertools import pairwise
from typing import Any
from urllib.parse import urlencode

from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from checkpoints.timeline import BranchTree, ChartPoint, Lane, TimelinePage, TreeNode, human_bytes, url_maker

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


def _safe(parts: list[str]) -> SafeString:
    # Each part escapes its text (escape or format_html) and holds otherwise only numbers
    # and constant markup, so the joined string is safe. Plain f-strings in the loops keep
    # a 120-point chart or a 50-node lane from costing more than the rest of the page.
    return mark_safe("".join(parts))  # noqa: S308


def _plural(count: int, word: str, plural: str | None = None) -> str:
    return f"{count:,} {word if count == 1 else plural or word + 's'}"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


# --------------------------------------------------------------------------- branch tree


def branch_tree(tree: BranchTree) -> SafeString:
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

    parts: list[str] = []
    for lane in tree.lanes:
        parts.append(_lane(lane, tree.columns, column_x, lane_y(lane.index)))
    for lane in tree.lanes:
        if lane.parent_index is not None and lane.fork_depth is not None and lane.fork_depth in column_x:
            parts.append(_connector(lane, column_x, lane_y(lane.parent_index), lane_y(lane.index)))
    for lane in tree.lanes:
        if lane.end_depth is None:
            parts.append(
                f'<g class="node node-empty"><title>No checkpoint on {escape(lane.branch.name)} yet</title>'
                f'<circle cx="{_n(column_x[lane.start_depth])}" cy="{_n(lane_y(lane.index))}" r="6" '
                'stroke="currentColor"/></g>'
            )
    lane_of = {lane.branch.id: lane for lane in tree.lanes}
    page_seqs = [node.seq for node in tree.nodes if "page" in node.kinds]
    page_ends = {min(page_seqs), max(page_seqs)} if page_seqs else set()
    checkpoint_url = url_maker("dashboard:checkpoint")
    last_label_x: dict[int, float] = {}
    for node in tree.nodes:
        lane = lane_of[node.branch_id]
        labelled = bool(node.kinds & {"first", "head", "fork"}) or ("page" in node.kinds and node.seq in page_ends)
        parts.append(
            _node(node, lane, column_x[node.depth], lane_y(lane.index), labelled, last_label_x, checkpoint_url)
        )
    if tree.hidden_branches:
        parts.append(
            f'<text class="tree-note" x="12" y="{_n(height - 6)}">'
            f"{_plural(tree.hidden_branches, 'more branch', 'more branches')} not drawn; "
            "pick one from the branch list.</text>"
        )

    total = sum(lane.branch.length for lane in tree.lanes)
    summary = (
        f"Branch tree: {_plural(len(tree.lanes), 'branch', 'branches')} with {_plural(total, 'checkpoint')}; "
        f"branch {tree.selected_name} is selected. Each node links to its checkpoint."
    )
    return format_html(
        '<svg id="branch-tree" class="tree" role="img" aria-label="{}" width="{}" height="{}" viewBox="0 0 {} {}">'
        "{}</svg>",
        summary, _n(width), _n(height), _n(width), _n(height), _safe(parts),
    )  # fmt: skip


def _lane(lane: Lane, columns: list[int], column_x: dict[int, float], y: float) -> str:
    classes = "lane lane-selected" if lane.selected else "lane"
    branch = lane.branch
    meta = _plural(branch.length, "checkpoint") if not branch.is_empty else "empty"
    if branch.parent_name is not None and branch.fork_seq is not None:
        meta += f" · from {branch.parent_name} #{branch.fork_seq}"
    label = format_html(
        '<a class="lane-link" href="{}"{}><title>Show branch {}</title>'
        '<text class="lane-name" x="12" y="{}">{}</text></a>'
        '<text class="lane-meta" x="12" y="{}">{}</text>',
        "?" + urlencode({"branch": branch.name}), mark_safe(' aria-current="true"') if lane.selected else "",
        branch.name, _n(y - 1), _short(branch.name, 22), _n(y + 14), _short(meta, 36),
    )  # fmt: skip
    segments: list[str] = []
    if lane.end_depth is not None:
        inside = [depth for depth in columns if lane.start_depth <= depth <= lane.end_depth]
        for left, right in pairwise(inside):
            x1, x2 = _n(column_x[left]), _n(column_x[right])
            if right - left == 1:
                segments.append(f'<line class="lane-line" x1="{x1}" y1="{_n(y)}" x2="{x2}" y2="{_n(y)}" '
                                'stroke="currentColor"/>')  # fmt: skip
                continue
            folded = right - left - 1
            middle = (column_x[left] + column_x[right]) / 2
            segments.append(
                f'<g class="lane-gap"><title>{_plural(folded, "checkpoint")} folded</title>'
                f'<line class="lane-line gap-line" x1="{x1}" y1="{_n(y)}" x2="{x2}" y2="{_n(y)}" '
                'stroke="currentColor"/>'
                f'<text class="gap-label" x="{_n(middle)}" y="{_n(y - 8)}" text-anchor="middle">⋯ {folded:,}</text></g>'
            )  # fmt: skip
        if len(inside) == 1:
            # A one-checkpoint branch still gets a stub of lane, so it reads as a line, not a dot.
            x = column_x[inside[0]]
            segments.append(f'<line class="lane-line" x1="{_n(x - 6)}" y1="{_n(y)}" x2="{_n(x + 6)}" y2="{_n(y)}" '
                            'stroke="currentColor"/>')  # fmt: skip
    return f'<g class="{classes}" data-branch="{escape(branch.name)}">{label}{"".join(segments)}</g>'


def _connector(lane: Lane, column_x: dict[int, float], parent_y: float, y: float) -> str:
    assert lane.fork_depth is not None
    x_fork, x_first = column_x[lane.fork_depth], column_x[lane.start_depth]
    radius = min(10.0, x_first - x_fork, y - parent_y)
    classes = "connector connector-selected" if lane.selected else "connector"
    title = f"{lane.branch.name} forks from {lane.branch.parent_name} #{lane.branch.fork_seq}"
    return (
        f'<path class="{classes}" d="M {_n(x_fork)} {_n(parent_y)} V {_n(y - radius)} '
        f'Q {_n(x_fork)} {_n(y)} {_n(x_fork + radius)} {_n(y)} H {_n(x_first)}" fill="none" stroke="currentColor">'
        f"<title>{escape(title)}</title></path>"
    )


_NODE_WORDS = (("first", "first"), ("fork", "fork point"), ("head", "branch head"), ("thread-head", "thread head"))


def _node(
    node: TreeNode,
    lane: Lane,
    x: float,
    y: float,
    labelled: bool,
    last_label_x: dict[int, float],
    checkpoint_url: Callable[[Any], str],
) -> str:
    classes = " ".join(["node", *(f"node-{kind}" for kind in sorted(node.kinds)),
                        *(["on-selected"] if lane.selected else [])])  # fmt: skip
    radius = "6" if node.kinds & {"first", "head", "fork"} else "4.5"
    what = [word for kind, word in _NODE_WORDS if kind in node.kinds]
    tooltip = f"#{node.seq} · {node.label or 'checkpoint'} · {lane.branch.name}"
    if what:
        tooltip += f" ({', '.join(what)})"
    ring = ""
    if "thread-head" in node.kinds:
        ring = f'<circle class="head-ring" cx="{_n(x)}" cy="{_n(y)}" r="10" fill="none"/>'
    label = ""
    if labelled:
        previous = last_label_x.get(lane.index)
        if previous is None or x - previous >= LABEL_SPACING:
            label = f'<text class="node-seq" x="{_n(x)}" y="{_n(y + 20)}" text-anchor="middle">{node.seq}</text>'
            last_label_x[lane.index] = x
    return (
        f'<a class="{classes}" href="{checkpoint_url(node.id)}" data-seq="{node.seq}"><title>{escape(tooltip)}</title>'
        f'{ring}<circle cx="{_n(x)}" cy="{_n(y)}" r="{radius}" stroke="currentColor"/>{label}</a>'
    )


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


def state_chart(points: list[ChartPoint], *, branch_name: str, length: int, page: TimelinePage) -> SafeString:
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

    parts: list[str] = []
    # Grid and both value axes: 0, half and the maximum.
    for fraction in (0.0, 0.5, 1.0):
        y = _n(bottom - fraction * plot_h)
        parts.append(
            f'<line class="chart-grid" x1="{PAD_LEFT}" y1="{y}" x2="{PAD_LEFT + plot_w}" y2="{y}"/>'
            f'<text class="axis-label axis-size" x="{PAD_LEFT - 8}" y="{y}" dy="4" text-anchor="end">'
            f"{human_bytes(max_size * fraction)}</text>"
            f'<text class="axis-label axis-gap" x="{PAD_LEFT + plot_w + 8}" y="{y}" dy="4">'
            f"{duration(max_gap * fraction) if gaps else ''}</text>"
        )
    # Seq axis: both ends and the middle.
    for seq in sorted({first_seq, last_seq, round((first_seq + last_seq) / 2)}):
        tick = _n(x_of(seq))
        parts.append(
            f'<line class="chart-axis" x1="{tick}" y1="{bottom}" x2="{tick}" y2="{bottom + 4}" stroke="currentColor"/>'
            f'<text class="axis-label" x="{tick}" y="{bottom + 18}" text-anchor="middle">#{seq:,}</text>'
        )
    parts.append(
        f'<line class="chart-axis" x1="{PAD_LEFT}" y1="{bottom}" x2="{PAD_LEFT + plot_w}" y2="{bottom}" '
        'stroke="currentColor"/>'
        f'<text class="axis-title" x="{_n(PAD_LEFT + plot_w / 2)}" y="{CHART_HEIGHT - 2}" text-anchor="middle">'
        f"seq on {escape(branch_name)}</text>"
    )
    # Shade the shown page, unless it is the whole branch (then the shading would say nothing).
    shaded = page.seqs is not None and len(points) > 1 and page.seqs != (first_seq, last_seq)
    if shaded and page.seqs is not None:
        low, high = page.seqs
        x1, x2 = x_of(max(low, first_seq)), x_of(min(high, last_seq))
        parts.append(
            f'<rect class="chart-page" x="{_n(min(x1, x2 - 2))}" y="{PAD_TOP}" width="{_n(max(2.0, x2 - x1))}" '
            f'height="{plot_h}"><title>This page: #{low} to #{high}</title></rect>'
        )

    # Bars first so the size line stays on top; each bar spans the interval it averages.
    previous_x: float | None = None
    for point in points:
        x = x_of(point.seq)
        if point.gap_seconds is not None and previous_x is not None:
            bar_w = max(1.0, x - previous_x - 1)
            top = bottom - point.gap_seconds / max_gap * plot_h
            parts.append(
                f'<rect class="chart-gap" x="{_n(x - bar_w)}" y="{_n(top)}" width="{_n(bar_w)}" '
                f'height="{_n(max(0.5, bottom - top))}" fill="currentColor">'
                f"<title>#{point.seq}: {duration(point.gap_seconds)} between checkpoints</title></rect>"
            )
        previous_x = x
    if points:
        line = " ".join(f"{_n(x_of(point.seq))},{_n(y_size(point.state_bytes))}" for point in points)
        parts.append(f'<polyline class="chart-size" points="{line}" fill="none" stroke="currentColor"/>')
        parts.extend(
            f'<circle class="chart-point" cx="{_n(x_of(p.seq))}" cy="{_n(y_size(p.state_bytes))}" r="2.5">'
            f"<title>#{p.seq}: {human_bytes(p.state_bytes)}</title></circle>"
            for p in points
        )
    legend_x = PAD_LEFT
    parts.append(
        f'<g class="chart-legend"><line class="chart-size" x1="{legend_x}" y1="14" x2="{legend_x + 22}" y2="14"/>'
        f'<text x="{legend_x + 28}" y="18">State size (left)</text>'
        f'<rect class="chart-gap" x="{legend_x + 170}" y="8" width="12" height="12"/>'
        f'<text x="{legend_x + 188}" y="18">Time between checkpoints (right)</text>'
        + (
            f'<rect class="chart-page" x="{legend_x + 430}" y="8" width="12" height="12"/>'
            f'<text x="{legend_x + 448}" y="18">This page</text>'
            if shaded
            else ""
        )
        + "</g>"
    )

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
    return format_html(
        '<svg id="state-chart" class="chart" role="img" aria-label="{}" data-points="{}" '
        'viewBox="0 0 {} {}" preserveAspectRatio="xMidYMid meet">{}</svg>',
        summary, len(points), CHART_WIDTH, CHART_HEIGHT, _safe(parts),
    )  # fmt: skip
