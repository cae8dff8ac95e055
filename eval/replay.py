"""Replay the four-branch workload through the scheduler twin and write a report.

    python -m eval.replay --workload mix --model qwen3.5-4b --policies stock,radix,traversal \\
        --regime all --order both --rate 5 --questions 200 --seed 0 --out out/mix-4b

The traffic workloads (eval/traffic.py) take their shape flags instead of the paper's
--regime/--order/--questions (an error with them):

    python -m eval.replay --workload gsp --model qwen3.5-4b --policies stock,radixflow
    python -m eval.replay --workload nsample --nsample-mode warm --n 8 --prompt-len 1024 ...

gsp: --groups --prompts-per-group --system-len --question-len --output-len (default 16 x 4,
2,048, 64, 4; --rate default inf, the burst); gsp-paced: the same, siblings after their group's
first request; sibling-after-completion: the same flags (16 x 4, 1,024, 64, 1; --rate 2
groups/s), one sibling alone, the rest after it completed, no boundary declared; nsample:
--nsample-mode burst|warm --prompts --n --prompt-len --output-len
(16 prompts, n 8, 1,024, 128; --rate 1); multiturn: --conversations --turns --prompt-len
--user-len --output-len --think-s (8 x 4, 1,024, 128, 128, 1 s; --rate 1); noshare: --prompts
--prompt-len --output-len (64, 2,112, 4; --rate 4). summary.json's config records the shape.
--seed draws the prompts and gaps; for race/quality/mix, seed 0 takes the first --questions in
file order (the old default) and any other seed a seeded sample of whole documents.

A Mooncake-format trace (eval/mooncake.py: hash id -> a fixed block of 512 ids) replays with
--workload trace --trace-file FILE [--trace-speed X (arrival = timestamp / 1000 / X)]
[--trace-window START:N] [--trace-max-input 30000 (longer records left out, counted)]
[--trace-max-output 256]; summary.json's config.trace_workload records what was kept.

--profile box|paper prices rounds as the simulated executor does at that cost profile
(radixflow_sglang/profiles.py; a live server's --radixflow-sim-profile), --alpha-ms/--beta-us/
--gamma-ms over it; without it the first-principles GPU model (eval/costmodel.py). --policies
takes stock-lpm too: SGLang's unmodified scheduler with --schedule-policy lpm.

Each policy is one arm: a fresh kit (SGLang's real scheduler on CPU) replays every segment in
virtual time (eval/twin.py). `--trace DIR` writes each non-stock arm's RadixFlow trace to
DIR/POLICY.jsonl (a server's --radixflow-trace events: round, selected, decide, forward), so a
cell can be diagnosed without editing code. An arm whose kit cannot be built, or whose replay
breaks an invariant, is recorded as failed with its error and no numbers. Exit status: 0 when
every arm replayed cleanly, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from eval import cli
from eval.hostcost import HOST_CHOICES
from eval.traffic import NSAMPLE_MODES, all_shape_fields, flag, shape_fields
from eval.traffic import WORKLOADS as TRAFFIC_WORKLOADS
from radixflow_sglang import models
from radixflow_sglang.profiles import PROFILES

PAPER_WORKLOADS = ("race", "quality", "mix", "synthetic")
TRACE_WORKLOAD = "trace"  # eval/mooncake.py
WORKLOAD_CHOICES = PAPER_WORKLOADS + TRAFFIC_WORKLOADS + (TRACE_WORKLOAD,)
TRACE_FLAGS = ("trace_file", "trace_speed", "trace_window", "trace_max_input",
               "trace_max_output")
PAPER_DEFAULTS = {"regime": "all", "order": "both", "questions": 200}
MODEL_CHOICES = tuple(models.names())
REGIME_CHOICES = ("cold", "mixed", "reuse", "all")
ORDER_CHOICES = ("forward", "reverse", "both")
LAYOUT_CHOICES = ("extra_buffer", "no_buffer")


def _positive_float(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not x > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (questions/s; 'inf' = all at once), "
                                         f"got {text!r}")
    return x


def _positive_int(text: str) -> int:
    try:
        x = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if x <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return x


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m eval.replay", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=WORKLOAD_CHOICES, default="mix")
    p.add_argument("--model", choices=MODEL_CHOICES, default="qwen3.5-4b")
    p.add_argument("--policies", type=cli.arms, default=["stock", "radix", "traversal"],
                   help=f"comma-separated, from: {', '.join(cli.ARMS)} (default: "
                        f"stock,radix,traversal; {cli.STOCK_LPM}: SGLang's unmodified "
                        "scheduler with --schedule-policy lpm)")
    p.add_argument("--regime", choices=REGIME_CHOICES, default=None,
                   help="paper workloads only (default all)")
    p.add_argument("--order", choices=ORDER_CHOICES, default=None,
                   help="paper workloads only (default both)")
    p.add_argument("--rate", type=_positive_float, default=None,
                   help="Poisson arrival rate per second (default 5 questions/s; the traffic "
                        "workloads' own defaults, see above)")
    p.add_argument("--questions", type=_positive_int, default=None,
                   help="questions per segment, paper workloads only (default 200)")
    add_shape_args(p)
    add_trace_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output directory (default out/WORKLOAD-MODEL)")
    p.add_argument("--layout", choices=LAYOUT_CHOICES, default="extra_buffer",
                   help="mamba cache layout of hybrid models (ignored for full attention)")
    p.add_argument("--overlap", action="store_true", help="overlap scheduling (publish lag 2)")
    p.add_argument("--profile", choices=PROFILES, default=None,
                   help="cost model: the simulated executor's at this profile "
                        "(radixflow_sglang/profiles.py: box 5 ms + 2 us/token + 0.1 ms/row; "
                        "paper the model's Table 9 rounds), as a live simulated server at "
                        "--radixflow-sim-profile charges its rounds (default: none, "
                        "eval/costmodel.py's first-principles GPU model)")
    p.add_argument("--release-lag-ms", type=cli.non_negative(float, "a number"), default=0.0,
                   help="questions one completion releases (gsp-paced, sibling-after-"
                        "completion siblings) reach the scheduler this many ms apart, in send "
                        "order, as a live server's HTTP and tokenizer take them in turn; "
                        "latency still counts from the release (default 0: together)")
    p.add_argument("--loop-pass-ms", type=cli.non_negative(float, "a number"), default=0.0,
                   help="the scheduler loop's pass from a launch or processed result to its "
                        "next scan (result processing, streaming, request intake: "
                        "testing/loop.py); eval.live_ab fits it on the live trace "
                        "(eval/calibrate.py loop_pass; default 0: the scan runs at once)")
    p.add_argument("--branch-spread-ms", type=cli.non_negative(float, "a number"), default=0.0,
                   help="a question's branches reach the scheduler this many ms apart, in "
                        "branch order, as a live client's concurrent sends pass HTTP and the "
                        "tokenizer in turn (eval.live_ab measures it); latency still counts "
                        "from the question's arrival (default 0: together)")
    p.add_argument("--front-end", default="off",
                   metavar="off|fitted|C_MS,A_MS,B_US[,JITTER_MS[,BACK_MS]]",
                   help="the live server's front end (eval/frontend.py): branch j of a question "
                        "reaches the scheduler C ms + the sum over branches k <= j of (A ms + "
                        "B us x tokens_k) after the question's arrival (HTTP and the tokenizer "
                        "take them in turn), each drawn with sd JITTER ms about that (seeded by "
                        "its rid), and the client receives a completion BACK ms after its "
                        "forward; `fitted`: the fit on the live paper mix runs "
                        "(eval/frontend.py FITTED). Measured from the client's send, it includes "
                        "the send spread: not with --branch-spread-ms (default off)")
    p.add_argument("--alpha-ms", type=cli.non_negative(float, "a number"), default=None,
                   help="cost model: fixed ms per round (default: eval/costmodel.py's)")
    p.add_argument("--beta-us", type=cli.non_negative(float, "a number"), default=None,
                   help="cost model: us per scheduled token (default: eval/costmodel.py's)")
    p.add_argument("--gamma-ms", type=cli.non_negative(float, "a number"), default=None,
                   help="cost model: ms per row (default: eval/costmodel.py's)")
    p.add_argument("--host-cost", choices=HOST_CHOICES, default="model",
                   help="the scheduler's CPU time per round: model (eval/hostcost.py, "
                        "deterministic; default), measured (the kit's scan CPU time, not "
                        "deterministic) or none (free scans: the old twin's figures)")
    p.add_argument("--data-dir", default=None,
                   help="RACE/QuALITY data directory (default: $RADIXFLOW_DATA_DIR or "
                        "shared/data)")
    p.add_argument("--executor", choices=("witness", "scripted"), default="witness",
                   help="witness (default): every resumed state and KV slot is checked "
                        "against its prefix, a mismatch fails the arm, and output ids depend "
                        "on the states; scripted: the old state-free tokens")
    p.add_argument("--trace", metavar="DIR", default=None,
                   help="write each arm's RadixFlow trace to DIR/POLICY.jsonl (round, selected, "
                        "decide and forward events, as a server's --radixflow-trace; none for "
                        "stock, which runs SGLang's unmodified scheduler)")
    p.add_argument("--undeclared", action="store_true",
                   help="drop every declared boundary: what a client that sends none (SGLang's "
                        "bench_serving) lets the server see; it learns them (eval/live_ab.py's "
                        "twin replays bench_serving workloads so)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def trace_config(trace_dir: str | None, policy: str):
    """The arm's RadixFlowConfig with its trace file (a fresh one per run), or None: no
    --trace, or stock (no trace to write)."""
    if trace_dir is None or policy == "stock":
        return None
    from radixflow_sglang.config import RadixFlowConfig

    path = Path(trace_dir) / f"{policy}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # NOTE: the runtime appends
    return RadixFlowConfig(policy=policy, trace=str(path))


def add_shape_args(p: argparse.ArgumentParser) -> None:
    """The traffic workloads' shape flags (default None: the workload's own); eval/run_arms.py
    takes the same."""
    shape = p.add_argument_group("traffic workload shape (eval/traffic.py; default: the "
                                 "workload's own)")
    for name in all_shape_fields():
        if name == "nsample_mode":
            shape.add_argument(flag(name), choices=NSAMPLE_MODES, default=None)
        elif name == "think_s":
            shape.add_argument(flag(name), type=cli.non_negative(float, "a number"),
                               default=None, help="mean think gap between turns, seconds")
        else:
            kind = cli.non_negative(int, "an integer") if name == "output_len" else \
                cli.positive(int, "an integer")
            shape.add_argument(flag(name), type=kind, default=None)


def add_trace_args(p: argparse.ArgumentParser, speed: bool = True) -> None:
    """The trace workload's flags (eval/mooncake.py); eval.run_arms and eval.sweep take them
    too (the sweep without --trace-speed: its --rates set the pace)."""
    from eval import mooncake

    g = p.add_argument_group("trace workload (--workload trace, eval/mooncake.py)")
    g.add_argument("--trace-file", default=None, metavar="FILE",
                   help="Mooncake-format JSONL: timestamp (ms), input_length, output_length, "
                        "hash_ids of 512-token blocks")
    if speed:
        g.add_argument("--trace-speed", type=cli.positive(float, "a number"), default=None,
                       help="time compression: arrival = timestamp / 1000 / X s (default 1)")
    g.add_argument("--trace-window", default=None, metavar="START:N",
                   help="N records from the START-th (0-based, file order; START: = to the "
                        "end), before the caps (default 0:, the whole file)")
    g.add_argument("--trace-max-input", type=cli.positive(int, "an integer"), default=None,
                   help="records with more input tokens are left out and counted (default "
                        f"{mooncake.DEFAULT_MAX_INPUT})")
    g.add_argument("--trace-max-output", type=cli.non_negative(int, "an integer"),
                   default=None, help="output tokens per request at most (default "
                                      f"{mooncake.DEFAULT_MAX_OUTPUT})")


def trace_spec(p: argparse.ArgumentParser, args: argparse.Namespace):
    """The --trace-* flags as a TraceSpec (None without --workload trace); errors name the
    flag."""
    from eval import mooncake

    if args.workload != TRACE_WORKLOAD:
        return None
    kw = {"file": args.trace_file, "speed": getattr(args, "trace_speed", None),
          "max_input": args.trace_max_input, "max_output": args.trace_max_output}
    try:
        if args.trace_window is not None:
            kw["start"], kw["count"] = mooncake.parse_window(args.trace_window)
        return mooncake.TraceSpec(**{k: v for k, v in kw.items() if v is not None})
    except ValueError as e:
        p.error(str(e))


def _check_trace_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    given = [k for k in TRACE_FLAGS if getattr(args, k, None) is not None]
    if args.workload != TRACE_WORKLOAD:
        if given:
            p.error(f"{flag(given[0])} applies to --workload {TRACE_WORKLOAD} only, not to "
                    f"{args.workload}")
        return
    if args.trace_file is None:
        p.error(f"--workload {TRACE_WORKLOAD} needs --trace-file FILE (Mooncake-format JSONL)")
    for k in PAPER_DEFAULTS:
        if getattr(args, k, None) is not None:
            p.error(f"--{k} applies to the paper workloads ({', '.join(PAPER_WORKLOADS)}) only, "
                    f"not to --workload {TRACE_WORKLOAD}")
    if getattr(args, "rate", None) is not None and hasattr(args, "trace_speed"):
        p.error(f"--rate does not apply to --workload {TRACE_WORKLOAD}: its arrivals are the "
                f"trace's timestamps (compress them with --trace-speed)")


def check_workload_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict:
    """Paper flags with a traffic or trace workload, or shape or trace flags another workload
    does not take, are errors that name the flag; returns the traffic shape given (field ->
    value)."""
    given = {k: getattr(args, k) for k in all_shape_fields() if getattr(args, k) is not None}
    _check_trace_flags(p, args)
    if args.workload == TRACE_WORKLOAD:
        for k in given:
            p.error(f"{flag(k)} does not apply to --workload {TRACE_WORKLOAD} (its flags: "
                    f"{', '.join(flag(a) for a in TRACE_FLAGS)})")
        return given
    if args.workload in TRAFFIC_WORKLOADS:
        for k in PAPER_DEFAULTS:
            if getattr(args, k) is not None:
                p.error(f"--{k} applies to the paper workloads ({', '.join(PAPER_WORKLOADS)}) "
                        f"only, not to --workload {args.workload}")
        allowed = shape_fields(args.workload)
        for k in given:
            if k not in allowed:
                p.error(f"{flag(k)} does not apply to --workload {args.workload} (its flags: "
                        f"{', '.join(flag(a) for a in allowed)})")
        return given
    for k in given:
        users = [w for w in TRAFFIC_WORKLOADS if k in shape_fields(w)]
        p.error(f"{flag(k)} applies to --workload {', '.join(users)} only, not to "
                f"{args.workload}")
    for k, default in PAPER_DEFAULTS.items():
        if getattr(args, k) is None:
            setattr(args, k, default)
    if args.rate is None:
        args.rate = 5.0
    return given


def front_end_arg(p: argparse.ArgumentParser, args: argparse.Namespace):
    """--front-end as an eval.frontend.FrontEnd (None: off); an error beside a spread."""
    from eval import frontend

    try:
        fe = frontend.parse(args.front_end)
    except ValueError as e:
        p.error(f"--front-end: {e}")
    if fe is not None and args.branch_spread_ms:
        p.error("--front-end includes the client's send spread: leave out --branch-spread-ms")
    if fe is not None:
        print(f"twin {fe.describe()}", file=sys.stderr)
    return fe


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    shape = check_workload_flags(parser, args)
    spec = trace_spec(parser, args)
    from eval import report
    from eval.hostcost import host_model
    from eval.twin import run_arm
    from eval.workload import workload

    front_end = front_end_arg(parser, args)
    out = Path(args.out or f"out/{args.workload}-{args.model}")
    config = {
        "workload": args.workload, "model": args.model, "policies": args.policies,
        "regime": args.regime, "order": args.order, "rate": args.rate,
        "questions": args.questions, "seed": args.seed, "layout": args.layout,
        "overlap": args.overlap, "data_dir": args.data_dir, "trace": args.trace,
        "executor": args.executor, "undeclared": args.undeclared, "profile": args.profile,
        "release_lag_ms": args.release_lag_ms, "branch_spread_ms": args.branch_spread_ms,
        "loop_pass_ms": args.loop_pass_ms,
        "front_end": None if front_end is None else front_end.describe(),
    }
    if args.workload in TRAFFIC_WORKLOADS:
        from eval.traffic import describe

        try:
            config["shape"] = describe(args.workload, args.seed, args.rate, **shape)
        except ValueError as e:
            parser.error(str(e))
        config["rate"] = config["shape"]["rate"]  # NOTE: "inf" for the burst (JSON has no inf)
    elif spec is not None:
        from eval.mooncake import describe as describe_trace

        try:
            config["trace_workload"] = describe_trace(spec)
        except (OSError, ValueError) as e:
            print(f"eval/replay.py: error: cannot build the workload: {e}", file=sys.stderr)
            return 2
    try:
        cost = replay_cost(args)
    except ValueError as e:
        parser.error(str(e))
    host = host_model(args.host_cost)
    config["cost_model"] = cost.as_dict()
    config["host_cost"] = host.as_dict() if host is not None else None
    t0 = time.perf_counter()
    try:
        if spec is not None:
            segments = workload(args.workload, args.model, trace=spec)
        elif args.workload in TRAFFIC_WORKLOADS:
            segments = workload(args.workload, args.model, rate=args.rate, seed=args.seed,
                                **shape)
        else:
            segments = workload(args.workload, args.model, regime=args.regime,
                                order=args.order, questions=args.questions, rate=args.rate,
                                seed=args.seed, data_dir=args.data_dir)
    except (OSError, ValueError) as e:
        print(f"eval/replay.py: error: cannot build the workload: {e}", file=sys.stderr)
        return 2
    if args.undeclared:
        from eval.requests import undeclared

        segments = undeclared(segments)
    progress = not args.no_progress and sys.stderr.isatty()
    arms = {}
    for policy in args.policies:
        base, kit = arm_args(policy)
        res = run_arm(segments, args.model, base, layout=args.layout, overlap=args.overlap,
                      seed=args.seed, progress=progress, cost=cost, host=host,
                      radixflow_config=trace_config(args.trace, base), executor=args.executor,
                      kit_overrides=kit, release_lag_s=args.release_lag_ms / 1e3,
                      branch_spread_s=args.branch_spread_ms / 1e3, front_end=front_end,
                      loop_pass_s=args.loop_pass_ms / 1e3)
        arms[policy] = res
        if res.ok:
            m = res.metrics
            print(f"[{policy}] rounds={m['rounds']} tokens={m['scheduled_tokens']} "
                  f"lat_mean={m['latency_mean_s']:.4f}s p95={m['latency_p95_s']:.4f}s "
                  f"({res.wall_s:.1f}s wall)", file=sys.stderr)
            if "witness" in m:
                w = m["witness"]
                print(f"[{policy}] witness: {w['verified']} of {w['requests']} requests "
                      f"verified, {w['mismatched']} mismatched ({w['resumed']} resumed "
                      f"states, {w['states_checked']} states checked)", file=sys.stderr)
        else:
            print(f"[{policy}] FAILED: {res.error}", file=sys.stderr)
    for policy, agreement in output_agreement(arms).items():
        arms[policy].metrics["outputs_vs_stock"] = agreement
        print(f"[{policy}] outputs: {agreement['identical']} of {agreement['compared']} "
              f"requests identical to stock", file=sys.stderr)
    report.write(out, config, arms)
    print(f"wrote {out}/summary.json and {out}/report.md "
          f"({time.perf_counter() - t0:.1f}s wall)", file=sys.stderr)
    broken = [p for p, r in arms.items() if not r.ok]
    differ = [p for p, r in arms.items() if r.ok and (r.metrics.get("outputs_vs_stock") or {})
              .get("differing")]
    if differ:
        print(f"eval/replay.py: outputs differ from stock under {', '.join(differ)}",
              file=sys.stderr)
    return 1 if broken or differ else 0


def replay_cost(args: argparse.Namespace):
    """--profile's simulated-executor cost (else the first-principles model), then --alpha-ms,
    --beta-us, --gamma-ms over it."""
    from eval.costmodel import default_cost, override, profile_cost

    base = (default_cost(args.model) if args.profile is None
            else profile_cost(args.profile, args.model))
    return override(base, alpha_ms=args.alpha_ms, beta_us=args.beta_us, gamma_ms=args.gamma_ms)


def arm_args(arm: str) -> tuple[str, dict | None]:
    """(policy, run_arm's kit_overrides) of an arm: stock-lpm is stock with SGLang's lpm."""
    policy, schedule = cli.arm_policy(arm)
    return policy, None if schedule is None else {"schedule_policy": schedule}


def output_agreement(arms: dict) -> dict[str, dict[str, int]]:
    """Per non-stock arm, its output ids against the stock arm's, request by request (with the
    witness executor, ids depend on every state a request computed from)."""
    ref = arms.get("stock")
    if ref is None or not ref.ok:
        return {}
    out = {}
    for policy, res in arms.items():
        if policy == "stock" or not res.ok:
            continue
        both = ref.outputs.keys() & res.outputs.keys()
        same = sum(ref.outputs[r] == res.outputs[r] for r in both)
        out[policy] = {"compared": len(both), "identical": same, "differing": len(both) - same}
    return out


if __name__ == "__main__":
    sys.exit(main())
