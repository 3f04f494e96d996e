"""Server-rendered SVG for the thread page: the branch tree and the state chart.

Both return safe markup built with `format_html`, so every label, branch name and tooltip is
escaped. Colours come from CSS classes (static/css/thread.css) that read the dashboard's
variables, so the drawings follow the light and dark themes.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from urllib.parse import urlencode

from django.template.defaultfilters import filesizeformat
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from checkpoints.timeline import BranchTree, ChartPoint, Lane, TimelinePage, TreeNode

# Branch tree geometry, in pixels.
LABEL_WIDTH = 176
TOP = 30
LANE_HEIGHT = 46
STEP = 18  # between neighbouring checkpoints
GAP = 56  # where a run of checkpoints is folded into a marker
RIGHT = 48
# Seq labels closer than this on one lane would overlap; the later one is left out.
LABEL_SPACING = 34


def _n(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


def _join(parts: Sequence[str]) -> SafeString:
    # Every part was built by format_html (or is a constant), so it is already escaped.
    return mark_safe("".join(parts))  # noqa: S308


def _checkpoint_url(checkpoint_id: object) -> str:
    return reverse("dashboard:checkpoint", args=[checkpoint_id])


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def branch_tree(tree: BranchTree) -> SafeString:
    """One lane per branch (main on top), forks as elbows from the fork point down to the child's
    lane, folded runs as dashed segments with a count, every checkpoint node a link."""
    column_x: dict[int, float] = {}
    x = LABEL_WIDTH + 20.0
    previous: int | None = None
    for depth in tree.columns:
        if previous is not None:
            x += STEP if depth - previous == 1 else GAP
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
                format_html(
                    '<g class="node node-empty"><title>No checkpoint on {} yet</title>'
                    '<circle cx="{}" cy="{}" r="6" fill="none" stroke="currentColor"/></g>',
                    lane.branch.name,
                    _n(column_x[lane.start_depth]),
                    _n(lane_y(lane.index)),
                )  # fmt: skip
            )
    lane_of = {lane.branch.id: lane for lane in tree.lanes}
    last_label_x: dict[int, float] = {}
    for node in tree.nodes:
        lane = lane_of[node.branch_id]
        parts.append(_node(node, lane, column_x[node.depth], lane_y(lane.index), last_label_x))
    if tree.hidden_branches:
        parts.append(
            format_html(
                '<text class="tree-note" x="12" y="{}">{} not drawn; pick one from the branch list.</text>',
                _n(height - 6),
                _plural(tree.hidden_branches, "more branch").replace("branchs", "branches"),
            )  # fmt: skip
        )

    total = sum(lane.branch.length for lane in tree.lanes)
    summary = (
        f"Branch tree: {_plural(len(tree.lanes), 'lane')}, {_plural(total, 'checkpoint')}; "
        f"branch {tree.selected_name} is selected. Each node links to its checkpoint."
    )
    return format_html(
        '<svg id="branch-tree" class="tree" role="img" aria-label="{}" width="{}" height="{}" viewBox="0 0 {} {}">'
        "{}</svg>",
        summary, _n(width), _n(height), _n(width), _n(height), _join(parts),
    )  # fmt: skip


def _lane(lane: Lane, columns: list[int], column_x: dict[int, float], y: float) -> str:
    classes = "lane lane-selected" if lane.selected else "lane"
    branch = lane.branch
    name = branch.name if len(branch.name) <= 20 else branch.name[:19] + "…"
    meta = _plural(branch.length, "checkpoint") if not branch.is_empty else "empty"
    if branch.parent_name is not None and branch.fork_seq is not None:
        meta += f" · from {branch.parent_name} #{branch.fork_seq}"
    meta = meta if len(meta) <= 30 else meta[:29] + "…"
    href = "?" + urlencode({"branch": branch.name})
    current = mark_safe(' aria-current="true"') if lane.selected else ""  # noqa: S308  (a constant)
    label = format_html(
        '<a class="lane-link" href="{}"{}><title>Show branch {}</title>'
        '<text class="lane-name" x="12" y="{}">{}</text></a>'
        '<text class="lane-meta" x="12" y="{}">{}</text>',
        href, current, branch.name, _n(y - 1), name, _n(y + 14), meta,
    )  # fmt: skip
    if lane.end_depth is None:
        return format_html('<g class="{}">{}</g>', classes, label)
    segments: list[str] = []
    inside = [depth for depth in columns if lane.start_depth <= depth <= lane.end_depth]
    for left, right in zip(inside, inside[1:], strict=False):
        x1, x2 = column_x[left], column_x[right]
        if right - left == 1:
            segments.append(format_html('<line class="lane-line" x1="{}" y1="{}" x2="{}" y2="{}"/>',
                                        _n(x1), _n(y), _n(x2), _n(y)))  # fmt: skip
        else:
            folded = right - left - 1
            segments.append(
                format_html(
                    '<g class="lane-gap"><title>{} folded</title>'
                    '<line class="lane-line gap-line" x1="{}" y1="{}" x2="{}" y2="{}"/>'
                    '<text class="gap-label" x="{}" y="{}" text-anchor="middle">⋯ {}</text></g>',
                    _plural(folded, "checkpoint"),
                    _n(x1),
                    _n(y),
                    _n(x2),
                    _n(y),
                    _n((x1 + x2) / 2),
                    _n(y - 8),
                    f"{folded:,}",
                )  # fmt: skip
            )
    if len(inside) == 1:
        # A one-checkpoint branch still shows a stub of lane so it reads as a line, not a dot.
        x1 = column_x[inside[0]]
        segments.append(format_html('<line class="lane-line" x1="{}" y1="{}" x2="{}" y2="{}"/>',
                                    _n(x1 - 6), _n(y), _n(x1 + 6), _n(y)))  # fmt: skip
    return format_html(
        '<g class="{}" data-branch="{}" stroke="currentColor">{}{}</g>', classes, branch.name, label, _join(segments)
    )


def _connector(lane: Lane, column_x: dict[int, float], parent_y: float, y: float) -> str:
    assert lane.fork_depth is not None
    x_fork, x_first = column_x[lane.fork_depth], column_x[lane.start_depth]
    radius = min(10.0, x_first - x_fork, y - parent_y)
    classes = "connector connector-selected" if lane.selected else "connector"
    return format_html(
        '<path class="{}" d="M {} {} V {} Q {} {} {} {} H {}" fill="none" stroke="currentColor">'
        "<title>{} forks from {} #{}</title></path>",
        classes, _n(x_fork), _n(parent_y), _n(y - radius), _n(x_fork), _n(y), _n(x_fork + radius), _n(y),
        _n(x_first), lane.branch.name, lane.branch.parent_name or "", lane.branch.fork_seq or "",
    )  # fmt: skip


def _node(node: TreeNode, lane: Lane, x: float, y: float, last_label_x: dict[int, float]) -> str:
    kinds = sorted(node.kinds)
    classes = " ".join(["node", *(f"node-{kind}" for kind in kinds), *(["on-selected"] if lane.selected else [])])
    landmark = bool(node.kinds & {"first", "head", "fork"})
    radius = 6 if landmark else 4.5
    what = [word for kind, word in (("first", "first"), ("fork", "fork point"), ("head", "head"),
                                    ("thread-head", "thread head")) if kind in node.kinds]  # fmt: skip
    tooltip = f"#{node.seq} · {node.label or 'checkpoint'} · {lane.branch.name}"
    if what:
        tooltip += f" ({', '.join(what)})"
    ring = ""
    if "thread-head" in node.kinds:
        ring = format_html('<circle class="head-ring" cx="{}" cy="{}" r="10" fill="none"/>', _n(x), _n(y))
    label = ""
    # Landmarks always want their seq; page nodes only at the page's ends, or the lane fills with digits.
    if landmark or "page" in node.kinds:
        previous = last_label_x.get(lane.index)
        if previous is None or x - previous >= LABEL_SPACING:
            label = format_html('<text class="node-seq" x="{}" y="{}" text-anchor="middle">{}</text>',
                                _n(x), _n(y + 20), node.seq)  # fmt: skip
            last_label_x[lane.index] = x
    return format_html(
        '<a class="{}" href="{}" data-seq="{}"><title>{}</title>{}'
        '<circle cx="{}" cy="{}" r="{}" stroke="currentColor"/>{}</a>',
        classes, _checkpoint_url(node.id), node.seq, tooltip, ring, _n(x), _n(y), _n(radius), label,
    )  # fmt: skip


def page_label_nodes(tree: BranchTree, page: TimelinePage) -> set[int]:
    """Seqs of the page's first and last rows (the only page nodes whose seq is printed)."""
    return {row.seq for row in (page.rows[:1] + page.rows[-1:])}


# --------------------------------------------------------------------------- chart

CHART_WIDTH = 1160
CHART_HEIGHT = 250
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 76, 76, 40, 36


def duration(seconds: float) -> str:
    """A short human duration: 850 ms, 4.2 s, 3.5 min, 2.1 h."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s".replace(".0 s", " s")
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _size(value: float) -> str:
    return str(filesizeformat(int(value))).replace("\xa0", " ")


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

    def y_gap(value: float) -> float:
        return bottom - value / max_gap * plot_h

    parts: list[str] = []
    # Grid and both value axes: 0, half and the maximum.
    for fraction in (0.0, 0.5, 1.0):
        y = bottom - fraction * plot_h
        parts.append(format_html(
            '<line class="chart-grid" x1="{}" y1="{}" x2="{}" y2="{}"/>'
            '<text class="axis-label axis-size" x="{}" y="{}" text-anchor="end">{}</text>'
            '<text class="axis-label axis-gap" x="{}" y="{}">{}</text>',
            PAD_LEFT, _n(y), PAD_LEFT + plot_w, _n(y), PAD_LEFT - 8, _n(y + 4), _size(max_size * fraction),
            PAD_LEFT + plot_w + 8, _n(y + 4), duration(max_gap * fraction) if gaps else "",
        ))  # fmt: skip
    # Seq axis: ends, middle, and where the shown page sits.
    ticks = sorted({first_seq, last_seq, round((first_seq + last_seq) / 2)})
    for seq in ticks:
        parts.append(format_html(
            '<line class="chart-axis" x1="{}" y1="{}" x2="{}" y2="{}"/>'
            '<text class="axis-label" x="{}" y="{}" text-anchor="middle">#{}</text>',
            _n(x_of(seq)), bottom, _n(x_of(seq)), bottom + 4, _n(x_of(seq)), bottom + 18, f"{seq:,}",
        ))  # fmt: skip
    parts.append(format_html(
        '<line class="chart-axis" x1="{}" y1="{}" x2="{}" y2="{}" stroke="currentColor"/>'
        '<text class="axis-title" x="{}" y="{}" text-anchor="middle">seq on {}</text>',
        PAD_LEFT, bottom, PAD_LEFT + plot_w, bottom, PAD_LEFT + plot_w / 2, CHART_HEIGHT - 2, branch_name,
    ))  # fmt: skip
    if page.seqs is not None and len(points) > 1:
        low, high = page.seqs
        x1, x2 = x_of(max(low, first_seq)), x_of(min(high, last_seq))
        parts.append(format_html(
            '<rect class="chart-page" x="{}" y="{}" width="{}" height="{}"><title>This page: #{}–#{}</title></rect>',
            _n(min(x1, x2 - 2)), PAD_TOP, _n(max(2.0, x2 - x1)), plot_h, low, high,
        ))  # fmt: skip

    # Bars first so the size line stays on top. Each bar spans the interval it averages.
    previous_x: float | None = None
    for point in points:
        x = x_of(point.seq)
        if point.gap_seconds is not None and previous_x is not None:
            bar_w = max(1.0, x - previous_x - 1)
            top = y_gap(point.gap_seconds)
            parts.append(format_html(
                '<rect class="chart-gap" x="{}" y="{}" width="{}" height="{}" fill="currentColor">'
                "<title>#{}: {} between checkpoints</title></rect>",
                _n(x - bar_w), _n(top), _n(bar_w), _n(max(0.5, bottom - top)), point.seq, duration(point.gap_seconds),
            ))  # fmt: skip
        previous_x = x
    if points:
        line = " ".join(f"{_n(x_of(point.seq))},{_n(y_size(point.state_bytes))}" for point in points)
        parts.append(format_html(
            '<polyline class="chart-size" points="{}" fill="none" stroke="currentColor"/>', line
        ))  # fmt: skip
        parts.append(format_html_join(
            "", '<circle class="chart-point" cx="{}" cy="{}" r="2.5"><title>#{}: {}</title></circle>',
            ((_n(x_of(p.seq)), _n(y_size(p.state_bytes)), p.seq, _size(p.state_bytes)) for p in points),
        ))  # fmt: skip
    # Legend, top left.
    parts.append(format_html(
        '<g class="chart-legend"><line class="chart-size" x1="{}" y1="14" x2="{}" y2="14"/>'
        '<text x="{}" y="18">State size (left)</text>'
        '<rect class="chart-gap" x="{}" y="8" width="12" height="12"/>'
        '<text x="{}" y="18">Time between checkpoints (right)</text>'
        '<rect class="chart-page" x="{}" y="8" width="12" height="12"/><text x="{}" y="18">This page</text></g>',
        PAD_LEFT, PAD_LEFT + 22, PAD_LEFT + 28, PAD_LEFT + 170, PAD_LEFT + 188, PAD_LEFT + 430, PAD_LEFT + 448,
    ))  # fmt: skip

    if points:
        summary = (
            f"State size along branch {branch_name}: {_size(points[0].state_bytes)} at #{points[0].seq}, "
            f"{_size(points[-1].state_bytes)} at #{points[-1].seq}, largest {_size(max_size)}. "
        )
        if gaps:
            summary += f"Time between checkpoints: median {duration(statistics.median(gaps))}, "
            summary += f"longest {duration(max(gaps))}. "
        summary += f"{_plural(len(points), 'point')} sampled from {_plural(length, 'checkpoint')}."
    else:
        summary = f"No checkpoints on branch {branch_name} yet."
    return format_html(
        '<svg id="state-chart" class="chart" role="img" aria-label="{}" data-points="{}" '
        'viewBox="0 0 {} {}" preserveAspectRatio="xMidYMid meet">{}</svg>',
        summary, len(points), CHART_WIDTH, CHART_HEIGHT, _join(parts),
    )  # fmt: skip
