"""Template tags for Timekeeper's admin pages: the dashboard on the index, relative times."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django import template
from django.utils import timezone
from django.utils.timesince import timesince, timeuntil

register = template.Library()


@register.inclusion_tag("scheduling/dashboard.html", takes_context=True)
def timekeeper_dashboard(context: dict[str, Any]) -> dict[str, Any]:
    """The dashboard, for users who may view scheduled jobs (nothing for others)."""
    from scheduling.web import dashboard

    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.has_perm("scheduling.view_scheduledjob"):
        return {"show": False}
    query = request.GET if request is not None else {}
    gathered = dashboard.gather(query.get("range"), query.get("kind"), query.get("queue"))
    # The inline style and refresh script carry the request's Content-Security-Policy nonce (django-csp).
    return {"show": True, "csp_nonce": getattr(request, "csp_nonce", ""), **gathered}


@register.filter
def relative(value: dt.datetime | None, now: dt.datetime | None = None) -> str:
    """'in 3 days, 2 hours' or '5 minutes ago' from ``now`` (default: this process's clock)."""
    if value is None:
        return ""
    now = now or timezone.now()
    if value >= now:
        return f"in {timeuntil(value, now)}"
    return f"{timesince(value, now)} ago"


@register.filter
def age(seconds: float | None) -> str:
    """Seconds as '12 s', '4 min 5 s', '3 h 2 min', '2 d 1 h'."""
    if seconds is None:
        return "—"
    seconds = max(float(seconds), 0.0)
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"
