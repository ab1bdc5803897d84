"""Recurring per-entity work: recurrences as rows, each occurrence an ordinary due_at job."""
