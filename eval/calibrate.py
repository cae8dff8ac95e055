"""Fit the twin's cost model (alpha, beta, gamma) from a server's --radixflow-trace JSONL.

    python -m eval.calibrate OUT/arm-radixflow/trace.jsonl [--overlap] [--json]

eval/costmodel.py's `fit` needs forward records {rows, scheduled_tokens, duration_s}. A
trace whose `forward` events carry `period_s` (servers since issue 36: each prefill round's
measured wall period, launch to the loop's next launch) gives one record per round the loop
did not go idle after (`period_records`); that is used when present. Older traces have none:
a `round` event's `t_start` / `t_end` are the START AND END OF THE SCAN, not of the forward.
A round event that carries `duration_s` is used as is. Else, for a server run WITHOUT overlap
scheduling (`--disable-overlap-schedule`, the default of eval/run_arms.py), one loop iteration
is

    scan i  ->  forward i  ->  result processing  ->  (receive requests)  ->  scan i+1

so the gap between consecutive scan starts, t_start[i+1] - t_start[i], is round i's forward
plus the scheduler's own per-iteration overhead (scan, batch preparation, result processing):
exactly what the twin's alpha is meant to hold. The gap measures round i only when the server
went straight on to the next scan, so a gap is used only if

1. round i launched a batch (rows > 0) and round i+1 is the very next scan (consecutive
   `round` numbers: no scan without an event in between);
2. the server was busy at the end of scan i: round i left a chunk (`chunked`) or parked
   requests (`wait_set` > 0), or a request the scheduler had already seen at scan i
   (`registered` <= t_end[i]) was first selected later (it waited in the queue);
3. round i+1 had no admission hold (`held` == 0: a hold sleeps inside the gap).

Every other gap (idle time before an arrival, holds, the last round) is dropped; the count is
printed. With `--overlap` (a trace of an overlap-scheduled server) scan i+1 runs while forward
i computes and the scheduler waits for forward i only after launching i+1, so the gap after
scan i+1 (t_start[i+2] - t_start[i+1]) is taken as forward i, under the same conditions on
rounds i and i+1; this is rougher (CPU work of both iterations overlaps the forward).

Fit needs at least 3 usable rounds with varied token AND row counts (constant rows make
alpha and gamma inseparable: refused, with the combination the data does determine). A
lightly loaded replay yields few usable rounds, mostly one-row producers: trace a busy run.
delta (attention pairs) is not fitted: the trace has no per-request prefix lengths (delta = 0;
beta absorbs it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from eval.client import read_jsonl
from eval.costmodel import CostModel, fit

Event = Mapping[str, Any]


def _busy_after(r: Event, selected: Sequence[Event]) -> bool:
    if r.get("chunked") or r.get("wait_set", 0) > 0:
        return True
    return any(s["first_selected_round"] > r["round"] and s["registered"] <= r["t_end"]
               for s in selected)


def period_records(events: Sequence[Event]) -> list[dict[str, Any]]:
    """{rows, scheduled_tokens, duration_s} per prefill round whose wall period the server
    measured (core/cost.py LaunchPeriods): `forward` event j carries the period of the
    prefill round of forward event j - 1 (`period_s`, None when the loop went idle), with or
    without overlap. The period is the round's launch to the loop's next launch: its forward
    and every host part, what the twin's cost model charges a round."""
    fwd = [e for e in events if e.get("event") == "forward"]
    return [{"rows": a["rows"], "scheduled_tokens": a["scheduled_tokens"],
             "duration_s": b["period_s"]}
            for a, b in zip(fwd, fwd[1:], strict=False)
            if b.get("period_s") is not None and a["rows"] > 0]


def forward_records(events: Sequence[Event], *, overlap: bool = False) -> list[dict[str, Any]]:
    """{rows, scheduled_tokens, duration_s} per usable round: measured wall periods when the
    trace has them (`period_records`), else scan gaps (module docstring)."""
    if any("period_s" in e for e in events if e.get("event") == "forward"):
        return period_records(events)
    rounds = sorted((e for e in events if e.get("event") == "round"), key=lambda e: e["round"])
    if any("duration_s" in e for e in rounds):
        return [{"rows": e["rows"], "scheduled_tokens": e["scheduled_tokens"],
                 "duration_s": e["duration_s"]} for e in rounds
                if e["rows"] > 0 and e.get("duration_s") is not None]
    selected = [e for e in events if e.get("event") == "selected"
                and e.get("first_selected_round") is not None]
    shift = 1 if overlap else 0
    out = []
    for i, r in enumerate(rounds[: len(rounds) - 1 - shift]):
        nxt = rounds[i + 1]
        if r["rows"] <= 0 or nxt["round"] != r["round"] + 1 or nxt.get("held", 0) > 0:
            continue
        if not _busy_after(r, selected):
            continue
        a, b = rounds[i + shift], rounds[i + 1 + shift]
        if shift and (b["round"] != a["round"] + 1 or b.get("held", 0) > 0):
            continue
        out.append({"rows": r["rows"], "scheduled_tokens": r["scheduled_tokens"],
                    "duration_s": b["t_start"] - a["t_start"]})
    return out


def calibrate(trace: str | Path | Sequence[Event], *, overlap: bool = False
              ) -> tuple[CostModel, int, int]:
    """(fitted cost model, rounds used, rounds with a batch in the trace)."""
    events = read_jsonl(trace) if isinstance(trace, str | Path) else list(trace)
    launched = sum(1 for e in events if e.get("event") == "round" and e["rows"] > 0)
    recs = forward_records(events, overlap=overlap)
    if len(recs) < 3:
        raise ValueError(f"only {len(recs)} of {launched} rounds have a usable duration; "
                         "need at least 3 (see eval/calibrate.py's docstring)")
    cost = fit(recs)
    _check_identifiable(recs, cost)
    return cost, len(recs), launched


def loop_pass(trace: str | Path | Sequence[Event]) -> tuple[float, int] | None:
    """(median seconds, scans) of the scheduler loop's pass in a server's trace: each `round`
    event's `pass_s`, from the loop's last launch or processed result, whichever came later, to
    that scan (adapter/scheduler.py; only the first pass after one, so an idle wait for an
    arrival is never in it; known only where the simulated executor says when a result was
    ready). The twin's `loop_pass_s` (testing/loop.py). None: no scan carries one."""
    events = read_jsonl(trace) if isinstance(trace, str | Path) else list(trace)
    passes = [float(e["pass_s"]) for e in events
              if e.get("event") == "round" and e.get("pass_s") is not None]
    return (statistics.median(passes), len(passes)) if passes else None


def negative(cost: CostModel) -> list[str]:
    """The fitted terms below 0: the usable rounds do not pin the model down."""
    return [k for k in ("alpha", "beta", "gamma") if getattr(cost, k) < 0]


def _check_identifiable(recs: Sequence[Mapping[str, Any]], cost: CostModel) -> None:
    """Constant rows (or tokens) make the least-squares problem rank-deficient: lstsq then
    splits the intercept arbitrarily between the collinear columns. Refuse, saying what the
    data does determine."""
    rows = {r["rows"] for r in recs}
    tokens = {r["scheduled_tokens"] for r in recs}
    if len(rows) == 1:
        (n,) = rows
        raise ValueError(f"every usable round has rows = {n}: alpha and gamma are not separable "
                         f"(only alpha + {n} * gamma = {cost.alpha + n * cost.gamma:.6g} s and "
                         f"beta = {cost.beta:.6g} s/token are); trace a busier run")
    if len(tokens) == 1:
        raise ValueError("every usable round schedules the same tokens: beta is not separable")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.calibrate",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("trace", type=Path)
    p.add_argument("--overlap", action="store_true",
                   help="the trace is from an overlap-scheduled server")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    try:
        cost, used, total = calibrate(args.trace, overlap=args.overlap)
    except (OSError, ValueError, KeyError) as e:
        print(f"eval/calibrate.py: error: {e}", file=sys.stderr)
        return 1
    below = negative(cost)
    if below:
        print(f"eval/calibrate.py: warning: negative {', '.join(below)}: the usable rounds "
              "do not pin the model down (too few, too noisy or too alike)", file=sys.stderr)
    if args.json:
        print(json.dumps(cost.as_dict() | {"rounds_used": used, "rounds": total}))
    else:
        print(f"alpha = {cost.alpha:.6g} s\nbeta  = {cost.beta:.6g} s/token\n"
              f"gamma = {cost.gamma:.6g} s/row\n"
              f"({used} of {total} rounds with a batch had a usable duration)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
