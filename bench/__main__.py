"""``python -m bench <scenario> [--quick]`` and ``python -m bench all [--quick]``.

``soak`` (an hour; ``--quick`` 10 minutes; ``--minutes N``) is not part of ``all``; options after
the scenario that this parser does not know go to the scenario (``python -m bench soak --minutes 2``).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import signal
import sys
import time
import traceback
from typing import Any

from bench import common

SCENARIOS = (
    "throughput",
    "realistic",
    "failures",
    "burst",
    "lag",
    "rescue",
    "scale",
    "sweep",
    "memory",
    "beat",
    "recurring",
    "flow",
)
# Run only by name, never by "all": the soaks (10 and 60 minutes); flow_abort (python -m bench flow calls
# it); ab (it needs --base).
ALONE = ("chaos", "soak", "flow_abort", "ab")


def run(name: str, quick: bool, extra: list[str] | None = None) -> dict[str, Any]:
    """Run one scenario module's ``main`` and emit its JSON (unless the module emitted it itself).

    ``extra`` (arguments this command does not know, e.g. ``--seed 7``) goes to an argv-style ``main``.
    """
    module = importlib.import_module(f"bench.{name}")
    params = inspect.signature(module.main).parameters
    if "quick" in params:
        figures = module.main(quick=quick)
    elif params:  # an argv-style main
        figures = module.main([*(["--quick"] if quick else []), *(extra or [])])
    else:
        figures = module.main()
    if isinstance(figures, dict) and figures.get("scenario") == name and "measured_at" in figures:
        return figures  # already emitted by the module
    return common.emit(name, figures if isinstance(figures, dict) else {}, quick=quick)


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM (``timeout``, a CI job's cancel, ``kill``) unwinds like Ctrl-C: a scenario's ``with``
    blocks stop its worker and beat processes and give the server its autovacuum setting back."""
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("scenario", choices=[*SCENARIOS, *ALONE, "all"], help="what to measure")
    parser.add_argument("--quick", action="store_true", help="smaller inputs: the whole run in under 5 minutes")
    args, extra = parser.parse_known_args(argv)
    if extra and args.scenario not in ALONE:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    names = SCENARIOS if args.scenario == "all" else (args.scenario,)
    failed = []
    summary: dict[str, Any] = {}
    for name in names:
        started = time.monotonic()
        common.say(f"== {name} (load average {common.load_average()})")
        try:
            summary[name] = run(name, args.quick, extra)
        except Exception:
            traceback.print_exc()
            failed.append(name)
            if args.scenario != "all":
                return 1
        common.say(f"== {name} took {time.monotonic() - started:.0f}s")
    if args.scenario == "all":
        print(
            common.table("Scenarios", ["scenario", "result"], [[n, "failed" if n in failed else "ok"] for n in names])
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
