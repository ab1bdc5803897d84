"""The dashboard's server-drawn charts: one unit per axis, outliers clipped and marked."""

from __future__ import annotations

import datetime as dt
import re

from scheduling.web import svg

END = dt.datetime(2031, 1, 1, 12, 0, tzinfo=dt.UTC)
START = END - dt.timedelta(hours=1)


def _at(minute: int) -> dt.datetime:
    return START + dt.timedelta(minutes=minute)


def _axis(chart: str) -> list[str]:
    return re.findall(r'class="tk-axis"[^>]*>([^<]*)</text>', chart)


def test_one_outlier_is_clipped_and_marked_not_the_axis():
    """A burst at 23-40 s and one lag of two days: the axis stays in seconds, the outlier is a marked point."""
    p99 = [svg.Series("p99", [(_at(m), 40.0) for m in range(10)] + [(_at(30), 2 * 86_400.0)])]
    chart = str(svg.lag_chart(p99, start=START, end=END, title="lag", clip_at=40.0))
    assert _axis(chart) == ["0 s", "25 s", "50 s"]
    assert chart.count('class="tk-clip-mark"') == 1
    assert "1 above the axis" in chart
    assert "48 h (above the axis)" in chart


def test_every_axis_label_has_the_same_unit():
    """Labels are in one unit chosen from the axis' top: ms below a second, min past two minutes, h past two hours."""
    for clip, unit in ((0.2, "ms"), (30.0, "s"), (600.0, "min"), (3 * 3600.0, "h")):
        chart = str(svg.lag_chart([svg.Series("p50", [(_at(1), clip)])], start=START, end=END, title="t", clip_at=clip))
        assert {label.split()[1] for label in _axis(chart)} == {unit}, (clip, _axis(chart))
        assert "tk-clip-mark" not in chart


def test_an_empty_lag_chart_says_so():
    """Without attempts the chart says nothing started rather than drawing a flat line."""
    chart = str(svg.lag_chart([svg.Series("p50", [])], start=START, end=END, title="t", clip_at=None))
    assert "no attempts started in this period" in chart


def test_span_labels_read_in_hours_past_an_hour():
    """The time axis says -24 h, not -1440 min."""
    assert (svg.span_text(86_400), svg.span_text(900), svg.span_text(21_600)) == ("24 h", "15 min", "6 h")
    assert (svg.span_text(15), svg.span_text(60), svg.span_text(90)) == ("15 s", "1 min", "1.5 min")  # 15 min / 60
