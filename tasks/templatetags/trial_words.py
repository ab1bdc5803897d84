"""How the trial pages name a reminder's state to a customer (not Timekeeper's internal states)."""

from __future__ import annotations

from django import template

register = template.Library()

CUSTOMER_WORDS = {
    "pending": "scheduled",
    "claimed": "sending",
    "done": "sent",
    "cancelled": "cancelled",
    "dead": "not sent (we are looking into it)",
}


@register.filter
def reminder_word(state: str) -> str:
    """The customer's word for a reminder job's state: scheduled, sending, sent, cancelled."""
    return CUSTOMER_WORDS.get(state, "scheduled")
