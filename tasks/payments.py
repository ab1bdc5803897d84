"""Payments: retry a failed charge in 30 s on the broker, up to 5 times with backoff, never charging twice.

``retry_later()`` records that a payment failed and defers ``payments.retry`` (a broker countdown:
short, fire-and-forget, and safe to replay). The handler is idempotent by payment: a payment that
already succeeded is left alone, and the charge carries the payment's reference as the gateway's
idempotency key, so a run replayed after a crash (the charge went through, the worker died before
recording it) gets the earlier charge back instead of a second one.

``FakeGateway`` stands in for the payment provider. It declines the first ``fail_times`` charge
requests of a payment (from the payload, so tests and demos are deterministic) and keeps its own
ledger as ``Execution`` rows (kind ``gateway.charged`` / ``gateway.declined``, key
``payment:<reference>``), which is how tests count charges.

Through the JSON API only users with ``tasks.schedule_payment`` may ask for a retry, and only of
their own payment; the handler checks the owner again (a payload's ids are never trusted).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from django.db.models import F
from django.db.models.functions import Now

from scheduling import api, registry
from scheduling.deferrals import countdowns
from tasks.models import Execution, Payment, PaymentState

logger = logging.getLogger(__name__)

RETRY_DELAY_SECONDS = 30  # the first retry of a failed payment
MAX_ATTEMPTS = 5  # retries of one payment before it is recorded dead for a person
BACKOFF = registry.Backoff(base_seconds=30, cap_seconds=600)  # 30 s, 60 s, 120 s, 240 s (with jitter)

RETRY_SCHEMA = {
    "type": "object",
    "properties": {
        "reference": {"type": "string", "minLength": 1, "maxLength": 64},
        "fail_times": {"type": "integer", "minimum": 0, "maximum": 100},  # fake gateway: declines before success
        "latency": {"type": "number", "minimum": 0, "maximum": 60},  # fake gateway: seconds to answer
    },
    "required": ["reference"],
    "additionalProperties": False,
}


class GatewayDeclined(RuntimeError):
    """Raised by the gateway when it refuses a charge."""


class PaymentDeclined(RuntimeError):
    """Raised by ``payments.retry`` when this attempt's charge was declined (the deferral retries it)."""


class FakeGateway:
    """A payment provider that declines the first ``fail_times`` requests per reference, then charges once."""

    def charge(self, reference: str, amount_cents: int, *, fail_times: int = 0, latency: float = 0.0) -> str:
        """Charge ``amount_cents`` for ``reference`` (its idempotency key); returns the charge id."""
        key = f"payment:{reference}"
        existing = Execution.objects.filter(idempotency_key=key, kind="gateway.charged").order_by("id").first()
        if existing is not None:
            return f"ch_{existing.pk}"  # the same idempotency key: the earlier charge, not a new one
        declined = Execution.objects.filter(idempotency_key=key, kind="gateway.declined").count()
        if declined < fail_times:
            Execution.objects.create(idempotency_key=key, kind="gateway.declined", pid=os.getpid())
            raise GatewayDeclined(f"card declined (request {declined + 1} of {fail_times} planned declines)")
        charged = Execution.objects.create(idempotency_key=key, kind="gateway.charged", pid=os.getpid())
        if latency:
            time.sleep(latency)  # the answer is slow: a worker killed now has charged but not recorded it
        return f"ch_{charged.pk}"


gateway = FakeGateway()


def retry_later(
    reference: str,
    amount_cents: int,
    error: str,
    *,
    fail_times: int = 0,
    delay: float = RETRY_DELAY_SECONDS,
    owner: Any = None,
) -> countdowns.Deferral:
    """Record that ``owner``'s payment ``reference`` failed with ``error``; retry it after ``delay`` seconds."""
    Payment.objects.update_or_create(
        reference=reference,
        defaults={
            "amount_cents": amount_cents,
            "state": PaymentState.FAILED,
            "last_error": error[:1000],
            "owner_id": getattr(owner, "pk", owner),
        },
    )
    return api.defer("payments.retry", {"reference": reference, "fail_times": fail_times}, delay)


def owns_payment(user: Any, payload: dict[str, Any]) -> bool:
    """The payment named in the payload exists and is ``user``'s."""
    return Payment.objects.filter(reference=payload["reference"], owner_id=user.pk).exists()


@registry.handler(
    "payments.retry",
    schema=RETRY_SCHEMA,
    timeout=30,
    max_attempts=MAX_ATTEMPTS,
    backoff=BACKOFF,
    batch_size=1,
    api=registry.Access(permission="tasks.schedule_payment", predicate=owns_payment),
    critical=True,  # customers wait on it: /healthz counts its overdue jobs
)
def retry(job: registry.Job) -> None:
    """Charge a failed payment again, unless it already succeeded; a decline raises so the deferral retries."""
    reference = job.payload["reference"]
    context: dict[str, Any] = {"payment": reference, "attempt": job.attempt, "ref": job.ref}
    payment = Payment.objects.filter(reference=reference).first()
    if payment is None:
        logger.warning("payment to retry does not exist", extra={**context, "action": "skipped"})
        return
    if job.owner_id is not None and payment.owner_id != job.owner_id:
        logger.warning("payment to retry is not the job owner's", extra={**context, "action": "refused"})
        return
    # Conditional: a succeeded payment is never charged again, however often this job runs.
    tried = (
        Payment.objects.filter(pk=payment.pk)
        .exclude(state=PaymentState.SUCCEEDED)
        .update(attempts=F("attempts") + 1, updated_at=Now())
    )
    if not tried:
        logger.info("payment already succeeded", extra={**context, "action": "duplicate_suppressed"})
        return
    try:
        charge_id = gateway.charge(
            reference,
            payment.amount_cents,
            fail_times=int(job.payload.get("fail_times", 0)),
            latency=float(job.payload.get("latency", 0)),
        )
    except GatewayDeclined as exc:
        Payment.objects.filter(pk=payment.pk).exclude(state=PaymentState.SUCCEEDED).update(
            state=PaymentState.FAILED, last_error=str(exc), updated_at=Now()
        )
        logger.info("payment declined", extra={**context, "action": "declined"})
        raise PaymentDeclined(f"payment {reference}: {exc}") from exc
    Payment.objects.filter(pk=payment.pk).update(state=PaymentState.SUCCEEDED, last_error="", updated_at=Now())
    logger.info("payment charged", extra={**context, "action": "charged", "charge": charge_id})
