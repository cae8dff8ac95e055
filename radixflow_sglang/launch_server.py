"""`python -m radixflow_sglang.launch_server`: SGLang's HTTP server with RadixFlow's scheduler.

Takes every SGLang server argument plus `--radixflow-*`. With no `--model-path` it serves the
embedded Qwen3.5-0.8B geometry (launch/models, dummy weights, offline tokenizer). Flags reach
the spawned scheduler processes through RADIXFLOW_* environment variables.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from pathlib import Path

from radixflow_sglang.core.policy import POLICIES

REPO = Path(__file__).resolve().parent.parent
EMBEDDED_MODEL = REPO / "launch" / "models" / "qwen3.5-0.8b"
EXECUTORS = ("model", "simulated")
logger = logging.getLogger("radixflow")


def _positive_int(flag: str, low: int = 0):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}: {text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{flag}: {value} must be >= {low}")
        return value

    return parse


def _admission_ms(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of milliseconds") from None
    if not 0 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"{value} is outside the allowed range [0, 1000] ms")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m radixflow_sglang.launch_server", add_help=False,
        description="SGLang server arguments plus the RadixFlow flags below.",
    )
    g = p.add_argument_group("radixflow")
    g.add_argument("--radixflow-policy", choices=POLICIES, default="radixflow")
    g.add_argument("--radixflow-admission-ms", type=_admission_ms, default=None,
                   help="flexible admission hold bound (default 5; timer5/timer10 fix theirs)")
    g.add_argument("--radixflow-trace", default=None, help="per-round JSONL trace path")
    g.add_argument("--radixflow-executor", choices=EXECUTORS, default=None,
                   help="model (GPU) or simulated (CPU cost model); default: model if a GPU")
    g.add_argument("--radixflow-theta", type=_positive_int("--radixflow-theta", 1), default=None,
                   help="minimum ready-prefix gain (tokens) worth a wait; default max(G, 64)")
    g.add_argument("--radixflow-park-margin", type=_positive_int("--radixflow-park-margin"),
                   default=1, help="rounds beyond the publish lag a request may stay parked")
    g.add_argument("--radixflow-frag-cap", type=_positive_int("--radixflow-frag-cap"),
                   default=2, help="rounds radixflow-frag may defer one request")
    return p


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    p = parser()
    ns, rest = p.parse_known_args(argv)
    unknown = [a for a in rest if a.startswith("--radixflow")]
    if unknown:
        p.error(f"unrecognized radixflow argument {unknown[0]!r}")
    if ns.radixflow_trace:
        parent = Path(ns.radixflow_trace).resolve().parent
        if not parent.is_dir():
            p.error(f"--radixflow-trace: directory {parent} does not exist")
    return ns, rest


def radixflow_env(ns: argparse.Namespace) -> dict[str, str]:
    env = {"RADIXFLOW_POLICY": ns.radixflow_policy,
           "RADIXFLOW_PARK_MARGIN": str(ns.radixflow_park_margin),
           "RADIXFLOW_FRAG_CAP": str(ns.radixflow_frag_cap)}
    if ns.radixflow_admission_ms is not None:
        env["RADIXFLOW_ADMISSION_MS"] = str(ns.radixflow_admission_ms)
    if ns.radixflow_theta is not None:
        env["RADIXFLOW_THETA"] = str(ns.radixflow_theta)
    if ns.radixflow_trace:
        env["RADIXFLOW_TRACE"] = str(Path(ns.radixflow_trace).resolve())
    return env


def has_model_arg(rest: list[str]) -> bool:
    return any(a in ("--model-path", "--model") or a.startswith(("--model-path=", "--model="))
               for a in rest)


def embedded_args() -> list[str]:
    _ensure_tokenizer(EMBEDDED_MODEL)
    return ["--model-path", str(EMBEDDED_MODEL), "--load-format", "dummy",
            "--context-length", "32768", "--max-running-requests", "16",
            "--chunked-prefill-size", "8192", "--max-prefill-tokens", "8192"]


def _ensure_tokenizer(model_dir: Path) -> None:
    spec = importlib.util.spec_from_file_location("rf_build_tokenizer",
                                                  REPO / "launch" / "build_tokenizer.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # NOTE: its dataclasses look their module up while building
    spec.loader.exec_module(mod)
    mod.ensure_tokenizer(model_dir)


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def simulated_args(rest: list[str]) -> list[str]:
    """CPU serving: SGLang resolves its args for `--device cpu`; an idle loop should sleep."""
    extra = []
    if not any(a == "--device" or a.startswith("--device=") for a in rest):
        extra += ["--device", "cpu"]
    if "--sleep-on-idle" not in rest:
        extra.append("--sleep-on-idle")
    return rest + extra


def cpu_rank_binding(ranks: int) -> str:
    """SGLANG_CPU_OMP_THREADS_BIND for `ranks` CPU scheduler ranks: this process's cores split
    evenly (ranks share cores when there are fewer cores than ranks).

    NOTE: SGLang (utils/numa_utils.py init_threads_binding) asserts one NUMA node per rank
    unless the variable is set, so `--dp-size 2` on a one-node box dies at start-up."""
    cores = sorted(os.sched_getaffinity(0))
    if ranks > len(cores):
        cores = cores * ranks
    per = len(cores) // ranks
    return "|".join(",".join(map(str, cores[i * per:(i + 1) * per])) for i in range(ranks))


def scheduler_entry(executor: str):
    if executor == "simulated":
        from radixflow_sglang.adapter.simulated import (
            allow_extra_buffer_on_cpu,
            run_scheduler_process_simulated,
        )

        allow_extra_buffer_on_cpu()
        return run_scheduler_process_simulated
    from radixflow_sglang.adapter.entry import run_scheduler_process

    return run_scheduler_process


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="[radixflow] %(message)s")
    ns, rest = parse(sys.argv[1:] if argv is None else argv)
    if not has_model_arg(rest):
        logger.info("no --model-path: serving the embedded Qwen3.5-0.8B geometry (dummy weights)")
        rest = embedded_args() + rest
    executor = ns.radixflow_executor or ("model" if gpu_available() else "simulated")
    if executor == "simulated":
        if ns.radixflow_executor is None:
            logger.info("no GPU found: simulated executor (CPU cost model, SGLang's scheduler)")
        rest = simulated_args(rest)
    os.environ.update(radixflow_env(ns))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    entry = scheduler_entry(executor)
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    server_args = prepare_server_args(rest)
    server_args.resolve_once()
    ranks = server_args.dp_size * server_args.tp_size * server_args.pp_size
    if executor == "simulated" and ranks > 1 and "SGLANG_CPU_OMP_THREADS_BIND" not in os.environ:
        os.environ["SGLANG_CPU_OMP_THREADS_BIND"] = cpu_rank_binding(ranks)
        logger.info("%d CPU scheduler ranks: SGLANG_CPU_OMP_THREADS_BIND=%s", ranks,
                    os.environ["SGLANG_CPU_OMP_THREADS_BIND"])
    logger.info("policy %s, executor %s", ns.radixflow_policy, executor)
    try:
        launch_server(server_args, run_scheduler_process_func=entry)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":
    main()
