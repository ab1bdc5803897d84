"""Where ``flow``'s other-kind lag goes: the wait for a claim, and the claim to the handler's start.

``python -m bench.flow_split [none|rate|partitioned] [--seconds N]`` runs one of ``flow``'s
scenarios (``none``: the other kind alone) for N seconds (default 20) and splits each other-kind
job's lag (``JobAttempt.started_at - due_at``, as ``flow`` measures it) in two, from the database
clock: ``claimed_at - due_at`` (the control loop: waking and claiming) and ``started_at -
claimed_at`` (the batch message crossing Redis, waiting for a pool process, and the batch's start).
A diagnostic, with no target: ``flow`` holds the target. The figures quoted in bench/README.md
("flow's other kind") came from it.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from bench import common, flow, lag, procs

MODES = ("none", "rate", "partitioned")
SPLIT = (
    "SELECT extract(epoch FROM j.claimed_at - a.due_at)::float8 * 1000,"
    " extract(epoch FROM a.started_at - j.claimed_at)::float8 * 1000,"
    " extract(epoch FROM a.started_at - a.due_at)::float8 * 1000,"
    " extract(epoch FROM a.due_at)::float8"
    " FROM scheduling_jobattempt AS a JOIN scheduling_scheduledjob AS j ON j.id = a.job_id"
    " WHERE j.kind = %s AND a.number = 1"
)


def run(mode: str, seconds: float) -> dict[str, Any]:
    common.setup()  # before the first import of Django models: it configures Django for the bench database
    from scheduling import api, registry

    rng = random.Random(1)
    common.reset_state()
    common.sql("DELETE FROM scheduling_kindrate")
    common.sql("DELETE FROM scheduling_kindcontrol")
    payloads: list[dict[str, Any]] = []
    if mode == "rate":
        api.set_rate(flow.LIMITED_KIND, f"{flow.LIMIT_PER_S}/s")
        payloads = [{"label": "one"}] * flow.BACKLOG
    elif mode == "partitioned":
        api.set_rate(flow.LIMITED_KIND, registry.Rate(flow.PARTITION_LIMIT_PER_S, 1.0, partition_by="label"))
        payloads = [{"label": f"p{i % flow.PARTITIONS:02d}"} for i in range(flow.PARTITIONS * 400)]
    with procs.Group("flow_split") as group:
        worker = group.worker("tk-w1", concurrency=2)
        group.wait_ready(worker)
        time.sleep(2.0)
        for chunk in range(0, len(payloads), 1000):
            api.schedule_many(flow.LIMITED_KIND, payloads[chunk : chunk + 1000], delay=0)
        sent = lag.paced(
            flow.OTHER_RATE_PER_S,
            seconds,
            lambda: api.schedule(flow.OTHER_KIND, {}, delay=rng.uniform(*lag.DELAY_RANGE_S)),
        )
        time.sleep(lag.DELAY_RANGE_S[1] + 1)  # the last paced jobs come due and run
        api.set_rate(flow.LIMITED_KIND, None)  # the rest of the backlog goes, so the group stops cleanly
    rows = common.sql(SPLIT, [flow.OTHER_KIND])
    common.reset_state()
    names = ("claim_wait", "claim_to_start", "total")
    return {
        "mode": mode,
        "seconds": seconds,
        "sent": sent,
        **{name: common.summary_ms([float(r[i]) for r in rows]) for i, name in enumerate(names)},
        # the total's p99 in each flow.WINDOW_S of due times: whether the lag grows as the run goes on
        "total_p99_ms_by_window": flow.by_window([(float(r[3]), float(r[2])) for r in rows]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.flow_split", description=__doc__)
    parser.add_argument("mode", choices=MODES, nargs="?", default="partitioned")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the other kind is sent (default 20)")
    args = parser.parse_args()
    figures = run(args.mode, args.seconds)
    print(
        common.table(
            f"flow_split: {args.mode}, the other kind at {flow.OTHER_RATE_PER_S}/s for {args.seconds:g} s",
            ["part", "n", "p50 ms", "p95 ms", "p99 ms", "max ms"],
            [
                [name, f["n"], f["p50_ms"], f["p95_ms"], f["p99_ms"], f["max_ms"]]
                for name in ("claim_wait", "claim_to_start", "total")
                for f in [figures[name]]
            ],
        )
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
