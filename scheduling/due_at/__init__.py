"""Per-entity future work: rows with a ``due_at``. ``api`` writes them, ``claim`` takes due rows
(``FOR UPDATE SKIP LOCKED``) and hands them out, ``runner`` runs a batch, ``lease`` keeps running
claims alive, ``sweep`` returns dead claims to pending and prunes history."""
