"""The shared core under every mechanism: settings, exceptions, the kind registry, the executor
that runs a handler, the store (the only code with a cursor on Timekeeper's tables) and its SQL,
advisory locks and leadership, and what is asked of the broker. Imports nothing above it."""
