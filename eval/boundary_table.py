"""Issue 15's boundary table through the scheduler twin: followers with 0 cached tokens and
scheduled prefill tokens vs stock, per arrival pattern x layout x boundary mode.

    python -m eval.boundary_table --model qwen3.5-4b --seed 0 [--out DIR]

Arms (one run, ratios vs the same cell's stock): stock, and radixflow with
`--radixflow-boundaries` off / declared / learned. Cells: gsp-paced with every group's first
request at t=0 (the default rate inf) and paced at `--paced-rate` groups/s (default 4), each in
extra_buffer and no_buffer. `--workloads multiturn,noshare` adds those workloads' checks (every
metric of METRICS vs stock). The twin is eval/twin.py's (host cost model on, as eval.replay).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from radixflow_sglang import models

MODES = ("off", "declared", "learned")
LAYOUTS = ("extra_buffer", "no_buffer")
METRICS = ("scheduled_tokens", "rounds", "latency_mean_s", "latency_p95_s", "makespan_s",
           "ttft_mean_s", "request_latency_mean_s")


def arm(segments, model: str, policy: str, layout: str, boundaries: str | None) -> dict:
    """One arm's metrics (eval/twin.py `replay`, host cost model as eval.replay's default)."""
    from eval.costmodel import default_cost
    from eval.hostcost import gpu_cost, host_model
    from eval.twin import replay
    from radixflow_sglang.config import RadixFlowConfig

    cost = default_cost(model)
    host = host_model("model")
    cfg = None if policy == "stock" else RadixFlowConfig(policy=policy, boundaries=boundaries)
    res = replay(segments, model, policy, layout=layout, cost=cost, host=host.host_fn(policy),
                 gpu=gpu_cost(cost, host), radixflow_config=cfg)
    return res.metrics


def cells(workloads: list[str], paced_rate: float) -> list[tuple[str, str, float | None]]:
    out = []
    for w in workloads:
        if w == "gsp-paced":
            out += [("gsp-paced", "t0", None), ("gsp-paced", "paced", paced_rate)]
        elif w == "gsp":  # NOTE: bench_serving's shuffled requests, the burst and issue 15's 16/s
            out += [("gsp", "burst", None), ("gsp", "poisson16", 16.0)]
        else:
            out.append((w, "default", None))
    return out


def run(model: str, seed: int, workloads: list[str], paced_rate: float,
        modes: tuple[str, ...] = MODES, layouts: tuple[str, ...] = LAYOUTS) -> list[dict]:
    from eval.workload import workload

    rows = []
    for name, label, rate in cells(workloads, paced_rate):
        segs = workload(name, model, seed=seed, rate=rate)
        for layout in layouts:
            base = arm(segs, model, "stock", layout, None)
            row: dict[str, Any] = {"workload": name, "arrivals": label, "layout": layout,
                                   "stock": _pick(base)}
            for mode in modes:
                m = arm(segs, model, "radixflow", layout, mode)
                row[mode] = {**_pick(m), "ratio": {k: _ratio(m[k], base[k]) for k in METRICS}}
            rows.append(row)
            print(_line(row, modes), file=sys.stderr, flush=True)
    return rows


def _pick(m: dict) -> dict:
    return {k: m[k] for k in (*METRICS, "zero_hit_after_requests", "after_requests",
                              "zero_hit_requests")}


def _ratio(a: float, b: float) -> float:
    return a / b if b else (1.0 if a == b else math.inf)


def _line(row: dict, modes) -> str:
    s = row["stock"]
    parts = [f"{row['workload']} {row['arrivals']} {row['layout']}: stock "
             f"{s['zero_hit_after_requests']}/{s['after_requests']} tok={s['scheduled_tokens']}"]
    for mode in modes:
        m = row[mode]
        r = m["ratio"]
        parts.append(f"{mode} {m['zero_hit_after_requests']}/{m['after_requests']} "
                     f"{r['scheduled_tokens']:.3f}x tok, lat {r['latency_mean_s']:.3f}x, "
                     f"p95 {r['latency_p95_s']:.3f}x, mk {r['makespan_s']:.3f}x")
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.boundary_table",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=tuple(models.names()), default="qwen3.5-4b")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workloads", default="gsp-paced",
                   help="comma-separated from gsp-paced, gsp, multiturn, noshare (default "
                        "gsp-paced)")
    p.add_argument("--paced-rate", type=float, default=4.0,
                   help="groups/s of the paced cell (default 4)")
    p.add_argument("--modes", default=",".join(MODES),
                   help="boundary modes of the radixflow arms (default off,declared,learned)")
    p.add_argument("--layouts", default=",".join(LAYOUTS))
    p.add_argument("--out", default=None, help="write table.json here")
    args = p.parse_args(argv)
    workloads = [w for w in args.workloads.split(",") if w]
    for w in workloads:
        if w not in ("gsp-paced", "gsp", "multiturn", "noshare"):
            p.error(f"--workloads: {w!r} is not one of gsp-paced, gsp, multiturn, noshare")
    modes = tuple(m for m in args.modes.split(",") if m)
    for m in modes:
        if m not in ("off", "declared", "learned", "both"):
            p.error(f"--modes: {m!r} is not one of off, declared, learned, both")
    layouts = tuple(x for x in args.layouts.split(",") if x)
    for x in layouts:
        if x not in LAYOUTS:
            p.error(f"--layouts: {x!r} is not one of {', '.join(LAYOUTS)}")
    rows = run(args.model, args.seed, workloads, args.paced_rate, modes, layouts)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.json").write_text(json.dumps(
            {"model": args.model, "seed": args.seed, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
