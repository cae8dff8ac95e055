"""RadixFlowScheduler: SGLang 0.5.23's Scheduler with the RadixFlow prefill scan installed."""

from __future__ import annotations

import os

from . import check_sglang_version

check_sglang_version()

from sglang.srt.managers.scheduler import NextBatchPlan, Scheduler  # noqa: E402

from .admission import scheduler_sleep  # noqa: E402
from .agreement import scheduler_agreement  # noqa: E402
from .metrics import scheduler_metrics  # noqa: E402
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
    _radixflow_held = False  # this pass's hold decision (read by _get_new_batch_prefill_raw)

    @property
    def radixflow(self) -> RadixFlowRuntime:
        if self._radixflow is None:
            self.init_radixflow()
        return self._radixflow

    def init_radixflow(self, **collaborators) -> RadixFlowRuntime:
        """Build the runtime with this scheduler's collaborators (rank agreement over the
        attention-TP group, metrics, waiting on the tokenizer socket); `collaborators`
        (clock, sleep, agreement, metrics) replace them, as the kit's virtual time does."""
        cfg = self.radixflow_config or config_from_env()
        defaults = {"sleep": scheduler_sleep(self), "agreement": scheduler_agreement(self),
                    "metrics": scheduler_metrics(self, cfg.policy)}
        self._radixflow = RadixFlowRuntime.for_scheduler(self, cfg, **{**defaults,
                                                                       **collaborators})
        return self._radixflow

    def get_internal_state(self, recv_req):
        out = super().get_internal_state(recv_req)
        out.internal_state["radixflow"] = self.radixflow.summary()  # shown by /server_info
        return out

    def get_new_batch_prefill(self, running_batch) -> NextBatchPlan:
        # NOTE: a held pass still goes through upstream's get_new_batch_prefill, so the
        # PrefillDelayer runs its per-pass all-gather (finalize negotiates "not prefillable",
        # as for an empty queue): under DP attention every rank joins it whatever it holds.
        self._radixflow_held = self.radixflow.hold(self, running_batch)
        try:
            return super().get_new_batch_prefill(running_batch)
        finally:
            self._radixflow_held = False

    def _get_new_batch_prefill_raw(self, prefill_delayer_single_pass, running_batch):
        if self._radixflow_held:
            return None, running_batch  # held: no scan this pass (as upstream's empty queue)
        return get_new_batch_prefill_raw(self, prefill_delayer_single_pass, running_batch)
