"""Job kinds that exist only for the fault tests (never in ``SCHEDULING_HANDLER_PACKAGES`` outside them)."""
