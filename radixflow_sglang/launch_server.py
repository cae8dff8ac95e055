"""`python -m radixflow_sglang.launch_server`: SGLang's HTTP server with RadixFlow's scheduler.

Takes every SGLang server argument plus `--radixflow-*` (built from config.py's SETTINGS; each
RADIXFLOW_* variable stands in for its absent flag). With no `--model-path` it serves the
embedded default model (radixflow_sglang/models.py, dummy weights, offline tokenizer). The checked
config reaches the spawned scheduler processes through the RADIXFLOW_* variables; the request
checks (adapter/validate.py) are installed here, in the process that runs SGLang's tokenizer
manager, for every policy. `--help` prints the RadixFlow flags before importing SGLang.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from radixflow_sglang import models, profiles
from radixflow_sglang.config import (
    BY_FIELD,
    ENV_PREFIX,
    FLAG_PREFIX,
    LAUNCHER_SETTINGS,
    SETTINGS,
    ConfigError,
    RadixFlowConfig,
    Setting,
    argparse_type,
    build,
    env_texts,
)

PROG = "python -m radixflow_sglang.launch_server"
logger = logging.getLogger("radixflow")


@dataclass(frozen=True)
class Launch:
    config: RadixFlowConfig
    executor: str | None  # None: model if a GPU is visible, else simulated
    sglang_args: list[str]
    sources: dict[str, str]  # field -> the flag or variable that set it (defaults absent)


def _help(s: Setting) -> str:
    parts = [s.help]
    if s.low is not None:
        parts.append(f"range [{s.num(s.low)}, {s.num(s.high)}]")
    if s.default is not None:
        parts.append(f"default {s.default}")
    if s.var:
        parts.append(f"env {s.var}")
    return "; ".join(parts)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, add_help=False,
        description="SGLang's HTTP server with RadixFlow's scheduler: every SGLang server "
                    "argument plus the RadixFlow flags below.",
    )
    g = p.add_argument_group(
        "RadixFlow arguments", f"Each {ENV_PREFIX}* variable named below sets its flag's value; "
                               "a flag given on the command line wins.")
    for s in SETTINGS + LAUNCHER_SETTINGS:
        g.add_argument(s.flag, dest=s.field, type=argparse_type(s), choices=s.choices,
                       default=None, help=_help(s))
    return p


def wants_help(argv: list[str]) -> bool:
    return any(a in ("-h", "--help") for a in argv)


def print_help() -> None:
    """Ours first (no SGLang import), then SGLang's own server arguments."""
    parser().print_help()
    print(f"\nSGLang {_sglang_version()} server arguments (here --model-path is optional: "
          "without it the embedded Qwen3.5-0.8B geometry is served):", flush=True)
    from sglang.srt.server_args import ServerArgs

    sp = argparse.ArgumentParser(prog=PROG, add_help=True)
    ServerArgs.add_cli_args(sp)
    sp.print_help()


def _sglang_version() -> str:
    from importlib.metadata import version

    return version("sglang")


def parse(argv: list[str], env: Mapping[str, str] | None = None) -> Launch:
    """Flags, else RADIXFLOW_* variables, else defaults; validated once (config.py). Errors
    exit 2 naming the flag or the variable the user set."""
    env = os.environ if env is None else env
    p = parser()
    ns, rest = p.parse_known_args(argv)
    unknown = [a for a in rest if a.startswith(FLAG_PREFIX)]
    if unknown:
        p.error(f"unrecognized radixflow argument {unknown[0]!r}")
    flags = {s.field: getattr(ns, s.field) for s in SETTINGS
             if getattr(ns, s.field) is not None}
    texts = {f: t for f, t in env_texts(env).items() if f not in flags}
    sources = {f: BY_FIELD[f].flag for f in flags} | {f: BY_FIELD[f].var for f in texts}
    try:
        cfg = build(texts, sources, parsed=flags)
    except ConfigError as e:
        p.error(str(e))
    return Launch(cfg, ns.executor, rest, sources)


def child_env(cfg: RadixFlowConfig) -> dict[str, str | None]:
    """What spawned scheduler processes read back (config_from_env); None: unset it. The
    trace path is made absolute (children may run elsewhere)."""
    env = cfg.to_env()
    if cfg.trace:
        env[BY_FIELD["trace"].var] = str(Path(cfg.trace).resolve())
    return env


def apply_env(env: dict[str, str | None], target: MutableMapping[str, str]) -> None:
    for name, value in env.items():
        if value is None:
            target.pop(name, None)
        else:
            target[name] = value


def has_model_arg(rest: list[str]) -> bool:
    return any(a in ("--model-path", "--model") or a.startswith(("--model-path=", "--model="))
               for a in rest)


def embedded_args() -> list[str]:
    from radixflow_sglang.tokenizer import served_model_dir

    return ["--model-path", str(served_model_dir(models.DEFAULT)), "--load-format", "dummy",
            "--context-length", str(models.CONTEXT_LENGTH), *models.budget_args(models.DEFAULT)]


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


def model_path_arg(rest: list[str]) -> str | None:
    """The SGLang args' model path (None: not given)."""
    for i, a in enumerate(rest):
        if a in ("--model-path", "--model") and i + 1 < len(rest):
            return rest[i + 1]
        if a.startswith(("--model-path=", "--model=")):
            return a.split("=", 1)[1]
    return None


def sim_cost(cfg: RadixFlowConfig, rest: list[str], sources: Mapping[str, str],
             env: Mapping[str, str] | None = None) -> profiles.SimCost:
    """The simulated executor's cost in force (profiles.py), checked before SGLang starts;
    an error names the flag or variable that chose the profile and exits 2."""
    name = sources.get("sim_profile", BY_FIELD["sim_profile"].flag)
    try:
        return profiles.resolve(cfg.sim_profile, profiles.model_of(model_path_arg(rest)),
                                os.environ if env is None else env, name)
    except ValueError as e:
        parser().error(str(e))


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
    argv = sys.argv[1:] if argv is None else argv
    if wants_help(argv):
        print_help()
        return
    logging.basicConfig(level=logging.INFO, format="[radixflow] %(message)s")
    launch = parse(argv)
    executor, rest = sglang_argv(launch)
    apply_env(child_env(launch.config), os.environ)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    serve(launch.config, executor, rest)


def sglang_argv(launch: Launch) -> tuple[str, list[str]]:
    """(the executor in force, SGLang's arguments): the embedded model's when none is given,
    the simulated executor's when it runs; each choice logged."""
    cfg, rest = launch.config, launch.sglang_args
    for field, source in launch.sources.items():
        if source.startswith(ENV_PREFIX):
            logger.info("%s from %s", BY_FIELD[field].flag, source)
    if not has_model_arg(rest):
        logger.info("no --model-path: serving the embedded %s geometry (dummy weights)",
                    models.DEFAULT)
        rest = embedded_args() + rest
    executor = launch.executor or ("model" if gpu_available() else "simulated")
    if executor == "simulated":
        if launch.executor is None:
            logger.info("no GPU found: simulated executor (CPU cost model, SGLang's scheduler)")
        rest = simulated_args(rest)
        # NOTE: the profile in force, in the start-up log (/server_info repeats it per rank)
        logger.info("simulated executor: %s", sim_cost(cfg, rest, launch.sources).describe())
    return executor, rest


def serve(cfg: RadixFlowConfig, executor: str, rest: list[str]) -> None:
    """SGLang's HTTP server with our scheduler entry; the process tree ends with it."""
    entry = scheduler_entry(executor)
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    from radixflow_sglang.adapter.entry import activate

    server_args = resolved_server_args(prepare_server_args(rest))
    if executor == "simulated" and (why := cpu_limit(server_args)) is not None:
        parser().error(why)
    # NOTE: checks for every policy; the resolved args give the line the model's theta
    activate(cfg, f"launcher, executor {executor}", executor, server_args=server_args)
    ranks = server_args.dp_size * server_args.tp_size * server_args.pp_size
    if executor == "simulated" and ranks > 1 and "SGLANG_CPU_OMP_THREADS_BIND" not in os.environ:
        os.environ["SGLANG_CPU_OMP_THREADS_BIND"] = cpu_rank_binding(ranks)
        logger.info("%d CPU scheduler ranks: SGLANG_CPU_OMP_THREADS_BIND=%s", ranks,
                    os.environ["SGLANG_CPU_OMP_THREADS_BIND"])
    try:
        launch_server(server_args, run_scheduler_process_func=entry)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


def cpu_limit(server_args, name: Callable[[str], str] = lambda f: "--" + f.replace("_", "-")
              ) -> str | None:
    """What SGLang 0.5.23 itself cannot run on CPU (the simulated executor's device), stock
    or not: each dies in the scheduler processes at start-up with a CUDA error. `name`: how
    the caller spells a setting (a flag here, a keyword for the Engine)."""
    for field in ("tp_size", "pp_size"):
        if (size := getattr(server_args, field)) > 1:
            return (f"{name(field)} {size}: the simulated executor runs on CPU, where SGLang "
                    "0.5.23 builds an NCCL communicator for each model-parallel group "
                    "(distributed/parallel_state.py init_model_parallel_group) and fails; use "
                    f"{name('dp_size')} N for several CPU scheduler ranks, or a GPU "
                    f"({name('radixflow_executor')} model)")
    if server_args.enable_hierarchical_cache:
        return (f"{name('enable_hierarchical_cache')}: the simulated executor runs on CPU, and "
                "SGLang 0.5.23's host KV pool registers its memory with CUDA (mem_cache/"
                "pool_host/common.py alloc_with_host_register); drop it, or use a GPU "
                f"({name('radixflow_executor')} model)")
    return None


def resolved_server_args(server_args):
    """SGLang's own resolution and checks of its arguments (server_args.py `resolve_once`,
    `check_server_args`, which upstream's launch runs again), whose refusals are assertions
    and value errors: an argument error (exit 2) with SGLang's message, where a traceback
    told the user the same."""
    try:
        server_args.resolve_once()
        server_args.check_server_args()
    except (AssertionError, ValueError) as e:
        parser().error(f"SGLang refuses these server arguments: {e}{_hint(str(e))}")
    return server_args


def _hint(message: str) -> str:
    # NOTE: SGLang names the field; the user typed (or defaulted) flags
    if "no_buffer do not support overlap" in message:
        return (" (--mamba-radix-cache-strategy no_buffer: add --disable-overlap-schedule, or "
                "choose --mamba-radix-cache-strategy extra_buffer)")
    return ""


if __name__ == "__main__":
    main()
