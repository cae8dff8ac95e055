"""Live arms: the same workload trace replayed against a fresh real SGLang server per arm.

    python -m eval.run_arms --policies stock,radixflow --workload synthetic --questions 8 \\
        --rate 10 --out out/arms-small

Each arm starts its own server on 127.0.0.1 (log, trace and raw request records in
OUT/arm-NAME/), replays the workload through eval/client.py, waits for SGLang's idle memory
invariant check, and stops the server (SIGTERM to its process group). The model is a catalog
entry (`--model`, radixflow_sglang/models.py: its dummy-weight dir and the paper's budgets S, T;
`--model-dir` serves another directory, e.g. real weights, with the same budgets). Arms:

* `stock`: untouched SGLang. On a GPU machine `python -m sglang.launch_server`; on CPU (stock
  SGLang needs CUDA) `python -m radixflow_sglang.launch_server --radixflow-policy stock`, i.e.
  SGLang's own unmodified Scheduler class with the simulated executor (`--stock-cmd`).
* every other policy: `python -m radixflow_sglang.launch_server --radixflow-policy P
  --radixflow-trace OUT/arm-P/trace.jsonl`.
* `stock-fork` and `radixflow-fork` (`--fork-arm`, default on): a stock and a radixflow server
  (the stock and radixflow arms' commands) driven by the same SGLang frontend program
  (`sgl.function`, `s.fork(4)`, `sgl.gen(max_tokens=1)`); the frontend sends text, so the
  workload's ids are decoded with the model's tokenizer and re-tokenized by the server, and it
  cannot send `extra_key`, so the namespace is a "[namespace]" tag line opening the prompt.
  The frontend may also send the shared prefix on its own (max_new_tokens=0) before the forks
  (lang/interpreter.py StreamExecutor.fork: only when the prefix text is already applied), so
  the report compares the two by what the server scheduled (SGLang's "Prefill batch" log lines
  in the replay window, both arms).
* bench_serving (`--bench gsp,random-ids`, default none; `--bench-policies`, default
  stock,radixflow): SGLang's own `python -m sglang.bench_serving` against a fresh server per
  policy (eval/bench_arm.py). `--no-replay` runs only these. `--bench-repeat N` runs the
  policies' servers N times in ABBA order (stock, radixflow, radixflow, stock, ...), each a
  fresh server, and reports each run and the median of the per-alternation ratios vs stock:
  on a shared machine one pair of runs minutes apart says little about latency.

Every arm and bench run records its scheduler process's CPU seconds (`scheduler_cpu_s`, read
from the OS for stock and radixflow alike): the host time its rounds cost.

Workloads: the paper's (race, quality, mix, synthetic: --regime --order --questions) or the
traffic ones of eval/traffic.py (gsp, gsp-paced, nsample, multiturn, noshare) with eval.replay's
shape flags, checked as it checks them (an error names the flag). The client sends each
request's own max_new_tokens and declared boundary (`custom_params.radixflow_boundary`, to
every arm: stock ignores it), releases `after` questions when their predecessor completed, and
for nsample warm sends one request with SGLang's `n` (its tokenizer manager sends the warm
request). `--boundaries declared,learned` starts one radixflow server per
`--radixflow-boundaries` mode (arms POLICY, POLICY-learned, ...).

`--workload trace --trace-file F` (eval.replay's --trace-* flags, eval/mooncake.py) sends a
Mooncake-format trace through the same client with the twin's exact block mapping (hash id ->
512 fixed ids, the prompt as input_ids), so live and twin replay the same tokens. SGLang's own
bench_serving reads the file too, with text prompts of its own ("{id} hi hi ...", about a
quarter of input_length in tokens, outputs uncapped), against a server you launched:
`python -m sglang.bench_serving --backend sglang --base-url http://127.0.0.1:30000 --model DIR
--tokenizer DIR --dataset-name mooncake --dataset-path F --num-prompts N
--mooncake-slowdown-factor 0.1` (DIR: `python -m radixflow_sglang.tokenizer --serve MODEL`;
the slowdown factor is 1 / --trace-speed; --request-rate is ignored, the trace's timestamps
pace it).

The twin (`--twin`, default on): after the live arms, each ids arm's policy and boundary mode
replays the same workload through eval/twin.py in virtual time (on CPU with the simulated
executor's cost model at the run's profile and the mamba layout the arm's server resolved; its
scans charged by eval/hostcost.py's deterministic `model`, calibrated on this kind of CPU box,
where the live host is known: `--twin-host`, default auto = model on CPU, free scans on a GPU
box), and report.md puts its scheduled tokens, zero-hit followers and latency next to the live
ones.

`--profiles box,paper` (radixflow_sglang/profiles.py) runs every arm, its twin and the bench
runs at each simulated-executor cost profile (`--radixflow-sim-profile` on each server),
OUT/profile-NAME/ each, and writes OUT/profiles.md: per profile and arm the live and the twin's
ratios to stock side by side. `--policies` takes `stock-lpm` too: SGLang's unmodified scheduler
with `--schedule-policy lpm`, its own arm and rows.

Every arm gets the same server arguments and the same offered trace; arms are isolated by a
fresh server each and by per-arm cache namespaces (`extra_key`). A failed arm is recorded with
its error text and no numbers. Outputs: OUT/summary.json ({"config", "arms", "audit"}, the
twin's metric keys), OUT/report.md, OUT/audit.json (written by eval/arms_report.py).

On CPU every latency comes from the simulated executor's cost model (RADIXFLOW_SIM_ALPHA/BETA/
GAMMA) plus the real server's own overheads on this machine, and every generated token is the
simulated executor's deterministic function of the prompt ids: the output audit then checks
the plumbing (same prompt -> same token), not model numerics.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from eval import bench_arm, cli
from eval.arms_report import BASELINE, STOCK_FORK, LiveArm, write_outputs
from eval.hostcost import HOST_CHOICES
from eval.replay import (
    PAPER_WORKLOADS,
    TRACE_WORKLOAD,
    WORKLOAD_CHOICES,
    add_shape_args,
    add_trace_args,
    check_workload_flags,
    trace_spec,
)
from eval.traffic import WORKLOADS as TRAFFIC_WORKLOADS
from radixflow_sglang import models
from radixflow_sglang.core.boundary import MODES as BOUNDARY_MODES
from radixflow_sglang.core.policy import POLICIES
from radixflow_sglang.profiles import DEFAULT_PROFILE, PROFILE_VAR, PROFILES, resolve
from radixflow_sglang.testing.server import (
    START_ATTEMPTS,
    Server,
    ServerError,
    free_port,
    http_json,
)

REGIME_CHOICES = ("cold", "mixed", "reuse", "all")
ORDER_CHOICES = ("forward", "reverse", "both")
FORK_ARM = "radixflow-fork"
FORK_ARMS = ((STOCK_FORK, BASELINE), (FORK_ARM, "radixflow"))  # (arm name, policy)
FORK_NAMESPACE = "fork/"  # the prompt's tag line: "[fork/<workload namespace>]"
PAPER_DEFAULTS = {"regime": "all", "order": "both", "questions": 16}
SERVER_BOUNDARIES = "both"  # --radixflow-boundaries' default (radixflow_sglang/config.py)


# --------------------------------------------------------------------------------------------
# Arguments
# --------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.run_arms",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=models.names(), default=models.DEFAULT,
                   help="catalog model: budgets, workload tokenizer, default model dir")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="serve this directory instead (default: the model's dummy-weight dir)")
    p.add_argument("--policies", type=cli.arms, default=list(POLICIES),
                   help=f"comma-separated, from: {', '.join(cli.ARMS)} (default: every policy; "
                        f"{cli.STOCK_LPM}: SGLang's unmodified scheduler with --schedule-policy "
                        "lpm)")
    p.add_argument("--profiles", type=cli.comma_choices(PROFILES), default=None,
                   help="simulated executor cost profiles (radixflow_sglang/profiles.py), "
                        f"comma-separated from: {', '.join(PROFILES)}; each runs every arm and "
                        "its twin, OUT/profile-NAME/ each, and OUT/profiles.md puts the live and "
                        "twin ratios side by side (default: $RADIXFLOW_SIM_PROFILE or box, "
                        "written to OUT)")
    p.add_argument("--twin-host", choices=("auto", *HOST_CHOICES), default="auto",
                   help="the twin's scan CPU time (eval/hostcost.py): auto (default) charges "
                        "the deterministic `model`, calibrated on this kind of CPU box, where "
                        "the live host is known (the simulated executor) and free scans "
                        "(none) on a GPU box, whose host it was not calibrated on")
    p.add_argument("--twin-front-end", type=twin_front_end_choice, default="live",
                   metavar="live|off|fitted|C_MS,A_MS,B_US[,JITTER_MS[,BACK_MS]]",
                   help="when the twin's branches reach its scheduler (eval/frontend.py): live "
                        "(default) fits the live server's front end on the first traced arm's "
                        "registrations against the client's sends (a per-question delay, then "
                        "each branch in turn by its length, each branch's own spread) and its "
                        "responses against the forwards' ends, where they pin one down, else "
                        "the client's branch spread; off: the spread; fitted or numbers: "
                        "eval.replay --front-end's")
    p.add_argument("--fork-arm", action=argparse.BooleanOptionalAction, default=None,
                   help="also run the SGLang frontend fork program against a stock and a "
                        "radixflow server (arms stock-fork, radixflow-fork; default: on for "
                        "the paper workloads, which it takes, off for the others)")
    p.add_argument("--boundaries", type=boundary_modes, default=[SERVER_BOUNDARIES],
                   help="--radixflow-boundaries of the radixflow policies' servers, comma-"
                        f"separated from: {', '.join(BOUNDARY_MODES)}; one arm per policy and "
                        f"mode, named POLICY for {SERVER_BOUNDARIES} (the server default) and "
                        "POLICY-MODE otherwise (default: %(default)s)")
    p.add_argument("--twin", action=argparse.BooleanOptionalAction, default=True,
                   help="replay the same workload through the twin (eval/twin.py) per arm, "
                        "its prediction next to the live figures (simulated executor: with "
                        "its cost model; default on)")
    p.add_argument("--replay", action=argparse.BooleanOptionalAction, default=True,
                   help="replay the workload (the policies' arms and the fork arms); "
                        "--no-replay runs only the --bench arms")
    p.add_argument("--workload", choices=WORKLOAD_CHOICES, default="mix",
                   help="the paper's four-branch workloads or the traffic ones (eval/traffic.py, "
                        "their shape flags below, as eval.replay takes them)")
    p.add_argument("--regime", choices=REGIME_CHOICES, default=None,
                   help="paper workloads only (default all)")
    p.add_argument("--order", choices=ORDER_CHOICES, default=None,
                   help="paper workloads only (default both)")
    p.add_argument("--questions", type=cli.positive(int), default=None,
                   help="per segment, paper workloads only (default 16)")
    p.add_argument("--rate", type=cli.positive(float), default=None,
                   help="questions/s, Poisson (default 5; the traffic workloads' own, see "
                        "python -m eval.replay --help; inf = all at once)")
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
    p.add_argument("--start-timeout", type=cli.positive(float), default=600.0,
                   help="seconds a server may take to get ready (per start)")
    p.add_argument("--start-attempts", type=cli.positive(int), default=START_ATTEMPTS,
                   help="starts per server: one that hangs before it is ready is stopped, its "
                        "log and stacks kept as server.log.attempt<k>, and started again "
                        "(default 2; a crash is never retried)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--no-progress", action="store_true")
    add_shape_args(p)
    add_trace_args(p)
    add_bench_args(p)
    return p


boundary_modes = cli.comma_choices(BOUNDARY_MODES)  # `--boundaries`


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """Workload flags as eval.replay checks them (errors name the flag), run_arms' own paper
    defaults, the fork arm's default; returns the traffic shape given (field -> value)."""
    cli.check_overlap(p, args.overlap, args.server_args)
    if not args.replay and not args.bench:
        p.error(f"--no-replay needs --bench (choose from {', '.join(bench_arm.BENCHES)}): "
                "nothing to run")
    if args.workload in PAPER_WORKLOADS:
        for k, v in PAPER_DEFAULTS.items():
            if getattr(args, k) is None:
                setattr(args, k, v)
    shape = check_workload_flags(p, args)
    args.trace_spec = trace_spec(p, args)
    if "mooncake" in args.bench and (args.trace_spec is None or args.trace_spec.start != 0):
        p.error("--bench mooncake reads --workload trace's --trace-file (bench_serving takes "
                "the file's first N records: --trace-window 0:N, not another start)")
    traffic = args.workload in TRAFFIC_WORKLOADS or args.trace_spec is not None
    if args.fork_arm is None:
        args.fork_arm = not traffic
    elif args.fork_arm and traffic:
        p.error(f"--fork-arm sends the paper's four-branch frontend program (s.fork(4)); it "
                f"does not apply to --workload {args.workload} (use --no-fork-arm, or one of "
                f"{', '.join(PAPER_WORKLOADS)})")
    if args.replay and not any(pol != BASELINE for pol in args.policies) \
            and args.boundaries != [SERVER_BOUNDARIES]:
        p.error("--boundaries applies to the radixflow policies' servers; --policies "
                f"{','.join(args.policies)} has none")
    return shape


def add_bench_args(p: argparse.ArgumentParser) -> None:
    d = bench_arm.BenchShape()
    g = p.add_argument_group("bench_serving arms (eval/bench_arm.py)")
    g.add_argument("--bench", type=bench_arm.benches, default=[],
                   help=f"comma-separated, from: {', '.join(bench_arm.BENCHES)} (default: none)")
    g.add_argument("--bench-policies", type=cli.arms, default=[BASELINE, "radixflow"],
                   help="one fresh server per policy runs every --bench (default: "
                        "stock,radixflow)")
    g.add_argument("--gsp-groups", type=cli.positive(int), default=d.groups,
                   help="system prompt groups (default: %(default)s)")
    g.add_argument("--gsp-prompts-per-group", type=cli.positive(int),
                   default=d.prompts_per_group, help="requests per group (default: %(default)s)")
    g.add_argument("--gsp-system-len", type=cli.positive(int), default=d.system_len,
                   help="system prompt tokens (default: %(default)s; random-ids: prompt = "
                        "system + question, groups x prompts requests)")
    g.add_argument("--gsp-question-len", type=cli.positive(int), default=d.question_len,
                   help="question tokens (default: %(default)s)")
    g.add_argument("--bench-output-len", type=cli.positive(int), default=d.output_len,
                   help="generated tokens per request (default: %(default)s)")
    g.add_argument("--bench-rate", type=cli.positive(float), default=d.rate,
                   help="requests/s, Poisson (default: inf = burst)")
    g.add_argument("--bench-text", action="store_true",
                   help="send text prompts (re-tokenized by the server) instead of exact ids")
    g.add_argument("--bench-repeat", type=cli.positive(int), default=1,
                   help="run the policies' servers this many times, alternated in ABBA "
                        "order (stock, radixflow, radixflow, stock, ...), each a fresh "
                        "server, so machine load falls on every policy alike; summary.json "
                        "keeps each run and the median ratio vs stock (default: %(default)s)")
    g.add_argument("--bench-timeout", type=cli.positive(float),
                   default=bench_arm.BENCH_TIMEOUT_S, help="seconds per bench_serving run")


def bench_shape(args: argparse.Namespace) -> bench_arm.BenchShape:
    """The --bench flags as a shape; `--bench mooncake` reads --workload trace's file (its
    first N records of --trace-window 0:N, paced by --trace-speed)."""
    spec = getattr(args, "trace_spec", None)
    trace = ({} if spec is None else
             {"trace_file": spec.file, "trace_count": spec.count, "trace_speed": spec.speed})
    return bench_arm.BenchShape(args.gsp_groups, args.gsp_prompts_per_group, args.gsp_system_len,
                                args.gsp_question_len, args.bench_output_len, args.bench_rate,
                                args.seed, not args.bench_text, **trace)


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
    boundaries: str = SERVER_BOUNDARIES  # --radixflow-boundaries (radixflow policies)
    schedule: str | None = None  # SGLang --schedule-policy (stock-lpm: lpm); None: default

    @classmethod
    def of(cls, arm: str) -> ArmSpec:
        """An arm of --policies / --bench-policies (stock-lpm: stock with lpm)."""
        policy, schedule = cli.arm_policy(arm)
        return cls(arm, policy, schedule=schedule)

    @property
    def kit_overrides(self) -> dict[str, str] | None:
        """The twin's KitConfig for the same SGLang schedule policy."""
        return None if self.schedule is None else {"schedule_policy": self.schedule}

    @property
    def traced(self) -> bool:
        return self.policy != BASELINE


def arm_specs(policies: Sequence[str], fork_arm: bool,
              boundaries: Sequence[str] = (SERVER_BOUNDARIES,)) -> list[ArmSpec]:
    """stock once; every other policy once per boundary mode (named POLICY for the server's
    default mode, POLICY-MODE otherwise); then the fork arms."""
    specs = []
    for p in policies:
        if p in cli.ARM_SCHEDULE:
            specs.append(ArmSpec.of(p))
            continue
        modes = [SERVER_BOUNDARIES] if p == BASELINE else boundaries
        specs += [ArmSpec(p if m == SERVER_BOUNDARIES else f"{p}-{m}", p, boundaries=m)
                  for m in modes]
    if fork_arm:
        specs += [ArmSpec(name, policy, fork=True) for name, policy in FORK_ARMS]
    return specs


def model_args(model: str, model_dir: Path) -> list[str]:
    """The same model and budgets for every arm (the catalog's S and T)."""
    args = ["--model-path", str(model_dir)]
    weights = [*model_dir.glob("*.safetensors"), *model_dir.glob("*.bin")]
    if not weights:
        args += ["--load-format", "dummy"]
    return args + ["--context-length", str(models.CONTEXT_LENGTH), *models.budget_args(model)]


def server_cmd(spec: ArmSpec, stock_cmd: str, common: list[str], trace: Path,
               profile: str | None = None) -> list[str]:
    """The arm's server command; `profile`: the simulated executor's cost profile (not for
    SGLang's own launcher, whose model executor has none)."""
    py = sys.executable
    common = common + ([] if spec.schedule is None else ["--schedule-policy", spec.schedule])
    sim = [] if profile is None else ["--radixflow-sim-profile", profile]
    if spec.policy == BASELINE:
        if stock_cmd == "sglang":
            return [py, "-m", "sglang.launch_server", *common]
        return [py, "-m", "radixflow_sglang.launch_server", "--radixflow-policy", "stock",
                *sim, *common]
    mode = ([] if spec.boundaries == SERVER_BOUNDARIES
            else ["--radixflow-boundaries", spec.boundaries])
    return [py, "-m", "radixflow_sglang.launch_server", "--radixflow-policy", spec.policy,
            "--radixflow-trace", str(trace), *mode, *sim, *common]


def server_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE="1")
    # NOTE: the profile is each command's flag (server_cmd); the variable would not say which
    for key in ("RADIXFLOW_POLICY", "RADIXFLOW_TRACE", PROFILE_VAR):
        env.pop(key, None)
    return env


def l_caps(segments, bud: Mapping[str, int | None]) -> dict[str, int]:
    """The twin's capacity bound per segment under the server's budgets (workload ids)."""
    from eval.twin import capacity_bound

    if not bud.get("rows") or not bud.get("tokens"):
        return {}
    return {s.name: capacity_bound(s, bud["rows"], bud["tokens"])[0] for s in segments}


def namespace_prefix(spec: ArmSpec) -> str:
    """The arm's cache namespace prefix: its own name for the ids arms (extra_key); one shared
    tag for every fork arm, whose namespace is prompt text: each fork arm has its own server,
    and with the same tag they send the same text, so their prompts, scheduled tokens and
    outputs compare one to one."""
    return FORK_NAMESPACE if spec.fork else f"{spec.name}/"


def make_sender(spec: ArmSpec, base: str, pool: int, model: str, n_param: bool = False):
    """The fork program for the fork arms; else one /generate per branch (`n_param`: one with
    SGLang's `n` for n identical branches, nsample warm)."""
    from eval import client

    if spec.fork:
        from eval.workload import get_tokenizer

        return client.ForkSender(base, get_tokenizer(model).decode,
                                 namespace_prefix=namespace_prefix(spec))
    return client.GenerateSender(base, pool=pool, namespace_prefix=namespace_prefix(spec),
                                 rid_prefix=f"{spec.name}/", n_param=n_param)


def run_arm(spec: ArmSpec, segments, cfg: argparse.Namespace, common: list[str],
            port: int) -> LiveArm:
    from eval import client

    arm_dir = cfg.out / f"arm-{spec.name}"
    arm_dir.mkdir(parents=True, exist_ok=True)
    trace_path, raw_path = arm_dir / "trace.jsonl", arm_dir / "requests.jsonl"
    for p in (trace_path, raw_path):
        p.unlink(missing_ok=True)
    cmd = server_cmd(spec, cfg.stock_cmd, [*common, "--port", str(port)], trace_path,
                     getattr(cfg, "sim_profile", None))
    arm = LiveArm(spec.name, command=shlex.join(cmd))
    t0 = time.perf_counter()
    try:
        with Server(cmd, server_env(), arm_dir / "server.log", port) as srv:
            srv.wait_ready(cfg.start_timeout, cfg.start_attempts)
            info = http_json(srv.base + "/server_info")
            (arm_dir / "server_info.json").write_text(json.dumps(info, indent=1, default=str))
            sender = make_sender(spec, srv.base, cfg.pool, cfg.model, cfg.n_param)
            log_mark = prefill_log_lines(arm_dir / "server.log")
            cpu0 = bench_arm.scheduler_cpu_s(srv.proc.pid)
            try:
                res = client.replay(segments, sender, pool=cfg.pool, raw_path=raw_path,
                                    progress=not cfg.no_progress, desc=spec.name)
            finally:
                sender.close()
            arm.replay_wall_s = res.wall_s
            sched_cpu = bench_arm.scheduler_cpu_s(srv.proc.pid) - cpu0
            batches = prefill_log_lines(arm_dir / "server.log")[len(log_mark):]
            leaks = srv.idle_leak_check()
            witness = served_witness(http_json(srv.base + "/server_info"))
        arm.records = client.read_jsonl(raw_path)
        trace = client.load_trace(trace_path) if spec.traced else None
        if spec.traced and trace is None:
            raise ServerError(f"no trace written at {trace_path}")
        bud = budgets(info)
        arm.metrics = client.summarize(arm.records, trace, leaks=leaks,
                                       l_caps=l_caps(segments, bud), budgets=bud)
        add_log_rounds(arm.metrics, batches)
        # NOTE: the scheduler's host time over the replay, read from the OS for every arm
        arm.metrics["scheduler_cpu_s"] = sched_cpu
        arm.metrics["server_start_attempts"] = srv.start_attempts
        if witness is not None:
            arm.metrics["witness"] = witness
            check_witness(witness)
    except Exception as e:  # noqa: BLE001 - the arm fails with its error, never filled in
        arm.error_detail = f"{type(e).__name__}: {e}"
        arm.error = one_line(arm.error_detail)  # NOTE: it goes in tables
        if raw_path.exists() and not arm.records:
            arm.records = client.read_jsonl(raw_path)
    arm.wall_s = time.perf_counter() - t0
    return arm


def served_witness(info: dict) -> dict | None:
    """The simulated executor's witness counts (adapter/witness.py), summed over ranks; None
    for a model executor."""
    states = [s["witness"] for s in info.get("internal_states") or () if s.get("witness")]
    if not states:
        return None
    out = {k: sum(s[k] for s in states) for k in ("requests", "verified", "mismatched",
                                                 "resumed", "states_checked")}
    out["first_mismatches"] = [m for s in states for m in s["first_mismatches"]]
    return out


def check_witness(witness: dict | None) -> None:
    """A ServerError when the server's witness saw a request handed a wrong state."""
    if witness is not None and witness["mismatched"]:
        raise ServerError(f"witness: {witness['mismatched']} requests handed a wrong state: "
                          f"{witness['first_mismatches'][:3]}")


def one_line(text: str, head: int = 400, tail: int = 2600) -> str:
    """An error on one line for tables and stderr: its start (what failed) and its end (the
    server log's last lines and stacks, where a hang shows)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= head + tail else f"{flat[:head]} [...] {flat[-tail:]}"


def bench_order(policies: Sequence[str], repeats: int) -> list[tuple[int, str]]:
    """(alternation, policy) in ABBA order: even alternations in the order given, odd ones
    reversed, so a drift in machine load over the run weighs on every policy alike."""
    return [(k, p) for k in range(repeats)
            for p in (policies if k % 2 == 0 else list(reversed(policies)))]


def run_bench_policy(policy: str, shape: bench_arm.BenchShape, cfg: argparse.Namespace,
                     common: list[str], port: int, repeat: int = 0) -> list[bench_arm.BenchRun]:
    """Every --bench against one fresh server of `policy`, in order. A run counts once the
    server's idle memory check passed after it; a failure fails that run and the ones not yet
    run on this server (recorded with the error, never filled in). Each run also records the
    scheduler process's CPU seconds during it (the host time its rounds cost)."""
    spec = ArmSpec.of(policy)
    out_dir = cfg.out / (f"bench-{policy}" + (f"-r{repeat}" if repeat else ""))
    out_dir.mkdir(parents=True, exist_ok=True)
    trace_path, log = out_dir / "trace.jsonl", out_dir / "server.log"
    trace_path.unlink(missing_ok=True)
    cmd = server_cmd(spec, cfg.stock_cmd, [*common, "--port", str(port)], trace_path,
                     getattr(cfg, "sim_profile", None))
    runs = [bench_arm.BenchRun(b, policy, server_command=shlex.join(cmd), repeat=repeat)
            for b in cfg.bench]
    done = 0
    try:
        with Server(cmd, server_env(), log, port) as srv:
            srv.wait_ready(cfg.start_timeout, cfg.start_attempts)
            # NOTE: the layout the server resolved, for the twin (server_layout)
            info = http_json(srv.base + "/server_info")
            (out_dir / "server_info.json").write_text(json.dumps(info, indent=1, default=str))
            for run in runs:
                t0 = time.perf_counter()
                mark = len(prefill_log_lines(log))
                argv = bench_arm.bench_cmd(run.bench, shape, srv.base, cfg.model_dir,
                                           out_dir / f"bench-{run.bench}.jsonl")
                run.command = shlex.join(argv)
                cpu0 = bench_arm.scheduler_cpu_s(srv.proc.pid)
                try:
                    _, result, server = bench_arm.run_one(
                        run.bench, shape, srv.base, cfg.model_dir, out_dir,
                        lambda mark=mark: prefill_log_lines(log)[mark:],
                        trace_path if spec.traced else None, cfg.bench_timeout)
                    server["scheduler_cpu_s"] = bench_arm.scheduler_cpu_s(srv.proc.pid) - cpu0
                    server["server_start_attempts"] = srv.start_attempts
                    srv.idle_leak_check()
                    # NOTE: every output checked against its state, as the client arms do
                    server["witness"] = served_witness(http_json(srv.base + "/server_info"))
                    check_witness(server["witness"])
                finally:
                    run.wall_s = time.perf_counter() - t0
                run.result, run.server = result, server
                done += 1
    except Exception as e:  # noqa: BLE001 - the runs fail with the error, never filled in
        text = one_line(f"{type(e).__name__}: {e}")
        for run in runs[done:]:
            run.error, run.result, run.server = text, None, None
    for run in runs:
        _print_bench(run)
    return runs


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
# The twin's prediction
# --------------------------------------------------------------------------------------------

TWIN_KEYS = ("requests", "rounds", "scheduled_tokens", "hit_tokens", "input_tokens",
             "zero_hit_requests", "zero_hit_after_requests", "after_requests", "output_tokens",
             "latency_mean_s", "latency_p95_s", "latency_p99_s", "ttft_mean_s",
             "request_latency_mean_s", "request_latency_p95_s")
LAYOUTS = ("extra_buffer", "no_buffer")


def twin_cost(model: str, gpu: bool, profile: str | None = None):
    """The simulated executor's cost model at `profile` as the twin's (prefill alpha + beta *
    tokens + gamma * rows; a decode step is a forward of one token per row: adapter/
    simulated.py; RADIXFLOW_SIM_ALPHA/BETA/GAMMA override as they do the servers'), or on a GPU
    machine the model's default cost (eval/costmodel.py)."""
    from eval.costmodel import default_cost, profile_cost

    if gpu:
        return default_cost(model)
    return profile_cost(profile or DEFAULT_PROFILE, model, os.environ, "--profiles")


def twin_host(choice: str, gpu: bool):
    """--twin-host as an eval.hostcost.HostCost (None: free scans); auto: the deterministic
    model where the live host is this kind of CPU box (the simulated executor), none on a GPU
    box."""
    from eval.hostcost import host_model

    return host_model(("none" if gpu else "model") if choice == "auto" else choice)


def server_layout(arm_dir: Path) -> str:
    """The mamba cache layout the arm's server resolved (--mamba-radix-cache-strategy auto picks
    by platform), from its server_info.json; extra_buffer when it does not say."""
    try:
        info = json.loads((arm_dir / "server_info.json").read_text())
    except (OSError, ValueError):
        return "extra_buffer"
    states = info.get("internal_states") or [{}]
    value = states[0].get("mamba_radix_cache_strategy",
                          info.get("mamba_radix_cache_strategy"))
    return value if value in LAYOUTS else "extra_buffer"


def release_lag(events: Sequence[Mapping[str, Any]] | None, segments, prefix: str
                ) -> float | None:
    """How far apart the live server registered the questions one completion released (a
    sibling-after-completion group's siblings, sent together): per group its registration
    span / (followers - 1), the median over groups (seconds; None without such groups or
    trace). `prefix`: the arm's rid prefix (make_sender)."""
    import statistics

    reg = {e["rid"]: e["registered"] for e in events or () if e.get("event") == "selected"}
    groups: dict[str, list[str]] = {}
    for seg in segments:
        for q in seg.questions:
            if q.after is not None:
                groups.setdefault(f"{seg.name}/{q.after}", []).append(q.branches[0].rid)
    spans = []
    for rids in groups.values():
        stamps = [reg.get(prefix + r) for r in rids]
        if len(rids) > 1 and None not in stamps:
            spans.append((max(stamps) - min(stamps)) / (len(rids) - 1))
    return statistics.median(spans) if spans else None


def branch_spread(requests: Path) -> float | None:
    """How far apart a live client sent a question's branches (seconds per gap): per question
    of several branches its send span / (branches - 1), the median over questions (None
    without such questions). The twin's `branch_spread_s`: a lower bound of their spread at
    the scheduler, whose HTTP and tokenizer take them in turn after the sends."""
    import statistics

    from eval.client import load_trace

    sends: dict[tuple, list[float]] = {}
    for r in load_trace(requests) or ():
        if r.get("send_s") is not None:
            sends.setdefault((r.get("segment"), r.get("qid")), []).append(r["send_s"])
    spans = [(max(v) - min(v)) / (len(v) - 1) for v in sends.values() if len(v) > 1]
    return statistics.median(spans) if spans else None


def twin_front_end_choice(text: str) -> str:
    from eval.frontend import twin_choice

    return twin_choice(text)


def twin_prediction(spec: ArmSpec, segments, model: str, overlap: bool, seed: int, cost,
                    layout: str, host=None, release_lag_s: float = 0.0,
                    branch_spread_s: float = 0.0, front_end=None,
                    loop_pass_s: float = 0.0) -> dict[str, Any]:
    """The twin's figures (TWIN_KEYS) for one arm: the same workload, policy and boundary mode
    in virtual time, free scans (`host`: an eval.hostcost.HostCost charges them, eval/twin.py
    `run_arm`); a failure is recorded with its error, never filled in."""
    from eval.twin import run_arm
    from radixflow_sglang.config import RadixFlowConfig

    rf = (None if spec.policy == BASELINE
          else RadixFlowConfig(policy=spec.policy, boundaries=spec.boundaries))
    out: dict[str, Any] = {"layout": layout, "cost_model": cost.source,
                           "host": None if host is None else host.source,
                           "release_lag_ms": release_lag_s * 1e3,
                           "branch_spread_ms": branch_spread_s * 1e3,
                           "loop_pass_ms": loop_pass_s * 1e3,
                           "front_end": None if front_end is None else front_end.describe()}
    res = run_arm(segments, model, spec.policy, layout=layout, overlap=overlap, cost=cost,
                  seed=seed, host=host, radixflow_config=rf, kit_overrides=spec.kit_overrides,
                  release_lag_s=release_lag_s, branch_spread_s=branch_spread_s,
                  front_end=front_end, loop_pass_s=loop_pass_s)
    if res.error is not None:
        return out | {"failed": True, "error": res.error[:2000], "wall_s": res.wall_s}
    return out | {k: res.metrics.get(k) for k in TWIN_KEYS} | {"wall_s": res.wall_s}


def twin_arms(arms: Mapping[str, LiveArm], specs: Sequence[ArmSpec], segments,
              args: argparse.Namespace, gpu: bool) -> dict[str, Any]:
    """Each ids arm's twin prediction into arms[name].twin; returns the models used."""
    cost = twin_cost(args.model, gpu, getattr(args, "sim_profile", None))
    host = twin_host(getattr(args, "twin_host", "auto"), gpu)
    # NOTE: a registration waits for the scan after the forward running when the request
    # came: at a long-round profile (paper: ~50 ms) that, not the sender, spaces them, so a run
    # of several profiles replays every one with the box run's lag (see main)
    lag = getattr(args, "release_lag_s", None)
    if lag is None:
        lag = live_release_lag(arms, specs, segments, args.out)
    spread = next((b for spec in specs if not spec.fork and arms.get(spec.name) is not None
                   and (b := branch_spread(args.out / f"arm-{spec.name}" / "requests.jsonl"))
                   is not None), None)
    front_end = twin_front_end(args, arms, specs)
    if front_end is not None:
        spread = None  # NOTE: the front end is measured from the send: it holds the spread
    # NOTE: the loop's pass is host time: charged with the scans' (live_ab's `scans` twin)
    loop = traced_loop_pass(arms, specs, args.out) if host is not None else None
    for spec in specs:
        if spec.fork:
            continue  # NOTE: re-tokenized text: the twin's ids are not what the server saw
        layout = server_layout(args.out / f"arm-{spec.name}")
        arms[spec.name].twin = twin_prediction(spec, segments, args.model, args.overlap,
                                               args.seed, cost, layout, host, lag or 0.0,
                                               spread or 0.0, front_end, loop or 0.0)
        t = arms[spec.name].twin
        print(f"[{spec.name} twin] " + (f"FAILED: {t['error']}" if t.get("failed") else
                                        f"sched={t['scheduled_tokens']} rounds={t['rounds']} "
                                        f"lat_mean={t['latency_mean_s']:.4f}s"),
              file=sys.stderr)
    return {"cost": cost.as_dict(), "host_cost": None if host is None else host.as_dict(),
            "release_lag_ms": None if lag is None else lag * 1e3,
            "branch_spread_ms": None if spread is None else spread * 1e3,
            "loop_pass_ms": None if loop is None else loop * 1e3,
            "front_end": None if front_end is None else front_end.as_dict()}


def traced_loop_pass(arms: Mapping[str, LiveArm], specs: Sequence[ArmSpec], out: Path
                     ) -> float | None:
    """The loop's pass in the first traced ids arm's trace, the twin's `loop_pass_s`; None
    where no trace carries one."""
    fit, _ = arm_loop_pass(traced_arm(arms, specs, out))
    return None if fit is None else fit[0]


def arm_loop_pass(arm_dir: Path | None) -> tuple[tuple[float, int] | None, str]:
    """(eval/calibrate.py `loop_pass` of the run's trace.jsonl, or None and why not)."""
    from eval.calibrate import loop_pass

    if arm_dir is None:
        return None, "no traced run"
    try:
        fit = loop_pass(Path(arm_dir) / "trace.jsonl")
    except (OSError, ValueError, KeyError) as e:
        return None, f"not read: {e}"
    return fit, "" if fit is not None else "the live trace has none"


def twin_front_end(args: argparse.Namespace, arms: Mapping[str, LiveArm],
                   specs: Sequence[ArmSpec]):
    """--twin-front-end as an eval.frontend.FrontEnd (None: the branch spread), `live` fitted
    on the first traced ids arm that ran, as the release lag is."""
    from eval.frontend import for_twin

    return for_twin(getattr(args, "twin_front_end", "live"), traced_arm(arms, specs, args.out))


def traced_arm(arms: Mapping[str, LiveArm], specs: Sequence[ArmSpec], out: Path
               ) -> Path | None:
    """The directory of the first traced ids arm that ran (None: none did)."""
    for spec in specs:
        arm = arms.get(spec.name)
        if spec.traced and not spec.fork and arm is not None and arm.ok:
            return out / f"arm-{spec.name}"
    return None


def live_release_lag(arms: Mapping[str, LiveArm], specs: Sequence[ArmSpec], segments,
                     out: Path) -> float | None:
    """release_lag of the first traced ids arm that ran (the twin's lag for every arm: the
    server's HTTP and tokenizer, not the policy, space the releases)."""
    from eval import client

    arm_dir = traced_arm(arms, specs, out)
    if arm_dir is None:
        return None
    prefix = arm_dir.name.removeprefix("arm-") + "/"  # NOTE: make_sender's rids
    return release_lag(client.load_trace(arm_dir / "trace.jsonl"), segments, prefix)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def gpu_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch, no GPU
        return False


def sim_cost(model: str, profile: str | None = None) -> dict[str, Any]:
    """The simulated executor's cost in force at `profile` (radixflow_sglang/profiles.py, the
    RADIXFLOW_SIM_* overrides of this environment, which the servers inherit)."""
    return resolve(profile or DEFAULT_PROFILE, model, os.environ, "--profiles").as_dict()


def make_config(args: argparse.Namespace, gpu: bool, common: list[str],
                shape: Mapping[str, Any] | None = None) -> dict[str, Any]:
    cfg = {"workload": args.workload, "model": args.model, "model_dir": str(args.model_dir),
           "profile": getattr(args, "sim_profile", None),
           "policies": args.policies, "boundaries": args.boundaries,
           "fork_arm": args.fork_arm, "regime": args.regime,
           "order": args.order, "rate": args.rate, "questions": args.questions,
           "seed": args.seed, "pool": args.pool, "overlap": args.overlap,
           "stock_cmd": args.stock_cmd, "executor": "model" if gpu else "simulated",
           "server_args": shlex.join(common), "data_dir": args.data_dir,
           "replay": args.replay, "twin": args.twin and args.replay, "bench": args.bench}
    if shape is not None:
        cfg |= {"shape": dict(shape), "rate": shape["rate"], "n_param": args.n_param}
    if args.bench:
        shape = asdict(bench_shape(args))
        shape["rate"] = "inf" if math.isinf(shape["rate"]) else shape["rate"]
        cfg |= {"bench_policies": args.bench_policies, "bench_shape": shape}
    if not gpu:
        cfg["sim_cost"] = sim_cost(args.model, getattr(args, "sim_profile", None))
    cfg["twin_host"] = getattr(args, "twin_host", "auto")
    cfg["twin_front_end"] = getattr(args, "twin_front_end", "live")
    return cfg


def build_segments(args: argparse.Namespace, shape: Mapping[str, Any]):
    """The workload's segments as the twin replays them (eval.replay's call)."""
    from eval.workload import workload

    if args.workload == TRACE_WORKLOAD:
        return workload(args.workload, args.model, trace=args.trace_spec)
    if args.workload in TRAFFIC_WORKLOADS:
        return workload(args.workload, args.model, rate=args.rate, seed=args.seed, **shape)
    return workload(args.workload, args.model, regime=args.regime, order=args.order,
                    questions=args.questions, rate=args.rate, seed=args.seed,
                    data_dir=args.data_dir)


def live_segments(segments, n_param: bool):
    """What the client sends: with SGLang's `n` (nsample warm) the workload's scripted warm
    question is dropped, as the tokenizer manager sends it itself (client.fold_warm)."""
    from eval.client import fold_warm

    return fold_warm(segments) if n_param else segments


def sigterm_exits() -> None:
    """SIGTERM (`timeout`, a job stop) unwinds the run like Ctrl-C: every `with Server(...)`
    on the way out stops its server's process group. NOTE: without it a killed run leaves its
    server (started in a session of its own) running, holding a port and CPU."""
    def exit_on(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_on)


def main(argv: list[str] | None = None) -> int:
    sigterm_exits()
    parser = build_parser()
    args = parser.parse_args(argv)
    shape_given = check_args(parser, args)
    from radixflow_sglang.tokenizer import served_model_dir

    shape = None
    if args.workload in TRAFFIC_WORKLOADS:
        from eval.traffic import describe

        try:
            shape = describe(args.workload, args.seed, args.rate, **shape_given)
        except ValueError as e:
            parser.error(str(e))
    elif args.trace_spec is not None:
        from eval.mooncake import describe as describe_trace

        try:
            shape = describe_trace(args.trace_spec)
        except (OSError, ValueError) as e:
            parser.error(str(e))
    args.n_param = shape is not None and shape.get("nsample_mode") == "warm"
    gpu = gpu_available()
    args.stock_cmd = args.stock_cmd or ("sglang" if gpu else "radixflow")
    try:
        segments = build_segments(args, shape_given) if args.replay else []
        args.model_dir = (args.model_dir or served_model_dir(args.model)).resolve()
    except (OSError, ValueError) as e:
        print(f"python -m eval.run_arms: error: cannot build the workload: {e}", file=sys.stderr)
        return 2
    common = [*model_args(args.model, args.model_dir), "--host", "127.0.0.1"]
    common += [] if args.overlap else ["--disable-overlap-schedule"]
    common += shlex.split(args.server_args)
    profiles = run_profiles(parser, args, gpu)
    results = {}
    for prof in profiles:
        sub = argparse.Namespace(**vars(args))
        sub.sim_profile = prof
        sub.out = args.out if len(profiles) == 1 else args.out / f"profile-{prof}"
        results[prof] = run_profile(sub, gpu, common, segments, shape)
        if prof == DEFAULT_PROFILE:  # NOTE: the box run's lag for the later profiles' twins
            lag_ms = (results[prof][1]["config"].get("twin_model") or {}).get("release_lag_ms")
            args.release_lag_s = None if lag_ms is None else lag_ms / 1e3
    if len(profiles) > 1:
        from eval.profiles_report import write_profiles

        write_profiles(args.out, {p: summary for p, (_, summary) in results.items()})
        print(f"wrote {args.out}/profiles.md", file=sys.stderr)
    return 0 if all(ok for ok, _ in results.values()) else 1


def run_profiles(parser: argparse.ArgumentParser, args: argparse.Namespace,
                 gpu: bool) -> list[str | None]:
    """--profiles, else $RADIXFLOW_SIM_PROFILE, else box; [None] on a GPU box (no profile: the
    model executor has none). Errors name the flag or the variable."""
    if gpu:
        if args.profiles:
            parser.error("--profiles: a GPU is visible, so the servers run the model executor, "
                         "which has no cost profile (profiles are the simulated executor's)")
        return [None]
    chosen = args.profiles or [os.environ.get(PROFILE_VAR) or DEFAULT_PROFILE]
    chosen = sorted(chosen, key=lambda p: p != DEFAULT_PROFILE)  # NOTE: box first (its lag)
    name = "--profiles" if args.profiles else PROFILE_VAR
    for prof in chosen:
        try:
            resolve(prof, args.model, os.environ, name)
        except ValueError as e:
            parser.error(str(e))
    return chosen


def run_profile(args: argparse.Namespace, gpu: bool, common: list[str], segments,
                shape) -> tuple[bool, dict[str, Any]]:
    """Every arm, its twin and the bench runs at one profile, written to args.out: (every run
    ok, summary.json's dict)."""
    args.out.mkdir(parents=True, exist_ok=True)
    config = make_config(args, gpu, common, shape)
    t0 = time.perf_counter()
    ports = iter(range(args.port_base, 1 << 16)) if args.port_base is not None else None
    arms: dict[str, LiveArm] = {}
    specs = arm_specs(args.policies, args.fork_arm, args.boundaries) if args.replay else []
    sent = live_segments(segments, args.n_param)
    for spec in specs:
        arm = arms[spec.name] = run_arm(spec, sent, args, common, _port(ports))
        _print_arm(arm)
    if args.twin and specs:
        # NOTE: after every live arm, so the twin's CPU work never overlaps a live server
        config["twin_model"] = twin_arms(arms, specs, segments, args, gpu)
    bshape = bench_shape(args)
    order = bench_order(args.bench_policies, args.bench_repeat) if args.bench else []
    runs = [r for k, policy in order
            for r in run_bench_policy(policy, bshape, args, common, _port(ports), k)]
    total = time.perf_counter() - t0
    summary = write_outputs(args.out, config, arms, total,
                            bench=bench_arm.summary(runs, bshape) if runs else None)
    print(f"wrote {args.out}/summary.json and {args.out}/report.md ({total:.1f}s wall)",
          file=sys.stderr)
    return all(a.ok for a in arms.values()) and all(r.ok for r in runs), summary


def _port(ports) -> int:
    """The next of PORT_BASE, PORT_BASE + 1, ... (--port-base), else a free port."""
    return next(ports) if ports is not None else free_port()


def _print_arm(arm: LiveArm) -> None:
    if arm.ok:
        m = arm.metrics
        print(f"[{arm.name}] rounds={m['rounds']} sched={m['scheduled_tokens']} "
              f"hit={m['hit_tokens']} lat_mean={m['latency_mean_s']:.4f}s "
              f"p95={m['latency_p95_s']:.4f}s ({arm.wall_s:.1f}s wall)", file=sys.stderr)
    else:
        print(f"[{arm.name}] FAILED: {arm.error_detail}", file=sys.stderr)


def _print_bench(run: bench_arm.BenchRun) -> None:
    name = f"[bench {run.bench} / {run.policy}" + (f" #{run.repeat}]" if run.repeat else "]")
    if not run.ok:
        print(f"{name} FAILED: {run.error}", file=sys.stderr)
        return
    r, s = run.result, run.server
    print(f"{name} completed={r['completed']} sched={s['scheduled_tokens_sglang_log']} "
          f"rounds={s['rounds_sglang_log']} e2e_mean={r['mean_e2e_latency_ms']:.1f}ms "
          f"ttft_mean={r['mean_ttft_ms']:.1f}ms thr={r['request_throughput']:.2f}req/s "
          f"sched_cpu={s.get('scheduler_cpu_s', math.nan):.2f}s "
          f"({run.wall_s:.1f}s wall)"
          + (f" [server started {n} times]" if (n := s.get("server_start_attempts", 1)) > 1
             else ""), file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
