"""RadixFlowScheduler: SGLang 0.5.23's Scheduler with the RadixFlow prefill scan installed."""

from __future__ import annotations

import time

from radixflow_sglang.config import RadixFlowConfig, config_from_env

from . import check_sglang_version

check_sglang_version()

from sglang.srt.managers.scheduler import NextBatchPlan, Scheduler  # noqa: E402
from sglang.srt.managers.utils import is_health_check_generate_req  # noqa: E402

from . import forward_timer  # noqa: E402
from .admission import scheduler_sleep  # noqa: E402
from .agreement import scheduler_agreement, scheduler_forward_share  # noqa: E402
from .metrics import dp_rank_of, scheduler_metrics  # noqa: E402
from .runtime import RadixFlowRuntime  # noqa: E402
from .scan import get_new_batch_prefill_raw  # noqa: E402

_HOST = "_radixflow_host_s"  # a prefill batch's scan + preparation seconds (this rank's clock)


class RadixFlowScheduler(Scheduler):
    radixflow_config: RadixFlowConfig | None = None  # None: read from the environment
    _radixflow: RadixFlowRuntime | None = None
    _radixflow_held = False  # this pass's hold decision (read by _get_new_batch_prefill_raw)
    _radixflow_native = False  # this pass runs SGLang's own scan (health checks only)
    _radixflow_wall = staticmethod(time.perf_counter)  # the launch periods' clock (tests: fake)
    _radixflow_processed = 0  # observed prefill rounds processed (LaunchPeriods' numbering)
    _radixflow_loop_forward = float("nan")  # the last processed one's forward, loop wall time
    _radixflow_launched_at = float("-inf")  # the loop's last launch (the launch periods' clock)
    _radixflow_free_at: float | None = None  # when the loop went on from its last launch/result

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
        # NOTE: rank 0's measured forward time (and host time, arrival rate) feeds every rank.
        self._radixflow.roundcost.share_forward = scheduler_forward_share(self)
        self._radixflow.trace.dp_rank = dp_rank_of(self)  # NOTE: DP ranks share one trace file
        return self._radixflow

    def get_next_batch_to_run(self, *args, **kwargs):
        if self._radixflow is not None:
            # NOTE: the loop's pass: from its last launch or processed result (whichever came
            # later) to this pass (traced, never decided on; the twin's loop pass)
            free, self._radixflow_free_at = self._radixflow_free_at, None
            self._radixflow.roundcost.pass_s = (None if free is None
                                                else self._radixflow_wall() - free)
        plan = super().get_next_batch_to_run(*args, **kwargs)
        if plan.batch_to_run is None and self._radixflow is not None:
            # NOTE: a wait is no round's cost; with work queued, the pass after a result
            self._radixflow.roundcost.periods.idle(waiting=bool(self.waiting_queue))
        return plan

    def run_batch(self, batch, *args, **kwargs):
        """Upstream's run_batch, with a prefill forward's duration measured around it and every
        launch's time taken (a prefill round's wall period ends at the loop's next launch)."""
        self._radixflow_launched_at = self._radixflow_free_at = self._radixflow_wall()
        self.radixflow.roundcost.periods.launch(self._radixflow_launched_at,
                                                observed_prefill(batch))
        if not batch.forward_mode.is_extend():
            return super().run_batch(batch, *args, **kwargs)
        token = forward_timer.start(self, self._radixflow_wall)
        result = super().run_batch(batch, *args, **kwargs)
        forward_timer.stop(token, result)
        return result

    def process_batch_result(self, batch, result):
        ready = forward_timer.ready_at(result)
        out = super().process_batch_result(batch, result)
        # NOTE: the loop went on from here once the result was ready and the launch before it
        # was made (under overlap the next batch's); a GPU's ready time is not known here
        self._radixflow_free_at = None if ready is None else max(ready,
                                                                 self._radixflow_launched_at)
        if observed_prefill(batch):
            # NOTE: every rank processes the same batches in the same order, so the broadcast
            # inside observe_forward runs on every rank, in order (one per prefill round).
            rows, tokens, pairs = forward_timer.batch_shape(batch)
            host = getattr(batch, _HOST, None)
            # NOTE: set on every rank's copy of this batch, or on none. A simulated forward's
            # time is the cost model's, so the CPU box's scan time is not fed beside it; the
            # loop's wall period below is, on every executor (recorded in the trace)
            if forward_timer.simulated(result):
                host = None
            # NOTE: the previous prefill round's period: its next launch (this round's, at the
            # latest) came before this result, with or without overlap
            k, self._radixflow_processed = self._radixflow_processed, self._radixflow_processed + 1
            p, resumed = self.radixflow.roundcost.periods.take(k - 1)
            period = (p, self._radixflow_loop_forward, resumed)
            self._radixflow_loop_forward = forward_timer.loop_seconds(result)
            self.radixflow.observe_forward(rows, tokens, forward_timer.seconds(result), host,
                                           period, pairs=pairs, forward_iter=batch.forward_iter)
        return out

    def _add_request_to_queue(self, req, is_retracted: bool = False):
        """Upstream's, after forgetting what RadixFlow knew of a request that re-enters the
        queue after a retraction: it is a new candidate, re-matched, with a fresh wait bound.
        NOTE: retract_decode passes is_retracted; priority preemption and retract-all re-queue
        through a bare call, their requests marked by reset_for_retract (req.is_retracted)."""
        if (is_retracted or req.is_retracted) and self._radixflow is not None:
            self._radixflow.records.forget(req.rid)
        return super()._add_request_to_queue(req, is_retracted)

    def _release_aborted_request(self, req) -> None:
        """Upstream's (scheduler.py: every abort of a queued request, `abort_request` and the
        queue-limit eviction, calls it), after forgetting what RadixFlow knew of the request:
        a parked one leaves the wait set at once (rank-identical: every rank gets the abort)."""
        if self._radixflow is not None:
            self._radixflow.records.forget(req.rid)
        return super()._release_aborted_request(req)

    def get_internal_state(self, recv_req):
        out = super().get_internal_state(recv_req)
        # NOTE: with DP, /server_info lists ranks in answer order: the rank says whose it is
        out.internal_state["radixflow"] = {"dp_rank": dp_rank_of(self) or 0,
                                           **self.radixflow.summary()}
        return out

    def get_new_batch_prefill(self, running_batch) -> NextBatchPlan:
        if self.chunked_req is None and health_checks_only(self.waiting_queue):
            # NOTE: a /health poll's 1-token prefill is not scheduling work: SGLang's own
            # scan runs it, and no RadixFlow counter, trace event or cost sample sees it
            self.radixflow.health_checks += 1
            self._radixflow_native = True
            try:
                return super().get_new_batch_prefill(running_batch)
            finally:
                self._radixflow_native = False
        # NOTE: a held pass still goes through upstream's get_new_batch_prefill, so the
        # PrefillDelayer runs its per-pass all-gather (finalize negotiates "not prefillable",
        # as for an empty queue): under DP attention every rank joins it whatever it holds.
        self._radixflow_held = self.radixflow.hold(self, running_batch)
        try:
            return super().get_new_batch_prefill(running_batch)
        finally:
            self._radixflow_held = False

    def _get_new_batch_prefill_raw(self, prefill_delayer_single_pass, running_batch):
        if self._radixflow_native:
            return super()._get_new_batch_prefill_raw(prefill_delayer_single_pass,
                                                      running_batch)
        if self._radixflow_held:
            return None, running_batch  # held: no scan this pass (as upstream's empty queue)
        t0 = time.perf_counter()
        ret, running_batch = get_new_batch_prefill_raw(self, prefill_delayer_single_pass,
                                                       running_batch)
        if ret is not None:
            # NOTE: the scan and batch preparation (prepare_for_extend runs in the scan): the
            # host time a round adds without overlap (core/cost.py RoundView.host_s)
            setattr(ret, _HOST, time.perf_counter() - t0)
        return ret, running_batch


def observed_prefill(batch) -> bool:
    """A prefill round the round-cost fit sees: an extend batch of more than health checks."""
    return batch.forward_mode.is_extend() and not health_checks_only(batch.reqs)


def health_checks_only(reqs) -> bool:
    """Every request is SGLang's health check (entrypoints/http_server.py `health_generate`:
    rid HEALTH_CHECK_RID_PREFIX..., managers/utils.py `is_health_check_generate_req`)."""
    return bool(reqs) and all(is_health_check_generate_req(r) for r in reqs)
