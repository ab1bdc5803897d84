"""Kinds of the chaos soak (``bench.chaos``), loaded through ``SCHEDULING_HANDLER_PACKAGES`` by its settings."""
