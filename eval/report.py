"""Write a twin run's results: DIR/summary.json, DIR/report.md and PNG plots.

summary.json = {"config": {...the command's arguments...}, "arms": {policy: metrics}} where a
failed arm is {"failed": true, "error": "..."} and never carries numbers. It is deterministic
for a seed (wall-clock times go to DIR/timing.json and report.md only).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eval.twin import ArmResult, eq2_split

BASELINE = "stock"


def finite(x: Any) -> Any:
    """JSON has no NaN/inf: write them as null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite(v) for v in x]
    return x


def arm_summary(res: ArmResult, base: ArmResult | None) -> dict[str, Any]:
    if not res.ok:
        return {"failed": True, "error": res.error}
    out = dict(res.metrics or {})
    out["cost_model"] = res.cost.as_dict() if res.cost is not None else None
    out["per_round"] = {"rows": res.round_rows, "tokens": res.round_tokens,
                        "cost_s": [r.cost_s for r in res.rounds]}
    out["segments"] = [
        {"name": s.name, "regime": s.regime, "order": s.order, "start_s": s.start_s,
         "end_s": s.end_s, "questions": s.questions, "l_cap": s.l_cap,
         "unique_tokens": s.unique_tokens}
        for s in res.segments
    ]
    if base is not None and base.ok and base is not res:
        out["vs_stock"] = ratios(res.metrics, base.metrics)
        out["eq2_split"] = eq2_split(res.metrics, base.metrics)
    return out


RATIO_KEYS = ("rounds", "scheduled_tokens", "latency_mean_s", "latency_p95_s", "latency_p99_s",
              "rows_per_round", "tokens_per_round", "busy_s")


def ratios(m: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, float | None]:
    return {k: (m[k] / b[k] if b.get(k) else None) for k in RATIO_KEYS}


def fmt(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if not math.isfinite(x):
            return "-"
        return f"{x:.{nd}f}"
    return str(x)


def _ratio(x: float | None, y: float | None) -> str:
    return f"{x / y:.2f}x" if x is not None and y else "-"


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out


def main_rows(arms: Mapping[str, ArmResult], pick=None) -> list[list[str]]:
    """One row per arm: Table 1 style. `pick(res)` selects a metrics dict (e.g. a regime)."""
    pick = pick or (lambda r: r.metrics)
    base = arms.get(BASELINE)
    bm = pick(base) if base is not None and base.ok else None
    rows = []
    for name, res in arms.items():
        if not res.ok:
            rows.append([name, "FAILED: " + (res.error or "?").replace("|", "/")[:300]]
                        + [""] * 11)
            continue
        m = pick(res)
        if m is None:
            continue

        def r(key, m=m):
            return _ratio(m[key], bm[key]) if bm else "-"

        rows.append([
            name, fmt(m["latency_mean_s"]), fmt(m["latency_p95_s"]), fmt(m["rounds"]),
            fmt(m["scheduled_tokens"]), fmt(m["reuse"]), fmt(m["rows_per_round"], 2),
            fmt(m["rounds_over_l_cap"], 2),
            r("latency_mean_s"), r("latency_p95_s"), r("rounds"), r("scheduled_tokens"),
            fmt(m["blocked"]),
        ])
    return rows


MAIN_HEADERS = ["policy", "lat mean (s)", "lat p95 (s)", "rounds", "sched tokens", "reuse",
                "rows/round", "rounds/L_cap", "mean vs stock", "p95 vs stock",
                "rounds vs stock", "tokens vs stock", "blocked"]


CAP_HEADERS = ["rounds", "L_cap", "rounds / L_cap", "tokens/round", "parked max rounds",
               "leaked KV", "leaked mamba"]


def cap_cells(m: Mapping[str, Any]) -> list[str]:
    """A "Rounds over the capacity bound" row after the arm's name (twin and live reports)."""
    return [fmt(m["rounds"]), fmt(m["l_cap"]), fmt(m["rounds_over_l_cap"], 2),
            fmt(m["tokens_per_round"], 0), fmt(m["parked_max_rounds"]),
            fmt(m["leaked_kv_slots"]), fmt(m["leaked_mamba_slots"])]


def render_markdown(config: Mapping[str, Any], arms: Mapping[str, ArmResult],
                    plots: list[str]) -> str:
    lines = ["# Scheduler twin report", ""]
    lines += ["Virtual-time replay of the workload through SGLang 0.5.23's real scheduler "
              "(eval/twin.py); GPU time from the cost model (eval/costmodel.py).", ""]
    cfg = ", ".join(f"{k}={v}" for k, v in config.items())
    lines += [f"Config: `{cfg}`", ""]
    ok = [a for a in arms.values() if a.ok]
    if ok:
        c = ok[0].cost
        m = ok[0].metrics
        lines += [f"Cost model ({c.source}): c = {c.alpha * 1e3:.2f} ms + "
                  f"{c.beta * 1e6:.3f} us/token + {c.gamma * 1e3:.3f} ms/row + "
                  f"{c.delta * 1e12:.3f} ps/attention-pair. Budgets: S = {m['row_budget']} rows,"
                  f" T = {m['token_budget']} tokens per round. L_cap = {m['l_cap']:,} rounds "
                  f"({m['unique_tokens']:,} unique tokens, {m['requests']:,} requests).", ""]
    lines += ["## Arms (Table 1 style)", ""]
    lines += table(MAIN_HEADERS, main_rows(arms))
    lines += [""]
    lines += ["Latency = question arrival -> completion of its last branch (however many it "
              "has: four-branch, gsp, nsample, one for multiturn/noshare). reuse = hit / input "
              "tokens (hit = ready prefix at first selection). rounds/L_cap: see eval/twin.py "
              "(L_cap = fewest rounds any scheduler could use under the S/T budgets).", ""]

    regimes = [reg for reg in ("cold", "mixed", "reuse")
               if any(a.ok and reg in a.regime_metrics() for a in arms.values())]
    extra = sorted({reg for a in arms.values() if a.ok for reg in a.regime_metrics()}
                   - set(regimes))
    regimes += extra
    if regimes and not (len(regimes) == 1 and regimes[0] == "custom"):
        lines += ["## Per regime (Table 4 style)", ""]
        for reg in regimes:
            lines += [f"### {reg}", ""]
            lines += table(MAIN_HEADERS, main_rows(
                arms, lambda r, reg=reg: r.regime_metrics().get(reg)))
            lines += [""]

    base = arms.get(BASELINE)
    if base is not None and base.ok:
        lines += ["## Latency split vs stock (Eq. 2 style, our decomposition)", ""]
        lines += ["L_arm - L_stock = (N_arm - N_stock) * C_stock [round credit] + "
                  "(C_arm - C_stock) * N_arm [cost shift], N = mean rounds a question waits "
                  "through, C = L / N. Busy time split the same way with total rounds and mean "
                  "round cost. Negative = faster than stock.", ""]
        rows = []
        for name, res in arms.items():
            if not res.ok or name == BASELINE:
                continue
            e = eq2_split(res.metrics, base.metrics)
            rows.append([name, fmt(e["latency_diff_s"], 4), fmt(e["round_credit_s"], 4),
                         fmt(e["cost_shift_s"], 4),
                         f"{e['rounds_waited_base']:.2f} -> {e['rounds_waited']:.2f}",
                         f"{e['cost_per_waited_round_base_s'] * 1e3:.1f} -> "
                         f"{e['cost_per_waited_round_s'] * 1e3:.1f}",
                         fmt(e["busy_diff_s"], 2), fmt(e["busy_round_credit_s"], 2),
                         fmt(e["busy_cost_shift_s"], 2)])
        lines += table(["policy", "dL mean (s)", "round credit (s)", "cost shift (s)",
                         "rounds waited", "ms / waited round", "d busy (s)",
                         "busy round credit (s)", "busy cost shift (s)"], rows)
        lines += [""]

    lines += ["## Rounds over the capacity bound", ""]
    rows = [[name, *cap_cells(res.metrics)] for name, res in arms.items() if res.ok]
    lines += table(["policy", *CAP_HEADERS], rows)
    lines += [""]

    lines += ["## Wall time", ""]
    lines += [f"- {name}: {res.wall_s:.1f} s" + ("" if res.ok else " (failed)")
              for name, res in arms.items()]
    lines += [""]
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{p}]({p})" for p in plots]
        lines += [""]
    return "\n".join(lines)


def plot(out: Path, arms: Mapping[str, ArmResult]) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ok = {n: a for n, a in arms.items() if a.ok and a.rounds}
    if not ok:
        return []
    files = []
    styles = ["-", "--", ":", "-."]  # identical arms (stock, radix) stay visible
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, (name, res) in enumerate(ok.items()):
        ls = styles[i % len(styles)]
        toks = np.sort(np.array(res.round_tokens))
        axes[0].step(toks, np.arange(1, toks.size + 1) / toks.size, where="post", ls=ls,
                     label=f"{name} ({toks.size} rounds)")
        rows = np.array(res.round_rows)
        axes[1].hist(rows, bins=np.arange(0.5, rows.max() + 1.5), histtype="step", ls=ls,
                     label=name)
    t = next(iter(ok.values())).metrics["token_budget"]
    axes[0].axvline(t, color="grey", ls=":", lw=1)
    axes[0].set(xlabel="scheduled tokens per round", ylabel="CDF of rounds",
                title="Round fullness (tokens)")
    axes[1].set(xlabel="rows per round", ylabel="rounds", title="Round fullness (rows)")
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "round_fullness.png", dpi=110)
    plt.close(fig)
    files.append("round_fullness.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (name, res) in enumerate(ok.items()):
        lat = np.sort(np.array(res.latencies))
        ax.step(lat, np.arange(1, lat.size + 1) / lat.size, where="post",
                ls=styles[i % len(styles)],
                label=f"{name} (mean {lat.mean():.3f} s)")
    ax.set(xlabel="question latency (s)", ylabel="CDF of questions", title="Latency CDF",
           xscale="log")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "latency_cdf.png", dpi=110)
    plt.close(fig)
    files.append("latency_cdf.png")
    return files


def write(out_dir: str | Path, config: Mapping[str, Any], arms: Mapping[str, ArmResult]) -> Path:
    """Write summary.json, timing.json, report.md and the plots into out_dir; return it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    base = arms.get(BASELINE)
    summary = {"config": dict(config),
               "arms": {name: arm_summary(res, base) for name, res in arms.items()}}
    (out / "summary.json").write_text(json.dumps(finite(summary), indent=1) + "\n")
    timing = {name: res.wall_s for name, res in arms.items()}
    (out / "timing.json").write_text(json.dumps(timing, indent=1) + "\n")
    plots = plot(out, arms)
    (out / "report.md").write_text(render_markdown(config, arms, plots) + "\n")
    return out
