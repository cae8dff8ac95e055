"""RadixFlow inside SGLang's offline engine (`sglang.Engine`, entrypoints/engine.py).

RL frameworks drive SGLang in-process: `Engine.generate` / `async_generate` with `n`, batches of
prompts, input ids. Upstream's Engine takes the hook the HTTP launcher uses, the class attribute
`Engine.run_scheduler_process_func` (entrypoints/engine.py `Engine.__init__` hands it to
`_launch_subprocesses`, which spawns each scheduler rank with it), so `Engine` here is upstream's
class with that attribute set per instance to launch_server.py's `scheduler_entry`:
SGLang's model worker on a GPU, the simulated witness executor on CPU (adapter/simulated.py).

Settings follow the config contract (config.py): keyword `radixflow_x_y` <-> flag
`--radixflow-x-y` <-> variable `RADIXFLOW_X_Y` <-> field `RadixFlowConfig.x_y`; a keyword wins
over its variable, and errors name the keyword or the variable the caller set. The checked
config reaches the spawned scheduler processes through the variables, set only while upstream's
constructor spawns them (the caller's environment is restored afterwards).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from . import check_sglang_version

check_sglang_version()

from sglang.srt.entrypoints.engine import Engine as _UpstreamEngine  # noqa: E402
from sglang.srt.plugins import load_plugins  # noqa: E402

from radixflow_sglang import models  # noqa: E402
from radixflow_sglang.config import (  # noqa: E402
    KWARG_PREFIX,
    RadixFlowConfig,
    config_from_kwargs,
)
from radixflow_sglang.launch_server import (  # noqa: E402
    child_env,
    cpu_limit,
    cpu_rank_binding,
    gpu_available,
    scheduler_entry,
)

logger = logging.getLogger("radixflow")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def embedded_kwargs() -> dict[str, Any]:
    """launch_server.py `embedded_args` as Engine keywords: the default catalog model."""
    from radixflow_sglang.tokenizer import served_model_dir

    m = models.get(models.DEFAULT)
    return {"model_path": str(served_model_dir(models.DEFAULT)), "load_format": "dummy",
            "context_length": models.CONTEXT_LENGTH, "max_running_requests": m.rows,
            "chunked_prefill_size": m.tokens, "max_prefill_tokens": m.tokens}


def sglang_kwargs(kwargs: Mapping[str, Any], executor: str) -> dict[str, Any]:
    """SGLang's own keywords, completed as the launcher completes its arguments: the embedded
    model without `model_path`, CPU serving for the simulated executor (simulated_args), and
    upstream Engine's quiet default log level."""
    out = {k: v for k, v in kwargs.items() if not k.startswith(KWARG_PREFIX)}
    if "server_args" in out:  # NOTE: upstream's other form: a complete record, used as is
        return out
    if "model_path" not in out:
        logger.info("no model_path: serving the embedded %s geometry (dummy weights)",
                    models.DEFAULT)
        out = embedded_kwargs() | out
    if executor == "simulated":
        out.setdefault("device", "cpu")
        out.setdefault("sleep_on_idle", True)
    out.setdefault("log_level", "error")  # NOTE: upstream Engine's default (engine.py __init__)
    return out


def spawn_env(cfg: RadixFlowConfig, executor: str, ranks: int) -> dict[str, str | None]:
    """What the spawned processes must see: the config, offline hubs, CPU rank binding."""
    env: dict[str, str | None] = dict(child_env(cfg))
    env |= {k: v for k, v in OFFLINE_ENV.items() if k not in os.environ}
    if executor == "simulated" and ranks > 1 and "SGLANG_CPU_OMP_THREADS_BIND" not in os.environ:
        env["SGLANG_CPU_OMP_THREADS_BIND"] = cpu_rank_binding(ranks)
    return env


@contextmanager
def scoped_env(env: Mapping[str, str | None]) -> Iterator[None]:
    """Set (None: unset) these variables, and put the caller's values back afterwards."""
    saved = {k: os.environ.get(k) for k in env}
    try:
        for k, v in env.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


class Engine(_UpstreamEngine):
    """`sglang.Engine` with RadixFlow's scheduler: every policy, in-process.

    `Engine(radixflow_policy="radixflow", **sglang_kwargs)`; `radixflow_executor` "model"
    (SGLang's model worker, a GPU) or "simulated" (the witness executor on CPU), default: model
    if a GPU is visible. Without `model_path` it serves the embedded default model."""

    def __init__(self, **kwargs: Any) -> None:
        cfg, executor = config_from_kwargs(kwargs, os.environ)
        executor = executor or ("model" if gpu_available() else "simulated")
        load_plugins()  # NOTE: upstream's, idempotent: run against the caller's own variables
        server_args = self._server_args(sglang_kwargs(kwargs, executor), executor)
        if executor == "simulated" and (why := cpu_limit(server_args, lambda f: f)) is not None:
            raise ValueError(why)  # NOTE: before any process starts (launch_server.py's check)
        ranks = server_args.dp_size * server_args.tp_size * server_args.pp_size
        self.radixflow_config, self.radixflow_executor = cfg, executor
        # NOTE: an instance attribute shadows upstream's class attribute (engine.py reads
        # `self.run_scheduler_process_func`); a module-level function, so spawn can pickle it
        self.run_scheduler_process_func = scheduler_entry(executor)
        from .entry import activate

        activate(cfg, f"Engine, executor {executor}", executor, server_args=server_args,
                 drain=False, every=True)
        with scoped_env(spawn_env(cfg, executor, ranks)):
            super().__init__(server_args=server_args)

    def _server_args(self, kwargs: dict[str, Any], executor: str):
        """Upstream's record from keywords (engine.py `__init__`'s kwargs path) or as given
        (`server_args=`, taken as is), resolved here so the start-up line can print what the
        model resolves (theta)."""
        if executor == "simulated":
            from .simulated import allow_extra_buffer_on_cpu

            allow_extra_buffer_on_cpu()  # NOTE: resolution runs in this process
        server_args = kwargs.get("server_args") or self.server_args_class(**kwargs)
        server_args.resolve_once()
        return server_args
