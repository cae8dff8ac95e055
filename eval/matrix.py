"""The matrix: stock vs the RadixFlow variants over geometries, round costs, loads and layouts.

    python -m eval.matrix --out DIR [--quick] [--policies stock,radixflow-always,radixflow]
        [--questions 4] [--workers 2] [--host-cost model]

Every cell replays one workload through the scheduler twin (eval/twin.py, the fair twin: the
scheduler's CPU time takes virtual time, eval/hostcost.py) once per policy, at the paper's S
(T = 8,192) of the cell's model:

* models: the six geometries (qwen3.5-0.8b/4b/9b/27b, nemotron-9b, qwen3-8b);
* alpha (fixed ms per round, eval/costmodel.py's other terms as default): 8, 25, 50, 100, 200;
* rate (questions/s, Poisson): 1.5, 5, 10;  workload: race, quality, mix;
* layout x overlap: extra_buffer without and with overlap, no_buffer without (SGLang turns
  overlap off for no_buffer); a full-attention model has one layout, with and without overlap.

A cell's workload is `--questions` questions per segment (default 4), every regime (cold, mixed,
reuse) in forward order: 3 x 4 x 4 = 48 requests. The first policy is the baseline: every ratio
is an arm's figure over the SAME cell's baseline figure. Work is split by (model, workload,
rate) over a pool of `--workers` processes; each builds that workload once for its cells.
`--quick`: qwen3.5-4b and qwen3-8b, alpha 8 and 100, rate 5, mix: a few minutes.

Writes DIR/matrix.json (config, and per cell every arm's figures and its ratios to the
baseline), DIR/matrix.md (the table) and DIR/matrix.png (heatmaps of the mean-latency ratio vs
the baseline per cell, one per non-baseline policy), and prints the cells where a policy is
slower than the baseline (mean or p95). Exit status 0, 1 when an arm failed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from eval import cli
from eval.hostcost import HOST_CHOICES
from radixflow_sglang import models
from radixflow_sglang.core.policy import POLICIES

MODELS = tuple(models.names())
ALPHAS_MS = (8.0, 25.0, 50.0, 100.0, 200.0)
RATES = (1.5, 5.0, 10.0)
WORKLOADS = ("race", "quality", "mix")
WORKLOAD_CHOICES = (*WORKLOADS, "synthetic")
QUICK = {"models": ("qwen3.5-4b", "qwen3-8b"), "alphas": (8.0, 100.0), "rates": (5.0,),
         "workloads": ("mix",)}
FIGURES = ("latency_mean_s", "latency_p95_s", "scheduled_tokens", "rounds")
RATIOS = {"mean": "latency_mean_s", "p95": "latency_p95_s", "tokens": "scheduled_tokens"}


def default_policies() -> list[str]:
    always = "radixflow-always"
    return ["stock", always, "radixflow"] if always in POLICIES else ["stock", "radixflow"]


@dataclass(frozen=True)
class Grid:
    models: tuple[str, ...] = MODELS
    alphas: tuple[float, ...] = ALPHAS_MS
    rates: tuple[float, ...] = RATES
    workloads: tuple[str, ...] = WORKLOADS
    questions: int = 4
    seed: int = 0


def layouts(model: str) -> list[tuple[str, bool]]:
    """(layout, overlap) pairs SGLang allows for the model."""
    from radixflow_sglang.geometry import load_geometry

    if not load_geometry(model).hybrid:
        return [("extra_buffer", False), ("extra_buffer", True)]  # full attention: one layout
    return [("extra_buffer", False), ("extra_buffer", True), ("no_buffer", False)]


@lru_cache(maxsize=4)
def _segments(workload: str, model: str, questions: int, rate: float, seed: int,
              data_dir: str | None) -> Any:
    from eval.workload import workload as build

    return build(workload, model, regime="all", order="forward", questions=questions,
                 rate=rate, seed=seed, data_dir=data_dir)


def run_group(model: str, workload: str, rate: float, grid: Grid, policies: Sequence[str],
              host_cost: str, data_dir: str | None) -> list[dict[str, Any]]:
    """Every cell of one (model, workload, rate): alphas x layouts, each policy once."""
    import torch

    from eval.costmodel import cost_with
    from eval.hostcost import host_model
    from eval.twin import run_arm

    torch.set_num_threads(1)  # NOTE: tiny CPU tensors; intra-op threads only contend
    segs = _segments(workload, model, grid.questions, rate, grid.seed, data_dir)
    host = host_model(host_cost)
    cells = []
    for alpha in grid.alphas:
        cost = cost_with(model, alpha_ms=alpha)
        for layout, overlap in layouts(model):
            t0 = time.perf_counter()
            arms: dict[str, Any] = {}
            for policy in policies:
                res = run_arm(segs, model, policy, layout=layout, overlap=overlap, cost=cost,
                              seed=grid.seed, host=host)
                arms[policy] = ({k: res.metrics[k] for k in FIGURES} if res.ok
                                else {"failed": True, "error": res.error})
            cells.append({"model": model, "workload": workload, "rate": rate,
                          "alpha_ms": alpha, "layout": layout, "overlap": overlap, "arms": arms,
                          "ratios": ratios(arms, policies[0]),
                          "wall_s": round(time.perf_counter() - t0, 2)})
    return cells


def ratios(arms: dict[str, Any], base: str) -> dict[str, dict[str, float | None]]:
    """Each arm's figures over the same cell's baseline arm (None where either failed)."""
    b = arms[base]
    out = {}
    for policy, m in arms.items():
        if policy == base:
            continue
        ok = "failed" not in m and "failed" not in b
        out[policy] = {name: (m[key] / b[key] if ok and b[key] else None)
                       for name, key in RATIOS.items()}
    return out


def run(grid: Grid, policies: Sequence[str], *, workers: int = 2, host_cost: str = "model",
        data_dir: str | None = None) -> list[dict[str, Any]]:
    groups = [(m, w, r) for m in grid.models for w in grid.workloads for r in grid.rates]
    args = [(m, w, r, grid, list(policies), host_cost, data_dir) for m, w, r in groups]
    if workers <= 1:
        parts = [run_group(*a) for a in args]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(run_group, *a) for a in args]
            parts = [f.result() for f in futures]
    return [c for part in parts for c in part]


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def cell_name(c: dict[str, Any]) -> str:
    ov = "+ov" if c["overlap"] else ""
    return (f"{c['model']} {c['workload']} r{c['rate']:g} a{c['alpha_ms']:g} "
            f"{c['layout']}{ov}")


def slower(cells: Sequence[dict[str, Any]], tol: float = 1.0) -> list[tuple[str, str, str, float]]:
    """(cell, policy, figure, ratio) for every ratio above `tol` (mean or p95 latency)."""
    out = []
    for c in cells:
        for policy, r in c["ratios"].items():
            for fig in ("mean", "p95"):
                x = r.get(fig)
                if x is not None and x > tol:
                    out.append((cell_name(c), policy, fig, x))
    return out


def _fmt(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}"


def markdown(cells: Sequence[dict[str, Any]], policies: Sequence[str], config: dict) -> str:
    base, others = policies[0], list(policies[1:])
    lines = ["# Matrix: latency vs " + base, "",
             f"{config['questions']} questions per segment, regimes cold/mixed/reuse (forward); "
             f"host cost: {config['host_cost']}. Ratios = arm / the same cell's {base}.", ""]
    head = ["model", "workload", "rate", "alpha ms", "layout", "overlap", f"{base} mean s"]
    for p in others:
        head += [f"{p} mean", f"{p} p95", f"{p} tokens"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for c in cells:
        b = c["arms"][base]
        row = [c["model"], c["workload"], f"{c['rate']:g}", f"{c['alpha_ms']:g}", c["layout"],
               "yes" if c["overlap"] else "no",
               "failed" if "failed" in b else f"{b['latency_mean_s']:.3f}"]
        for p in others:
            r = c["ratios"][p]
            row += [_fmt(r["mean"]), _fmt(r["p95"]), _fmt(r["tokens"])]
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "## Summary", ""]
    for p in others:
        means = [c["ratios"][p]["mean"] for c in cells if c["ratios"][p]["mean"] is not None]
        p95s = [c["ratios"][p]["p95"] for c in cells if c["ratios"][p]["p95"] is not None]
        if means:
            lines.append(f"- {p}: mean-latency ratio median {sorted(means)[len(means) // 2]:.2f}, "
                         f"max {max(means):.2f}, > 1.02 in {sum(x > 1.02 for x in means)} of "
                         f"{len(means)} cells; p95 ratio max {max(p95s):.2f}")
    return "\n".join(lines) + "\n"


def heatmap(cells: Sequence[dict[str, Any]], policies: Sequence[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    others = list(policies[1:])
    cols = sorted({(c["alpha_ms"], c["rate"]) for c in cells})
    rows = sorted({(c["model"], c["workload"], c["layout"], c["overlap"]) for c in cells})
    fig, axes = plt.subplots(1, len(others), squeeze=False,
                             figsize=(2 + 0.45 * len(cols) * len(others), 1.5 + 0.22 * len(rows)))
    for ax, p in zip(axes[0], others, strict=True):
        z = np.full((len(rows), len(cols)), np.nan)
        for c in cells:
            x = c["ratios"][p]["mean"]
            if x is not None:
                z[rows.index((c["model"], c["workload"], c["layout"], c["overlap"])),
                  cols.index((c["alpha_ms"], c["rate"]))] = x
        im = ax.imshow(np.log2(z), cmap="RdBu_r", vmin=-1.5, vmax=1.5, aspect="auto")
        ax.set_xticks(range(len(cols)), [f"a{a:g}/r{r:g}" for a, r in cols], rotation=90,
                      fontsize=6)
        ax.set_yticks(range(len(rows)),
                      [f"{m} {w} {lay}{'+ov' if ov else ''}" for m, w, lay, ov in rows],
                      fontsize=6)
        ax.set_title(f"{p} / {policies[0]} mean latency", fontsize=8)
        for i in range(len(rows)):
            for j in range(len(cols)):
                if math.isfinite(z[i, j]):
                    ax.text(j, i, f"{z[i, j]:.2f}", ha="center", va="center", fontsize=4)
    fig.colorbar(im, ax=axes[0].tolist(), label="log2 ratio (blue: faster)")
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)


def write(out: Path, cells: list[dict[str, Any]], policies: Sequence[str],
          config: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {"config": config, "cells": cells}
    (out / "matrix.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "matrix.md").write_text(markdown(cells, policies, config))
    heatmap(cells, policies, out / "matrix.png")


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _list(kind: type, allowed: Sequence[Any] | None = None):
    def parse(text: str) -> tuple:
        try:
            xs = tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a comma-separated list: {text!r}") from None
        bad = [x for x in xs if (allowed is not None and x not in allowed)
               or (allowed is None and not x > 0)]
        if not xs or bad:
            what = f"choose from {', '.join(map(str, allowed))}" if allowed else "each > 0"
            raise argparse.ArgumentTypeError(f"invalid value(s) {bad or text!r} ({what})")
        return xs

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.matrix", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--quick", action="store_true", help="a small matrix (a few minutes)")
    p.add_argument("--policies", type=cli.policies, default=default_policies(),
                   help="comma-separated, the first is the baseline (default: "
                        f"{','.join(default_policies())})")
    p.add_argument("--models", type=_list(str, MODELS), default=None)
    p.add_argument("--alphas-ms", type=_list(float), default=None)
    p.add_argument("--rates", type=_list(float), default=None)
    p.add_argument("--workloads", type=_list(str, WORKLOAD_CHOICES), default=None)
    p.add_argument("--questions", type=cli.positive(int, "an integer"), default=4,
                   help="questions per segment and cell (default 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=cli.positive(int, "an integer"), default=2)
    p.add_argument("--host-cost", choices=HOST_CHOICES, default="model")
    p.add_argument("--data-dir", default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.policies[0] != "stock":
        print("eval/matrix.py: error: argument --policies: the first policy is the baseline and "
              "must be stock", file=sys.stderr)
        return 2
    if len(args.policies) < 2:
        print("eval/matrix.py: error: argument --policies: give the baseline and at least one "
              "more policy", file=sys.stderr)
        return 2
    q = QUICK if args.quick else {}
    grid = Grid(models=args.models or q.get("models", MODELS),
                alphas=args.alphas_ms or q.get("alphas", ALPHAS_MS),
                rates=args.rates or q.get("rates", RATES),
                workloads=args.workloads or q.get("workloads", WORKLOADS),
                questions=args.questions, seed=args.seed)
    t0 = time.perf_counter()
    cells = run(grid, args.policies, workers=args.workers, host_cost=args.host_cost,
                data_dir=args.data_dir)
    wall = time.perf_counter() - t0
    config = {**asdict(grid), "policies": args.policies, "host_cost": args.host_cost,
              "workers": args.workers, "cells": len(cells), "wall_s": round(wall, 1)}
    write(Path(args.out), cells, args.policies, config)
    for cell, policy, fig, x in slower(cells):
        print(f"slower than {args.policies[0]}: {cell}: {policy} {fig} {x:.2f}x")
    failed = [(cell_name(c), p) for c in cells for p, m in c["arms"].items() if "failed" in m]
    for cell, p in failed:
        print(f"FAILED: {cell}: {p}", file=sys.stderr)
    print(f"wrote {args.out}/matrix.json, matrix.md, matrix.png ({len(cells)} cells, "
          f"{wall:.0f}s wall)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
