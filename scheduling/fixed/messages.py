"""The ``scheduling.run_fixed`` message: what beat and "run now" send, signed so nobody else can.

A fixed-time run executes its schedule's kind as the system, so whoever can put a message on the
broker (Flower's send-task API, a Redis client, a periodic task) could otherwise add runs of any
declared schedule by inventing a tick, or a "manual" trigger that has no starting deadline. The two
producers, beat (``beat.carry_out``: on-time and catch-up ticks) and "run now" (``gate.run_now``:
the admin's button and action, and any code that calls it), build the message here, with an
HMAC-SHA256 of (schedule, tick, trigger) keyed from ``SECRET_KEY`` (django.core.signing, salt
``timekeeper.fixed_tick``). The worker runs only a message whose signature checks, with
``SECRET_KEY`` or one of ``SECRET_KEY_FALLBACKS``; any other (no tick, no signature, a tick or
trigger changed) is refused: logged without its arguments but the schedule's name, counted in
``timekeeper_refused_messages_total{task="scheduling.run_fixed"}``, and nothing is run or recorded.

A signed message sent again unchanged names a tick the ledger already holds (or has pruned), so the
gate refuses it as a duplicate: a signature plus the ledger make every tick run at most once.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from typing import Any

from django.core import signing

from scheduling.core import store, tasknames

logger = logging.getLogger(__name__)

SIGNING_SALT = "timekeeper.fixed_tick"  # keeps a tick's signature from being valid for any other signed value
REFUSED = "refused"  # the outcome a refused message reports (no run row exists for it)


def _signer() -> signing.Signer:
    return signing.Signer(salt=SIGNING_SALT, algorithm="sha256")


def _signed_value(schedule: str, tick: str, trigger: str) -> str:
    """The text a tick's signature covers: schedule, tick (as sent) and trigger as canonical JSON."""
    return json.dumps([schedule, tick, trigger], separators=(",", ":"))


def sign(schedule: str, tick: str, trigger: str) -> str:
    """The signature of one tick message (HMAC-SHA256 with SECRET_KEY, salted)."""
    signer = _signer()
    return signer.sign(_signed_value(schedule, tick, trigger)).rsplit(signer.sep, 1)[1]


def message_kwargs(schedule: str, tick: dt.datetime, trigger: str) -> dict[str, str]:
    """The kwargs of a ``run_fixed`` message for ``tick`` of ``schedule``, signed."""
    text = tick.isoformat()
    return {"schedule": schedule, "tick": text, "trigger": trigger, "signature": sign(schedule, text, trigger)}


def authentic(schedule: Any, tick: Any, trigger: Any, signature: Any) -> bool:
    """Whether a received message was built by ``message_kwargs`` (SECRET_KEY or one of SECRET_KEY_FALLBACKS)."""
    if not all(isinstance(value, str) and value for value in (schedule, tick, trigger, signature)):
        return False
    signer = _signer()
    try:
        signer.unsign(f"{_signed_value(schedule, tick, trigger)}{signer.sep}{signature}")
    except signing.BadSignature:
        return False
    return True


def refuse(schedule: Any) -> None:
    """A ``run_fixed`` message beat or "run now" did not make: logged (its schedule's name only), counted."""
    logger.error(
        "fixed-time run message refused: its signature does not check (not sent by beat or run now)",
        extra={"schedule": str(schedule)[:200], "action": "refused_unsigned"},
    )
    store.count_refused_message(tasknames.RUN_FIXED)
