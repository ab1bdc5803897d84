"""The ``scheduling.run_fixed`` message: what beat and "run now" send, signed so nobody else can.

A fixed-time run executes its schedule's kind as the system, so whoever can put a message on the
broker (Flower's send-task API, a Redis client, a periodic task) could otherwise add runs of any
declared schedule by inventing a tick, or a "manual" trigger that has no starting deadline. The two
producers, beat (``beat.carry_out``: on-time and catch-up ticks) and "run now" (``gate.run_now``:
the admin's button and action, and any code that calls it), build the message here, with an
HMAC-SHA256 of (schedule, policy, tick, trigger) keyed from ``SECRET_KEY`` (django.core.signing,
salt ``timekeeper.fixed_tick``), where ``policy`` is the primary key of the schedule's
``SchedulePolicy`` row. The worker runs only a message whose signature checks, with ``SECRET_KEY``
or one of ``SECRET_KEY_FALLBACKS``; any other (no tick, no signature, a tick, trigger or policy
changed) is refused: logged without its arguments but the schedule's name, counted in
``timekeeper_refused_messages_total{task="scheduling.run_fixed"}``, and nothing is run or recorded.

A signed message sent again unchanged names a tick the ledger already holds (or has pruned), so the
gate refuses it as a duplicate: a signature plus the ledger make every tick run at most once. The
ledger and its ``pruned_through`` mark belong to one policy row, so the signature names that row
too: once a schedule is deleted and declared again under the same name (a new row, an empty
ledger), the gate refuses every message signed for the old row (``gate.run``: the policy it names
is not the schedule's current one), refused and counted like a bad signature.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from django.core import signing

from scheduling.core import exceptions, store, tasknames

logger = logging.getLogger(__name__)

SIGNING_SALT = "timekeeper.fixed_tick"  # keeps a tick's signature from being valid for any other signed value
REFUSED = "refused"  # the outcome a refused message reports (no run row exists for it)


def _signer() -> signing.Signer:
    return signing.Signer(salt=SIGNING_SALT, algorithm="sha256")


def _signed_value(schedule: str, policy: str, tick: str, trigger: str) -> str:
    """The text a tick's signature covers: schedule, policy row, tick (as sent) and trigger as canonical JSON."""
    return json.dumps([schedule, policy, tick, trigger], separators=(",", ":"))


def sign(schedule: str, policy: str, tick: str, trigger: str) -> str:
    """The signature of one tick message (HMAC-SHA256 with SECRET_KEY, salted)."""
    signer = _signer()
    return signer.sign(_signed_value(schedule, policy, tick, trigger)).rsplit(signer.sep, 1)[1]


def message_kwargs(schedule: str, tick: dt.datetime, trigger: str, policy_id: int | None = None) -> dict[str, str]:
    """The kwargs of a ``run_fixed`` message for ``tick`` of ``schedule``'s policy row ``policy_id``, signed.

    Without ``policy_id`` the schedule's current policy row is read (``ScheduleNotFound`` if none).
    """
    if policy_id is None:
        policy_id = _current_policy_id(schedule)
    text, policy = tick.isoformat(), str(policy_id)
    return {
        "schedule": schedule,
        "policy": policy,
        "tick": text,
        "trigger": trigger,
        "signature": sign(schedule, policy, text, trigger),
    }


def _current_policy_id(schedule: str) -> int:
    from scheduling.models import SchedulePolicy

    pk = SchedulePolicy.objects.filter(periodic_task__name=schedule).values_list("pk", flat=True).first()
    if pk is None:
        raise exceptions.ScheduleNotFound(schedule)
    return int(pk)


def authentic(schedule: Any, tick: Any, trigger: Any, signature: Any, policy: Any = "") -> bool:
    """Whether a received message was built by ``message_kwargs`` (SECRET_KEY or one of SECRET_KEY_FALLBACKS)."""
    if not all(isinstance(value, str) and value for value in (schedule, policy, tick, trigger, signature)):
        return False
    signer = _signer()
    try:
        signer.unsign(f"{_signed_value(schedule, policy, tick, trigger)}{signer.sep}{signature}")
    except signing.BadSignature:
        return False
    return True


def refuse(schedule: Any, reason: str = "its signature does not check (not sent by beat or run now)") -> None:
    """A ``run_fixed`` message beat or "run now" did not make: logged (its schedule's name only), counted."""
    logger.error(
        f"fixed-time run message refused: {reason}",
        extra={"schedule": str(schedule)[:200], "action": "refused_unsigned"},
    )
    store.count_refused_message(tasknames.RUN_FIXED)
