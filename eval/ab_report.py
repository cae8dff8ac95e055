"""The live A/B harness's pure parts (eval/live_ab.py runs the servers): the host's load, the
run records, paired ratios with a bootstrap interval, the twin's prediction next to them,
summary.json, report.md and one plot per workload.

Statistics. Repetition k runs both arms (ABBA order: a drift in the machine's load weighs on
both alike), so each figure gives one paired ratio radixflow_k / stock_k per repetition. The
point estimate is the median of those ratios; its 95 % interval is a percentile bootstrap over
the repetitions (resampled with replacement, the median of each resample; numpy with a fixed
seed, so a report is reproducible from its runs). With 3 repetitions the interval is crude (it
spans the observed ratios at best): it says how far apart the repetitions were, not more.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ARMS = ("stock", "radixflow")  # the A and B of every workload (fork: their fork arms)
# NOTE: a third arm beside them (eval/live_ab.py --lpm): SGLang's own scheduler with
# --schedule-policy lpm, its ratios to stock paired by repetition as radixflow's are
LPM = "stock-lpm"
# NOTE: the twin's predictions (eval/live_ab.py), each with its plot marker and colour
TWIN_MARKS = {"default": ("x", "tab:blue"), "scans": ("s", "tab:green"),
              "calibrated": ("D", "tab:orange"), "replay": ("^", "tab:red")}
TWINS = tuple(TWIN_MARKS)
# (key, label): what each run reports; None where the workload has no such figure
METRICS = (("mean_e2e_ms", "mean e2e (ms)"), ("p99_e2e_ms", "p99 e2e (ms)"),
           ("mean_ttft_ms", "mean TTFT (ms)"), ("prefill_tokens", "prefill tokens"),
           ("prefill_batches", "prefill batches"),
           # NOTE: the scheduler process's CPU over the replay (OS-read, every arm alike): the
           # host work an arm adds, beside the latency it shows in
           ("sched_cpu_ms", "scheduler CPU (ms)"))
BUSY_FRACTION = 0.5  # CPUs busier than this share before a run (no sample: 1-min load / CPUs)
BOOTSTRAP = 2000
SEED = 0


# --------------------------------------------------------------------------------------------
# Host load
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """The OS's load averages and the CPUs this process may run on, at one moment."""

    load1: float
    load5: float
    load15: float
    cpus: int
    cpu_busy: float | None = None  # share of all CPUs' time not idle over a short sample

    def busy(self, fraction: float = BUSY_FRACTION) -> bool:
        # NOTE: the 1-min load lags: right after this harness's previous server it still
        # counts that server (a quiet 2-core box read 1.18 after one run). The sampled busy
        # share, where taken, is the box now.
        if self.cpu_busy is not None:
            return self.cpu_busy > fraction
        return self.load1 > fraction * self.cpus


def cpu_times(path: str = "/proc/stat") -> tuple[int, int] | None:
    """(idle, total) jiffies of all CPUs (Linux /proc/stat's `cpu` line); None elsewhere."""
    try:
        with open(path) as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields[:8])  # idle + iowait


def busy_share(a: tuple[int, int] | None, b: tuple[int, int] | None) -> float | None:
    """The share of CPU time not idle between two `cpu_times` readings."""
    if a is None or b is None or b[1] <= a[1]:
        return None
    return 1.0 - (b[0] - a[0]) / (b[1] - a[1])


def host_load(sample_s: float = 0.0) -> Load:
    """The load now; `sample_s` > 0 also samples the CPUs' busy share over that long."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    share = None
    if sample_s > 0:
        a = cpu_times()
        time.sleep(sample_s)  # NOTE: a measurement window, not a wait for an event
        share = busy_share(a, cpu_times())
    return Load(*os.getloadavg(), cpus or 1, share)


def load_warning(load: Load, what: str, fraction: float = BUSY_FRACTION) -> str | None:
    """A warning line when the box is busy before a run (its figures are unreliable)."""
    if not load.busy(fraction):
        return None
    if load.cpu_busy is not None:
        return (f"warning: busy machine before {what}: CPUs {load.cpu_busy:.0%} busy > "
                f"{fraction:.0%} (1-min load {load.load1:.2f}, {load.cpus} CPUs); its "
                "latencies are unreliable")
    return (f"warning: busy machine before {what}: 1-min load {load.load1:.2f} > "
            f"{fraction:g} x {load.cpus} CPUs; its latencies are unreliable")


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


@dataclass
class RunRecord:
    """One server run of one arm: its figures (METRICS keys) or its error, and the load."""

    workload: str
    arm: str  # one of ARMS
    repeat: int
    position: int  # its place in the workload's ABBA sequence
    dir: str = ""
    figures: dict[str, float | None] = field(default_factory=dict)
    error: str | None = None
    load_before: Load | None = None
    load_after: Load | None = None
    wall_s: float = 0.0
    warning: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def abba(repeats: int, arms: Sequence[str] = ARMS) -> list[tuple[int, str]]:
    """(repetition, arm): A B, B A, A B, ... (eval/run_arms.py bench_order)."""
    from eval.run_arms import bench_order

    return bench_order(list(arms), repeats)


def paired_ratios(runs: Sequence[RunRecord], metric: str, arm: str = ARMS[1]) -> list[float]:
    """`arm` (default radixflow) / stock per repetition where both ran and stock's figure is
    > 0."""
    by = {(r.arm, r.repeat): r.figures.get(metric) for r in runs if r.ok}
    out = []
    for k in sorted({r.repeat for r in runs}):
        a, b = by.get((arm, k)), by.get((ARMS[0], k))
        if a is not None and b is not None and b > 0 and math.isfinite(a):
            out.append(a / b)
    return out


def bootstrap_ci(values: Sequence[float], n: int = BOOTSTRAP, seed: int = SEED,
                 level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the median (None without values)."""
    import numpy as np

    if not values:
        return None
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    med = np.median(x[rng.integers(0, len(x), size=(n, len(x)))], axis=1)
    tail = (1 - level) / 2 * 100
    return float(np.percentile(med, tail)), float(np.percentile(med, 100 - tail))


def median(values: Sequence[float]) -> float | None:
    import statistics

    return statistics.median(values) if values else None


def summarize(runs: Sequence[RunRecord], n: int = BOOTSTRAP, seed: int = SEED
              ) -> dict[str, Any]:
    """Per metric: each arm's median, radixflow's median paired ratio and its bootstrap
    interval, and under "others" the same ratio of any further arm (stock-lpm)."""
    out: dict[str, Any] = {}
    extra = [a for a in dict.fromkeys(r.arm for r in runs) if a not in ARMS]
    for key, _ in METRICS:
        arms = {a: median([v for r in runs if r.ok and r.arm == a
                           and (v := r.figures.get(key)) is not None]) for a in (*ARMS, *extra)}
        out[key] = {"median": arms, **_paired(runs, key, ARMS[1], n, seed),
                    "others": {a: _paired(runs, key, a, n, seed) for a in extra}}
    return out


def _paired(runs: Sequence[RunRecord], key: str, arm: str, n: int, seed: int
            ) -> dict[str, Any]:
    ratios = paired_ratios(runs, key, arm)
    return {"ratios": ratios, "ratio": median(ratios), "ci95": bootstrap_ci(ratios, n, seed)}


# --------------------------------------------------------------------------------------------
# The twin next to the live figures
# --------------------------------------------------------------------------------------------

TWIN_METRICS = {"mean_e2e_ms": "latency_mean_s", "p99_e2e_ms": "latency_p99_s",
                "mean_ttft_ms": "ttft_mean_s", "prefill_tokens": "scheduled_tokens",
                "prefill_batches": "rounds"}


def twin_ratios(stock: Mapping[str, Any], radixflow: Mapping[str, Any]) -> dict[str, Any]:
    """The twin's radixflow / stock per METRICS key (eval/run_arms.py twin_prediction dicts;
    None where either failed or lacks the figure)."""
    if stock.get("failed") or radixflow.get("failed"):
        return {k: None for k in TWIN_METRICS}
    out: dict[str, Any] = {}
    for key, twin_key in TWIN_METRICS.items():
        a, b = radixflow.get(twin_key), stock.get(twin_key)
        out[key] = a / b if a is not None and b and math.isfinite(a) else None
    return out


def twin_gap(live: Mapping[str, Any], twin: Mapping[str, float | None] | None,
             arm: str = ARMS[1]) -> dict[str, float | None]:
    """|twin ratio - live median ratio| per metric, of `arm` (default radixflow)."""
    twin = twin or {}

    def ratio(v: Mapping[str, Any]) -> float | None:
        return v["ratio"] if arm == ARMS[1] else (v.get("others") or {}).get(arm, {}).get("ratio")

    return {k: (abs(t - r) if (t := twin.get(k)) is not None and (r := ratio(v)) is not None
                else None) for k, v in live.items()}


# --------------------------------------------------------------------------------------------
# Outputs
# --------------------------------------------------------------------------------------------


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _ratio_cell(v: Mapping[str, Any]) -> str:
    if v["ratio"] is None:
        return "-"
    ci = v["ci95"]
    return f"**{v['ratio']:.3f}x** [{ci[0]:.3f}, {ci[1]:.3f}]"


def workload_table(entry: Mapping[str, Any]) -> list[str]:
    """One workload's headline table: arm medians, live ratio with its interval, the twin."""
    twins = entry.get("twin") or {}
    names = [n for n in TWINS if twins.get(n, {}).get("ratios")]
    head = ["metric", "stock median", "radixflow median", "radixflow/stock [95% CI]", "pairs"]
    head += [f"twin ({n})" for n in names] + [f"\\|twin ({n}) - live\\|" for n in names]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key, label in METRICS:
        v = entry["summary"][key]
        if v["median"][ARMS[0]] is None and v["median"][ARMS[1]] is None:
            continue  # NOTE: no such figure for this workload (the client arms' TTFT)
        fmt = ".0f" if key.startswith("prefill") else ".1f"
        row = [label, _f(v["median"][ARMS[0]], fmt), _f(v["median"][ARMS[1]], fmt),
               _ratio_cell(v), str(len(v["ratios"]))]
        row += [_f(twins[n]["ratios"].get(key), ".3f") for n in names]
        row += [_f(twins[n]["gap"].get(key), ".3f") for n in names]
        lines.append("| " + " | ".join(row) + " |")
    return lines + lpm_table(entry, names)


def lpm_table(entry: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    """The stock-lpm arm's own rows (SGLang's --schedule-policy lpm vs stock), if it ran."""
    twins = entry.get("twin") or {}
    rows = []
    for key, label in METRICS:
        v = entry["summary"][key]
        o = (v.get("others") or {}).get(LPM)
        if o is None or v["median"].get(LPM) is None:
            continue
        fmt = ".0f" if key.startswith("prefill") else ".1f"
        row = [label, _f(v["median"][ARMS[0]], fmt), _f(v["median"][LPM], fmt), _ratio_cell(o),
               str(len(o["ratios"]))]
        row += [_f((twins[n].get("ratios_lpm") or {}).get(key), ".3f") for n in names]
        row += [_f((twins[n].get("gap_lpm") or {}).get(key), ".3f") for n in names]
        rows.append("| " + " | ".join(row) + " |")
    if not rows:
        return []
    head = ["metric", "stock median", f"{LPM} median", f"{LPM}/stock [95% CI]", "pairs"]
    head += [f"twin ({n})" for n in names] + [f"\\|twin ({n}) - live\\|" for n in names]
    return ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head), *rows]


def runs_table(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["| # | rep | arm | mean e2e ms | p99 e2e ms | TTFT ms | prefill tokens | batches | "
             "load1 before / after (CPUs) | wall s |", "|" + "---|" * 10]
    for r in runs:
        f, lb, la = r["figures"], r["load_before"] or {}, r["load_after"] or {}
        load = (f"{_f(lb.get('load1'), '.2f')} / {_f(la.get('load1'), '.2f')} "
                f"({lb.get('cpus', '-')})" + (" **busy**" if r.get("warning") else ""))
        if r["error"] is not None:
            cells = [f"FAILED: {r['error'][:200]}", "", "", "", ""]
        else:
            cells = [_f(f.get("mean_e2e_ms")), _f(f.get("p99_e2e_ms")),
                     _f(f.get("mean_ttft_ms")), _f(f.get("prefill_tokens"), ".0f"),
                     _f(f.get("prefill_batches"), ".0f")]
        lines.append(f"| {r['position']} | {r['repeat']} | {r['arm']} | " + " | ".join(cells)
                     + f" | {load} | {r['wall_s']:.1f} |")
    return lines


def twin_notes(entry: Mapping[str, Any]) -> list[str]:
    twins = entry.get("twin") or {}
    out = [f"- twin ({n}): {t.get('note', '')}" for n, t in twins.items()]
    return out or [f"- twin: {entry.get('twin_note') or 'none'}"]


def report_md(summary: Mapping[str, Any]) -> str:
    cfg = summary["config"]
    sim = cfg.get("sim_cost") or {}
    lines = ["# Live A/B: stock vs radixflow" + (f" (and {LPM})" if cfg.get("lpm") else ""),
             "", (f"Cost profile **{sim.get('profile')}**: {sim.get('source')} "
                  f"(alpha {sim.get('alpha', 0) * 1e3:.2f} ms, beta "
                  f"{sim.get('beta', 0) * 1e6:.3g} us/token, gamma "
                  f"{sim.get('gamma', 0) * 1e3:.3g} ms/row)." if sim else
                  "Model executor: no cost profile."), "",
             f"Model {cfg['model']} ({cfg['executor']} executor), overlap "
             f"{'on' if cfg['overlap'] else 'off'}, server args `{cfg['server_args']}`; "
             f"{cfg['repeat']} repetition(s) per workload in ABBA order, each run a fresh "
             f"server; ratios are the median of the per-repetition radixflow/stock ratios, "
             f"[95 % percentile bootstrap over repetitions, {cfg['bootstrap']} resamples, seed "
             f"{cfg['seed']}]. Host: {cfg['cpus']} CPUs.", ""]
    if cfg.get("command"):
        lines += [f"Command: `{cfg['command']}`", ""]
    if summary["warnings"]:
        lines += ["## Warnings", ""] + [f"- {w}" for w in summary["warnings"]] + [""]
    for name, entry in summary["workloads"].items():
        lines += [f"## {name}", "", entry["describe"], ""]
        lines += workload_table(entry) + [""] + twin_notes(entry) + [""]
        if entry.get("plot"):
            lines += [f"![{name}]({entry['plot']})", ""]
        lines += ["Runs:", ""] + runs_table(entry["runs"]) + [""]
    return "\n".join(lines)


def plot_workload(name: str, entry: Mapping[str, Any], path: Path) -> bool:
    """Per metric: each repetition's ratio, the median with its interval, the twin's
    predictions, 1.0 marked. False (nothing written) without a ratio to show."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [(k, lab) for k, lab in METRICS if entry["summary"][k]["ratios"]]
    if not keys:
        return False
    fig, ax = plt.subplots(figsize=(1.6 * len(keys) + 2.5, 3.6))
    for i, (k, _) in enumerate(keys):
        v = entry["summary"][k]
        ax.scatter([i] * len(v["ratios"]), v["ratios"], color="0.6", s=14, zorder=2,
                   label="repetition" if i == 0 else None)
        lo, hi = v["ci95"]
        ax.errorbar([i], [v["ratio"]], yerr=[[v["ratio"] - lo], [hi - v["ratio"]]], fmt="o",
                    color="black", capsize=4, zorder=3, label="median [95% CI]" if i == 0 else None)
    for n, (mark, color) in TWIN_MARKS.items():
        t = ((entry.get("twin") or {}).get(n) or {}).get("ratios") or {}
        pts = [(i, t[k]) for i, (k, _) in enumerate(keys) if t.get(k) is not None]
        if pts:
            ax.scatter(*zip(*pts, strict=True), marker=mark, color=color, s=40, zorder=4,
                       label=f"twin ({n})")
    ax.axhline(1.0, color="0.3", lw=0.8, ls="--")
    ax.set_xticks(range(len(keys)), [lab for _, lab in keys], rotation=15)
    ax.set_ylabel("radixflow / stock")
    ax.set_title(f"{name}: {len(entry['summary'][keys[0][0]]['ratios'])} paired repetition(s)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(out: Path, summary: dict[str, Any]) -> None:
    """summary.json, report.md and plot-<workload>.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for name, entry in summary["workloads"].items():
        png = f"plot-{name}.png"
        entry["plot"] = png if plot_workload(name, entry, out / png) else None
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (out / "report.md").write_text(report_md(summary))


def workload_entry(describe: str, runs: Sequence[RunRecord], twin: Mapping[str, Any] | None,
                   twin_note: str = "", n: int = BOOTSTRAP, seed: int = SEED
                   ) -> dict[str, Any]:
    """summary.json's entry of one workload; `twin`: {cost name: {"ratios", "note", ...}}."""
    live = summarize(runs, n, seed)
    twin = {k: dict(t, gap=twin_gap(live, t.get("ratios")),
                    **({"gap_lpm": twin_gap(live, t["ratios_lpm"], LPM)}
                       if t.get("ratios_lpm") else {}))
            for k, t in (twin or {}).items()}
    return {"describe": describe, "summary": live, "twin": twin, "twin_note": twin_note,
            "runs": [r.as_dict() for r in runs]}


__all__ = ["ARMS", "BUSY_FRACTION", "METRICS", "Load", "RunRecord", "abba", "bootstrap_ci",
           "host_load", "load_warning", "paired_ratios", "plot_workload", "report_md",
           "summarize", "twin_gap", "twin_ratios", "workload_entry", "write"]
