"""Capacity sweep: latency vs offered rate per policy, and the max sustainable rate (issue 12).

    python -m eval.sweep --workload mix --model qwen3.5-4b --policies stock,radixflow \\
        --out DIR [--rates 1,2,4,8,16,32,64,128] [--slo-p95-s X] [--questions 300] [--seed 3]
        [--regime cold] [--order forward] [--refine 2] [--workers 1] [--quick]

Every point is one twin replay (eval/twin.py: SGLang's real scheduler on CPU in virtual time)
of the same questions at one offered rate (Poisson, questions/s; the same seed, so every
rate's arrival gaps are the same draws scaled by 1/rate). `--workload trace --trace-file F`
(eval/mooncake.py, with --trace-window and the caps) replays a Mooncake-format trace: each
rate is requests/s, the trace's own arrival gaps scaled so that their mean rate is that rate.
Segments (`--regime`, `--order`) replay in sequence, each drained before the next; the
figures below are per segment, the worst segment counts.

Definitions (a point is *sustainable* when all three hold):

* completions keep pace: throughput ratio = 1 / (1 + s) >= 0.95, s the least-squares slope
  of question latency over arrival time. Under overload (service rate mu < offered rate
  lambda) question i completes at i / mu and arrives at i / lambda, so its latency grows by
  s = lambda / mu - 1 per second of arrivals and the ratio is mu / lambda; a stable queue has
  s ~ 0 (a fit over every question: the jitter of the first and last ones does not decide);
* the queue does not grow: backlog growth = (mean backlog over the second half of the arrival
  window - mean over the first half) / (n / 2) <= 0.05, the backlog being the questions
  arrived and not yet completed (time-averaged); a deficit mu < lambda gives 1 - mu / lambda;
* latency within the objective: p95 question latency (arrival -> last branch done) <= the
  objective, `--slo-p95-s` or by default 5x stock's *unloaded* p95: stock's p95 at a quarter
  of the lowest swept rate (`--unloaded-rate`).

Max sustainable rate: the highest swept rate at which the point and every lower swept rate are
sustainable (a lucky pass above a failure does not count); null when the lowest fails.
`--refine K` bisects (geometrically) K times between it and the next swept rate; a policy that
sustains the top rate is censored there (`"censored": "above"`: the true maximum is higher and
its ratio vs stock a lower bound). `ratio_vs_stock` = a policy's max rate / stock's. NOTE: on
the doubling ladder K refinements bracket each max rate within a factor 2^(1/2^K) (K 4: 4.4 %,
K 6: 1.1 %), so two policies' ratio moves in such steps: compare ratios at one K.

Tokens: every point records the oracle (`unique_tokens`: each shared prefix computed once,
eval/twin.py's L_cap), `tokens_vs_oracle` and `oracle_vs_stock` (the floor of
`tokens_vs_stock` at that rate; stock reuses more under load, since siblings split across full
rounds reuse the earlier ones' states, so the floor rises with the rate), and `waste`: the
tokens beyond the oracle split exactly by cause (eval/waste.py). `saturated` (per policy, when
the top swept rate overloads it): its service rate, and that rate scheduling only the floor
(oracle + grid) at its own time per token; stock's figure is what computing each shared
prefix once buys at stock's time per token.

Writes DIR/sweep.json (`{"config", "slo_p95_s", "unloaded", "policies": {NAME: {"max_rate",
"points": [...], ...}}, "ratio_vs_stock": {NAME: ratio}}`), DIR/report.md and DIR/sweep.png
(mean and p95 latency vs rate per policy, the objective, scheduled tokens vs stock). Exit 0, 1
when a replay failed, 2 for bad arguments. `--quick`: a small synthetic sweep (seconds) for
tests.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eval import cli
from eval.hostcost import HOST_CHOICES
from eval.waste import CAUSES
from radixflow_sglang import models

DEFAULT_RATES = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
PACE = 0.95  # completion rate / arrival rate, at least
GROWTH = 0.05  # backlog growth over the run, at most (fraction of half the arrivals)
SLO_FACTOR = 5.0  # default objective: this x stock's unloaded p95
QUICK = {"workload": "synthetic", "model": "qwen3.5-0.8b", "questions": 16,
         "rates": (1.0, 4.0, 16.0, 64.0), "refine": 0}
POINT_KEYS = ("latency_mean_s", "latency_p50_s", "latency_p95_s", "latency_p99_s",
              "scheduled_tokens", "rounds", "blocked", "recomputed", "released_by_bound",
              "forks", "busy_s", "makespan_s", "host_s", "unique_tokens", "retractions",
              "reprefill_tokens", "decode_steps", "decode_s")


@dataclass(frozen=True)
class Setup:
    """What every point shares: the workload and the twin's configuration."""

    workload: str = "mix"
    model: str = "qwen3.5-4b"
    questions: int = 300
    seed: int = 3
    regime: str = "cold"
    order: str = "forward"
    layout: str = "extra_buffer"
    overlap: bool = False
    host_cost: str = "model"
    data_dir: str | None = None
    trace: Any = None  # eval/mooncake.py's TraceSpec (--workload trace); rates are requests/s


def segments_at(setup: Setup, rate: float) -> list[Any]:
    """The workload at one offered rate (a trace's arrivals rescaled to it)."""
    from eval.workload import workload

    if setup.trace is not None:
        return workload(setup.workload, setup.model, rate=rate, trace=setup.trace)
    return workload(setup.workload, setup.model, regime=setup.regime, order=setup.order,
                    questions=setup.questions, rate=rate, seed=setup.seed,
                    data_dir=setup.data_dir)


# --------------------------------------------------------------------------------------------
# One point
# --------------------------------------------------------------------------------------------


def pace(arrivals: Sequence[float], completions: Sequence[float]) -> tuple[float, float]:
    """(throughput ratio, backlog growth) of one segment's questions (module docstring)."""
    n = len(arrivals)
    a, c = list(arrivals), list(completions)
    t0, t1 = min(a), max(a)
    if n < 3 or t1 <= t0:
        return 1.0, 0.0  # all at once: no arrival rate to keep pace with
    lat = [ci - ai for ai, ci in zip(a, c, strict=True)]
    ma, ml = sum(a) / n, sum(lat) / n
    slope = (sum((ai - ma) * (li - ml) for ai, li in zip(a, lat, strict=True))
             / sum((ai - ma) ** 2 for ai in a))
    mid = (t0 + t1) / 2
    first, second = _mean_backlog(a, c, t0, mid), _mean_backlog(a, c, mid, t1)
    ratio = 1.0 / (1.0 + slope) if slope > -1.0 else math.inf
    return ratio, (second - first) / (n / 2)


def _mean_backlog(a: Sequence[float], c: Sequence[float], t0: float, t1: float) -> float:
    """Time-average over [t0, t1] of #arrived - #completed."""
    events = sorted([(t, 1) for t in a] + [(t, -1) for t in c])  # NOTE: a tie completes first
    level = sum(d for t, d in events if t <= t0)
    area, last = 0.0, t0
    for t, d in events:
        if t <= t0:
            continue
        if t >= t1:
            break
        area += level * (t - last)
        level += d
        last = t
    area += level * (t1 - last)
    return area / (t1 - t0)


def point_from(res: Any, rate: float, slo: float | None) -> dict[str, Any]:
    """A point's figures from a twin ArmResult (eval/twin.py)."""
    m = res.metrics
    out: dict[str, Any] = {"rate": rate, **{k: m.get(k, 0) for k in POINT_KEYS}}
    ratios, growths, arr_n, arr_s, done_s = [], [], 0, 0.0, 0.0
    for si in range(len(res.segments)):
        qs = [q for q in res.questions if q.segment == si]
        if not qs:
            continue
        a = [q.arrival_s for q in qs]
        c = [q.completion_s for q in qs]
        r, g = pace(a, c)
        ratios.append(r)
        growths.append(g)
        arr_n += len(qs) - 1
        arr_s += max(a) - min(a)
        done_s += max(c) - min(c)
    out["questions"] = len(res.questions)
    out["offered_rate"] = arr_n / arr_s if arr_s > 0 else math.inf
    out["completion_rate"] = arr_n / done_s if done_s > 0 else math.inf
    out["throughput_ratio"] = min(ratios)
    out["backlog_growth"] = max(growths)
    out["utilization"] = m["busy_s"] / m["makespan_s"] if m.get("makespan_s") else 0.0
    judge(out, slo)
    return out


def judge(point: dict[str, Any], slo: float | None) -> dict[str, Any]:
    """Set `sustainable` and the reasons it is not (`why`)."""
    why = []
    if point.get("failed"):
        why.append("failed")
    else:
        if point["throughput_ratio"] < PACE:
            why.append(f"throughput {point['throughput_ratio']:.3f} x offered < {PACE}")
        if point["backlog_growth"] > GROWTH:
            why.append(f"backlog grows {point['backlog_growth']:.3f} > {GROWTH}")
        if slo is not None and point["latency_p95_s"] > slo:
            why.append(f"p95 {point['latency_p95_s']:.3f}s > objective {slo:.3f}s")
    point["sustainable"] = not why
    point["why"] = why
    return point


def run_point(setup: Setup, policy: str, rate: float) -> dict[str, Any]:
    """Replay the workload at `rate` under `policy`; a failure is a point with its error."""
    import torch

    from eval.costmodel import cost_with
    from eval.hostcost import host_model
    from eval.twin import run_arm
    from eval.waste import breakdown
    from radixflow_sglang.geometry import load_geometry

    torch.set_num_threads(1)  # NOTE: tiny CPU tensors; intra-op threads only contend
    t0 = time.perf_counter()
    segs = segments_at(setup, rate)
    res = run_arm(segs, setup.model, policy, layout=setup.layout, overlap=setup.overlap,
                  cost=cost_with(setup.model), seed=setup.seed,
                  host=host_model(setup.host_cost))
    if not res.ok:
        return {"rate": rate, "failed": True, "error": res.error, "sustainable": False,
                "why": ["failed"]}
    point = point_from(res, rate, None)
    point["waste"] = breakdown(segs, res, load_geometry(setup.model).grid)
    point["wall_s"] = round(time.perf_counter() - t0, 2)
    del res
    gc.collect()  # NOTE: a kit's pools sit in reference cycles; free them per point
    return point


def run_points(setup: Setup, tasks: Sequence[tuple[str, float]],
               workers: int) -> list[dict[str, Any]]:
    """`run_point` for every (policy, rate), in a pool of `workers` processes when > 1."""
    if workers <= 1 or len(tasks) <= 1:
        return [_logged(setup, p, r) for p, r in tasks]
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks))) as pool:
        futures = [pool.submit(_logged, setup, p, r) for p, r in tasks]
        return [f.result() for f in futures]


def _logged(setup: Setup, policy: str, rate: float) -> dict[str, Any]:
    pt = run_point(setup, policy, rate)
    if pt.get("failed"):
        print(f"[{policy} @ {rate:g}/s] FAILED: {pt['error']}", file=sys.stderr)
    else:
        print(f"[{policy} @ {rate:g}/s] mean {pt['latency_mean_s']:.3f}s p95 "
              f"{pt['latency_p95_s']:.3f}s tokens {pt['scheduled_tokens']} pace "
              f"{pt['throughput_ratio']:.3f} growth {pt['backlog_growth']:.3f} "
              f"({pt['wall_s']:.0f}s wall)", file=sys.stderr, flush=True)
    return pt


# --------------------------------------------------------------------------------------------
# The sweep
# --------------------------------------------------------------------------------------------


def max_rate(points: Sequence[dict[str, Any]]) -> tuple[float | None, float | None]:
    """(highest rate sustainable together with every lower rate, the lowest rate that is
    not sustainable): see the module docstring."""
    best = None
    for pt in sorted(points, key=lambda p: p["rate"]):
        if not pt["sustainable"]:
            return best, pt["rate"]
        best = pt["rate"]
    return best, None


def sweep(setup: Setup, policies: Sequence[str], rates: Sequence[float], *,
          slo: float | None = None, unloaded_rate: float | None = None, refine: int = 0,
          workers: int = 1) -> dict[str, Any]:
    """Run the ladder (and the refinement) for every policy; the sweep.json document."""
    rates = sorted(set(rates))
    unloaded = None
    if slo is None:
        u_rate = unloaded_rate or rates[0] / 4
        unloaded = run_points(setup, [("stock", u_rate)], 1)[0]
        if unloaded.get("failed"):
            raise RuntimeError(f"stock's unloaded run failed: {unloaded['error']}")
        slo = SLO_FACTOR * unloaded["latency_p95_s"]
    tasks = [(p, r) for p in policies for r in rates]
    got = run_points(setup, tasks, workers)
    points: dict[str, list[dict[str, Any]]] = {p: [] for p in policies}
    for (p, _), pt in zip(tasks, got, strict=True):
        points[p].append(judge(pt, slo))
    for _ in range(refine):
        todo = []
        for p in policies:
            lo, hi = max_rate(points[p])
            if lo is not None and hi is not None:
                todo.append((p, _round_rate(math.sqrt(lo * hi))))
        todo = [(p, r) for p, r in todo if r not in {x["rate"] for x in points[p]}]
        if not todo:
            break
        for (p, _), pt in zip(todo, run_points(setup, todo, workers), strict=True):
            pt["refine"] = True
            points[p].append(judge(pt, slo))
    return document(setup, policies, rates, points, slo, unloaded, refine)


def saturated(pts: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """Service at the top swept rate when it overloads the policy (its queue never empties):
    questions completed per second, and that rate at the floor every hybrid-model scheduler
    pays (the oracle plus the checkpoint grid's recompute, eval/waste.py) with its time per
    scheduled token held: `at_floor` = service x scheduled / floor. Stock's `at_floor_vs_stock`
    is then the saturated service ratio of a scheduler that computes each shared prefix once
    at stock's time per token. None: the top rate keeps pace (nothing measures the service)."""
    ok = [pt for pt in pts if not pt.get("failed")]
    top = max(ok, key=lambda pt: pt["rate"]) if ok else None
    if top is None or top["throughput_ratio"] >= PACE or not top.get("completion_rate"):
        return None
    w = top.get("waste") or {}
    floor = w.get("unique", 0) + w.get("grid", 0)
    mu = top["completion_rate"]
    over = top["scheduled_tokens"] / floor if floor else None
    return {"rate": top["rate"], "service_rate": mu, "floor_tokens": floor,
            "tokens_vs_floor": over, "at_floor": mu * over if over else None}


def _round_rate(x: float) -> float:
    return float(f"{x:.4g}")


def document(setup: Setup, policies: Sequence[str], rates: Sequence[float],
             points: dict[str, list[dict[str, Any]]], slo: float,
             unloaded: dict[str, Any] | None, refine: int) -> dict[str, Any]:
    stock = {pt["rate"]: pt for pt in points.get("stock", []) if not pt.get("failed")}
    out: dict[str, Any] = {}
    for p in policies:
        pts = sorted(points[p], key=lambda x: x["rate"])
        for pt in pts:
            b = stock.get(pt["rate"])
            ok = b is not None and not pt.get("failed") and b["scheduled_tokens"]
            pt["tokens_vs_stock"] = pt["scheduled_tokens"] / b["scheduled_tokens"] if ok else None
            # NOTE: the oracle computes every shared prefix once (eval/twin.py's unique tokens):
            # tokens_vs_oracle is what a policy wastes; oracle_vs_stock the floor of
            # tokens_vs_stock at that rate (stock's own reuse grows with load: the floor rises)
            u = pt.get("unique_tokens") or 0
            pt["tokens_vs_oracle"] = pt["scheduled_tokens"] / u if u and not pt.get("failed") \
                else None
            pt["oracle_vs_stock"] = u / b["scheduled_tokens"] if ok and u else None
        best, first_bad = max_rate(pts)
        censored = ("above" if best is not None and first_bad is None
                    else "below" if best is None else None)
        toks = [pt["tokens_vs_stock"] for pt in pts if pt["tokens_vs_stock"] is not None]
        waste = [pt["tokens_vs_oracle"] for pt in pts if pt["tokens_vs_oracle"] is not None]
        out[p] = {"max_rate": best, "first_unsustainable": first_bad, "censored": censored,
                  "tokens_vs_stock_max": max(toks) if toks else None,
                  "tokens_vs_oracle_max": max(waste) if waste else None,
                  "saturated": saturated(pts), "points": pts}
    base_mu = (out.get("stock", {}).get("saturated") or {}).get("service_rate")
    for d in out.values():
        sat = d["saturated"]
        if sat is not None and base_mu:
            sat["vs_stock"] = sat["service_rate"] / base_mu
            sat["at_floor_vs_stock"] = sat["at_floor"] / base_mu if sat["at_floor"] else None
    ratio = {}
    base = out.get("stock", {}).get("max_rate")
    for p in policies:
        if p != "stock":
            mr = out[p]["max_rate"]
            ratio[p] = mr / base if base and mr is not None else None
    config = {**asdict(setup), "policies": list(policies), "rates": list(rates),
              "refine": refine, "pace": PACE, "growth": GROWTH, "slo_factor": SLO_FACTOR}
    return {"config": config, "slo_p95_s": slo, "unloaded": unloaded, "policies": out,
            "ratio_vs_stock": ratio if "stock" in policies else None}


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def _f(x: Any, fmt: str = ".3f") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, fmt)


def markdown(doc: dict[str, Any]) -> str:
    cfg = doc["config"]
    pol = doc["policies"]
    lines = [f"# Capacity sweep: {cfg['workload']} on {cfg['model']}", "",
             f"{cfg['questions']} questions per segment, regime {cfg['regime']}, order "
             f"{cfg['order']}, seed {cfg['seed']}, layout {cfg['layout']}"
             f"{' + overlap' if cfg['overlap'] else ''}, host cost {cfg['host_cost']}.",
             f"Objective: p95 <= {doc['slo_p95_s']:.3f} s"
             + (f" ({cfg['slo_factor']:g}x stock's unloaded p95 "
                f"{doc['unloaded']['latency_p95_s']:.3f} s at {doc['unloaded']['rate']:g} q/s)"
                if doc["unloaded"] else " (given)")
             + f"; sustainable: throughput >= {cfg['pace']} x offered, backlog growth <= "
               f"{cfg['growth']}, p95 within the objective (eval/sweep.py).", "",
             "| policy | max sustainable rate (q/s) | vs stock | first unsustainable | "
             "tokens vs stock (max over rates) | tokens vs oracle (max) |",
             "|---|---|---|---|---|---|"]
    ratio = doc.get("ratio_vs_stock") or {}
    for p, d in pol.items():
        mr = d["max_rate"]
        cens = {"above": " (top of the ladder: at least)", "below": " (below the ladder)"}
        lines.append(f"| {p} | {_f(mr, 'g')}{cens.get(d['censored'], '')} | "
                     f"{_f(ratio.get(p), '.2f') if p != 'stock' else '1'} | "
                     f"{_f(d['first_unsustainable'], 'g')} | {_f(d['tokens_vs_stock_max'])} | "
                     f"{_f(d.get('tokens_vs_oracle_max'))} |")
    lines += ["", "## Points", "",
              "| policy | rate | offered | throughput ratio | backlog growth | mean s | p95 s | "
              "tokens | tokens vs stock | oracle vs stock | tokens vs oracle | rounds | "
              "recomputed | sustainable |",
              "|" + "---|" * 14]
    for p, d in pol.items():
        for pt in d["points"]:
            if pt.get("failed"):
                lines.append(f"| {p} | {pt['rate']:g} | failed: {pt['error']} |" + " |" * 11)
                continue
            lines.append(
                f"| {p} | {pt['rate']:g}{'*' if pt.get('refine') else ''} | "
                f"{_f(pt['offered_rate'], '.2f')} | {_f(pt['throughput_ratio'])} | "
                f"{_f(pt['backlog_growth'])} | {_f(pt['latency_mean_s'])} | "
                f"{_f(pt['latency_p95_s'])} | {pt['scheduled_tokens']} | "
                f"{_f(pt['tokens_vs_stock'])} | {_f(pt.get('oracle_vs_stock'))} | "
                f"{_f(pt.get('tokens_vs_oracle'))} | {pt['rounds']} | {pt['recomputed']} | "
                f"{'yes' if pt['sustainable'] else 'no: ' + '; '.join(pt['why'])} |")
    lines += _saturation_table(pol)
    lines += _waste_table(pol)
    lines += ["", "`*`: a refinement point (bisection between the last sustainable and the first "
              "unsustainable swept rate). oracle: every shared prefix computed once (the "
              "unique tokens of eval/twin.py's L_cap); oracle vs stock is the floor of tokens "
              "vs stock at that rate, tokens vs oracle what a policy recomputes beyond it."]
    return "\n".join(lines) + "\n"


def _saturation_table(pol: dict[str, Any]) -> list[str]:
    """Service at the top swept rate (`saturated`): what capacity is made of once queued."""
    rows = [f"| {p} | {s['rate']:g} | {_f(s['service_rate'], '.2f')} | "
            f"{_f(s.get('vs_stock'), '.2f')} | {s['floor_tokens']} | "
            f"{_f(s['tokens_vs_floor'])} | {_f(s['at_floor'], '.2f')} | "
            f"{_f(s.get('at_floor_vs_stock'), '.2f')} |"
            for p, d in pol.items() if (s := d.get("saturated")) is not None]
    if not rows:
        return []
    return ["", "## At saturation (the top swept rate, every question queued)", "",
            "| policy | rate | service q/s | vs stock | floor tokens | tokens vs floor | "
            "service at the floor | vs stock |", "|" + "---|" * 8, *rows, "",
            "floor: the oracle's tokens plus the checkpoint grid's recompute, which no "
            "scheduler of a hybrid model avoids (eval/waste.py). Service at the floor: the "
            "service rate with each policy's time per scheduled token held, scheduling only "
            "the floor; stock's is what computing each shared prefix once buys at stock's "
            "time per token."]


def _waste_table(pol: dict[str, Any]) -> list[str]:
    """Scheduled tokens beyond the oracle per point, by cause (eval/waste.py), / oracle."""
    rows = []
    for p, d in pol.items():
        for pt in d["points"]:
            w = pt.get("waste")
            if not w or not w.get("unique"):
                continue
            u = w["unique"]
            rows.append(f"| {p} | {pt['rate']:g}{'*' if pt.get('refine') else ''} | "
                        f"{w['scheduled'] / u:.3f} | "
                        + " | ".join(f"{w[c] / u:.3f}" for c in CAUSES) + " |")
    if not rows:
        return []
    return ["", "## Tokens beyond the oracle, by cause (eval/waste.py; fractions of the oracle)",
            "", "| policy | rate | scheduled / oracle | " + " | ".join(CAUSES) + " |",
            "|" + "---|" * (3 + len(CAUSES)), *rows]


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (p, d) in enumerate(doc["policies"].items()):
        color = cycle[i % len(cycle)]  # NOTE: one colour per policy in every panel
        pts = [pt for pt in d["points"] if not pt.get("failed")]
        x = [pt["rate"] for pt in pts]
        for ax, key in zip(axes[:2], ("latency_mean_s", "latency_p95_s"), strict=True):
            ax.plot(x, [pt[key] for pt in pts], marker="o", label=p, color=color)
            if d["max_rate"] is not None:
                ax.axvline(d["max_rate"], color=color, ls=":", lw=1)
        tv = [(pt["rate"], pt["tokens_vs_stock"]) for pt in pts if pt["tokens_vs_stock"]]
        if tv and p != "stock":
            axes[2].plot(*zip(*tv, strict=True), marker="o", label=p, color=color)
    for ax, title in zip(axes, ("mean latency (s)", "p95 latency (s)",
                                "scheduled prefill tokens / stock"), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("offered rate (questions/s)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    axes[1].axhline(doc["slo_p95_s"], color="k", ls="--", lw=1, label="objective")
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(out: Path, doc: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(doc, indent=1, default=_json) + "\n")
    (out / "report.md").write_text(markdown(doc))
    plot(doc, out / "sweep.png")


def _json(x: Any) -> Any:
    raise TypeError(f"not JSON: {type(x).__name__}")


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _rates(text: str) -> tuple[float, ...]:
    try:
        xs = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}"
                                         ) from None
    if len(xs) < 2 or not all(0 < x < math.inf for x in xs) or len(set(xs)) != len(xs):
        raise argparse.ArgumentTypeError(
            f"give at least two distinct finite rates > 0 (questions/s), got {text!r}")
    return tuple(sorted(xs))


def build_parser() -> argparse.ArgumentParser:
    from eval.replay import LAYOUT_CHOICES, ORDER_CHOICES, REGIME_CHOICES, add_trace_args

    p = argparse.ArgumentParser(prog="python -m eval.sweep", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--workload", default=None,
                   help="any name eval.workload.workload accepts (race, quality, mix, "
                        "synthetic, ...; default mix)")
    p.add_argument("--model", choices=tuple(models.names()), default=None,
                   help="default qwen3.5-4b")
    p.add_argument("--policies", type=cli.policies, default=["stock", "radixflow"],
                   help="comma-separated (default stock,radixflow); the ratio is vs stock")
    p.add_argument("--rates", type=_rates, default=None,
                   help="offered rates, questions/s (default: "
                        f"{','.join(f'{r:g}' for r in DEFAULT_RATES)})")
    p.add_argument("--slo-p95-s", type=cli.positive(float, "a number"), default=None,
                   help=f"p95 latency objective, s (default {SLO_FACTOR:g}x stock's unloaded p95)")
    p.add_argument("--unloaded-rate", type=cli.positive(float, "a number"), default=None,
                   help="rate of stock's unloaded run (default: a quarter of the lowest rate)")
    p.add_argument("--questions", type=cli.positive(int, "an integer"), default=None,
                   help="questions per segment (default 300)")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--regime", choices=REGIME_CHOICES, default="cold")
    p.add_argument("--order", choices=tuple(o for o in ORDER_CHOICES), default="forward")
    p.add_argument("--layout", choices=LAYOUT_CHOICES, default="extra_buffer")
    p.add_argument("--overlap", action="store_true")
    p.add_argument("--refine", type=cli.non_negative(int, "an integer"), default=None,
                   help="bisection steps past the last sustainable rate (default 2)")
    p.add_argument("--workers", type=cli.positive(int, "an integer"), default=1)
    p.add_argument("--host-cost", choices=HOST_CHOICES, default="model",
                   help="the scheduler's CPU time per round (eval/hostcost.py; default model)")
    p.add_argument("--data-dir", default=None)
    add_trace_args(p, speed=False)
    p.add_argument("--quick", action="store_true",
                   help="small synthetic sweep for tests (qwen3.5-0.8b, 16 questions, rates "
                        "1,4,16,64, no refinement; explicit flags still win)")
    return p


def setup_from(args: argparse.Namespace,
               trace: Any = None) -> tuple[Setup, tuple[float, ...], int]:
    q = QUICK if args.quick else {}
    setup = Setup(trace=trace,workload=args.workload or q.get("workload", "mix"),
                  model=args.model or q.get("model", "qwen3.5-4b"),
                  questions=args.questions or q.get("questions", 300), seed=args.seed,
                  regime=args.regime, order=args.order, layout=args.layout,
                  overlap=args.overlap, host_cost=args.host_cost, data_dir=args.data_dir)
    rates = args.rates or q.get("rates", DEFAULT_RATES)
    refine = args.refine if args.refine is not None else q.get("refine", 2)
    return setup, rates, refine


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup, rates, refine = setup_from(args, _trace(parser, args))
    if setup.questions < 4:
        parser.error(f"argument --questions: at least 4 (a rate needs arrivals to measure), "
                     f"got {setup.questions}")
    try:  # NOTE: fail fast, naming the flag, before any replay
        segments_at(setup, rates[0])
    except (OSError, ValueError) as e:
        parser.error(f"argument --workload: cannot build {setup.workload!r}: {e}")
    t0 = time.perf_counter()
    doc = sweep(setup, args.policies, rates, slo=args.slo_p95_s,
                unloaded_rate=args.unloaded_rate, refine=refine, workers=args.workers)
    doc["config"]["wall_s"] = round(time.perf_counter() - t0, 1)
    out = Path(args.out)
    write(out, doc)
    for p, d in doc["policies"].items():
        r = (doc.get("ratio_vs_stock") or {}).get(p)
        print(f"{p}: max sustainable rate {_f(d['max_rate'], 'g')} q/s"
              f"{' (censored ' + d['censored'] + ')' if d['censored'] else ''}"
              + (f", {r:.2f}x stock" if r is not None else ""), file=sys.stderr)
    print(f"wrote {out}/sweep.json, report.md, sweep.png "
          f"({doc['config']['wall_s']:.0f}s wall)", file=sys.stderr)
    failed = any(pt.get("failed") for d in doc["policies"].values() for pt in d["points"])
    return 1 if failed else 0


def _trace(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """--workload trace's TraceSpec (--trace-* flags; errors name the flag), else None."""
    from eval.replay import TRACE_FLAGS, TRACE_WORKLOAD, trace_spec
    from eval.traffic import flag

    given = [k for k in TRACE_FLAGS if getattr(args, k, None) is not None]
    if args.workload != TRACE_WORKLOAD:
        if given:
            parser.error(f"{flag(given[0])} applies to --workload {TRACE_WORKLOAD} only")
        return None
    if args.trace_file is None:
        parser.error(f"--workload {TRACE_WORKLOAD} needs --trace-file FILE")
    return trace_spec(parser, args)


if __name__ == "__main__":
    sys.exit(main())
