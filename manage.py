#!/usr/bin/env python
"""Django's command-line utility for Timekeeper."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    from django.core.management import execute_from_command_line

    from project import preflight

    # A wrong setting, or a server the command needs that does not answer, is one line (exit 78).
    with preflight.exit_on_error():
        preflight.check_command(*(sys.argv[1:] or ["help"]))
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
