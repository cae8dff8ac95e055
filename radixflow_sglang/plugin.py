"""Entry point for SGLang's `sglang.srt.plugins` group: off unless RADIXFLOW_POLICY is set.

With `RADIXFLOW_POLICY=radixflow sglang serve ...` (or `python -m sglang.launch_server`),
SGLang's `load_plugins()` runs `register()` in every process, including each spawned scheduler,
before the scheduler is built (scheduler.py `run_scheduler_process`, first line).
"""

from __future__ import annotations

import os


def register() -> None:
    policy = os.environ.get("RADIXFLOW_POLICY")
    if not policy:
        return
    from radixflow_sglang.adapter.scheduler import config_from_env

    config_from_env()  # NOTE: bad values fail loudly at start-up, naming the variable
    from radixflow_sglang.adapter.entry import install

    install(policy)
