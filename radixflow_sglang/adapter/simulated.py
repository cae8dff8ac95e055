from __future__ import annotations

import sglang.srt.managers.scheduler as _sched_mod

_UPSTREAM_RUN = _sched_mod.run_scheduler_process


def run_scheduler_process_simulated(*args, **kwargs):
    return _UPSTREAM_RUN(*args, **kwargs)
