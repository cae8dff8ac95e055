"""Installing RadixFlow inside SGLang's scheduler processes (spawned: patches must happen there).

`run_scheduler_process` is handed to SGLang's launcher as its `run_scheduler_process_func`; the
data-parallel controller forwards it to its own children, so TP, DP and PP launches all pass
through it. It swaps our class into `sglang.srt.managers.scheduler.Scheduler`, which
upstream `run_scheduler_process` (scheduler.py) looks up as a module global, then delegates.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from typing import TYPE_CHECKING

from . import check_sglang_version

check_sglang_version()

import sglang.srt.managers.scheduler as _sched_mod  # noqa: E402

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


def activate(cfg: RadixFlowConfig, origin: str, executor: str | None = None) -> None:
    """Every policy, in each process that loads RadixFlow (launcher: the launching one; plugin:
    all): the request checks (validate.py; `executor` "simulated" adds its refusals), the
    bounded SIGTERM drain (drain.py, the launching process), the scheduler class, one log
    line."""
    from radixflow_sglang.core.boundary import wants

    from .validate import install as install_checks

    install_checks(executor)
    if multiprocessing.parent_process() is None:  # NOTE: where SGLang's HTTP server runs
        from .drain import install as install_drain

        install_drain(cfg.drain_timeout)
    if cfg.policy != "stock" and cfg.chat_boundary == "on" and wants(cfg.boundaries, "declared"):
        from .boundary import install_chat

        install_chat()  # NOTE: chat requests declare their system message's end
    install(cfg.policy)
    announce(f"RadixFlow active ({origin}): policy {cfg.policy}: {cfg.spec.describe()}; "
             f"settings {cfg.describe_settings()}; request checks on")


def announce(msg: str) -> None:
    """One INFO line (the first caller's: the launcher's before the plugin's), in the launching
    process only (SGLang's spawned children run the plugin too); stderr when nothing would show
    it (`sglang serve` loads plugins before it configures logging)."""
    global _announced
    if _announced or multiprocessing.parent_process() is not None:
        return
    _announced = True
    if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
        logger.info(msg)
    else:
        print(f"[radixflow] {msg}", file=sys.stderr, flush=True)
