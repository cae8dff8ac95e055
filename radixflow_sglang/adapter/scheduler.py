"""RadixFlowScheduler: SGLang 0.5.23's Scheduler with the RadixFlow prefill scan installed."""

from __future__ import annotations

from radixflow_sglang.config import RadixFlowConfig, config_from_env

from . import check_sglang_version

check_sglang_version()

from sglang.srt.managers.scheduler import NextBatchPlan, Scheduler  # noqa: E402

from .admission import scheduler_sleep  # noqa: E402
from .agreement import scheduler_agreement  # noqa: E402
from .metrics import scheduler_metrics  # noqa: E402
from .runtime import RadixFlowRuntime  # noqa: E402
from .scan import get_new_batch_prefill_raw  # noqa: E402


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
