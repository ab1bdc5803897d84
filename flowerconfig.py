"""Flower's configuration file: ``celery -A project flower --conf=<this file>`` executes it at start.

It sets no option (credentials come from ``FLOWER_BASIC_AUTH`` in the environment, never from a
file or an argv); it puts Flower's ``/metrics`` behind the same authentication as its pages.
"""

from project import flower_auth

flower_auth.protect_metrics()
