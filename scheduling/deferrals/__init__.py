"""Short deferrals on the broker: Celery countdown messages under a ceiling below the broker's
visibility timeout, their retries, and the counts of delayed messages (``countdowns``)."""
