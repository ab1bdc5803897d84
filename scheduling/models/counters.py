"""``OutcomeCounter``: the monotonic counts behind ``/metrics``' ``*_total`` counters."""

from __future__ import annotations

from django.db import models

__all__ = [
    "OutcomeCounter",
]


class OutcomeCounter(models.Model):
    """A monotonic count of outcomes (``/metrics``' ``*_total`` counters), kept apart from the rows the pruner deletes.

    Written by database triggers (migration 0015) in the transaction that records the outcome, one
    row per (metric, label, outcome), so a count survives pruning and restarts and never goes down.
    One exception: ``refused_messages`` (per task), a broker message refused for its signature,
    leaves no row for a trigger to see, so the refusal adds it (``store.count_refused_message``).
    """

    metric = models.CharField(
        "metric",
        max_length=32,
        help_text="job_attempts, jobs_finished, job_retries, jobs_reclaimed, fixed_runs or refused_messages.",
    )
    label = models.CharField(
        "label", max_length=200, help_text="The job's kind, the fixed-time schedule's name, or the refused task's name."
    )
    outcome = models.CharField("outcome", max_length=16, blank=True, default="", help_text="How it ended ('' if n/a).")
    value = models.BigIntegerField("value", default=0, help_text="How many so far.")

    class Meta:
        verbose_name = "outcome counter"
        constraints = [
            models.UniqueConstraint(fields=["metric", "label", "outcome"], name="outcomecounter_key_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.metric}{{{self.label},{self.outcome}}} = {self.value}"
