"""Django tasks (``@task``) the backend's tests run in-process and on real workers (SCHEDULING_HANDLER_PACKAGES)."""
