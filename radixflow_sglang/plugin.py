"""Entry point for SGLang's `sglang.srt.plugins` group: off unless RADIXFLOW_POLICY is set.

With `RADIXFLOW_POLICY=radixflow sglang serve ...` (or `python -m sglang.launch_server`),
SGLang's `load_plugins()` runs `register()` in every process: the launching one (HTTP server and
tokenizer manager: the request checks) and each spawned scheduler (scheduler.py
`run_scheduler_process`, first line, before the scheduler is built: our class). The other
RADIXFLOW_* variables are radixflow_sglang/config.py's SETTINGS. Each such process also dumps its
Python stacks to stderr on SIGUSR2.
"""

from __future__ import annotations

import faulthandler
import os
import signal


def register() -> None:
    from radixflow_sglang.config import VAR_NAMES, ConfigError, config_from_env

    if not os.environ.get(VAR_NAMES["policy"]):
        return
    # NOTE: a hung start-up or round can be read without a debugger: SIGUSR2 writes every
    # thread's stack to stderr (the server log); radixflow_sglang/testing/server.py sends it.
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    try:
        cfg = config_from_env()
    except ConfigError as e:
        # NOTE: plugins/__init__.py `load_plugins` logs and swallows any Exception and start-up
        # would go on without RadixFlow; SystemExit is not an Exception, so start-up stops.
        raise SystemExit(f"radixflow plugin: {e}; not starting") from None
    from radixflow_sglang.adapter.entry import activate

    activate(cfg, "plugin")
