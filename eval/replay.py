"""Replay the four-branch workload through the scheduler twin and write a report.

    python -m eval.replay --workload mix --model qwen3.5-4b --policies stock,radix,traversal \\
        --regime all --order both --rate 5 --questions 200 --seed 0 --out out/mix-4b

Each policy is one arm: a fresh kit (SGLang's real scheduler on CPU) replays every segment in
virtual time (eval/twin.py). An arm whose kit cannot be built, or whose replay breaks an
invariant, is recorded as failed with its error and no numbers. Exit status: 0 when every arm
replayed cleanly, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from eval import cli
from eval.hostcost import HOST_CHOICES
from radixflow_sglang import models
from radixflow_sglang.core.policy import POLICIES

WORKLOAD_CHOICES = ("race", "quality", "mix", "synthetic")
MODEL_CHOICES = tuple(models.names())
REGIME_CHOICES = ("cold", "mixed", "reuse", "all")
ORDER_CHOICES = ("forward", "reverse", "both")
LAYOUT_CHOICES = ("extra_buffer", "no_buffer")


def _positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (questions/s; 'inf' = all at once), "
                                         f"got {text!r}")
    return x


def _positive_int(text: str) -> int:
    try:
        x = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if x <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return x


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m eval.replay", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=WORKLOAD_CHOICES, default="mix")
    p.add_argument("--model", choices=MODEL_CHOICES, default="qwen3.5-4b")
    p.add_argument("--policies", type=cli.policies, default=["stock", "radix", "traversal"],
                   help=f"comma-separated, from: {', '.join(POLICIES)} (default: "
                        "stock,radix,traversal)")
    p.add_argument("--regime", choices=REGIME_CHOICES, default="all")
    p.add_argument("--order", choices=ORDER_CHOICES, default="both")
    p.add_argument("--rate", type=_positive_float, default=5.0,
                   help="Poisson arrival rate, questions/s (default 5)")
    p.add_argument("--questions", type=_positive_int, default=200,
                   help="questions per segment (default 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output directory (default out/WORKLOAD-MODEL)")
    p.add_argument("--layout", choices=LAYOUT_CHOICES, default="extra_buffer",
                   help="mamba cache layout of hybrid models (ignored for full attention)")
    p.add_argument("--overlap", action="store_true", help="overlap scheduling (publish lag 2)")
    p.add_argument("--alpha-ms", type=cli.non_negative(float, "a number"), default=None,
                   help="cost model: fixed ms per round (default: eval/costmodel.py's)")
    p.add_argument("--beta-us", type=cli.non_negative(float, "a number"), default=None,
                   help="cost model: us per scheduled token (default: eval/costmodel.py's)")
    p.add_argument("--gamma-ms", type=cli.non_negative(float, "a number"), default=None,
                   help="cost model: ms per row (default: eval/costmodel.py's)")
    p.add_argument("--host-cost", choices=HOST_CHOICES, default="model",
                   help="the scheduler's CPU time per round: model (eval/hostcost.py, "
                        "deterministic; default), measured (the kit's scan CPU time, not "
                        "deterministic) or none (free scans: the old twin's figures)")
    p.add_argument("--data-dir", default=None,
                   help="RACE/QuALITY data directory (default: $RADIXFLOW_DATA_DIR or "
                        "shared/data)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from eval import report
    from eval.costmodel import cost_with
    from eval.hostcost import host_model
    from eval.twin import run_arm
    from eval.workload import workload

    out = Path(args.out or f"out/{args.workload}-{args.model}")
    config = {
        "workload": args.workload, "model": args.model, "policies": args.policies,
        "regime": args.regime, "order": args.order, "rate": args.rate,
        "questions": args.questions, "seed": args.seed, "layout": args.layout,
        "overlap": args.overlap, "data_dir": args.data_dir,
    }
    cost = cost_with(args.model, alpha_ms=args.alpha_ms, beta_us=args.beta_us,
                     gamma_ms=args.gamma_ms)
    host = host_model(args.host_cost)
    config["cost_model"] = cost.as_dict()
    config["host_cost"] = host.as_dict() if host is not None else None
    t0 = time.perf_counter()
    try:
        segments = workload(args.workload, args.model, regime=args.regime, order=args.order,
                            questions=args.questions, rate=args.rate, seed=args.seed,
                            data_dir=args.data_dir)
    except (OSError, ValueError) as e:
        print(f"eval/replay.py: error: cannot build the workload: {e}", file=sys.stderr)
        return 2
    progress = not args.no_progress and sys.stderr.isatty()
    arms = {}
    for policy in args.policies:
        res = run_arm(segments, args.model, policy, layout=args.layout, overlap=args.overlap,
                      seed=args.seed, progress=progress, cost=cost, host=host)
        arms[policy] = res
        if res.ok:
            m = res.metrics
            print(f"[{policy}] rounds={m['rounds']} tokens={m['scheduled_tokens']} "
                  f"lat_mean={m['latency_mean_s']:.4f}s p95={m['latency_p95_s']:.4f}s "
                  f"({res.wall_s:.1f}s wall)", file=sys.stderr)
        else:
            print(f"[{policy}] FAILED: {res.error}", file=sys.stderr)
    report.write(out, config, arms)
    print(f"wrote {out}/summary.json and {out}/report.md "
          f"({time.perf_counter() - t0:.1f}s wall)", file=sys.stderr)
    broken = [p for p, r in arms.items() if not r.ok]
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
