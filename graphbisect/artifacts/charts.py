"""Charts as standalone SVG text, so reports need no plotting library and open in any browser."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

from graphbisect.text.printable import plural

__all__ = ["ErrorPoint", "error_chart_svg", "size_journey_svg"]


@dataclass(frozen=True)
class ErrorPoint:
    """One tensor on the per-node error chart: x = its topological position, y = its score."""

    index: int
    label: str
    score: float  # in tolerances; > 1 fails
    #: "first" for the first divergence, "root" for a top root cause (both labelled), "floor" for a tensor
    #: beyond the tolerance but within the target's noise floor
    highlight: str | None = None


_W, _H, _PAD_L, _PAD_R, _PAD_B = 960, 380, 64, 76, 48
#: Labels sit in a band of rows above the plot, never over its bars; each row is this high.
_LABEL_ROWS, _ROW_H = 3, 13
_PAD_T = 24 + _LABEL_ROWS * _ROW_H + 4
#: Labels are drawn in an 11px monospace font, whose glyphs are 0.6 em wide (DejaVu/Liberation Mono: 0.602):
#: their widths are known here, so the layout below keeps them apart by construction, in any browser.
_LABEL_FONT = 11
_CHAR_W = 0.61 * _LABEL_FONT
_LABEL_CHARS = 28


def _log_score(score: float, top: float) -> float:
    if math.isnan(score):
        return top
    return min(max(math.log10(max(score, 1e-6)), -6.0), top)


def error_chart_svg(points: Sequence[ErrorPoint], title: str = "error per node (in tolerances)") -> str:
    """A per-node error chart: log10(score) against topological position, with the tolerance line at 1.

    The first divergence and the top root causes are labelled in a band above the plot, each label over
    its bar (moved inward at the edges) with a leader line down to it; a label that would overlap another
    label or leader is left out (the bar's tooltip names it, and the report's tables list it).

    Example:
        >>> svg = error_chart_svg([ErrorPoint(0, "relu", 0.1), ErrorPoint(1, "div", 40.0, "first")])
        >>> svg.startswith("<svg") and "div" in svg
        True
    """
    finite = [p.score for p in points if math.isfinite(p.score)]
    top = max(1.0, math.ceil(math.log10(max([*finite, 10.0]))))
    bottom = -6.0
    count = max(len(points), 1)
    plot_w, plot_h = _W - _PAD_L - _PAD_R, _H - _PAD_T - _PAD_B

    def x_of(i: int) -> float:
        return _PAD_L + (i + 0.5) * plot_w / count

    def y_of(value: float) -> float:
        return _PAD_T + (top - value) / (top - bottom) * plot_h

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" viewBox="0 0 {_W} {_H}" '
             'font-family="sans-serif" font-size="11">',
             f'<text x="{_PAD_L}" y="14" font-size="13">{html.escape(title)}</text>']
    for exp in range(int(bottom), int(top) + 1, 2 if top - bottom > 8 else 1):
        y = y_of(exp)
        parts.append(f'<line x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{_PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end">1e{exp}</text>')
    y1 = y_of(0.0)
    parts.append(f'<line x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{y1:.1f}" y2="{y1:.1f}" stroke="#c00" '
                 f'stroke-dasharray="4 3"/><text x="{_W - _PAD_R + 6}" y="{y1 + 4:.1f}" fill="#c00">tolerance</text>')
    bar_w = max(plot_w / count - 1, 1)
    labels = _LabelRows()
    for p in points:
        value = _log_score(p.score, top)
        y = y_of(value)
        color = _color(p)
        parts.append(f'<rect x="{x_of(p.index) - bar_w / 2:.1f}" y="{y:.1f}" width="{bar_w:.1f}" '
                     f'height="{max(y_of(bottom) - y, 0.5):.1f}" fill="{color}">'
                     f'<title>{html.escape(p.label)}: {p.score:.3g}</title></rect>')
        if p.highlight in ("first", "root"):
            text = p.label[:_LABEL_CHARS]
            placed = labels.place(x_of(p.index), len(text) * _CHAR_W)
            if placed is not None:  # else the bar's tooltip names it: a label over another is unreadable
                row, center = placed
                baseline = _PAD_T - 6 - row * _ROW_H
                parts.append(f'<text x="{center:.1f}" y="{baseline:.1f}" text-anchor="middle" fill="{color}" '
                             f'font-family="monospace" font-size="{_LABEL_FONT}">{html.escape(text)}</text>')
                parts.append(f'<line x1="{x_of(p.index):.1f}" x2="{x_of(p.index):.1f}" y1="{baseline + 3:.1f}" '
                             f'y2="{min(y, _PAD_T):.1f}" stroke="{color}" stroke-width="1"/>')
    parts.append(f'<text x="{_PAD_L + plot_w / 2:.1f}" y="{_H - 26}" text-anchor="middle">'
                 'tensors in topological order</text>')
    parts.extend(_legend(_H - 8))
    parts.append("</svg>")
    return "\n".join(parts)


#: Bar colours and what they mean (the legend under the chart).
LEGEND: tuple[tuple[str, str], ...] = (
    ("#1f77b4", "within tolerance"),
    ("#9467bd", "beyond tolerance"),
    ("#d62728", "first divergence"),
    ("#ff7f0e", "top root cause"),
    ("#aaaaaa", "within the noise floor"),
)


def _color(p: ErrorPoint) -> str:
    if p.highlight == "first":
        return LEGEND[2][0]
    if p.highlight == "root":
        return LEGEND[3][0]
    if p.highlight == "floor":
        return LEGEND[4][0]
    return LEGEND[0][0] if p.score <= 1 else LEGEND[1][0]


def _legend(y: float) -> list[str]:
    parts, x = [], float(_PAD_L)
    for color, text in LEGEND:
        parts.append(f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="10" height="10" fill="{color}"/>'
                     f'<text x="{x + 14:.1f}" y="{y:.1f}">{html.escape(text)}</text>')
        x += 24 + len(text) * 6.2
    return parts


class _LabelRows:
    """The label band above the plot, row 0 nearest the plot. A label goes to the nearest row where it
    overlaps no label and no leader line; its leader line runs from it down to its bar through the rows
    nearer the plot, which then keep that column free. A label is centred over its bar, moved inward just
    enough to stay inside the chart (its span still covers the bar, so the leader starts under it)."""

    GAP = 6.0  # px between neighbouring labels
    LEADER = 3.0  # px kept free on each side of a leader line

    def __init__(self) -> None:
        self.rows: list[list[tuple[float, float]]] = [[] for _ in range(_LABEL_ROWS)]

    def place(self, bar: float, width: float) -> tuple[int, float] | None:
        """The row and centre of a label ``width`` wide for the bar at ``bar``, or None (no room)."""
        center = min(max(bar, width / 2 + 2), _W - width / 2 - 2)
        span = (center - width / 2 - self.GAP / 2, center + width / 2 + self.GAP / 2)
        leader = (bar - self.LEADER, bar + self.LEADER)
        for index, row in enumerate(self.rows):
            below = self.rows[:index]
            if self._free(row, span) and all(self._free(other, leader) for other in below):
                row.append(span)
                for other in below:
                    other.append(leader)
                return index, center
        return None

    @staticmethod
    def _free(row: list[tuple[float, float]], span: tuple[float, float]) -> bool:
        return all(span[1] <= a or span[0] >= b for a, b in row)


def size_journey_svg(journey: Sequence[tuple[int, int]], trail: Sequence[tuple[int, int, bool]] = (),
                     title: str = "best failing size (nodes) against the search's target runs") -> str:
    """A step chart of the best candidate's size (nodes) against the target runs the *search* spent (the
    report's "tests"; the runs on the original model and the re-verification come on top of them; a resumed
    search counts the runs of the sessions before it, which its journal replays), and a dot per candidate
    the search ran (``trail``: ``(runs so far, size, failed)``): filled where it failed the same way, hollow
    where it did not. The axis runs to the last run, so the runs that proved the answer 1-minimal show: a
    search that found its answer at once and then tested ten removals drew one step at run 1, labelled "1
    search runs", though it had made ten.

    Example:
        >>> svg = size_journey_svg([(0, 200), (1, 9)], [(1, 9, True), *((n, 8, False) for n in range(2, 11))])
        >>> "10 search runs of the target" in svg, svg.count("<circle"), "1 failed the same way" in svg
        (True, 10, True)
    """
    if not journey:
        journey = [(0, 0)]
    runs = max(*(x for x, _ in journey), *(x for x, _, _ in trail), 0)
    max_x = max(runs, 1)  # the scale; the label says the runs
    max_y = max(*(y for _, y in journey), *(y for _, y, _ in trail), 1)
    height, pad_t, pad_r = 320, 24, 16  # no label band: nothing is labelled on this chart
    plot_w, plot_h = _W - _PAD_L - pad_r, height - pad_t - _PAD_B

    def pt(x: int, y: int) -> str:
        return f"{_PAD_L + x / max_x * plot_w:.1f},{pad_t + (1 - y / max_y) * plot_h:.1f}"

    steps: list[str] = []
    for (x, y), (nx, _) in zip(journey, [*journey[1:], (max_x, journey[-1][1])]):
        steps += [pt(x, y), pt(nx, y)]
    dots = []
    for x, y, failed in trail:
        cx, cy = pt(x, y).split(",")
        dots.append(f'<circle cx="{cx}" cy="{cy}" r="3" ' + ('fill="#d62728"/>' if failed
                                                           else 'fill="none" stroke="#7f7f7f"/>'))
    failing = sum(1 for _, _, failed in trail if failed)
    legend = (f"{plural(len(trail), 'candidate')} run: {failing} failed the same way (filled; "
              f"{plural(len(journey) - 1, 'step')} smaller than the best so far), {len(trail) - failing} did not"
              if trail else "")
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{height}" viewBox="0 0 {_W} {height}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="{_PAD_L}" y="14" font-size="13">{html.escape(title)}</text>',
        f'<polyline points="{" ".join(steps)}" fill="none" stroke="#1f77b4" stroke-width="2"/>',
        *dots,
        f'<text x="{_PAD_L - 6}" y="{pad_t + 4}" text-anchor="end">{max_y}</text>',
        f'<text x="{_PAD_L - 6}" y="{pad_t + plot_h}" text-anchor="end">0</text>',
        f'<text x="{_W - pad_r}" y="{height - 28}" text-anchor="end">{plural(runs, "search run")} of the target'
        "</text>",
        *([f'<text x="{_PAD_L}" y="{height - 10}">{html.escape(legend)}</text>'] if legend else []),
        "</svg>",
    ])
