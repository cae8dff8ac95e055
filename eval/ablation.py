"""Rule ablation: does each rule of the rulebook change a measured outcome?

    python -m eval.ablation --out DIR [--questions 4] [--scale 4] [--trace-window 0:24]
        [--policies radixflow,radixflow-frag] [--rules a,b] [--cells paper,traffic,trace]
        [--workers 1]

Every cell replays one workload through the scheduler twin (eval/twin.py `run_arm`, the witness
executor: a wrong state fails the arm) once per policy with no rule ablated (the baseline), then
once per ablatable rule (core/reasons.py `ABLATABLE`) with that rule disabled (`ablating`: its
decision point goes on to its next rule). Cells, at alpha 100 ms unless `--alphas` says more for
the paper cells (eval/costmodel.py's other terms as default), host cost `model`, seed 0:

* paper: qwen3.5-4b mix, qwen3.5-0.8b mix, qwen3.5-27b race (eval.matrix's cells: rate 5,
  `--questions` per segment, every regime, forward order), each in every layout SGLang allows
  (eval.matrix `layouts`);
* traffic (eval/traffic.py, qwen3.5-4b, extra_buffer and no_buffer): gsp (a shared system
  prompt), nsample burst (n > 1 as RL rollouts send it), nsample warm (SGLang's n path),
  multiturn; sizes shrink with `--scale` (groups, prompts, conversations);
* trace: the Mooncake trace (eval/mooncake.py, `--trace-file`, default the shared data's
  synthetic_trace.jsonl), `--trace-window`, qwen3.5-4b, extra_buffer and no_buffer.

Outcome per arm: mean and p95 question latency, prefill rounds, scheduled prefill tokens (or
its error). A rule "changes nothing" when every outcome of every cell and policy equals the
baseline's exactly; a rule whose ablated arm fails (an exception, a witness mismatch, a
conservation error) is load-bearing. The baseline's decisions per rule (the runtime's reason
counts) say where it fired. Writes DIR/ablation.json and DIR/ablation.md, prints the table.
Exit status 0, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval import cli

FIGURES = ("latency_mean_s", "latency_p95_s", "rounds", "scheduled_tokens")
CELL_KINDS = ("paper", "traffic", "trace")
PAPER = (("qwen3.5-4b", "mix"), ("qwen3.5-0.8b", "mix"), ("qwen3.5-27b", "race"))
TRAFFIC_MODEL = "qwen3.5-4b"
ALPHA_MS = 100.0
RATE = 5.0


@dataclass(frozen=True)
class Cell:
    kind: str  # paper | traffic | trace
    model: str
    workload: str  # the paper workload, the traffic shape's name (nsample-warm: warm mode)
    layout: str
    overlap: bool = False
    alpha_ms: float = ALPHA_MS
    shape: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def name(self) -> str:
        ov = "+ov" if self.overlap else ""
        return f"{self.model} {self.workload} a{self.alpha_ms:g} {self.layout}{ov}"


def traffic_shapes(scale: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """The traffic cells: name -> (eval/traffic.py workload, shape), sized by `scale`."""
    return {
        "gsp": ("gsp", {"groups": scale, "prompts_per_group": 4}),
        "nsample-burst": ("nsample", {"nsample_mode": "burst", "prompts": scale, "n": 4,
                                      "output_len": 16}),
        "nsample-warm": ("nsample", {"nsample_mode": "warm", "prompts": scale, "n": 4,
                                     "output_len": 16}),
        "multiturn": ("multiturn", {"conversations": scale, "turns": 3, "output_len": 32,
                                    "user_len": 64}),
    }


def cells(kinds: Sequence[str], scale: int, trace_file: str | None,
          alphas: Sequence[float] = (ALPHA_MS,)) -> list[Cell]:
    from eval.matrix import layouts

    out = []
    if "paper" in kinds:
        out += [Cell("paper", m, w, lay, ov, a) for a in alphas for m, w in PAPER
                for lay, ov in layouts(m)]
    if "traffic" in kinds:
        for name, (_, shape) in traffic_shapes(scale).items():
            out += [Cell("traffic", TRAFFIC_MODEL, name, lay, shape=shape)
                    for lay in ("extra_buffer", "no_buffer")]
    if "trace" in kinds and trace_file is not None:
        out += [Cell("trace", TRAFFIC_MODEL, "trace", lay) for lay in ("extra_buffer",
                                                                      "no_buffer")]
    return out


def segments(cell: Cell, questions: int, trace: tuple[str, int, int]) -> list[Any]:
    if cell.kind == "paper":
        from eval.matrix import _segments

        return _segments(cell.workload, cell.model, questions, RATE, 0, None)
    if cell.kind == "traffic":
        from eval.traffic import segments as traffic

        name = cell.workload.split("-")[0]
        return traffic(name, cell.model, seed=0, **cell.shape)
    from eval import mooncake

    file, start, count = trace
    return mooncake.segments(mooncake.TraceSpec(file=file, start=start, count=count),
                             cell.model)


def outcome(res: Any) -> dict[str, Any]:
    if not res.ok:
        return {"failed": True, "error": res.error}
    return {k: res.metrics[k] for k in FIGURES}


# NOTE: rules whose condition is asked where their firing is counted under another reason
# (the verdict inside recompute_unprobed's bound), or whose site skips work of its own (the
# learned sources' lazy depths, the quiet scan's hooks): ablated even where they never fired
ALWAYS_RUN = frozenset({"wait_wins", "recompute_wins", "marker", "repeat",
                        "learned", "quiet_scan"})


def run_cell(cell: Cell, policies: Sequence[str], rules: Sequence[str], questions: int,
             trace: tuple[str, int, int]) -> list[dict[str, Any]]:
    """One cell: per policy the baseline, then each rule ablated. A rule the baseline never
    fired is skipped (its site's condition never held, so disabling it changes nothing),
    except ALWAYS_RUN; a skipped rule's outcome is the baseline's (`skipped`)."""
    import torch

    from eval.costmodel import cost_with
    from eval.hostcost import host_model
    from eval.twin import run_arm
    from radixflow_sglang.core.reasons import ablating

    torch.set_num_threads(1)  # NOTE: tiny CPU tensors; intra-op threads only contend
    segs = segments(cell, questions, trace)
    cost, host = cost_with(cell.model, alpha_ms=cell.alpha_ms), host_model("model")
    out = []

    def arm(policy: str, ablate: Sequence[str]) -> Any:
        with ablating(ablate):
            res = run_arm(segs, cell.model, policy, layout=cell.layout, overlap=cell.overlap,
                          cost=cost, seed=0, host=host)
        gc.collect()  # NOTE: a kit's pools sit in reference cycles; free them per arm
        return res

    for policy in policies:
        t0 = time.perf_counter()
        base = arm(policy, ())
        arms = {rule: (outcome(arm(policy, (rule,)))
                       if rule in ALWAYS_RUN or fired(base.reasons, rule) else {"skipped": True})
                for rule in rules}
        out.append({"cell": cell.name, "kind": cell.kind, "policy": policy,
                    "baseline": outcome(base), "decisions": base.reasons, "arms": arms,
                    "wall_s": round(time.perf_counter() - t0, 1)})
        print(f"{cell.name} {policy}: {out[-1]['wall_s']} s", file=sys.stderr, flush=True)
    return out


def fired(decisions: dict[str, int], rule: str) -> int:
    """A rule's decisions in a run: by its own reason and its cases' (core/reasons.py)."""
    from radixflow_sglang.core.reasons import RULES, Reason

    return sum(decisions.get(why.value, 0) for why in RULES[Reason(rule)].reasons)


def changed(base: dict[str, Any], arm: dict[str, Any]) -> dict[str, Any] | None:
    """What the ablated arm changed vs the baseline (None: nothing)."""
    if "skipped" in arm:
        return None
    if "failed" in arm:
        return {"failed": arm["error"]}
    if "failed" in base:
        return {"baseline_failed": base["error"]}
    diff = {k: (base[k], arm[k]) for k in FIGURES if arm[k] != base[k]}
    return diff or None


def verdicts(results: Sequence[dict[str, Any]], rules: Sequence[str]) -> dict[str, Any]:
    """Per rule: decisions in the baselines, the (cell, policy) runs it changed, and how."""
    out = {}
    for rule in rules:
        n, runs, failed = 0, [], 0
        for r in results:
            n += fired(r["decisions"], rule)
            d = changed(r["baseline"], r["arms"][rule])
            if d is not None:
                runs.append({"cell": r["cell"], "policy": r["policy"], "changed": d})
                failed += "failed" in d
        out[rule] = {"decisions": n, "changed_runs": len(runs), "failed_runs": failed,
                     "runs": runs, "changes_nothing": not runs}
    return out


def _ratio(d: dict[str, Any], key: str) -> str:
    if key not in d:
        return "="
    a, b = d[key]
    return f"{b / a:.3f}x" if a else f"{a}->{b}"


def table(results: Sequence[dict[str, Any]], v: dict[str, Any]) -> str:
    """One row per rule: its point, baseline decisions, runs changed (failed) of all, and the
    first changed run's figures (ablated / baseline)."""
    from radixflow_sglang.core.reasons import RULES, Reason

    lines = ["| rule | point | decisions | changed / runs (failed) | first change: run, mean, "
             "p95, rounds, tokens |", "|---|---|---|---|---|"]
    for rule, x in v.items():
        first = "nothing"
        if x["runs"]:
            run = x["runs"][0]
            d = run["changed"]
            first = (f"{run['cell']} {run['policy']}: fails ({_short(d['failed'])})"
                     if "failed" in d else
                     f"{run['cell']} {run['policy']}: " + ", ".join(
                         _ratio(d, k) for k in FIGURES))
        lines.append(f"| `{rule}` | {RULES[Reason(rule)].point} | {x['decisions']} | "
                     f"{x['changed_runs']} / {len(results)} ({x['failed_runs']}) | {first} |")
    return "\n".join(lines) + "\n"


def _short(error: str, n: int = 60) -> str:
    error = error.replace("|", "/").replace("\n", " ")
    return error if len(error) <= n else error[:n] + "..."


def build_parser() -> argparse.ArgumentParser:
    from eval.workload import default_data_dir

    data = default_data_dir()
    default_trace = (str(data / "mooncake" / "synthetic_trace.jsonl")
                     if data is not None else None)
    p = argparse.ArgumentParser(prog="python -m eval.ablation",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--questions", type=cli.positive(int, "an integer"), default=4,
                   help="paper cells: questions per segment (default 4: 48 requests)")
    p.add_argument("--scale", type=cli.positive(int, "an integer"), default=4,
                   help="traffic cells: groups / prompts / conversations (default 4)")
    p.add_argument("--alphas", default="100",
                   help="paper cells: fixed ms per round, comma-separated (default 100; the "
                        "other cells run at 100)")
    p.add_argument("--trace-file", default=default_trace,
                   help="Mooncake-format JSONL (default: the shared data's synthetic trace)")
    p.add_argument("--trace-window", default="0:24", metavar="START:N",
                   help="trace records replayed (default 0:24)")
    p.add_argument("--policies", type=cli.policies, default=["radixflow", "radixflow-frag"],
                   help="baseline policies (default radixflow,radixflow-frag)")
    p.add_argument("--rules", default=None,
                   help="rules to ablate, comma-separated (default: every ablatable rule)")
    p.add_argument("--cells", default=",".join(CELL_KINDS),
                   help=f"cell kinds (default {','.join(CELL_KINDS)})")
    p.add_argument("--workers", type=cli.positive(int, "an integer"), default=1,
                   help="processes, one cell each at a time (default 1)")
    return p


def main(argv: list[str] | None = None) -> int:
    from eval import mooncake
    from radixflow_sglang.core.reasons import ABLATABLE, parse_ablate

    p = build_parser()
    args = p.parse_args(argv)
    try:
        chosen = parse_ablate(args.rules) if args.rules else frozenset(ABLATABLE)
        start, count = mooncake.parse_window(args.trace_window)
        alphas = tuple(float(a) for a in args.alphas.split(","))
    except ValueError as e:
        p.error(str(e))
    rules = [r.value for r in ABLATABLE if r in chosen]  # NOTE: the rulebook's order
    kinds = [k.strip() for k in args.cells.split(",") if k.strip()]
    if not kinds or any(k not in CELL_KINDS for k in kinds):
        p.error(f"--cells: choose from {', '.join(CELL_KINDS)}, got {args.cells!r}")
    todo = cells(kinds, args.scale, args.trace_file, alphas)
    trace = (args.trace_file, start, count)
    t0 = time.perf_counter()
    jobs = [(c, args.policies, rules, args.questions, trace) for c in todo]
    if args.workers <= 1:
        parts = [run_cell(*j) for j in jobs]
    else:
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            parts = list(pool.map(run_cell, *zip(*jobs, strict=True)))
    results = [r for part in parts for r in part]
    v = verdicts(results, rules)
    md = table(results, v)
    doc = {"config": {"questions": args.questions, "scale": args.scale,
                      "trace_file": args.trace_file, "trace_window": args.trace_window,
                      "policies": args.policies, "alphas": alphas, "rate": RATE,
                      "cells": [c.name for c in todo], "wall_s": round(time.perf_counter() - t0)},
           "rules": v, "results": results}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ablation.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    (out / "ablation.md").write_text(md)
    print(md)
    nothing = [r for r, x in v.items() if x["changes_nothing"]]
    print(f"changes nothing anywhere: {', '.join(nothing) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
