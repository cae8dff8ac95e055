"""Live A/B harness (issue 36): stock vs radixflow servers on this box, ABBA x N per workload.

    python -m eval.live_ab --workloads gsp-burst,gsp-paced --repeat 3 --out out/ab

For each workload of `--workloads` it runs a stock and a radixflow server `--repeat` times in
ABBA order (stock, radixflow, radixflow, stock, ...; each run a fresh server, so no run sees
another's cache and a drift in the machine's load weighs on both arms alike), then writes the
medians, the median paired ratio radixflow/stock with a bootstrap 95 % interval
(eval/ab_report.py), the twin's prediction of the same ratios and its distance from the live
one, OUT/summary.json, OUT/report.md and OUT/plot-WORKLOAD.png. It is a layer on
eval/run_arms.py: a bench_serving workload is its `run_bench_policy`, a client one its
`run_arm`, with their server commands, logs, traces and idle leak checks (per run under
OUT/WORKLOAD/).

Workloads:
* `gsp-burst`, `gsp-paced`: SGLang's `bench_serving --dataset-name generated-shared-prefix`
  (eval/bench_arm.py; --gsp-* shape, --output-len), all at once or Poisson at --paced-rate
  requests/s.
* `mooncake`: bench_serving's mooncake dataset on --trace-file (its first N records of
  --trace-window 0:N, --trace-speed compresses the timestamps; bench_serving's own text prompts).
* `trace`: the same trace through the project's client with the twin's exact block mapping
  (eval/mooncake.py; every --trace-* flag).
* `paper`: the paper's four-branch workload (--paper-workload, --questions, --regime, --order,
  --paper-rate) through the project's client.
* `fork`: the same paper workload as SGLang frontend `s.fork(4)` programs (arms stock-fork and
  radixflow-fork; no twin: the server re-tokenizes the frontend's text).
* `sibling-after-completion` (issue 51): eval/traffic.py's shape through the project's client,
  no boundary declared: per group one sibling alone, then, once it completed, the rest together
  (--sibling-rate groups/s).
* `noshare`: eval/traffic.py's independent prompts (64 x 2,112 tokens, 4 out, 4 req/s) through
  the project's client: nothing to share, so radixflow can only cost.

`--lpm` (default on) adds a third arm to every workload but fork: `stock-lpm`, SGLang's own
scheduler with `--schedule-policy lpm`, in the ABBA order (stock, radixflow, stock-lpm,
stock-lpm, radixflow, stock, ...), its ratios to stock paired by repetition and its twin beside
the live ones. `--profiles box,paper` runs everything at each simulated-executor cost profile
(radixflow_sglang/profiles.py), OUT/profile-NAME/ each, and OUT/profiles.md side by side.

Per run it records the host's load (os.getloadavg and the CPUs before and after, and the CPUs'
busy share sampled over 2 s before it: the 1-min load still counts the previous run's server);
a busy share above --busy-fraction before a run prints a warning on stderr and in report.md:
the box is busy and that run's latencies are unreliable.

The twin (`--twin`, default on), after every live run: each workload's stock and radixflow
replayed through eval/twin.py (the workload's own requests: the same gsp shape and rate, the
trace's blocks, bench_serving's mooncake prompts re-built by eval/mooncake.py bench_segments),
with two cost models: `default` (the simulated executor's, or on a GPU the model's first-
principles one; free scans), `scans` (the same, each scan charged the CPU time it took here:
the traversal's visits cost the live server what they cost the twin's kit) and `calibrated`
(eval/calibrate.py fitted on the first radixflow run's trace: alpha then holds the live
round's whole wall cost, host work included; a decode step is charged the same alpha;
skipped, with the reason, where the trace does not pin the model down) and, for a
bench_serving workload, `replay` (eval/livetwin.py: the default on the live radixflow run's
registration stamps as arrivals, a burst's latencies counted from the send, the scans
charged by eval/hostcost.py's `model`, and every loop iteration charged what the live stock
decode period exceeds the twin's by).
A bench_serving workload's twin declares no boundary (bench_serving sends none: the server
learns them). Server flags pass through (--server-args, --overlap), so no_buffer vs
extra_buffer is two invocations.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from eval import ab_report, bench_arm, cli, run_arms
from eval.ab_report import ARMS, LPM, RunRecord
from eval.hostcost import host_model
from eval.replay import PAPER_WORKLOADS, add_trace_args
from eval.traffic import SIBLING
from radixflow_sglang import models
from radixflow_sglang.profiles import DEFAULT_PROFILE, PROFILES
from radixflow_sglang.testing.server import START_ATTEMPTS, free_port

CLIENT_TRAFFIC = (SIBLING, "noshare")  # eval/traffic.py shapes sent by the project's client
WORKLOADS = ("gsp-burst", "gsp-paced", "mooncake", "trace", "paper", "fork", *CLIENT_TRAFFIC)
BENCH_OF = {"gsp-burst": "gsp", "gsp-paced": "gsp", "mooncake": "mooncake"}
TRACE_WORKLOADS = ("mooncake", "trace")
TRACE_FLAGS = ("trace_file", "trace_speed", "trace_window", "trace_max_input",
               "trace_max_output")
PAPER_FLAGS = ("paper_workload", "questions", "regime", "order", "paper_rate")


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------


workloads = cli.comma_choices(WORKLOADS)  # `--workloads`
LOAD_SAMPLE_S = 2.0  # the CPUs' busy share is sampled this long before each run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.live_ab",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", type=workloads, default=["gsp-burst", "gsp-paced"],
                   help=f"comma-separated, from: {', '.join(WORKLOADS)} (default: "
                        "gsp-burst,gsp-paced)")
    p.add_argument("--repeat", type=cli.positive(int), default=3,
                   help="ABBA repetitions per workload, each a stock and a radixflow run "
                        "(default: %(default)s)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", choices=models.names(), default=models.DEFAULT)
    p.add_argument("--model-dir", type=Path, default=None,
                   help="serve this directory instead (default: the model's dummy-weight dir)")
    p.add_argument("--overlap", action="store_true",
                   help="overlap scheduling (default off: --disable-overlap-schedule; "
                        "no_buffer needs it off)")
    p.add_argument("--server-args", default="",
                   help="extra SGLang args for both servers, e.g. \"--mamba-radix-cache-"
                        "strategy extra_buffer\"")
    p.add_argument("--stock-cmd", choices=("sglang", "radixflow"), default=None,
                   help="stock launcher (default: sglang with a GPU, radixflow without)")
    p.add_argument("--start-timeout", type=cli.positive(float), default=600.0)
    p.add_argument("--start-attempts", type=cli.positive(int), default=START_ATTEMPTS)
    p.add_argument("--bench-timeout", type=cli.positive(float),
                   default=bench_arm.BENCH_TIMEOUT_S, help="seconds per bench_serving run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pool", type=cli.positive(int), default=64,
                   help="the project's client: most questions in flight")
    p.add_argument("--twin", action=argparse.BooleanOptionalAction, default=True,
                   help="the twin's predicted ratios next to the live ones (default on)")
    p.add_argument("--busy-fraction", type=cli.positive(float), default=ab_report.BUSY_FRACTION,
                   help="warn when the CPUs are busier than this share before a run "
                        "(default: %(default)s)")
    p.add_argument("--bootstrap", type=cli.positive(int), default=ab_report.BOOTSTRAP,
                   help="bootstrap resamples (default: %(default)s)")
    p.add_argument("--progress", action="store_true", help="the client's progress bars")
    p.add_argument("--twin-front-end", type=run_arms.twin_front_end_choice, default="live",
                   metavar="live|off|fitted|C_MS,A_MS,B_US[,JITTER_MS[,BACK_MS]]",
                   help="the twins' front end for client workloads (eval.run_arms "
                        "--twin-front-end; live, the default, fits it on each workload's first "
                        "radixflow run)")
    p.add_argument("--lpm", action=argparse.BooleanOptionalAction, default=True,
                   help=f"a {LPM} arm (SGLang's scheduler with --schedule-policy lpm) beside "
                        "stock and radixflow in every workload but fork (default on)")
    p.add_argument("--profiles", type=cli.comma_choices(PROFILES), default=None,
                   help="simulated executor cost profiles, comma-separated from: "
                        f"{', '.join(PROFILES)}; each runs every workload, OUT/profile-NAME/ "
                        "each, OUT/profiles.md side by side (default: $RADIXFLOW_SIM_PROFILE "
                        "or box, written to OUT)")
    p.add_argument("--sibling-rate", type=cli.positive(float), default=None,
                   help=f"{SIBLING}: groups/s, Poisson (default: eval/traffic.py's, 2)")
    d = bench_arm.BenchShape()
    g = p.add_argument_group("gsp-burst / gsp-paced (bench_serving generated-shared-prefix)")
    g.add_argument("--gsp-groups", type=cli.positive(int), default=d.groups)
    g.add_argument("--gsp-prompts-per-group", type=cli.positive(int), default=d.prompts_per_group)
    g.add_argument("--gsp-system-len", type=cli.positive(int), default=d.system_len)
    g.add_argument("--gsp-question-len", type=cli.positive(int), default=d.question_len)
    g.add_argument("--output-len", type=cli.positive(int), default=16,
                   help="generated tokens per gsp request (default: %(default)s)")
    g.add_argument("--paced-rate", type=cli.positive(float), default=8.0,
                   help="gsp-paced: requests/s, Poisson (default: %(default)s)")
    g = p.add_argument_group("paper / fork (the four-branch workload)")
    g.add_argument("--paper-workload", choices=PAPER_WORKLOADS, default=None,
                   help="default synthetic (no data files)")
    g.add_argument("--questions", type=cli.positive(int), default=None,
                   help="per segment (default 8)")
    g.add_argument("--regime", choices=run_arms.REGIME_CHOICES, default=None,
                   help="default all")
    g.add_argument("--order", choices=run_arms.ORDER_CHOICES, default=None,
                   help="default forward")
    g.add_argument("--paper-rate", type=cli.positive(float), default=None,
                   help="questions/s, Poisson (default 5)")
    g.add_argument("--data-dir", default=None)
    add_trace_args(p)
    return p


PAPER_DEFAULTS = {"paper_workload": "synthetic", "questions": 8, "regime": "all",
                  "order": "forward", "paper_rate": 5.0}


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Flags a listed workload does not take are errors naming the flag; the trace spec."""
    cli.check_overlap(p, args.overlap, args.server_args)
    chosen = set(args.workloads)
    if not chosen & set(TRACE_WORKLOADS):
        given = [k for k in TRACE_FLAGS if getattr(args, k) is not None]
        if given:
            p.error(f"--{given[0].replace('_', '-')} applies to the workloads "
                    f"{', '.join(TRACE_WORKLOADS)} only (--workloads {','.join(args.workloads)})")
    if not chosen & {"paper", "fork"}:
        given = [k for k in PAPER_FLAGS if getattr(args, k) is not None]
        if given:
            p.error(f"--{given[0].replace('_', '-')} applies to the workloads paper, fork only "
                    f"(--workloads {','.join(args.workloads)})")
    if args.sibling_rate is not None and SIBLING not in chosen:
        p.error(f"--sibling-rate applies to the workload {SIBLING} only "
                f"(--workloads {','.join(args.workloads)})")
    for k, v in PAPER_DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    args.trace_spec = trace_spec(p, args) if chosen & set(TRACE_WORKLOADS) else None
    if "mooncake" in chosen and args.trace_spec.start != 0:
        p.error("--trace-window: the mooncake workload (bench_serving) reads the file's first "
                f"N records; use 0:N, not {args.trace_window}")


def trace_spec(p: argparse.ArgumentParser, args: argparse.Namespace):
    from eval import mooncake

    if args.trace_file is None:
        p.error(f"--workloads {','.join(w for w in args.workloads if w in TRACE_WORKLOADS)} "
                "needs --trace-file FILE (Mooncake-format JSONL)")
    kw = {"file": args.trace_file, "speed": args.trace_speed,
          "max_input": args.trace_max_input, "max_output": args.trace_max_output}
    try:
        if args.trace_window is not None:
            kw["start"], kw["count"] = mooncake.parse_window(args.trace_window)
        spec = mooncake.TraceSpec(**{k: v for k, v in kw.items() if v is not None})
        mooncake.describe(spec)  # NOTE: reads the file: a bad record fails here, named
    except (OSError, ValueError) as e:
        p.error(str(e))
    return spec


# --------------------------------------------------------------------------------------------
# Workloads
# --------------------------------------------------------------------------------------------


@dataclass
class Workload:
    """One workload: a bench_serving dataset (`bench`) or the client's segments, and what the
    twin replays for it (None: no twin, `twin_note` says why)."""

    name: str
    describe: str
    arms: tuple[str, ...] = ARMS  # ABBA order of the arms (--lpm adds stock-lpm)
    bench: str | None = None
    shape: bench_arm.BenchShape | None = None
    segments: Any = None  # what the project's client sends
    specs: dict[str, run_arms.ArmSpec] | None = None  # arm -> spec (client workloads)
    twin_segments: Callable[[], Any] | None = None
    twin_note: str = ""
    # NOTE: the same segments with every fork declared (gsp): the replay twin's bound, what
    # radixflow would do on the same arrivals and loop time knowing every fork from the start
    twin_declared: Callable[[], Any] | None = None
    release_lag_s: float | None = None  # the box run's measured release lag (client_release_lag)


def gsp_shape(args: argparse.Namespace, rate: float) -> bench_arm.BenchShape:
    return bench_arm.BenchShape(args.gsp_groups, args.gsp_prompts_per_group, args.gsp_system_len,
                                args.gsp_question_len, args.output_len, rate, args.seed)


def gsp_twin(args: argparse.Namespace, shape: bench_arm.BenchShape,
             declared: bool = False) -> Callable[[], Any]:
    """The twin's gsp: the same shape and rate (its own prompts and Poisson draws), with no
    declared boundary: bench_serving sends none, so the live server learns them (`declared`:
    every fork declared, the bound of what learning them could reach)."""
    from eval.requests import undeclared
    from eval.workload import workload

    keys = ("groups", "prompts_per_group", "system_len", "question_len", "output_len")

    def segments():
        segs = workload("gsp", args.model, rate=shape.rate, seed=args.seed,
                        **{k: getattr(shape, k) for k in keys})
        return segs if declared else undeclared(segs)

    return segments


def make_workload(name: str, args: argparse.Namespace) -> Workload:
    """The workload with its arms: stock, radixflow and (--lpm, not fork) stock-lpm."""
    w = _workload(name, args)
    if args.lpm and name != "fork":
        w.arms = (*ARMS, LPM)
        if w.specs is not None:
            w.specs[LPM] = run_arms.ArmSpec.of(LPM)
    return w


def _workload(name: str, args: argparse.Namespace) -> Workload:
    ids = {a: run_arms.ArmSpec.of(a) for a in ARMS}
    if name in CLIENT_TRAFFIC:
        return traffic_workload(name, args, ids)
    if name in ("gsp-burst", "gsp-paced"):
        rate = math.inf if name == "gsp-burst" else args.paced_rate
        shape = gsp_shape(args, rate)
        return Workload(name, f"bench_serving gsp: {shape.groups} groups x "
                        f"{shape.prompts_per_group}, {shape.system_len} + {shape.question_len} "
                        f"tokens, {shape.output_len} out, "
                        + ("burst" if math.isinf(rate) else f"{rate:g} req/s Poisson"),
                        bench="gsp", shape=shape, twin_segments=gsp_twin(args, shape),
                        twin_declared=gsp_twin(args, shape, declared=True))
    spec = args.trace_spec
    if name == "mooncake":
        shape = replace(gsp_shape(args, math.inf), trace_file=spec.file,
                        trace_count=spec.count, trace_speed=spec.speed)
        return Workload(name, f"bench_serving mooncake: {spec.file}, first "
                        f"{shape.requests_of('mooncake')} records, speed {spec.speed:g}",
                        bench="mooncake", shape=shape,
                        twin_segments=lambda: mooncake_twin(spec, args.model_dir))
    if name == "trace":
        segs = paper_args(args, "trace").segments()
        return Workload(name, f"trace via the project's client: {spec.file} window "
                        f"{args.trace_window or '0:'}, speed {spec.speed:g}",
                        segments=segs, specs=ids, twin_segments=lambda: segs)
    segs = paper_args(args, args.paper_workload).segments()
    what = (f"{args.paper_workload}, {args.questions} questions per segment, regime "
            f"{args.regime}, order {args.order}, {args.paper_rate:g} questions/s")
    if name == "paper":
        return Workload(name, f"paper replay via the project's client: {what}", segments=segs,
                        specs=ids, twin_segments=lambda: segs)
    forks = {a: run_arms.ArmSpec(n, pol, fork=True)
             for a, (n, pol) in zip(ARMS, run_arms.FORK_ARMS, strict=True)}
    return Workload(name, f"frontend fork(4) programs: {what}", segments=segs, specs=forks,
                    twin_note="none: the server re-tokenizes the frontend's text, so the "
                              "twin's ids are not what it saw")


def traffic_workload(name: str, args: argparse.Namespace,
                     ids: dict[str, run_arms.ArmSpec]) -> Workload:
    """An eval/traffic.py workload at its default shape through the project's client."""
    from eval.traffic import describe
    from eval.workload import workload

    rate = args.sibling_rate if name == SIBLING else None
    segs = workload(name, args.model, rate=rate, seed=args.seed)
    d = describe(name, args.seed, rate)
    what = ", ".join(f"{k} {v}" for k, v in d.items() if k not in ("workload", "seed"))
    return Workload(name, f"{name} via the project's client ({what}; no boundary declared)",
                    segments=segs, specs=ids, twin_segments=lambda: segs)


@dataclass
class _SegArgs:
    """What eval/run_arms.py build_segments reads."""

    workload: str
    model: str
    regime: str | None
    order: str | None
    questions: int | None
    rate: float | None
    seed: int
    data_dir: str | None
    trace_spec: Any

    def segments(self):
        return run_arms.build_segments(self, {})


def paper_args(args: argparse.Namespace, workload: str) -> _SegArgs:
    return _SegArgs(workload, args.model, args.regime, args.order, args.questions,
                    args.paper_rate, args.seed, args.data_dir, args.trace_spec)


def mooncake_twin(spec, model_dir: Path):
    """bench_serving's mooncake prompts, tokenized as bench_serving's tokenizer does."""
    from sglang.benchmark.utils import get_tokenizer

    from eval.mooncake import bench_segments

    return bench_segments(spec, get_tokenizer(str(model_dir)))


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


def run_config(args: argparse.Namespace, out: Path, bench: str | None) -> argparse.Namespace:
    """The namespace eval/run_arms.py's run_bench_policy / run_arm read."""
    return argparse.Namespace(
        out=out, bench=[bench] if bench else [], stock_cmd=args.stock_cmd,
        start_timeout=args.start_timeout, start_attempts=args.start_attempts,
        model_dir=args.model_dir, bench_timeout=args.bench_timeout, pool=args.pool,
        model=args.model, n_param=False, no_progress=not args.progress,
        sim_profile=getattr(args, "sim_profile", None))


def bench_figures(run: bench_arm.BenchRun) -> dict[str, float | None]:
    r, s = run.result or {}, run.server or {}
    return {"mean_e2e_ms": r.get("mean_e2e_latency_ms"), "p99_e2e_ms": r.get("p99_e2e_latency_ms"),
            "mean_ttft_ms": r.get("mean_ttft_ms"),
            "prefill_tokens": s.get("scheduled_tokens_sglang_log"),
            "prefill_batches": s.get("rounds_sglang_log"),
            "sched_cpu_ms": _ms(s.get("scheduler_cpu_s"))}


def arm_figures(metrics: dict[str, Any]) -> dict[str, float | None]:
    """The client's figures: latency per question (a gsp / trace request is one), no TTFT."""
    return {"mean_e2e_ms": _ms(metrics.get("latency_mean_s")),
            "p99_e2e_ms": _ms(metrics.get("latency_p99_s")),
            "mean_ttft_ms": None, "prefill_tokens": metrics.get("scheduled_tokens_sglang_log"),
            "prefill_batches": metrics.get("rounds_sglang_log"),
            "sched_cpu_ms": _ms(metrics.get("scheduler_cpu_s"))}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def run_one(w: Workload, arm: str, k: int, args: argparse.Namespace, common: list[str]
            ) -> tuple[str, dict[str, float | None], str | None]:
    """One fresh server of `arm`: (its run directory, figures, error)."""
    if w.bench is not None:
        cfg = run_config(args, args.out / w.name, w.bench)
        (run,) = run_arms.run_bench_policy(arm, w.shape, cfg, common, free_port(), k)
        d = cfg.out / (f"bench-{arm}" + (f"-r{k}" if k else ""))
        return str(d), bench_figures(run) if run.ok else {}, run.error
    spec = w.specs[arm]
    cfg = run_config(args, args.out / w.name / f"r{k}", None)
    res = run_arms.run_arm(spec, w.segments, cfg, common, free_port())
    d = cfg.out / f"arm-{spec.name}"
    return str(d), arm_figures(res.metrics) if res.ok else {}, res.error


def run_workload(w: Workload, args: argparse.Namespace, common: list[str],
                 warnings: list[str]) -> list[RunRecord]:
    runs = []
    for pos, (k, arm) in enumerate(ab_report.abba(args.repeat, w.arms)):
        # NOTE: sampled after the previous run's server is gone: the box as this run finds it
        rec = RunRecord(w.name, arm, k, pos, load_before=ab_report.host_load(LOAD_SAMPLE_S))
        rec.warning = ab_report.load_warning(rec.load_before, f"{w.name} #{pos} ({arm}, "
                                             f"repetition {k})", args.busy_fraction)
        if rec.warning:
            print(rec.warning, file=sys.stderr)
            warnings.append(rec.warning)
        t0 = time.perf_counter()
        rec.dir, rec.figures, rec.error = run_one(w, arm, k, args, common)
        rec.wall_s, rec.load_after = time.perf_counter() - t0, ab_report.host_load()
        _print_run(rec)
        runs.append(rec)
    return runs


def _print_run(r: RunRecord) -> None:
    head = f"[{r.workload} #{r.position} {r.arm} r{r.repeat}]"
    if not r.ok:
        print(f"{head} FAILED: {r.error}", file=sys.stderr)
        return
    f = r.figures
    print(f"{head} e2e mean={f['mean_e2e_ms']:.1f}ms p99={f['p99_e2e_ms']:.1f}ms "
          f"tokens={f['prefill_tokens']} batches={f['prefill_batches']} "
          f"load1 {r.load_before.load1:.2f}->{r.load_after.load1:.2f} "
          f"({r.wall_s:.1f}s wall)", file=sys.stderr)


# --------------------------------------------------------------------------------------------
# The twin
# --------------------------------------------------------------------------------------------


def calibrated_cost(trace: Path, overlap: bool, default):
    """eval/calibrate.py's fit of the live radixflow run's trace, its decode step charged the
    fitted alpha (a decode iteration pays the loop's host work too) and the simulated
    forward's per-row term; (None, reason) where the trace does not pin it down."""
    from eval.calibrate import calibrate, negative

    try:
        cost, used, total = calibrate(trace, overlap=overlap)
    except (OSError, ValueError, KeyError) as e:
        return None, f"not calibrated ({e}); see eval/calibrate.py"
    if below := negative(cost):
        return None, (f"not calibrated: the fit of {trace} has negative "
                      f"{', '.join(below)} ({used} of {total} rounds usable)")
    cost = replace(cost, dec_alpha=cost.alpha, dec_gamma=default.dec_gamma,
                   dec_kv=default.dec_kv, source=f"calibrate:{trace}")
    return cost, (f"eval/calibrate.py on {trace} ({used} of {total} rounds usable): alpha "
                  f"{cost.alpha * 1e3:.2f} ms, beta {cost.beta * 1e6:.3f} us/token, gamma "
                  f"{cost.gamma * 1e3:.3f} ms/row; decode step alpha + "
                  f"{cost.dec_gamma * 1e3:.3f} ms/row")


def twin_pair(segments, args: argparse.Namespace, cost, layout: str,
              host=None, lag: float = 0.0, spread: float = 0.0,
              front_end=None, loop_pass: float = 0.0) -> dict[str, Any]:
    """The twin's stock and radixflow (and, --lpm, stock-lpm) on the same requests, their
    ratios to stock (`host`: scans charged, eval/hostcost.py; `lag`, `spread`, `front_end`,
    `loop_pass`: the live arrivals' release lag, branch spread and front end and the live
    loop's pass, eval/twin.py `replay`)."""
    arms = (*ARMS, LPM) if getattr(args, "lpm", False) else ARMS
    preds = {a: run_arms.twin_prediction(run_arms.ArmSpec.of(a), segments, args.model,
                                         args.overlap, args.seed, cost, layout, host, lag,
                                         spread, front_end, loop_pass)
             for a in arms}
    out = {"ratios": ab_report.twin_ratios(preds[ARMS[0]], preds[ARMS[1]]),
           "arms": preds, "layout": layout, "cost_model": cost.as_dict(),
           "front_end": None if front_end is None else front_end.as_dict()}
    if LPM in preds:
        out["ratios_lpm"] = ab_report.twin_ratios(preds[ARMS[0]], preds[LPM])
    return out


def live_twin(w: Workload, runs: Sequence[RunRecord], segs, args: argparse.Namespace, cost,
              layout: str) -> dict[str, Any]:
    """The twin on the live run's arrivals and loop host time (eval/livetwin.py); where the
    workload can declare its forks (gsp), again with every fork declared ("declared"): what
    knowing each fork from the first request would reach on the same arrivals and loop time,
    the bound of the learned boundaries (and of any target set for them)."""
    from eval import livetwin

    ref = next((r for r in runs if r.ok and r.arm == ARMS[1]), None)
    stock = [Path(r.dir) for r in runs if r.ok and r.arm == ARMS[0]]
    if ref is None or not stock:
        return {"note": "not replayed: needs a successful stock and radixflow run"}
    try:
        facts = livetwin.LiveFacts(
            livetwin.registrations(Path(ref.dir) / "trace.jsonl", w.shape.requests_of(w.bench)),
            livetwin.median_itl_s(stock, w.bench), burst=w.name == "gsp-burst")
        variants = [segs] + ([w.twin_declared()] if w.twin_declared is not None else [])
        preds = [livetwin.predict(ss, facts, args.model, args.overlap, args.seed, cost, layout,
                                  run_arms.TWIN_KEYS, host_model("model")) for ss in variants]
    except (OSError, ValueError, RuntimeError) as e:
        return {"note": f"not replayed: {e}"}
    pred, ratios = preds[0], [ab_report.twin_ratios(p["arms"][ARMS[0]], p["arms"][ARMS[1]])
                              for p in preds]
    out = {"ratios": ratios[0], "arms": pred["arms"], "layout": layout, "note": pred["note"],
           "cost_model": livetwin.loop_cost(cost, pred["h_s"]).as_dict()}
    if len(preds) > 1:
        out["declared"] = {"ratios": ratios[1], "arms": preds[1]["arms"]}
        out["note"] += "; " + declared_note(ratios[1])
    return out


def declared_note(r: dict[str, Any]) -> str:
    cells = ", ".join(f"{label} {'-' if r[k] is None else format(r[k], '.3f') + 'x'}"
                      for label, k in (("mean e2e", "mean_e2e_ms"), ("p99", "p99_e2e_ms"),
                                       ("prefill tokens", "prefill_tokens")))
    return f"every fork declared (the bound of learning them, same arrivals and h): {cells}"


def client_release_lag(w: Workload, ref: RunRecord | None, segs) -> tuple[float, str]:
    """(seconds, note): how far apart the live radixflow run's server registered the questions
    one completion released (eval/run_arms.py release_lag), for the twin of a client workload;
    0 for bench_serving workloads (their twin replays arrivals its own way)."""
    from eval.client import load_trace

    if w.bench is not None or ref is None:
        return 0.0, ""
    lag = w.release_lag_s  # NOTE: the box run's, where one ran first (eval/run_arms.py main)
    if lag is not None:
        return lag, (f"; released questions {lag * 1e3:.1f} ms apart, as the box profile's "
                     "live radixflow run registered them")
    lag = run_arms.release_lag(load_trace(Path(ref.dir) / "trace.jsonl"), segs, "radixflow/")
    if lag is None:
        return 0.0, ""
    return lag, (f"; released questions {lag * 1e3:.1f} ms apart, as the live radixflow run "
                 "registered them")


def client_arrivals(w: Workload, ref: RunRecord | None, args: argparse.Namespace
                    ) -> tuple[float, Any, str]:
    """(branch spread s, front end, note) for the twin of a client workload: the front end
    --twin-front-end names (`live`: fitted on the live radixflow run's registrations against
    its client's sends, eval/frontend.py), else the client's measured branch spread; none for
    bench_serving workloads (their twin replays arrivals its own way, as the lag)."""
    from eval.frontend import for_twin

    if ref is None or w.bench is not None:
        return 0.0, None, ""
    fe = for_twin(getattr(args, "twin_front_end", "live"), Path(ref.dir))
    if fe is not None:  # NOTE: measured from the send, it holds the client's spread
        return 0.0, fe, f"; {fe.describe()}"
    spread = run_arms.branch_spread(Path(ref.dir) / "requests.jsonl") or 0.0
    return spread, None, (f"; a question's branches {spread * 1e3:.2f} ms apart, as the live "
                          "client sent them" if spread else "")


def live_loop_pass(ref: RunRecord | None) -> tuple[float, str]:
    """(seconds, note): the live radixflow run's loop pass (eval/calibrate.py `loop_pass`),
    for the twin that charges the loop's host time (the calibrated one's periods hold it
    already); 0 where its trace has none."""
    fit, why = run_arms.arm_loop_pass(None if ref is None else Path(ref.dir))
    if fit is None:
        return 0.0, f"; loop pass 0 ({why})"
    return fit[0], f"; loop pass {fit[0] * 1e3:.2f} ms (live median of {fit[1]} scans)"


def twin_workload(w: Workload, runs: Sequence[RunRecord], args: argparse.Namespace,
                  gpu: bool) -> dict[str, Any]:
    """{"default": ..., "scans": ..., "calibrated": ..., "replay": ...}: the twin's ratios
    with the default cost model (free scans; `scans`: each scan charged its CPU time measured
    here, as the live server's scans take theirs), with one fitted to the live trace (whose
    measured periods hold the scans already) and on the live run's arrivals and loop time."""
    if w.twin_segments is None:
        return {}
    ref = next((r for r in runs if r.ok and r.arm == ARMS[1]), None)
    layout = run_arms.server_layout(Path(ref.dir)) if ref else "extra_buffer"
    try:
        segs = w.twin_segments()
    except (OSError, ValueError) as e:
        return {"default": {"note": f"FAILED to build the twin's workload: {e}"}}
    default = run_arms.twin_cost(args.model, gpu, getattr(args, "sim_profile", None))
    lag, lag_note = client_release_lag(w, ref, segs)
    if getattr(args, "sim_profile", None) == DEFAULT_PROFILE and w.release_lag_s is None:
        # NOTE: a registration waits for the scan after the running forward: at a long-round
        # profile (paper) the rounds, not the sender, space them; later profiles take this one
        w.release_lag_s = lag or None
    spread, fe, arrival_note = client_arrivals(w, ref, args)
    lag_note += arrival_note
    out = {"default": twin_pair(segs, args, default, layout, lag=lag, spread=spread,
                                front_end=fe)}
    out["default"]["note"] = (f"{default.source} cost model, free scans and loop pass, layout "
                              f"{layout}{lag_note}")
    # NOTE: the twin with the loop's host time: each scan's and the pass after a launch or
    # result (notes/2026-12-idle-wait.md section 9: the pass alone, with free scans, moved
    # paper mix seed 2 away from live, 0.035 -> 0.094)
    passed, pass_note = live_loop_pass(ref)
    out["scans"] = twin_pair(segs, args, default, layout, host_model("measured"), lag, spread,
                             fe, passed)
    out["scans"]["note"] = (f"{default.source} cost model, each scan charged its CPU time "
                            f"measured on this host (eval/hostcost.py `measured`), layout "
                            f"{layout}{lag_note}{pass_note}")
    cost, note = ((None, "no radixflow run succeeded") if ref is None
                  else calibrated_cost(Path(ref.dir) / "trace.jsonl", args.overlap, default))
    out["calibrated"] = ({"note": note} if cost is None
                         else twin_pair(segs, args, cost, layout, lag=lag, spread=spread,
                                        front_end=fe)
                         | {"note": note})
    if w.bench is not None:
        out["replay"] = live_twin(w, runs, segs, args, default, layout)
    for name, t in out.items():
        r = t.get("ratios") or {}
        print(f"[{w.name} twin {name}] mean e2e ratio {r.get('mean_e2e_ms')} "
              f"({t['note']})", file=sys.stderr)
    return out


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def config(args: argparse.Namespace, gpu: bool, common: list[str]) -> dict[str, Any]:
    return {"model": args.model, "model_dir": str(args.model_dir), "workloads": args.workloads,
            "repeat": args.repeat, "overlap": args.overlap, "server_args": shlex.join(common),
            "stock_cmd": args.stock_cmd, "executor": "model" if gpu else "simulated",
            "seed": args.seed, "bootstrap": args.bootstrap, "busy_fraction": args.busy_fraction,
            "cpus": ab_report.host_load().cpus, "paced_rate": args.paced_rate,
            "command": shlex.join(["python", "-m", "eval.live_ab", *args.argv]),
            "lpm": args.lpm, "profile": getattr(args, "sim_profile", None),
            "twin_front_end": args.twin_front_end,
            **({} if gpu else {"sim_cost": run_arms.sim_cost(args.model, args.sim_profile)})}


def main(argv: list[str] | None = None) -> int:
    run_arms.sigterm_exits()
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    check_args(parser, args)
    from radixflow_sglang.tokenizer import served_model_dir

    gpu = run_arms.gpu_available()
    args.stock_cmd = args.stock_cmd or ("sglang" if gpu else "radixflow")
    args.model_dir = (args.model_dir or served_model_dir(args.model)).resolve()
    try:
        loads = [make_workload(n, args) for n in args.workloads]
    except (OSError, ValueError) as e:
        print(f"python -m eval.live_ab: error: cannot build the workload: {e}", file=sys.stderr)
        return 2
    common = [*run_arms.model_args(args.model, args.model_dir), "--host", "127.0.0.1"]
    common += [] if args.overlap else ["--disable-overlap-schedule"]
    common += shlex.split(args.server_args)
    profiles = run_arms.run_profiles(parser, args, gpu)
    results = {}
    for prof in profiles:
        sub = argparse.Namespace(**vars(args))
        sub.sim_profile = prof
        sub.out = args.out if len(profiles) == 1 else args.out / f"profile-{prof}"
        results[prof] = run_profile(sub, loads, gpu, common)
    if len(profiles) > 1:
        write_profiles(args.out, {p: summary for p, (_, summary) in results.items()})
        print(f"wrote {args.out}/profiles.md", file=sys.stderr)
    return 0 if all(ok for ok, _ in results.values()) else 1


def run_profile(args: argparse.Namespace, loads: Sequence[Workload], gpu: bool,
                common: list[str]) -> tuple[bool, dict[str, Any]]:
    """Every workload's ABBA runs and twins at one profile, written to args.out."""
    args.out.mkdir(parents=True, exist_ok=True)
    warnings: list[str] = []
    t0 = time.perf_counter()
    runs = {w.name: run_workload(w, args, common, warnings) for w in loads}
    # NOTE: after every live run, so the twin's CPU work never overlaps a live server
    twins = {w.name: twin_workload(w, runs[w.name], args, gpu) if args.twin else {}
             for w in loads}
    summary = {"config": config(args, gpu, common), "warnings": warnings,
               "wall_s": time.perf_counter() - t0,
               "workloads": {w.name: ab_report.workload_entry(
                   w.describe, runs[w.name], twins[w.name], w.twin_note, args.bootstrap,
                   args.seed) for w in loads}}
    ab_report.write(args.out, summary)
    print(f"wrote {args.out}/summary.json and {args.out}/report.md "
          f"({summary['wall_s']:.1f}s wall)", file=sys.stderr)
    return all(r.ok for rs in runs.values() for r in rs), summary


def write_profiles(out: Path, per_profile: dict[str, dict[str, Any]]) -> None:
    """OUT/profiles.md: per profile, workload and arm, the live mean ratio to stock and each
    twin's prediction of it."""
    lines = ["# Live A/B at each cost profile", "",
             "Mean e2e latency / stock: the live median paired ratio [95 % CI] and the twins' "
             "predictions (eval/live_ab.py; each profile's report.md has every metric).", "",
             "| profile | workload | arm | live mean | live p99 | twins (mean) |",
             "|---|---|---|---|---|---|"]
    for prof, summary in per_profile.items():
        for name, entry in summary["workloads"].items():
            for arm, key in ((ARMS[1], "ratios"), (LPM, "ratios_lpm")):
                lines.append(_profile_row(prof, name, arm, key, entry))
    (out / "profiles.md").write_text("\n".join(x for x in lines if x) + "\n")
    (out / "profiles.json").write_text(json.dumps(
        {p: {n: {"summary": e["summary"], "twin": e["twin"]} for n, e in s["workloads"].items()}
         for p, s in per_profile.items()}, indent=1, default=str))


def _profile_row(prof: str, name: str, arm: str, key: str, entry: dict[str, Any]) -> str:
    def live(metric: str) -> dict[str, Any] | None:
        v = entry["summary"][metric]
        return v if arm == ARMS[1] else (v.get("others") or {}).get(arm)

    mean, p99 = live("mean_e2e_ms"), live("p99_e2e_ms")
    if mean is None or mean["ratio"] is None:
        return ""
    twins = ", ".join(f"{n} {r['mean_e2e_ms']:.3f}" for n, t in entry["twin"].items()
                      if (r := t.get(key)) and r.get("mean_e2e_ms") is not None)
    return (f"| {prof} | {name} | {arm} | {ab_report._ratio_cell(mean)} | "
            f"{ab_report._ratio_cell(p99) if p99 else '-'} | {twins or '-'} |")

if __name__ == "__main__":
    sys.exit(main())
