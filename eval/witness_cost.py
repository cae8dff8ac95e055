"""The witness executor's cost in the twin: wall time with it over without it, side by side.

    python -m eval.witness_cost --model qwen3.5-4b --workload mix --questions 200 --reps 2

Each repetition replays the same workload under every policy with both executors, alternated
(witness, scripted, scripted, witness, ...) in one process after imports, and reports the
median wall-time ratio per policy. The figures must also be identical (the witness changes
only what the tokens are, not when work runs): a difference is an error.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from eval.costmodel import cost_with
from eval.twin import run_arm
from eval.workload import workload

FIGURES = ("rounds", "scheduled_tokens", "latency_mean_s", "latency_p95_s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.witness_cost", description=__doc__)
    p.add_argument("--model", default="qwen3.5-4b")
    p.add_argument("--workload", default="mix", choices=("race", "quality", "mix"))
    p.add_argument("--questions", type=int, default=200)
    p.add_argument("--rate", type=float, default=5.0)
    p.add_argument("--alpha-ms", type=float, default=8.0)
    p.add_argument("--policies", default="stock,radixflow")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--data-dir", default=None)
    args = p.parse_args(argv)
    segs = workload(args.workload, args.model, regime="all", order="forward",
                    questions=args.questions, rate=args.rate, seed=0, data_dir=args.data_dir)
    cost = cost_with(args.model, alpha_ms=args.alpha_ms)
    # NOTE: an untimed warm-up: the first arm of a process pays the kit's imports
    run_arm(segs[:1], args.model, "stock", cost=cost, executor="witness")
    walls: dict[tuple[str, str], list[float]] = {}
    cpus: dict[tuple[str, str], list[float]] = {}
    figures: dict[tuple[str, str], tuple] = {}
    bad = 0
    for rep in range(args.reps):
        order = ("witness", "scripted") if rep % 2 == 0 else ("scripted", "witness")
        for policy in args.policies.split(","):
            for ex in order:
                t, c = time.perf_counter(), time.process_time()
                res = run_arm(segs, args.model, policy, cost=cost, executor=ex)
                walls.setdefault((policy, ex), []).append(time.perf_counter() - t)
                cpus.setdefault((policy, ex), []).append(time.process_time() - c)
                if not res.ok:
                    print(f"{policy} {ex}: FAILED {res.error}", file=sys.stderr)
                    return 1
                fig = tuple(res.metrics[k] for k in FIGURES)
                if figures.setdefault((policy, "any"), fig) != fig:
                    print(f"{policy}: figures differ between executors: {fig} vs "
                          f"{figures[(policy, 'any')]}", file=sys.stderr)
                    bad = 1
                w = res.metrics.get("witness")
                if w:
                    print(f"rep {rep} {policy} {ex}: {walls[(policy, ex)][-1]:.2f}s, "
                          f"{w['verified']}/{w['requests']} verified, {w['mismatched']} "
                          f"mismatched, {w['resumed']} resumed", file=sys.stderr)
    for policy in args.policies.split(","):
        w = statistics.median(walls[(policy, "witness")])
        s = statistics.median(walls[(policy, "scripted")])
        cw = statistics.median(cpus[(policy, "witness")])
        cs = statistics.median(cpus[(policy, "scripted")])
        print(f"{policy}: wall witness {w:.2f}s / scripted {s:.2f}s = {w / s:.3f}x; "
              f"CPU {cw:.2f}s / {cs:.2f}s = {cw / cs:.3f}x (medians of {args.reps})")
    return bad


if __name__ == "__main__":
    sys.exit(main())
