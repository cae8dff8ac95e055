"""RadixFlowScheduler: SGLang 0.5.23's Scheduler with the RadixFlow prefill scan installed."""

from __future__ import annotations

import os

from . import check_sglang_version

check_sglang_version()

from sglang.srt.managers.scheduler import NextBatchPlan, Scheduler  # noqa: E402

from .agreement import scheduler_agreement  # noqa: E402
from .metrics import dp_rank_of, scheduler_metrics  # noqa: E402
from .runtime import RadixFlowConfig, RadixFlowRuntime  # noqa: E402
from .scan import get_new_batch_prefill_raw  # noqa: E402

ENV_PREFIX = "RADIXFLOW_"


def _env_number(env, name: str, kind: type, default, low: float, high: float):
    text = env.get(ENV_PREFIX + name)
    if not text:
        return default
    try:
        value = kind(text)
    except ValueError:
        raise ValueError(f"{ENV_PREFIX}{name}={text!r}: not a {kind.__name__}") from None
    if not low <= value <= high:
        raise ValueError(f"{ENV_PREFIX}{name}={text!r}: outside [{low:g}, {high:g}]")
    return value


def config_from_env(env: dict[str, str] | None = None) -> RadixFlowConfig:
    """The launcher passes its flags to spawned scheduler processes through the environment;
    the plugin reads the same variables. Bad values fail at start-up, naming the variable."""
    env = os.environ if env is None else env
    cfg = RadixFlowConfig(
        policy=env.get(ENV_PREFIX + "POLICY", "radixflow"),
        admission_ms=_env_number(env, "ADMISSION_MS", float, None, 0, 1000),
        theta=_env_number(env, "THETA", int, None, 1, 1 << 20),
        park_margin=_env_number(env, "PARK_MARGIN", int, 1, 0, 1000),
        frag_cap=_env_number(env, "FRAG_CAP", int, 2, 0, 1000),
        trace=env.get(ENV_PREFIX + "TRACE") or None,
    )
    _ = cfg.spec  # NOTE: validates the policy name (the error names the flag and the choices)
    return cfg


class RadixFlowScheduler(Scheduler):
    radixflow_config: RadixFlowConfig | None = None  # None: read from the environment
    _radixflow: RadixFlowRuntime | None = None

    @property
    def radixflow(self) -> RadixFlowRuntime:
        if self._radixflow is None:
            cfg = self.radixflow_config or config_from_env()
            self._radixflow = RadixFlowRuntime.for_scheduler(self, cfg)
            self._radixflow.agreement = scheduler_agreement(self)
            self._radixflow.metrics = scheduler_metrics(self, cfg.policy)
            self._radixflow.dp_rank = dp_rank_of(self)  # NOTE: DP ranks share one trace file
        return self._radixflow

    _get_new_batch_prefill_raw = get_new_batch_prefill_raw

    def get_internal_state(self, recv_req):
        out = super().get_internal_state(recv_req)
        # NOTE: with DP, /server_info lists ranks in answer order: the rank says whose it is
        out.internal_state["radixflow"] = {"dp_rank": dp_rank_of(self) or 0,
                                           **self.radixflow.summary()}
        return out

    def get_new_batch_prefill(self, running_batch):
        if self.radixflow.hold(self, running_batch):
            return NextBatchPlan(batch_to_run=None, running_batch=running_batch)
        return super().get_new_batch_prefill(running_batch)
