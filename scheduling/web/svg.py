"""Small charts drawn on the server as inline SVG: no JavaScript, no chart library, readable without CSS.

Colours come from CSS custom properties with fallbacks, so the charts follow the admin's light and
dark themes. Every text is escaped; the numbers are formatted here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Callable, Sequence

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

PALETTE = ("#417690", "#e07a1f", "#a23b72", "#5b8c2a")


@dataclasses.dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[dt.datetime, float]]
    dashed: bool = False  # drawn dashed, so a line lying on another one stays visible


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above ``value`` (at least 1)."""
    if value <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value:
            return float(step * power)
    return float(10 * power)  # pragma: no cover - the loop ends at 10 * power


def seconds_text(value: float) -> str:
    """1.2 ms, 350 ms, 4.2 s, 3 min, 2.5 h."""
    if value < 1:
        return f"{value * 1000:.3g} ms"
    if value < 120:
        return f"{value:.3g} s"
    if value < 7200:
        return f"{value / 60:.3g} min"
    return f"{value / 3600:.3g} h"


UNITS = ((1.0, 0.001, "ms"), (120.0, 1.0, "s"), (7200.0, 60.0, "min"), (math.inf, 3600.0, "h"))


def time_unit(max_seconds: float) -> tuple[float, str]:
    """One unit for a whole axis, chosen from its top: (seconds per unit, name): ms, s, min or h."""
    for below, size, name in UNITS:
        if max_seconds < below:
            return size, name
    return UNITS[-1][1], UNITS[-1][2]  # pragma: no cover - the last bound is infinite


def span_text(seconds: float) -> str:
    """15 s, 15 min, 1 h, 24 h: a span in the largest unit it fills (an axis' start, a bucket's width)."""
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def count_text(value: float) -> str:
    return f"{value:,.0f}" if value >= 1 or value == 0 else f"{value:.2g}"


class _Frame:
    """What every time chart shares: the svg element, three gridlines with y labels, the time axis, the legend.

    ``parts`` is the svg text so far (the caller adds its marks and the closing tag); ``x`` and
    ``y`` map a time and a value to the plot.
    """

    right, top, bottom = 10, 22, 22

    def __init__(
        self,
        series: Sequence[Series],
        start: dt.datetime,
        end: dt.datetime,
        title: str,
        y_max: float,
        y_label: Callable[[float], str],
        *,
        left: int,
        width: int,
        height: int,
        svg_attrs: str = "",  # trusted attribute text (numbers and fixed words only)
        axis_class: str = "",
    ) -> None:
        self.left, self.start, self.y_max = left, start, y_max
        self.plot_w, self.plot_h = width - left - self.right, height - self.top - self.bottom
        self.span = span = max((end - start).total_seconds(), 1e-9)
        self.parts = parts = [
            f'<svg xmlns="http://www.w3.org/2000/svg" class="tk-chart" role="img" viewBox="0 0 {width} {height}" '
            f'width="{width}" height="{height}" aria-label="{escape(title)}"{svg_attrs}>',
            f"<title>{escape(title)}</title>",
        ]
        right, plot_w = self.right, self.plot_w
        for fraction in (0.0, 0.5, 1.0):
            gy = self.y(y_max * fraction)
            parts.append(
                f'<line x1="{left}" y1="{gy:.1f}" x2="{width - right}" y2="{gy:.1f}" '
                f'stroke="var(--hairline-color, #ddd)" stroke-width="1"/>'
            )
            parts.append(
                f'<text x="{left - 4}" y="{gy + 4:.1f}" text-anchor="end" font-size="10"{axis_class} '
                f'fill="var(--body-quiet-color, #666)">{escape(y_label(y_max * fraction))}</text>'
            )
        for fraction, label in ((0.0, f"-{span_text(span)}"), (0.5, f"-{span_text(span / 2)}"), (1.0, "now")):
            anchor = "start" if fraction == 0 else "end" if fraction == 1 else "middle"
            parts.append(
                f'<text x="{left + plot_w * fraction:.1f}" y="{height - 6}" text-anchor="{anchor}" font-size="10" '
                f'fill="var(--body-quiet-color, #666)">{escape(label)}</text>'
            )
        legend_x = left
        for i, s in enumerate(series):
            colour = PALETTE[i % len(PALETTE)]
            parts.append(f'<rect x="{legend_x}" y="6" width="10" height="4" fill="{colour}"/>')
            parts.append(
                f'<text x="{legend_x + 14}" y="12" font-size="10" fill="var(--body-fg, #333)">{escape(s.name)}</text>'
            )
            legend_x += 14 + 7 * len(s.name) + 16

    def x(self, at: dt.datetime) -> float:
        return self.left + self.plot_w * min(max((at - self.start).total_seconds() / self.span, 0.0), 1.0)

    def y(self, value: float) -> float:
        return self.top + self.plot_h * (1 - min(max(value / self.y_max, 0.0), 1.0))


def line_chart(
    series: Sequence[Series],
    *,
    start: dt.datetime,
    end: dt.datetime,
    title: str,
    value_text: Callable[[float], str] = count_text,
    width: int = 480,
    height: int = 150,
    empty_text: str = "no data in this period",
) -> SafeString:
    """Lines over [start, end] on a shared y axis from 0; a series with one point is drawn as a dot."""
    values = [v for s in series for _, v in s.points]
    y_max = nice_ceiling(max(values, default=0.0))
    frame = _Frame(series, start, end, title, y_max, value_text, left=58, width=width, height=height)
    parts, x, y = frame.parts, frame.x, frame.y
    left, top, plot_w, plot_h = frame.left, frame.top, frame.plot_w, frame.plot_h
    if not values:
        parts.append(
            f'<text x="{left + plot_w / 2:.1f}" y="{top + plot_h / 2:.1f}" text-anchor="middle" font-size="12" '
            f'fill="var(--body-quiet-color, #666)">{escape(empty_text)}</text>'
        )
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        coords = [(x(at), y(v)) for at, v in s.points]
        if len(coords) == 1:
            cx, cy = coords[0]
            parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="2.5" fill="{colour}"/>')
        elif coords:
            text = " ".join(f"{cx:.1f},{cy:.1f}" for cx, cy in coords)
            dash = ' stroke-dasharray="4 3"' if s.dashed else ""
            parts.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" stroke-linejoin="round"{dash} '
                f'points="{text}"/>'
            )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every interpolated text above is escaped or a number


def stacked_bars(
    stacks: Sequence[tuple[str, Sequence[float]]],
    *,
    labels: Sequence[str],
    title: str,
    width: int = 480,
    height: int = 150,
) -> SafeString:
    """One bar per label, each made of the stacks' values at that position (all stacks as long as labels)."""
    left, right, top, bottom = 44, 10, 22, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    totals = [sum(values[i] for _, values in stacks) for i in range(len(labels))]
    y_max = nice_ceiling(max(totals, default=0.0))
    slot = plot_w / max(len(labels), 1)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="tk-chart" role="img" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
    ]
    for fraction in (0.0, 0.5, 1.0):
        gy = top + plot_h * (1 - fraction)
        parts.append(
            f'<line x1="{left}" y1="{gy:.1f}" x2="{width - right}" y2="{gy:.1f}" '
            f'stroke="var(--hairline-color, #ddd)" stroke-width="1"/>'
        )
        parts.append(
            f'<text x="{left - 4}" y="{gy + 4:.1f}" text-anchor="end" font-size="10" '
            f'fill="var(--body-quiet-color, #666)">{escape(count_text(y_max * fraction))}</text>'
        )
    for i, label in enumerate(labels):
        base = float(top + plot_h)
        for j, (name, values) in enumerate(stacks):
            value = values[i]
            if value <= 0:
                continue
            h = plot_h * value / y_max
            base -= h
            parts.append(
                f'<rect x="{left + slot * i + 1:.1f}" y="{base:.1f}" width="{max(slot - 2, 1):.1f}" height="{h:.1f}" '
                f'fill="{PALETTE[j % len(PALETTE)]}"><title>{escape(label)}: {escape(count_text(value))} '
                f"{escape(name)}</title></rect>"
            )
        if i % 6 == 0:
            parts.append(
                f'<text x="{left + slot * i:.1f}" y="{height - 6}" font-size="10" '
                f'fill="var(--body-quiet-color, #666)">{escape(label)}</text>'
            )
    legend_x = left
    for j, (name, _values) in enumerate(stacks):
        parts.append(f'<rect x="{legend_x}" y="6" width="10" height="4" fill="{PALETTE[j % len(PALETTE)]}"/>')
        parts.append(
            f'<text x="{legend_x + 14}" y="12" font-size="10" fill="var(--body-fg, #333)">{escape(name)}</text>'
        )
        legend_x += 14 + 7 * len(name) + 16
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every interpolated text above is escaped or a number


def lag_chart(
    series: Sequence[Series],
    *,
    start: dt.datetime,
    end: dt.datetime,
    title: str,
    clip_at: float | None,
    width: int = 480,
    height: int = 150,
    empty_text: str = "no attempts started in this period",
) -> SafeString:
    """Lag lines in one time unit, the axis topped at ``clip_at`` (the window's p99): no outlier flattens the rest.

    A point above the axis is drawn at the top as a hollow triangle whose tooltip gives its value.
    The unit (ms, s, min or h) is chosen from the axis' top and used for every label.
    """
    values = [v for s in series for _, v in s.points]
    limit = clip_at if clip_at is not None and clip_at > 0 else max(values, default=0.0)
    size, unit = time_unit(max(limit, 1e-9))
    y_max = nice_ceiling(limit / size) * size if limit > 0 else size
    frame = _Frame(
        series, start, end, title, y_max, lambda value: f"{value / size:.4g} {unit}",
        left=52, width=width, height=height, svg_attrs=f' data-unit="{unit}"', axis_class=' class="tk-axis"',
    )  # fmt: skip
    parts, x, y = frame.parts, frame.x, frame.y
    left, right, top, plot_w, plot_h = frame.left, frame.right, frame.top, frame.plot_w, frame.plot_h
    clipped = sum(1 for v in values if v > y_max)
    if clipped:
        parts.append(
            f'<text x="{width - right}" y="12" text-anchor="end" font-size="10" class="tk-clipped" '
            f'fill="var(--body-quiet-color, #666)">▲ {clipped} above the axis</text>'
        )
    if not values:
        parts.append(
            f'<text x="{left + plot_w / 2:.1f}" y="{top + plot_h / 2:.1f}" text-anchor="middle" font-size="12" '
            f'fill="var(--body-quiet-color, #666)">{escape(empty_text)}</text>'
        )
    for i, s in enumerate(series):
        colour = PALETTE[i % len(PALETTE)]
        coords = [(x(at), y(v)) for at, v in s.points]
        if len(coords) == 1:
            cx, cy = coords[0]
            parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="2.5" fill="{colour}"/>')
        elif coords:
            text = " ".join(f"{cx:.1f},{cy:.1f}" for cx, cy in coords)
            parts.append(
                f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" stroke-linejoin="round" points="{text}"/>'
            )
        for at, v in s.points:
            if v > y_max:
                cx = x(at)
                parts.append(
                    f'<path class="tk-clip-mark" d="M{cx - 4:.1f},{top + 6:.1f} L{cx:.1f},{top - 1:.1f} '
                    f'L{cx + 4:.1f},{top + 6:.1f} Z" fill="var(--body-bg, #fff)" stroke="{colour}">'
                    f"<title>{escape(s.name)}: {escape(seconds_text(v))} (above the axis)</title></path>"
                )
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - every interpolated text above is escaped or a number
