"""The test helpers that read the database clock do what the tests that lean on them need."""

from __future__ import annotations

import pytest

from tests import support

pytestmark = pytest.mark.django_db


def test_clear_of_a_slot_edge_waits_into_the_next_slot_only_when_the_edge_is_near():
    """A one-second slot with a margin of 1.5 s is always near its edge: it waits what was left of the slot
    (never a whole one more); with no margin it never waits."""
    waited = support.clear_of_a_slot_edge(1.0, margin=1.5)
    assert 0.05 <= waited <= 1.05
    assert support.clear_of_a_slot_edge(3600, margin=0.0) == 0.0
