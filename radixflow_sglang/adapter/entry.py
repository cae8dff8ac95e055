"""Installing RadixFlow inside SGLang's scheduler processes (spawned: patches must happen there).

`run_scheduler_process` is handed to SGLang's launcher as its `run_scheduler_process_func`; the
data-parallel controller forwards it to its own children, so TP, DP and PP launches all pass
through it. It swaps our class into `sglang.srt.managers.scheduler.Scheduler`, which
upstream `run_scheduler_process` (scheduler.py) looks up as a module global, then delegates.
"""

from __future__ import annotations

import logging
import os

from . import check_sglang_version

check_sglang_version()

import sglang.srt.managers.scheduler as _sched_mod  # noqa: E402

_UPSTREAM_CLASS = _sched_mod.Scheduler
_UPSTREAM_RUN = _sched_mod.run_scheduler_process
logger = logging.getLogger(__name__)


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
