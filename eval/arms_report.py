"""The live arms' report: summary.json, audit.json, timing.json and report.md from the arms
that eval/run_arms.py ran, plus the output-agreement audit against the stock arm.

Kept apart from running the arms so the report can be rebuilt and tested without servers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.report import (
    CAP_HEADERS,
    MAIN_HEADERS,
    cap_cells,
    finite,
    fmt,
    main_rows,
    ratios,
    table,
)

BASELINE = "stock"
STOCK_FORK = "stock-fork"  # the frontend fork program against a stock server
# Fork arms compare by what the server scheduled (the frontend's own prefix requests included).
FORK_RATIO_KEYS = ("scheduled_tokens_sglang_log", "rounds_sglang_log", "latency_mean_s",
                   "latency_p95_s", "latency_p99_s", "scheduler_cpu_s")


@dataclass
class LiveArm:
    """What eval/report.py's table helpers read (ok, error, metrics, regime_metrics)."""

    name: str
    metrics: dict[str, Any] | None = None
    error: str | None = None
    wall_s: float = 0.0
    replay_wall_s: float = 0.0
    records: list[dict[str, Any]] = field(default_factory=list)
    command: str = ""
    error_detail: str | None = None  # the error with its server log tail
    twin: dict[str, Any] | None = None  # the twin's prediction (eval/run_arms.py TWIN_KEYS)

    @property
    def ok(self) -> bool:
        return self.error is None

    def regime_metrics(self) -> dict[str, dict[str, Any]]:
        return (self.metrics or {}).get("per_regime", {})


# --------------------------------------------------------------------------------------------
# Output-agreement audit
# --------------------------------------------------------------------------------------------


def generated(r: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[Any, Any, str]:
    """Every generated id (with the witness executor they depend on every state a request
    computed from), else the text the frontend returns."""
    if r.get("output_ids") and b.get("output_ids"):
        return list(r["output_ids"]), list(b["output_ids"]), "token ids"
    return r.get("text"), b.get("text"), "text"


def audit_arm(rows: Sequence[Mapping[str, Any]],
              ref: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    compared = agreed = missing = input_differs = 0
    how: set[str] = set()
    differing = []
    for r in rows:
        b = ref.get(r["rid"])
        if b is None or r.get("error") or r.get("done_s") is None:
            missing += 1
            continue
        mine, theirs, kind = generated(r, b)
        how.add(kind)
        compared += 1
        same_input = r.get("prompt_tokens") == b.get("prompt_tokens")
        input_differs += not same_input
        if mine == theirs:
            agreed += 1
        else:
            differing.append({"rid": r["rid"], "compared": kind, "arm": mine, "stock": theirs,
                              "arm_prompt_tokens": r.get("prompt_tokens"),
                              "stock_prompt_tokens": b.get("prompt_tokens"),
                              "arm_cached_tokens": r.get("cached_tokens"),
                              "stock_cached_tokens": b.get("cached_tokens")})
    return {"compared": compared, "agreed": agreed, "differing": len(differing),
            "missing": missing, "prompt_length_differs": input_differs,
            "compared_by": sorted(how), "pairs": differing}


def audit(arms: Mapping[str, LiveArm], base: str = BASELINE) -> dict[str, Any]:
    """Exact output comparison per branch against the stock arm; differing pairs kept."""
    if base not in arms or not arms[base].records:
        return {"ran": False, "baseline": base,
                "reason": f"no {base} records" + (f" ({arms[base].error})"
                                                  if base in arms and arms[base].error else "")}
    ref = {r["rid"]: r for r in arms[base].records
           if not r.get("error") and r.get("done_s") is not None}
    out: dict[str, Any] = {"ran": True, "baseline": base, "arms": {}}
    for name, arm in arms.items():
        if name != base:
            out["arms"][name] = (audit_arm(arm.records, ref) if arm.records
                                 else {"ran": False, "reason": arm.error or "no records"})
    return out


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def arm_summary(arm: LiveArm, base: LiveArm | None) -> dict[str, Any]:
    if not arm.ok:
        return {"failed": True, "error": arm.error, "error_detail": arm.error_detail,
                "command": arm.command}
    out = dict(arm.metrics or {})
    out["command"] = arm.command
    out["wall_s"] = arm.wall_s
    out["replay_wall_s"] = arm.replay_wall_s
    if base is not None and base.ok and base is not arm:
        out["vs_stock"] = ratios(arm.metrics, base.metrics)
    if arm.twin is not None:
        out["twin"] = dict(arm.twin)
        bt = base.twin if base is not None and base is not arm else None
        if bt is not None and not bt.get("failed") and not arm.twin.get("failed"):
            out["twin"]["vs_stock"] = {k: _ratio(arm.twin.get(k), bt.get(k))
                                       for k in PREFILL_RATIO_KEYS}
    return out


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if a is not None and b else None


# --------------------------------------------------------------------------------------------
# Scheduled prefill and zero-hit followers: live next to the twin
# --------------------------------------------------------------------------------------------

PREFILL_RATIO_KEYS = ("scheduled_tokens", "latency_mean_s", "latency_p95_s",
                      "request_latency_mean_s")
PREFILL_HEADERS = ["arm", "scheduled (SGLang log)", "vs stock", "scheduled (trace)",
                   "twin scheduled", "twin vs stock", "zero-hit requests", "twin",
                   "zero-hit followers", "twin", "lat mean (s)", "vs stock", "lat p95 (s)",
                   "twin lat mean (s)", "twin vs stock", "req lat mean (s)", "twin req lat (s)"]


def live_sched(m: Mapping[str, Any]) -> Any:
    """What the server scheduled in the replay window: SGLang's own log lines (every arm)."""
    return m.get("scheduled_tokens_sglang_log")


def _followers(m: Mapping[str, Any] | None) -> str:
    if not m or m.get("after_requests") is None:
        return "-"
    return f"{m['zero_hit_after_requests']} / {m['after_requests']}"


def prefill_rows(arms: Mapping[str, LiveArm]) -> list[list[str]]:
    base = arms.get(BASELINE)
    bm = base.metrics if base is not None and base.ok else None
    bt = base.twin if base is not None and base.twin and not base.twin.get("failed") else None
    rows = []
    for name, a in arms.items():
        if not a.ok or name.endswith("-fork"):
            continue
        m = a.metrics
        t = a.twin if a.twin and not a.twin.get("failed") else {}
        trace = m["scheduled_tokens"] if m.get("counters") == "radixflow trace" else None

        def vs(x, b):
            return "-" if x is None or not b else f"{x / b:.2f}x"

        rows.append([
            name, fmt(live_sched(m)), vs(live_sched(m), bm and live_sched(bm)), fmt(trace),
            fmt(t.get("scheduled_tokens")), vs(t.get("scheduled_tokens"),
                                               bt and bt.get("scheduled_tokens")),
            fmt(m.get("zero_hit_requests")), fmt(t.get("zero_hit_requests")),
            _followers(m), _followers(t),
            fmt(m["latency_mean_s"]), vs(m["latency_mean_s"], bm and bm["latency_mean_s"]),
            fmt(m["latency_p95_s"]), fmt(t.get("latency_mean_s")),
            vs(t.get("latency_mean_s"), bt and bt.get("latency_mean_s")),
            fmt(m.get("request_latency_mean_s")), fmt(t.get("request_latency_mean_s"))])
    return rows


def prefill_lines(config: Mapping[str, Any], arms: Mapping[str, LiveArm]) -> list[str]:
    lines = ["## Scheduled prefill, zero-hit followers, latency: live and twin", "",
             "scheduled (SGLang log): the new tokens of SGLang's own \"Prefill batch\" log "
             "lines in the replay window, every arm alike (chunks included); trace: the "
             "--radixflow-trace rounds (radixflow arms). zero-hit: requests whose "
             "meta_info.cached_tokens was 0; followers: requests released `after` another "
             "question (gsp-paced siblings, later turns, n samples after a warm request), "
             "zero-hit / all. twin: the same workload, policy and boundary mode through "
             "eval/twin.py in virtual time" + _twin_note(config, arms) + ".", ""]
    lines += table(PREFILL_HEADERS, prefill_rows(arms)) + [""]
    lines += prefix_once_lines(config.get("shape") or {}, arms)
    failed = {n: a.twin["error"] for n, a in arms.items() if a.twin and a.twin.get("failed")}
    lines += [f"- twin for {n} FAILED: {e[:300]}" for n, e in failed.items()]
    return lines + ([""] if failed else [])


def prefix_once_tokens(shape: Mapping[str, Any]) -> int | None:
    """gsp / gsp-paced: the work of computing each group's prefix once (issue 12: groups x
    (system + question) + groups x (prompts - 1) x question), else None."""
    if shape.get("workload") not in ("gsp", "gsp-paced"):
        return None
    g, p = shape["groups"], shape["prompts_per_group"]
    return g * (shape["system_len"] + shape["question_len"]) + g * (p - 1) * shape["question_len"]


def prefix_once_lines(shape: Mapping[str, Any], arms: Mapping[str, LiveArm]) -> list[str]:
    once = prefix_once_tokens(shape)
    if not once:
        return []
    out = [f"Scheduled over prefix once ({once:,} tokens: each group's system prompt and "
           "question once, then every other question):", ""]
    for name, a in arms.items():
        if a.ok and not name.endswith("-fork"):
            t = a.twin if a.twin and not a.twin.get("failed") else {}
            live, tw = live_sched(a.metrics), t.get("scheduled_tokens")
            out.append(f"- {name}: live {fmt(live / once if live is not None else None, 2)}x, "
                       f"twin {fmt(tw / once if tw is not None else None, 2)}x")
    return out + [""]


def _twin_note(config: Mapping[str, Any], arms: Mapping[str, LiveArm]) -> str:
    twins = [a.twin for a in arms.values() if a.twin]
    if not twins:
        return " (not run: --no-twin)"
    layouts = sorted({t["layout"] for t in twins})
    note = f" ({twins[0]['cost_model']} cost model, free scans, layout {', '.join(layouts)}"
    if twins[0].get("front_end"):
        note += f"; {twins[0]['front_end']}"
    elif twins[0].get("branch_spread_ms"):
        note += f"; a question's branches {twins[0]['branch_spread_ms']:.2f} ms apart"
    if config.get("n_param"):
        note += "; the live client sends SGLang's `n` and its warm request is the tokenizer "
        note += "manager's, inside the question's latency, where the twin counts the warm "
        note += "question apart"
    return note + ")"


def _vs(r: Mapping[str, float | None], k: str) -> str:
    return "-" if r.get(k) is None else f"{r[k]:.2f}x"


def fork_ratios(m: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, float | None]:
    return {k: (m[k] / b[k] if m.get(k) is not None and b.get(k) else None)
            for k in FORK_RATIO_KEYS}


def fork_arms(arms: Mapping[str, LiveArm]) -> dict[str, LiveArm]:
    """The frontend-program arms (stock-fork first), when stock-fork ran."""
    if STOCK_FORK not in arms:
        return {}
    return {STOCK_FORK: arms[STOCK_FORK]} | {n: a for n, a in arms.items()
                                             if n.endswith("-fork") and n != STOCK_FORK}


def fork_rows(forks: Mapping[str, LiveArm]) -> list[list[str]]:
    base = forks[STOCK_FORK].metrics if forks[STOCK_FORK].ok else None
    rows = []
    for name, a in forks.items():
        if not a.ok:
            rows.append([name, "FAILED"] + ["-"] * 10)
            continue
        m = a.metrics
        r = fork_ratios(m, base) if base is not None else {}

        rows.append([name, fmt(m.get("scheduled_tokens_sglang_log")),
                     _vs(r, "scheduled_tokens_sglang_log"), fmt(m.get("rounds_sglang_log")),
                     _vs(r, "rounds_sglang_log"), fmt(m["latency_mean_s"]),
                     _vs(r, "latency_mean_s"),
                     fmt(m["latency_p95_s"]), _vs(r, "latency_p95_s"),
                     fmt(m["scheduled_tokens"] if m["counters"] == "radixflow trace" else None),
                     fmt(m["hit_tokens"]), fmt(m["input_tokens"])])
    return rows


FORK_HEADERS = ["arm", "scheduled tokens (SGLang log)", "vs stock-fork", "rounds (SGLang log)",
                "vs stock-fork", "lat mean (s)", "vs stock-fork", "lat p95 (s)",
                "vs stock-fork", "scheduled (trace)", "hit tokens (meta)",
                "prompt tokens (meta)"]


def fork_lines(forks: Mapping[str, LiveArm], aud: Mapping[str, Any]) -> list[str]:
    lines = ["## Frontend program: stock-fork vs radixflow-fork", "",
             "The same SGLang frontend program (`s.fork(4)`) against a stock and a radixflow "
             "server. Scheduled tokens and rounds are SGLang's own \"Prefill batch\" log lines "
             "during the replay, for both arms: they would also count a prefix request the "
             "frontend sends on its own before the forks, which the per-branch records (meta) "
             "do not.", ""]
    lines += table(FORK_HEADERS, fork_rows(forks)) + [""]
    if aud.get("ran"):
        for name, a in aud["arms"].items():
            if a.get("ran") is False:
                lines.append(f"- output audit {name} vs stock-fork: not run ({a['reason']})")
            else:
                lines.append(f"- output audit {name} vs stock-fork: {a['agreed']} of "
                             f"{a['compared']} outputs agree, {a['differing']} differ, "
                             f"{a['prompt_length_differs']} prompt lengths differ")
        lines.append("")
    return lines


def latency_rows(arms: Mapping[str, LiveArm]) -> list[list[str]]:
    rows = []
    for name, a in arms.items():
        if not a.ok:
            continue
        m = a.metrics
        rows.append([name, fmt(m["latency_mean_s"]), fmt(m["latency_p50_s"]),
                     fmt(m["latency_p95_s"]), fmt(m["latency_p99_s"]),
                     fmt(m["offered_latency_mean_s"]), fmt(m["offered_latency_p95_s"]),
                     fmt(m["sender_lag_mean_s"], 4), fmt(m["sender_lag_max_s"], 4),
                     fmt(m["first_selection_mean_s"], 4), fmt(m["hit_tokens"]),
                     fmt(m["input_tokens"]), m["counters"]])
    return rows


LATENCY_HEADERS = ["arm", "lat mean (s)", "p50", "p95", "p99", "offered lat mean (s)",
                   "offered p95", "sender lag mean (s)", "lag max", "first sel. mean (s)",
                   "hit tokens", "input tokens", "counters from"]


def cap_rows(arms: Mapping[str, LiveArm]) -> list[list[str]]:
    return [[name, *cap_cells(a.metrics), fmt(a.metrics["tokens_conserved"])]
            for name, a in arms.items() if a.ok]


def audit_lines(aud: Mapping[str, Any]) -> list[str]:
    if not aud.get("ran"):
        return [f"Not run: {aud.get('reason')}.", ""]
    rows = []
    for name, a in aud["arms"].items():
        if a.get("ran") is False:
            rows.append([name, "-", "-", "-", "-", "-", a["reason"][:200].replace("|", "/")])
            continue
        rows.append([name, str(a["compared"]), str(a["agreed"]), str(a["differing"]),
                     str(a["missing"]), str(a["prompt_length_differs"]),
                     ", ".join(a["compared_by"])])
    lines = table(["arm", "compared", "agreed", "differing", "missing", "prompt length differs",
                    "compared by"], rows)
    lines += ["", "Exact generated ids per branch vs the stock arm (every id when both have "
              "output_ids, else the text the frontend returns). Differing pairs are all "
              "in audit.json. The fork arm's prompts are re-tokenized text, so its prompt "
              "lengths (and, with the simulated executor, its tokens) can differ by "
              "construction.", ""]
    return lines


BENCH_HEADERS = ["policy", "completed", "scheduled tokens (SGLang log)", "vs stock",
                 "/ prefix once", "rounds (SGLang log)", "cached (SGLang log)",
                 "scheduled (trace)", "req/s", "vs stock", "e2e mean (ms)", "vs stock",
                 "e2e median (ms)", "e2e p99 (ms)", "TTFT mean (ms)", "vs stock",
                 "TPOT mean (ms)"]


def bench_rows(per_policy: Mapping[str, Mapping[str, Any]]) -> list[list[str]]:
    rows = []
    for policy, e in per_policy.items():
        if e.get("failed"):
            err = str(e.get("error", ""))[:300].replace("|", "/")
            rows.append([policy, f"FAILED: {err}"] + ["-"] * (len(BENCH_HEADERS) - 2))
            continue
        b, srv, r = e["bench_serving"], e["server"], e.get("vs_stock") or {}

        rows.append([policy, fmt(b["completed"]), fmt(srv["scheduled_tokens_sglang_log"]),
                     _vs(r, "scheduled_tokens"), fmt(e.get("scheduled_over_prefix_once"), 2),
                     fmt(srv["rounds_sglang_log"]), fmt(srv["cached_tokens_sglang_log"]),
                     fmt(srv["scheduled_tokens_trace"]), fmt(b["request_throughput"], 2),
                     _vs(r, "request_throughput"), fmt(b["mean_e2e_latency_ms"], 1),
                     _vs(r, "mean_e2e_latency_ms"), fmt(b["median_e2e_latency_ms"], 1),
                     fmt(b["p99_e2e_latency_ms"], 1), fmt(b["mean_ttft_ms"], 1),
                     _vs(r, "mean_ttft_ms"), fmt(b["mean_tpot_ms"], 1)])
    return rows


REPEAT_HEADERS = ["policy", "run", "e2e mean (ms)", "TTFT mean (ms)", "e2e p99 (ms)",
                  "scheduled tokens", "rounds", "scheduler CPU (s)"]


def repeat_lines(per_policy: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """--bench-repeat: every alternation's figures (ABBA order, a fresh server each) and the
    median of the per-alternation ratios vs stock."""
    if not any(e.get("repeats") for e in per_policy.values()):
        return []
    rows = []
    for policy, e in per_policy.items():
        for r in e.get("repeats", []):
            if r.get("failed"):
                err = str(r.get("error", ""))[:200].replace("|", "/")
                rows.append([policy, str(r["repeat"]), f"FAILED: {err}"] + ["-"] * 5)
                continue
            rows.append([policy, str(r["repeat"]), fmt(r["mean_e2e_latency_ms"], 1),
                         fmt(r["mean_ttft_ms"], 1), fmt(r["p99_e2e_latency_ms"], 1),
                         fmt(r["scheduled_tokens_sglang_log"]), fmt(r["rounds_sglang_log"]),
                         fmt(r.get("scheduler_cpu_s"), 2)])
    lines = ["Alternations (--bench-repeat, ABBA order, a fresh server each):", ""]
    lines += table(REPEAT_HEADERS, rows) + [""]
    for policy, e in per_policy.items():
        med = e.get("vs_stock_median")
        if med:
            lines.append(f"- {policy} vs stock, median over {len(e['vs_stock_repeats'])} "
                         "alternations: " + ", ".join(
                             f"{k} {_vs(med, k)}" for k in (
                                 "mean_e2e_latency_ms", "mean_ttft_ms", "scheduled_tokens",
                                 "rounds", "scheduler_cpu_s")))
    return lines + [""]


def bench_lines(config: Mapping[str, Any], bench: Mapping[str, Any]) -> list[str]:
    shape = config.get("bench_shape", {})
    lines = ["## bench_serving: SGLang's own benchmark client", "",
             "`python -m sglang.bench_serving --backend sglang --warmup-requests 0` against a "
             "fresh server per policy (eval/bench_arm.py); its benchmarks run in sequence on "
             "that server. Shape: " + ", ".join(f"{k}={v}" for k, v in shape.items()) + ". "
             "Scheduled tokens, rounds and cached tokens: SGLang's \"Prefill batch\" log "
             "lines during the benchmark; trace: the --radixflow-trace rounds in the same "
             "window (radixflow policies). / prefix once (gsp): scheduled tokens over groups x "
             "system + requests x question, the work of computing every shared prefix once. "
             "Latencies and throughput are bench_serving's (ms, client side).", ""]
    for name, per_policy in bench.items():
        lines += [f"### {name}", ""]
        lines += table(BENCH_HEADERS, bench_rows(per_policy)) + [""]
        lines += repeat_lines(per_policy)
        cmds = {p: e.get("command") for p, e in per_policy.items() if e.get("command")}
        lines += [f"- `{p}`: `{c}`" for p, c in cmds.items()] + [""]
    return lines


def render_markdown(config: Mapping[str, Any], arms: Mapping[str, LiveArm],
                    aud: Mapping[str, Any], total_wall_s: float,
                    bench: Mapping[str, Any] | None = None,
                    fork_aud: Mapping[str, Any] | None = None) -> str:
    cfg = ", ".join(f"{k}={v}" for k, v in config.items())
    lines = ["# Live arms report", "",
             "The workload replayed against a fresh real SGLang 0.5.23 HTTP server per arm "
             "(eval/run_arms.py, eval/client.py).", "", f"Config: `{cfg}`", ""]
    if config.get("executor") == "simulated":
        c = config.get("sim_cost", {})
        lines += [f"**No GPU: simulated executor, cost profile {c.get('profile')}.** Every "
                  f"forward sleeps c = {c.get('alpha'):.4g} s + {c.get('beta'):.4g} s/token + "
                  f"{c.get('gamma'):.4g} s/row ({c.get('source')}; radixflow_sglang/"
                  "profiles.py, RADIXFLOW_SIM_ALPHA/BETA/GAMMA override); latencies are that "
                  "cost model plus the "
                  "real server's overheads on this CPU, not GPU measurements. Generated tokens "
                  "are a deterministic function of the prompt ids.", ""]
    lines += ["## Arms (Table 1 style)", ""]
    lines += table(MAIN_HEADERS, main_rows(arms))
    lines += ["", "Latency = question send (pool slot) -> completion of its last branch "
              "(however many it has). reuse = hit / input tokens (hit = "
              "meta_info.cached_tokens). Rounds, rows/round, blocked come from the server's "
              "--radixflow-trace; the stock arm has no trace, so they are '-' (unknown) there "
              "and its scheduled tokens are prompt - cached.", ""]
    lines += prefill_lines(config, arms)
    forks = fork_arms(arms)
    if forks:
        lines += fork_lines(forks, fork_aud or {})
    if bench:
        lines += bench_lines(config, bench)
    lines += ["## Latency detail", ""]
    lines += table(LATENCY_HEADERS, latency_rows(arms)) + [""]
    regimes = sorted({reg for a in arms.values() if a.ok for reg in a.regime_metrics()})
    if regimes:
        lines += ["## Per regime (Table 4 style)", ""]
        for reg in regimes:
            lines += [f"### {reg}", ""]
            lines += table(MAIN_HEADERS, main_rows(
                arms, lambda r, reg=reg: r.regime_metrics().get(reg))) + [""]
    lines += ["## Rounds over the capacity bound", ""]
    lines += table(["arm", *CAP_HEADERS, "tokens conserved"], cap_rows(arms))
    lines += ["", "L_cap: eval/twin.py's bound on the workload's ids under the server's "
              "budgets. Leaks: 0 = SGLang's strict idle memory check passed after the replay. "
              "tokens conserved: the trace's scheduled tokens == prompt - cached tokens (the "
              "twin's conservation law; '-' without a trace).",
              "", "## Output agreement audit", ""]
    lines += audit_lines(aud)
    lines += ["## Not reported", "",
              "- Eq. 2 latency split and busy time: the trace has scan times, not forward "
              "durations (eval/calibrate.py estimates them from scan gaps).", ""]
    lines += ["## Wall time", ""]
    lines += [f"- {n}: {a.wall_s:.1f} s (replay {a.replay_wall_s:.1f} s)"
              + ("" if a.ok else f" FAILED: {a.error.splitlines()[0][:300]}")
              for n, a in arms.items()]
    lines += [f"- total: {total_wall_s:.1f} s", ""]
    return "\n".join(lines)


def _without_pairs(aud: Mapping[str, Any]) -> dict[str, Any]:
    return ({k: v for k, v in aud.items() if k != "arms"}
            | {"arms": {n: {k: v for k, v in a.items() if k != "pairs"}
                        for n, a in aud.get("arms", {}).items()}})


def write_outputs(out: Path, config: Mapping[str, Any], arms: Mapping[str, LiveArm],
                  total_wall_s: float, bench: Mapping[str, Any] | None = None,
                  ) -> dict[str, Any]:
    """summary.json ({"config", "arms", "audit"}, plus "audit_fork" with the fork arms and
    "bench" with the bench_serving runs), audit.json, timing.json, report.md."""
    aud = audit(arms)
    base = arms.get(BASELINE)
    forks = fork_arms(arms)
    summary = {"config": dict(config),
               "arms": {n: arm_summary(a, base) for n, a in arms.items()},
               "audit": _without_pairs(aud)}
    fork_aud = audit(forks, base=STOCK_FORK) if forks else None
    if fork_aud is not None:
        summary["audit_fork"] = _without_pairs(fork_aud)
        sf = forks[STOCK_FORK]
        for n, a in forks.items():
            if n != STOCK_FORK and a.ok and sf.ok:
                summary["arms"][n]["vs_stock_fork"] = fork_ratios(a.metrics, sf.metrics)
    if bench:
        summary["bench"] = dict(bench)
    (out / "summary.json").write_text(json.dumps(finite(summary), indent=1) + "\n")
    full = dict(aud) | ({"fork": fork_aud} if fork_aud is not None else {})
    (out / "audit.json").write_text(json.dumps(finite(full), indent=1, default=str) + "\n")
    timing = {n: {"wall_s": a.wall_s, "replay_wall_s": a.replay_wall_s} for n, a in arms.items()}
    if bench:
        timing["bench"] = {f"{b}/{p}": e.get("wall_s") for b, per in bench.items()
                           for p, e in per.items()}
    (out / "timing.json").write_text(json.dumps(timing | {"total_s": total_wall_s}, indent=1))
    (out / "report.md").write_text(
        render_markdown(config, arms, aud, total_wall_s, bench, fork_aud) + "\n")
    return summary
