"""RadixFlowScheduler: SGLang 0.5.23's Scheduler with the RadixFlow prefill scan installed."""

from __future__ import annotations

from radixflow_sglang.config import RadixFlowConfig, config_from_env

from . import check_sglang_version

check_sglang_version()

from sglang.srt.managers.scheduler import NextBatchPlan, Scheduler  # noqa: E402

from .agreement import scheduler_agreement  # noqa: E402
from .metrics import scheduler_metrics  # noqa: E402
from .runtime import RadixFlowRuntime  # noqa: E402
from .scan import get_new_batch_prefill_raw  # noqa: E402


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
        return self._radixflow

    _get_new_batch_prefill_raw = get_new_batch_prefill_raw

    def get_internal_state(self, recv_req):
        out = super().get_internal_state(recv_req)
        out.internal_state["radixflow"] = self.radixflow.summary()  # shown by /server_info
        return out

    def get_new_batch_prefill(self, running_batch):
        if self.radixflow.hold(self, running_batch):
            return NextBatchPlan(batch_to_run=None, running_batch=running_batch)
        return super().get_new_batch_prefill(running_batch)
