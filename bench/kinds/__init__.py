"""Job kinds only the benchmarks use, loaded by the workers a scenario starts (SCHEDULING_HANDLER_PACKAGES)."""
