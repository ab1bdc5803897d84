"""What a fixed-time schedule may ask of the workers when a person who is not a superuser sets it up.

A periodic task's runs have no owner and no quota: a one-second interval with overlapping runs
allowed and a thousand retries would hold every worker. So for everyone but a superuser (the
admin's policy inline asks, ``scheduling.web.admin``):

- the shortest gap between two ticks is at least ``SCHEDULING_FIXED_MIN_INTERVAL_SECONDS``;
- a run's timeout (its ``active_deadline_seconds``, else its kind's timeout) is shorter than that gap,
  so a run is over before the next tick, whatever the overlap policy;
- attempts (retries + 1) x that timeout stay within ``SCHEDULING_API_MAX_JOB_SECONDS``, the bound
  one JSON API job has;
- ``missed_policy=run_all`` does not go with ``concurrency_policy=allow``: after a beat outage up to
  ``SCHEDULING_FIXED_MAX_CATCH_UP`` catch-up runs would go out at once, all overlapping.

Each refusal is an ``InvalidPolicy`` whose ``field`` names the form field it is about.
"""

from __future__ import annotations

from scheduling.core import conf, exceptions, registry
from scheduling.fixed import ticks

MIN_INTERVAL_SETTING = "SCHEDULING_FIXED_MIN_INTERVAL_SECONDS"


def _refuse(message: str, field: str | None) -> exceptions.InvalidPolicy:
    exc = exceptions.InvalidPolicy(message)
    exc.field = field  # type: ignore[attr-defined]
    return exc


def check_caller_bounds(
    timing: ticks.Timing,
    *,
    kind: str,
    active_deadline_seconds: float | None,
    backoff_limit: int,
    timing_field: str | None = None,
    missed_policy: str | None = None,
    concurrency_policy: str | None = None,
) -> None:
    """Raise ``InvalidPolicy`` (with ``.field``) unless the schedule stays within the bounds above."""
    settings = conf.get()
    if missed_policy == "run_all" and concurrency_policy == "allow":
        raise _refuse(
            "missed_policy=run_all with concurrency_policy=allow would send every missed run at once after an "
            f"outage (up to {settings.fixed_max_catch_up}, SCHEDULING_FIXED_MAX_CATCH_UP), all overlapping: only a "
            "superuser may combine them; choose concurrency_policy forbid or replace, or missed_policy skip or "
            "run_once.",
            "missed_policy",
        )
    shortest = timing.min_interval_seconds()
    if shortest < settings.fixed_min_interval_seconds:
        raise _refuse(
            f"The schedule runs every {shortest:g}s at its shortest ({timing.describe()}); only a superuser may "
            f"schedule runs closer than {settings.fixed_min_interval_seconds:g}s ({MIN_INTERVAL_SETTING}).",
            timing_field,
        )
    timeout = float(active_deadline_seconds or registry.get(kind).timeout_seconds)
    if timeout >= shortest:
        raise _refuse(
            f"A run may take {timeout:g}s (the run timeout, else the kind's timeout), not shorter than the "
            f"schedule's shortest interval ({shortest:g}s): set a run timeout below it.",
            "active_deadline_seconds",
        )
    limit = settings.api_max_job_seconds
    attempts = backoff_limit + 1
    if limit and attempts * timeout > limit:
        raise _refuse(
            f"{attempts} attempts x {timeout:g}s = {attempts * timeout:g}s a tick, over "
            f"{registry.MAX_JOB_SECONDS_SETTING} ({limit:g}s): at most {max(int(limit // timeout) - 1, 0)} "
            "retries at this timeout.",
            "backoff_limit",
        )
