"""Installing RadixFlow inside SGLang's scheduler processes (spawned: patches must happen there).

`run_scheduler_process` is handed to SGLang's launcher as its `run_scheduler_process_func`; the
data-parallel controller forwards it to its own children, so TP, DP and PP launches all pass
through it. It swaps our class into `sglang.srt.managers.scheduler.Scheduler`, which
upstream `run_scheduler_process` (scheduler.py) looks up as a module global, then delegates.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import sys
from typing import TYPE_CHECKING, Any

from . import check_sglang_version

check_sglang_version()

import sglang.srt.managers.scheduler as _sched_mod  # noqa: E402

from radixflow_sglang.core.traversal import THETA_FLOOR  # noqa: E402

if TYPE_CHECKING:
    from radixflow_sglang.config import RadixFlowConfig

_UPSTREAM_CLASS = _sched_mod.Scheduler
_UPSTREAM_RUN = _sched_mod.run_scheduler_process
logger = logging.getLogger(__name__)
_announced = False


def install(policy: str | None = None) -> type:
    """Make this process build our scheduler class (idempotent). Returns the class in effect."""
    policy = policy or os.environ.get("RADIXFLOW_POLICY", "radixflow")
    if policy == "stock":
        _sched_mod.Scheduler = _UPSTREAM_CLASS
        return _UPSTREAM_CLASS
    from .scheduler import RadixFlowScheduler

    _sched_mod.Scheduler = RadixFlowScheduler
    return RadixFlowScheduler


def run_scheduler_process(*args, **kwargs):
    cls = install()
    logger.info("radixflow: scheduler class %s, policy %s", cls.__name__,
                os.environ.get("RADIXFLOW_POLICY", "radixflow"))
    return _UPSTREAM_RUN(*args, **kwargs)


def activate(cfg: RadixFlowConfig, origin: str, executor: str | None = None, *,
             server_args: Any = None, drain: bool = True, every: bool = False) -> None:
    """Every policy, in each process that loads RadixFlow (launcher and Engine: the launching
    one; plugin: all): the request checks (validate.py; `executor` "simulated" adds its
    refusals), the bounded SIGTERM drain (drain.py, the launching process, when `drain`: an
    HTTP server's), the scheduler class, one log line (with what `server_args`, resolved,
    resolves: theta; `every`: each call's, as each Engine of a process has its own)."""
    from radixflow_sglang.core.boundary import wants

    from .validate import install as install_checks

    install_checks(executor)
    if drain and multiprocessing.parent_process() is None:  # NOTE: where the HTTP server runs
        from .drain import install as install_drain

        install_drain(cfg.drain_timeout)
    if cfg.policy != "stock" and cfg.chat_boundary == "on" and wants(cfg.boundaries, "declared"):
        from .chat import install_chat

        install_chat()  # NOTE: chat requests declare their system message's end
    install(cfg.policy)
    resolved = {} if server_args is None else {"theta": resolved_theta(cfg, server_args)}
    announce(f"RadixFlow active ({origin}): policy {cfg.policy}: {cfg.spec.describe()}; "
             f"settings {cfg.describe_settings(resolved)}; request checks on", every)


def resolved_theta(cfg: RadixFlowConfig, server_args: Any) -> int:
    """The theta a scheduler of these (resolved) server args runs with, as runtime.py
    `cache_grid` and core/traversal.py `TraversalConfig.default` resolve it: max(G, 64), G the
    mamba checkpoint grid lcm(mamba_cache_chunk_size, page) (runtime_context.py
    `mamba_checkpoint_grid`), or the page for full attention."""
    if cfg.theta is not None:
        return cfg.theta
    from sglang.srt.arg_groups.model_override_base import model_config_of, resolved_view
    from sglang.srt.arg_groups.overrides import mamba_cache_chunk_size
    from sglang.srt.configs.hybrid_arch import mambaish_config

    page = resolved_view(server_args).page_size or 1
    grid = page
    if mambaish_config(model_config_of(server_args)) is not None:
        grid = math.lcm(mamba_cache_chunk_size(server_args), page)
    return max(grid, THETA_FLOOR)


def announce(msg: str, every: bool = False) -> None:
    """One INFO line (the first caller's: the launcher's before the plugin's), in the launching
    process only (SGLang's spawned children run the plugin too); stderr when nothing would show
    it (`sglang serve` loads plugins before it configures logging)."""
    global _announced
    if (_announced and not every) or multiprocessing.parent_process() is not None:
        return
    _announced = True
    if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
        logger.info(msg)
    else:
        print(f"[radixflow] {msg}", file=sys.stderr, flush=True)
