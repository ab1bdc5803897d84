"""``python -m bench <scenario> [--quick]`` and ``python -m bench all [--quick]``."""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import time
import traceback
from typing import Any

from bench import common

SCENARIOS = ("throughput", "realistic", "burst", "lag", "rescue", "scale", "sweep", "memory", "beat", "recurring")


def run(name: str, quick: bool) -> dict[str, Any]:
    """Run one scenario module's ``main`` and emit its JSON (unless the module emitted it itself)."""
    module = importlib.import_module(f"bench.{name}")
    params = inspect.signature(module.main).parameters
    if "quick" in params:
        figures = module.main(quick=quick)
    elif params:  # an argv-style main
        figures = module.main(["--quick"] if quick else [])
    else:
        figures = module.main()
    if isinstance(figures, dict) and figures.get("scenario") == name and "measured_at" in figures:
        return figures  # already emitted by the module
    return common.emit(name, figures if isinstance(figures, dict) else {}, quick=quick)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("scenario", choices=[*SCENARIOS, "all"], help="what to measure")
    parser.add_argument("--quick", action="store_true", help="smaller inputs: the whole run in under 5 minutes")
    args = parser.parse_args(argv)
    names = SCENARIOS if args.scenario == "all" else (args.scenario,)
    failed = []
    summary: dict[str, Any] = {}
    for name in names:
        started = time.monotonic()
        common.say(f"== {name} (load average {common.load_average()})")
        try:
            summary[name] = run(name, args.quick)
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
