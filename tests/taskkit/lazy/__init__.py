"""Tasks in a subpackage that no process imports at start (``SCHEDULING_HANDLER_PACKAGES`` lists its parent only)."""
