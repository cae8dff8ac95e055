"""A round's wall cost (issue 36 item 1): the scheduler loop's period from a prefill launch to
its next launch while busy, measured on every executor (a fake clock here), fed as the round's
wall overhead (period - forward) into the fixed cost every decision reads, recorded in the
trace, and rank 0's on every TP rank. The kit feeds no period: the twin's figures stay."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch.multiprocessing as mp

from radixflow_sglang.core.cost import GENERIC_PRIOR, LaunchPeriods, RoundCostEstimator
from radixflow_sglang.testing.ranks import gloo_pair
from radixflow_sglang.testing.server import free_port


def test_periods_run_from_a_prefill_launch_to_the_next_launch_while_busy():
    p = LaunchPeriods()
    p.launch(0.0, prefill=True)  # round 0
    p.launch(0.030, prefill=True)  # round 1: round 0's period ends here
    p.launch(0.050, prefill=False)  # a decode step ends round 1's
    p.launch(0.060, prefill=True)  # round 2
    p.idle()  # a pass with nothing to run: round 2's period would count the wait
    p.launch(0.500, prefill=True)  # round 3, still open
    assert p.launched == 4
    assert p.take(0)[0] == pytest.approx(0.030) and p.take(1)[0] == pytest.approx(0.020)
    assert all(map(math.isnan, p.take(0)))  # handed out once
    assert all(map(math.isnan, p.take(2) + p.take(3)))


def test_a_pass_that_waits_for_a_result_with_work_queued_is_kept_apart():
    """Work queued (parked consumers) while the loop waits for a forward: the period less the
    forward is the pass from the result to the next launch (core/cost.py RoundView.idle_wait_s);
    a pass with nothing queued is any idle time and ends it."""
    p = LaunchPeriods()
    p.launch(0.0, prefill=True)  # round 0
    p.idle(waiting=True)  # its consumers parked: the loop waits for its result
    p.launch(0.070, prefill=True)  # round 1, after the result: round 0's resumed period 70 ms
    p.idle(waiting=True)
    p.idle(waiting=False)  # then the queue ran dry: unknown
    p.launch(0.900, prefill=True)
    p0, r0 = p.take(0)
    assert math.isnan(p0) and r0 == pytest.approx(0.070)
    assert all(map(math.isnan, p.take(1)))
    est = RoundCostEstimator(GENERIC_PRIOR)
    assert est.resume_s is None
    for period in (0.070, 0.062, math.nan, 0.300):
        est.observe_resume(period, 0.060)
    assert est.resume_s == pytest.approx(0.010)  # median of 10, 2, 240 ms
    assert est.coeffs == RoundCostEstimator(GENERIC_PRIOR).coeffs  # NOTE: no fixed cost moves


def test_a_rounds_wall_overhead_enters_the_fixed_cost_decisions_read():
    est = RoundCostEstimator(GENERIC_PRIOR)
    before = est.decision_coeffs
    assert est.round_coeffs == est.coeffs == before and not est.measures_wall
    est.observe_period(math.nan, 0.005)  # unknown period: nothing
    est.observe_period(0.030, math.nan)  # no forward to pair it with: nothing
    assert not est.measures_wall
    for period in (0.030, 0.025, 0.004, 0.027):  # 0.004: overlap hid the host parts
        est.observe_period(period, 0.005)
    assert est.wall_s == pytest.approx(0.022)  # median of 0.025, 0.020, 0.0, 0.022
    for c in (est.decision_coeffs, est.round_coeffs):
        assert c.alpha == pytest.approx(before.alpha + 0.022)
        assert (c.beta, c.gamma, c.delta) == (before.beta, before.gamma, before.delta)
        assert c.source.endswith("+wall")
    assert est.coeffs == before  # NOTE: the forward fit itself stays the forward's
    assert est.as_dict()["wall_s"] == est.wall_s and est.as_dict()["periods"] == 4


def test_a_pinned_overhead_prices_every_round_whatever_the_periods_measure():
    """--radixflow-round-overhead-ms: decisions a busy host cannot move (the periods are still
    recorded for the trace)."""
    from radixflow_sglang.adapter.runtime import RadixFlowRuntime
    from radixflow_sglang.config import RadixFlowConfig
    from radixflow_sglang.core.grid import Grid, Layout

    est = RoundCostEstimator(GENERIC_PRIOR, wall=0.02)
    assert est.measures_wall and est.wall_s == 0.02  # before any period
    for period in (0.300, 0.250, 0.400):  # a cold, loaded host
        est.observe_period(period, 0.005)
    assert est.wall_s == 0.02 and est.as_dict()["periods"] == 3 and est.as_dict()["wall_pinned"]
    assert est.decision_coeffs.alpha == pytest.approx(est.coeffs.alpha + 0.02)
    rt = RadixFlowRuntime(RadixFlowConfig(round_overhead_ms=20), Grid(Layout.FULL, 1), False)
    rt.use_prior(GENERIC_PRIOR)  # NOTE: a restarted fit keeps the pin
    assert rt.cost.wall_s == 0.02 and rt.roundcost.host_s() == 0.0


# --- the scheduler's hooks, on SGLang's Scheduler class with a stub worker ------------------


def _scheduler(tmp_path):
    from sglang.srt.managers.scheduler import Scheduler

    from radixflow_sglang.adapter import forward_timer
    from radixflow_sglang.adapter.runtime import RadixFlowRuntime
    from radixflow_sglang.adapter.scheduler import RadixFlowScheduler
    from radixflow_sglang.config import RadixFlowConfig
    from radixflow_sglang.core.grid import Grid, Layout

    class Stub(Scheduler):
        """Upstream's loop methods without a model: each batch carries its simulated forward."""

        def get_next_batch_to_run(self, running_batch=None, last_batch=None):
            return SimpleNamespace(batch_to_run=self.next_batch, running_batch=None)

        def run_batch(self, batch, *args, **kwargs):
            ready = self.now + batch.forward_s  # NOTE: as the simulated executor says
            self.now += batch.wall_s  # NOTE: the simulated forward sleeps (and may wait longer)
            return SimpleNamespace(**{forward_timer.SIM_ATTR: batch.forward_s,
                                      forward_timer.READY_ATTR: ready})

        def process_batch_result(self, batch, result):
            return None

    class Sched(RadixFlowScheduler, Stub):  # NOTE: MRO: ours, then the stub, then upstream
        pass

    s = object.__new__(Sched)
    cfg = RadixFlowConfig(policy="radixflow", trace=str(tmp_path / "trace.jsonl"))
    s._radixflow = RadixFlowRuntime(cfg, Grid(Layout.FULL, 1), overlap=False)
    s.now = 0.0
    s.waiting_queue = []  # NOTE: nothing queued at an idle pass: its period is unknown
    s._radixflow_wall = lambda: s.now
    return s


def _batch(kind: str, forward_s: float = 0.0, wall_s: float | None = None):
    extend = kind != "decode"
    rid = "HEALTH_CHECK_x" if kind == "health" else "r"
    return SimpleNamespace(forward_mode=SimpleNamespace(is_extend=lambda: extend),
                           reqs=[SimpleNamespace(rid=rid)], extend_lens=[16], prefix_lens=[0],
                           extend_num_tokens=16, forward_iter=0, forward_s=forward_s,
                           wall_s=forward_s if wall_s is None else wall_s)


def _step(s, t: float, batch) -> None:
    """One pass of upstream's normal loop at time t: plan, launch, process (or idle)."""
    s.now, s.next_batch = t, batch
    plan = s.get_next_batch_to_run(None, None)
    if plan.batch_to_run is not None:
        s.process_batch_result(batch, s.run_batch(batch))


def test_the_loop_feeds_each_prefill_rounds_period_with_its_forward(tmp_path):
    s = _scheduler(tmp_path)
    rt = s._radixflow
    _step(s, 0.000, _batch("prefill", 0.005))  # round 0
    _step(s, 0.030, _batch("prefill", 0.005))  # round 1: round 0's period 30 ms
    _step(s, 0.055, _batch("decode"))  # round 1's period 25 ms
    _step(s, 0.060, _batch("health", 0.001))  # a health check: no round of the fit's
    _step(s, 0.070, _batch("prefill", 0.005))  # round 2
    _step(s, 0.080, None)  # idle: round 2's period is unknown
    # NOTE: a forward held 300 ms beyond its simulated 5 ms (a test's gate, a stall) is the
    # forward's wall time, not the loop's host time: round 3's overhead is 340 - 305 = 35 ms
    _step(s, 0.500, _batch("prefill", 0.005, wall_s=0.305))  # round 3
    _step(s, 0.840, _batch("prefill", 0.005))  # round 4: round 3's period 340 ms
    _step(s, 0.870, _batch("prefill", 0.005))  # round 5: round 4's period 30 ms
    assert rt.cost.as_dict()["periods"] == 4
    assert rt.cost.wall_s == pytest.approx(0.025)  # median of 25, 20, 35 and 25 ms
    events = [json.loads(x) for x in (tmp_path / "trace.jsonl").read_text().splitlines()]
    fwd = [e for e in events if e["event"] == "forward"]
    assert [e["period_s"] and round(e["period_s"], 6) for e in fwd] == [
        None, 0.03, 0.025, None, 0.34, 0.03]
    assert [e["period_forward_s"] and round(e["period_forward_s"], 6) for e in fwd] == [
        None, 0.005, 0.005, 0.005, 0.305, 0.005]
    assert [e["duration_s"] for e in fwd] == [0.005] * 6  # the fit's: the simulated time
    assert fwd[-1]["wall_s"] == pytest.approx(0.025)
    assert rt.cost.decision_coeffs.alpha == pytest.approx(rt.cost.coeffs.alpha + 0.025)
    assert rt.roundcost.host_s() == 0.0  # NOTE: in the fixed cost now, not added twice


def test_each_pass_reads_the_loops_pass_since_its_last_launch_or_result(tmp_path):
    """The twin's loop pass (tests/test_loop_pass.py): from the loop's last launch or processed
    result, whichever came later, to its next pass; only the first pass after one (a pass
    that follows an idle one would count the idle wait); unknown for a result whose ready time
    the scheduler does not know (a GPU's)."""
    s = _scheduler(tmp_path)
    rc = s._radixflow.roundcost

    def plan(t: float, batch=None):
        s.now, s.next_batch = t, batch
        s.get_next_batch_to_run(None, None)
        return rc.pass_s

    a, b = _batch("prefill", 0.005, wall_s=0.001), _batch("prefill", 0.005, wall_s=0.001)
    assert plan(0.000, a) is None  # NOTE: nothing launched or processed before
    ra = s.run_batch(a)  # launched at 0.000, ready at 0.005 (overlap: processed next pass)
    assert plan(0.006, b) == pytest.approx(0.006)  # from the launch
    rb = s.run_batch(b)  # launched at 0.006, ready at 0.011
    s.now = 0.008
    s.process_batch_result(a, ra)  # ready at 0.005, before b's launch: from the launch
    assert plan(0.012) == pytest.approx(0.006)
    assert plan(0.020) is None  # NOTE: the first pass after it took it
    s.process_batch_result(b, rb)  # no launch since: from its result
    assert plan(0.030) == pytest.approx(0.019)
    from radixflow_sglang.adapter.forward_timer import SIM_ATTR

    gpu = SimpleNamespace(**{SIM_ATTR: 0.005})  # NOTE: no ready time
    s.process_batch_result(b, gpu)
    assert plan(0.040) is None


# --- rank agreement -----------------------------------------------------------------------


def _period_ranks(rank: int, port: int, out) -> None:
    import torch.distributed as dist

    from radixflow_sglang.adapter.agreement import forward_share
    from radixflow_sglang.adapter.runtime import RadixFlowRuntime
    from radixflow_sglang.config import RadixFlowConfig
    from radixflow_sglang.core.grid import Grid, Layout

    with gloo_pair(rank, port) as calls:
        rt = RadixFlowRuntime(RadixFlowConfig(policy="radixflow"), Grid(Layout.FULL, 1), False,
                              clock=lambda: 100.0 + rank)
        rt.roundcost.share_forward = forward_share(dist.group.WORLD)
        # NOTE: each rank's clock measured slightly different forwards and periods
        for k in range(4):
            period = math.nan if k == 0 else 0.030 + 0.01 * rank + 0.001 * k
            rt.observe_forward(1, 16, 0.005 + 0.002 * rank, 0.001,
                               (period, 0.005 + 0.002 * rank, 0.012 + 0.004 * rank))
        c = rt.cost.decision_coeffs
        out[rank] = (rt.cost.wall_s, c.alpha, c.beta, rt.roundcost.agreed_now, calls[0],
                     rt.roundcost.idle_wait_s())


def test_tp_ranks_agree_on_the_rounds_wall_period_in_the_forwards_broadcast():
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_period_ranks, args=(free_port(), out), nprocs=2, join=True)
        r0, r1 = out[0], out[1]
    assert r0 == r1
    assert r0[0] == pytest.approx(0.027)  # rank 0's: median of 30+k - 5 ms, k = 1..3
    assert r0[3] == 100.0 and r0[4] == 4  # rank 0's clock; one broadcast per forward
    assert r0[5] == pytest.approx(0.007)  # rank 0's pass from a result to the next launch
