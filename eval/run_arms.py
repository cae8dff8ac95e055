"""Live arms: the same workload trace replayed against a fresh real SGLang server per arm.

    python eval/run_arms.py --policies stock,radixflow --workload synthetic --questions 8 \\
        --rate 10 --out out/arms-small

Each arm starts its own server on 127.0.0.1 (log, trace and raw request records in
OUT/arm-NAME/), replays the workload through eval/client.py, waits for SGLang's idle memory
invariant check, and stops the server (SIGTERM to its process group). Arms:

* `stock`: untouched SGLang. On a GPU machine `python -m sglang.launch_server`; on CPU (stock
  SGLang needs CUDA) `python -m radixflow_sglang.launch_server --radixflow-policy stock`, i.e.
  SGLang's own unmodified Scheduler class with the simulated executor (`--stock-cmd`).
* every other policy: `python -m radixflow_sglang.launch_server --radixflow-policy P
  --radixflow-trace OUT/arm-P/trace.jsonl`.
* `radixflow-fork` (`--fork-arm`, default on): a radixflow server driven by the SGLang
  frontend (`sgl.function`, `s.fork(4)`, `sgl.gen(max_tokens=1)`); the frontend sends text, so
  the workload's ids are decoded with the model's tokenizer and re-tokenized by the server, and
  it cannot send `extra_key`, so the namespace is a "[namespace]" tag line opening the prompt.

Every arm gets the same server arguments and the same offered trace; arms are isolated by a
fresh server each and by per-arm cache namespaces (`extra_key`). A failed arm is recorded with
its error text and no numbers. Outputs: OUT/summary.json ({"config", "arms", "audit"}, the
twin's metric keys), OUT/report.md, OUT/audit.json.

On CPU every latency comes from the simulated executor's cost model (RADIXFLOW_SIM_ALPHA/BETA/
GAMMA) plus the real server's own overheads on this machine, and every generated token is the
simulated executor's deterministic function of the prompt ids: the output audit then checks
the plumbing (same prompt -> same token), not model numerics.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # NOTE: eval/ is a folder of scripts, run from anywhere

from eval import cli  # noqa: E402
from radixflow_sglang.core.policy import POLICIES  # noqa: E402
from radixflow_sglang.testing.server import (  # noqa: E402
    Server,
    ServerError,
    free_port,
    http_json,
)

EMBEDDED_MODEL_DIR = ROOT / "launch" / "models" / "qwen3.5-0.8b"
WORKLOAD_CHOICES = ("race", "quality", "mix", "synthetic")
REGIME_CHOICES = ("cold", "mixed", "reuse", "all")
ORDER_CHOICES = ("forward", "reverse", "both")
FORK_ARM = "radixflow-fork"
BASELINE = "stock"
# The launcher's embedded defaults (radixflow_sglang/launch_server.py embedded_args), applied
# to every arm so stock and ours see identical budgets.
BUDGET_ARGS = ("--context-length", "32768", "--max-running-requests", "16",
               "--chunked-prefill-size", "8192", "--max-prefill-tokens", "8192")
SIM_DEFAULTS = {"alpha": 0.005, "beta": 2e-6, "gamma": 1e-4}  # adapter/simulated.py CostModel


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="eval/run_arms.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, default=EMBEDDED_MODEL_DIR)
    p.add_argument("--policies", type=cli.policies, default=list(POLICIES),
                   help=f"comma-separated, from: {', '.join(POLICIES)} (default: all)")
    p.add_argument("--fork-arm", action=argparse.BooleanOptionalAction, default=True,
                   help="also run the SGLang frontend fork program against a radixflow server")
    p.add_argument("--workload", choices=WORKLOAD_CHOICES, default="mix")
    p.add_argument("--regime", choices=REGIME_CHOICES, default="all")
    p.add_argument("--order", choices=ORDER_CHOICES, default="both")
    p.add_argument("--questions", type=cli.positive(int), default=16, help="per segment")
    p.add_argument("--rate", type=cli.positive(float), default=5.0, help="questions/s (Poisson)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--port-base", type=int, default=None,
                   help="arm i listens on PORT_BASE + i (default: a free port per arm)")
    p.add_argument("--pool", type=cli.positive(int), default=64,
                   help="most questions in flight (the client's submission pool)")
    p.add_argument("--stock-cmd", choices=("sglang", "radixflow"), default=None,
                   help="stock arm launcher (default: sglang with a GPU, radixflow without)")
    p.add_argument("--overlap", action="store_true",
                   help="overlap scheduling (default off: --disable-overlap-schedule, as the "
                        "twin's default)")
    p.add_argument("--server-args", default="", help="extra SGLang args for every arm")
    p.add_argument("--start-timeout", type=cli.positive(float), default=600.0)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--no-progress", action="store_true")
    return p


# --------------------------------------------------------------------------------------------
# Servers
# --------------------------------------------------------------------------------------------


def budgets(info: Mapping[str, Any]) -> dict[str, int | None]:
    """Rows and tokens per round from /server_info (top level or its first internal state)."""
    states = info.get("internal_states") or [{}]

    def get(key: str) -> Any:
        return states[0].get(key, info.get(key))

    rows, chunk, prefill = (get("max_running_requests"), get("chunked_prefill_size"),
                            get("max_prefill_tokens"))
    tokens = min(prefill, chunk) if chunk and chunk > 0 and prefill else prefill or chunk
    return {"rows": rows, "tokens": tokens}


# --------------------------------------------------------------------------------------------
# Arms
# --------------------------------------------------------------------------------------------


@dataclass
class ArmSpec:
    name: str
    policy: str
    fork: bool = False  # drive it with the SGLang frontend program

    @property
    def traced(self) -> bool:
        return self.policy != BASELINE


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

    @property
    def ok(self) -> bool:
        return self.error is None

    def regime_metrics(self) -> dict[str, dict[str, Any]]:
        return (self.metrics or {}).get("per_regime", {})


def arm_specs(policies: Sequence[str], fork_arm: bool) -> list[ArmSpec]:
    specs = [ArmSpec(p, p) for p in policies]
    if fork_arm:
        specs.append(ArmSpec(FORK_ARM, "radixflow", fork=True))
    return specs


def ensure_tokenizer(model_dir: Path) -> None:
    if not (model_dir / "tokenizer.json").exists():
        subprocess.run([sys.executable, str(ROOT / "launch" / "build_tokenizer.py"), "--ensure",
                        str(model_dir)], cwd=ROOT, check=True, timeout=600)


def model_args(model_dir: Path) -> list[str]:
    args = ["--model-path", str(model_dir)]
    weights = [*model_dir.glob("*.safetensors"), *model_dir.glob("*.bin")]
    if not weights:
        args += ["--load-format", "dummy"]
    return args + list(BUDGET_ARGS)


def server_cmd(spec: ArmSpec, stock_cmd: str, common: list[str], trace: Path) -> list[str]:
    py = sys.executable
    if spec.policy == BASELINE:
        if stock_cmd == "sglang":
            return [py, "-m", "sglang.launch_server", *common]
        return [py, "-m", "radixflow_sglang.launch_server", "--radixflow-policy", "stock",
                *common]
    return [py, "-m", "radixflow_sglang.launch_server", "--radixflow-policy", spec.policy,
            "--radixflow-trace", str(trace), *common]


def server_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE="1")
    for key in ("RADIXFLOW_POLICY", "RADIXFLOW_TRACE"):
        env.pop(key, None)
    return env


def l_caps(segments, bud: Mapping[str, int | None]) -> dict[str, int]:
    """The twin's capacity bound per segment under the server's budgets (workload ids)."""
    from eval.twin import capacity_bound

    if not bud.get("rows") or not bud.get("tokens"):
        return {}
    return {s.name: capacity_bound(s, bud["rows"], bud["tokens"])[0] for s in segments}


def make_sender(spec: ArmSpec, base: str, pool: int, model: str):
    from eval import client

    if spec.fork:
        from eval.workload import get_tokenizer

        return client.ForkSender(base, get_tokenizer(model).decode,
                                 namespace_prefix=f"{spec.name}/")
    return client.GenerateSender(base, pool=pool, namespace_prefix=f"{spec.name}/",
                                 rid_prefix=f"{spec.name}/")


def run_arm(spec: ArmSpec, segments, cfg: argparse.Namespace, common: list[str],
            port: int) -> LiveArm:
    from eval import client

    arm_dir = cfg.out / f"arm-{spec.name}"
    arm_dir.mkdir(parents=True, exist_ok=True)
    trace_path, raw_path = arm_dir / "trace.jsonl", arm_dir / "requests.jsonl"
    for p in (trace_path, raw_path):
        p.unlink(missing_ok=True)
    cmd = server_cmd(spec, cfg.stock_cmd, [*common, "--port", str(port)], trace_path)
    arm = LiveArm(spec.name, command=shlex.join(cmd))
    t0 = time.perf_counter()
    try:
        with Server(cmd, server_env(), arm_dir / "server.log", port, cwd=ROOT) as srv:
            srv.wait_ready(cfg.start_timeout)
            info = http_json(srv.base + "/server_info")
            (arm_dir / "server_info.json").write_text(json.dumps(info, indent=1, default=str))
            sender = make_sender(spec, srv.base, cfg.pool, cfg.model)
            log_mark = prefill_log_lines(arm_dir / "server.log")
            try:
                res = client.replay(segments, sender, pool=cfg.pool, raw_path=raw_path,
                                    progress=not cfg.no_progress, desc=spec.name)
            finally:
                sender.close()
            arm.replay_wall_s = res.wall_s
            batches = prefill_log_lines(arm_dir / "server.log")[len(log_mark):]
            leaks = srv.idle_leak_check()
        arm.records = client.read_jsonl(raw_path)
        trace = client.load_trace(trace_path) if spec.traced else None
        if spec.traced and trace is None:
            raise ServerError(f"no trace written at {trace_path}")
        bud = budgets(info)
        arm.metrics = client.summarize(arm.records, trace, leaks=leaks,
                                       l_caps=l_caps(segments, bud), budgets=bud)
        add_log_rounds(arm.metrics, batches)
    except Exception as e:  # noqa: BLE001 - the arm fails with its error, never filled in
        arm.error_detail = f"{type(e).__name__}: {e}"
        arm.error = " ".join(arm.error_detail.split())[:2000]  # one line: it goes in tables
        if raw_path.exists() and not arm.records:
            arm.records = client.read_jsonl(raw_path)
    arm.wall_s = time.perf_counter() - t0
    return arm


PREFILL_LINE = re.compile(
    r"Prefill batch, #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+)")


def prefill_log_lines(log: Path) -> list[tuple[int, int, int]]:
    """SGLang's own per-batch log line (SchedulerMetricsReporter.report_prefill_stats), one per
    prefill round, written by every arm including untouched stock: (rows, new, cached)."""
    if not log.exists():
        return []
    return [tuple(map(int, m.groups())) for m in PREFILL_LINE.finditer(log.read_text())]


def add_log_rounds(metrics: dict[str, Any], batches: list[tuple[int, int, int]]) -> None:
    """Rounds seen in SGLang's log during the replay; they stand in for the trace's where an
    arm has no trace (stock), and cross-check it where it has one."""
    metrics["rounds_sglang_log"] = len(batches)
    metrics["scheduled_tokens_sglang_log"] = sum(b[1] for b in batches)
    if metrics.get("rounds") is None and batches:
        metrics["rounds"] = len(batches)
        metrics["rows_per_round"] = sum(b[0] for b in batches) / len(batches)
        metrics["tokens_per_round"] = sum(b[1] for b in batches) / len(batches)
        metrics["rounds_source"] = "sglang log"


# --------------------------------------------------------------------------------------------
# Output-agreement audit
# --------------------------------------------------------------------------------------------


def _first_token(r: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[Any, Any, str]:
    if r.get("output_ids") and b.get("output_ids"):
        return r["output_ids"][0], b["output_ids"][0], "token id"
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
        mine, theirs, kind = _first_token(r, b)
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
    """Exact first-token comparison per branch against the stock arm; differing pairs kept."""
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
    from eval import report

    if not arm.ok:
        return {"failed": True, "error": arm.error, "error_detail": arm.error_detail,
                "command": arm.command}
    out = dict(arm.metrics or {})
    out["command"] = arm.command
    out["wall_s"] = arm.wall_s
    out["replay_wall_s"] = arm.replay_wall_s
    if base is not None and base.ok and base is not arm:
        out["vs_stock"] = report.ratios(arm.metrics, base.metrics)
    return out


def _latency_rows(arms: Mapping[str, LiveArm]) -> list[list[str]]:
    from eval.report import _fmt

    rows = []
    for name, a in arms.items():
        if not a.ok:
            continue
        m = a.metrics
        rows.append([name, _fmt(m["latency_mean_s"]), _fmt(m["latency_p50_s"]),
                     _fmt(m["latency_p95_s"]), _fmt(m["latency_p99_s"]),
                     _fmt(m["offered_latency_mean_s"]), _fmt(m["offered_latency_p95_s"]),
                     _fmt(m["sender_lag_mean_s"], 4), _fmt(m["sender_lag_max_s"], 4),
                     _fmt(m["first_selection_mean_s"], 4), _fmt(m["hit_tokens"]),
                     _fmt(m["input_tokens"]), m["counters"]])
    return rows


LATENCY_HEADERS = ["arm", "lat mean (s)", "p50", "p95", "p99", "offered lat mean (s)",
                   "offered p95", "sender lag mean (s)", "lag max", "first sel. mean (s)",
                   "hit tokens", "input tokens", "counters from"]


def _cap_rows(arms: Mapping[str, LiveArm]) -> list[list[str]]:
    from eval.report import _fmt

    rows = []
    for name, a in arms.items():
        if a.ok:
            m = a.metrics
            rows.append([name, _fmt(m["rounds"]), _fmt(m["l_cap"]),
                         _fmt(m["rounds_over_l_cap"], 2), _fmt(m["tokens_per_round"], 0),
                         _fmt(m["parked_max_rounds"]), _fmt(m["leaked_kv_slots"]),
                         _fmt(m["leaked_mamba_slots"]), _fmt(m["tokens_conserved"])])
    return rows


def _audit_lines(aud: Mapping[str, Any]) -> list[str]:
    from eval.report import _table

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
    lines = _table(["arm", "compared", "agreed", "differing", "missing", "prompt length differs",
                    "compared by"], rows)
    lines += ["", "Exact first generated token per branch vs the stock arm (token id when both "
              "have output_ids, else the text the frontend returns). Differing pairs are all "
              "in audit.json. The fork arm's prompts are re-tokenized text, so its prompt "
              "lengths (and, with the simulated executor, its tokens) can differ by "
              "construction.", ""]
    return lines


def render_markdown(config: Mapping[str, Any], arms: Mapping[str, LiveArm],
                    aud: Mapping[str, Any], total_wall_s: float) -> str:
    from eval.report import MAIN_HEADERS, _main_rows, _table

    cfg = ", ".join(f"{k}={v}" for k, v in config.items())
    lines = ["# Live arms report", "",
             "The workload replayed against a fresh real SGLang 0.5.23 HTTP server per arm "
             "(eval/run_arms.py, eval/client.py).", "", f"Config: `{cfg}`", ""]
    if config.get("executor") == "simulated":
        c = config.get("sim_cost", {})
        lines += [f"**No GPU: simulated executor.** Every forward sleeps c = {c.get('alpha')} s "
                  f"+ {c.get('beta')} s/token + {c.get('gamma')} s/row "
                  "(RADIXFLOW_SIM_ALPHA/BETA/GAMMA); latencies are that cost model plus the "
                  "real server's overheads on this CPU, not GPU measurements. Generated tokens "
                  "are a deterministic function of the prompt ids.", ""]
    lines += ["## Arms (Table 1 style)", ""]
    lines += _table(MAIN_HEADERS, _main_rows(arms))
    lines += ["", "Latency = question send (pool slot) -> completion of its 4th branch. reuse = "
              "hit / input tokens (hit = meta_info.cached_tokens). Rounds, rows/round, blocked "
              "come from the server's --radixflow-trace; the stock arm has no trace, so they "
              "are '-' (unknown) there and its scheduled tokens are prompt - cached.", ""]
    lines += ["## Latency detail", ""]
    lines += _table(LATENCY_HEADERS, _latency_rows(arms)) + [""]
    regimes = sorted({reg for a in arms.values() if a.ok for reg in a.regime_metrics()})
    if regimes:
        lines += ["## Per regime (Table 4 style)", ""]
        for reg in regimes:
            lines += [f"### {reg}", ""]
            lines += _table(MAIN_HEADERS, _main_rows(
                arms, lambda r, reg=reg: r.regime_metrics().get(reg))) + [""]
    lines += ["## Rounds over the capacity bound", ""]
    lines += _table(["arm", "rounds", "L_cap", "rounds / L_cap", "tokens/round",
                     "parked max rounds", "leaked KV", "leaked mamba", "tokens conserved"],
                    _cap_rows(arms))
    lines += ["", "L_cap: eval/twin.py's bound on the workload's ids under the server's "
              "budgets. Leaks: 0 = SGLang's strict idle memory check passed after the replay. "
              "tokens conserved: the trace's scheduled tokens == prompt - cached tokens (the "
              "twin's conservation law; '-' without a trace).",
              "", "## Output agreement audit", ""]
    lines += _audit_lines(aud)
    lines += ["## Not reported", "",
              "- Eq. 2 latency split and busy time: the trace has scan times, not forward "
              "durations (eval/calibrate.py estimates them from scan gaps).", ""]
    lines += ["## Wall time", ""]
    lines += [f"- {n}: {a.wall_s:.1f} s (replay {a.replay_wall_s:.1f} s)"
              + ("" if a.ok else f" FAILED: {a.error.splitlines()[0][:300]}")
              for n, a in arms.items()]
    lines += [f"- total: {total_wall_s:.1f} s", ""]
    return "\n".join(lines)


def write_outputs(out: Path, config: Mapping[str, Any], arms: Mapping[str, LiveArm],
                  total_wall_s: float) -> dict[str, Any]:
    from eval.report import _finite

    aud = audit(arms)
    base = arms.get(BASELINE)
    summary = {"config": dict(config),
               "arms": {n: arm_summary(a, base) for n, a in arms.items()},
               "audit": {k: v for k, v in aud.items() if k != "arms"}
               | {"arms": {n: {k: v for k, v in a.items() if k != "pairs"}
                           for n, a in aud.get("arms", {}).items()}}}
    (out / "summary.json").write_text(json.dumps(_finite(summary), indent=1) + "\n")
    (out / "audit.json").write_text(json.dumps(_finite(aud), indent=1, default=str) + "\n")
    timing = {n: {"wall_s": a.wall_s, "replay_wall_s": a.replay_wall_s} for n, a in arms.items()}
    (out / "timing.json").write_text(json.dumps(timing | {"total_s": total_wall_s}, indent=1))
    (out / "report.md").write_text(render_markdown(config, arms, aud, total_wall_s) + "\n")
    return summary


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def gpu_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch, no GPU
        return False


def sim_cost() -> dict[str, float]:
    env = {"alpha": "RADIXFLOW_SIM_ALPHA", "beta": "RADIXFLOW_SIM_BETA",
           "gamma": "RADIXFLOW_SIM_GAMMA"}
    return {k: float(os.environ[v]) if os.environ.get(v) else SIM_DEFAULTS[k]
            for k, v in env.items()}


def make_config(args: argparse.Namespace, gpu: bool, common: list[str]) -> dict[str, Any]:
    cfg = {"workload": args.workload, "model": args.model, "model_dir": str(args.model_dir),
           "policies": args.policies, "fork_arm": args.fork_arm, "regime": args.regime,
           "order": args.order, "rate": args.rate, "questions": args.questions,
           "seed": args.seed, "pool": args.pool, "overlap": args.overlap,
           "stock_cmd": args.stock_cmd, "executor": "model" if gpu else "simulated",
           "server_args": shlex.join(common), "data_dir": args.data_dir}
    if not gpu:
        cfg["sim_cost"] = sim_cost()
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from eval.workload import workload

    args.model = args.model_dir.name
    args.model_dir = args.model_dir.resolve()
    gpu = gpu_available()
    args.stock_cmd = args.stock_cmd or ("sglang" if gpu else "radixflow")
    try:
        segments = workload(args.workload, args.model, regime=args.regime, order=args.order,
                            questions=args.questions, rate=args.rate, seed=args.seed,
                            data_dir=args.data_dir)
        ensure_tokenizer(args.model_dir)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        print(f"eval/run_arms.py: error: cannot build the workload: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    common = [*model_args(args.model_dir), "--host", "127.0.0.1"]
    common += [] if args.overlap else ["--disable-overlap-schedule"]
    common += shlex.split(args.server_args)
    config = make_config(args, gpu, common)
    t0 = time.perf_counter()
    arms: dict[str, LiveArm] = {}
    for i, spec in enumerate(arm_specs(args.policies, args.fork_arm)):
        port = args.port_base + i if args.port_base is not None else free_port()
        arm = arms[spec.name] = run_arm(spec, segments, args, common, port)
        _print_arm(arm)
    total = time.perf_counter() - t0
    write_outputs(args.out, config, arms, total)
    print(f"wrote {args.out}/summary.json and {args.out}/report.md ({total:.1f}s wall)",
          file=sys.stderr)
    return 0 if all(a.ok for a in arms.values()) else 1


def _print_arm(arm: LiveArm) -> None:
    if arm.ok:
        m = arm.metrics
        print(f"[{arm.name}] rounds={m['rounds']} sched={m['scheduled_tokens']} "
              f"hit={m['hit_tokens']} lat_mean={m['latency_mean_s']:.4f}s "
              f"p95={m['latency_p95_s']:.4f}s ({arm.wall_s:.1f}s wall)", file=sys.stderr)
    else:
        print(f"[{arm.name}] FAILED: {arm.error_detail}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
