"""The simulated forward is asynchronous, as a GPU's: the worker call returns at once and the
loop waits for the forward where SGLang's result processor syncs (adapter/simulated.py)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest

from radixflow_sglang.adapter import forward_timer

sim = pytest.importorskip("radixflow_sglang.adapter.simulated")


def test_forwards_run_one_after_another_on_the_one_device():
    dev = sim._SimDevice()
    assert dev.launch(1.000, 0.050) == pytest.approx(1.050)  # an idle device starts at once
    assert dev.launch(1.010, 0.050) == pytest.approx(1.100)  # queued behind the first
    assert dev.launch(1.300, 0.020) == pytest.approx(1.320)  # idle again: from its launch


def test_the_loop_waits_what_is_left_of_the_forward_and_no_more():
    slept = []
    ready = SimpleNamespace(**{forward_timer.READY_ATTR: 2.0})
    assert sim.wait_ready(ready, clock=lambda: 1.75, sleep=slept.append) == pytest.approx(0.25)
    assert slept == [pytest.approx(0.25)]
    # NOTE: host work after the launch that outlasted the forward: nothing left to wait
    assert sim.wait_ready(ready, clock=lambda: 2.5, sleep=slept.append) == 0.0
    # NOTE: a result that no simulated forward made (a health check's idle batch, a kit's)
    assert sim.wait_ready(SimpleNamespace(), clock=lambda: 0.0, sleep=slept.append) == 0.0
    assert len(slept) == 1


def test_the_wait_sits_where_sglangs_result_processor_syncs():
    """Drift guard: each wrapped method of upstream still syncs on the forward's copy before
    it reads a result, so the simulated wait stands where a GPU server's loop waits."""
    proc = sim._PROCESSOR
    sim.wait_where_sglang_syncs()
    sim.wait_where_sglang_syncs()  # NOTE: idempotent: one wait per method, not two
    for name in sim.SYNCED:
        wrapped = getattr(proc, name)
        assert wrapped._radixflow_waits
        upstream = wrapped.__wrapped__
        assert not getattr(upstream, "_radixflow_waits", False), name
        body = inspect.getsource(upstream)
        sync = body.index("result.copy_done.synchronize()")
        assert "result.next_token_ids" not in body[:sync], name


def test_the_wrapped_processor_waits_before_upstream_reads_the_result(monkeypatch):
    seen = []

    def upstream(self, batch, result):
        seen.append(("upstream", result))

    monkeypatch.setattr(sim, "wait_ready", lambda result: seen.append(("wait", result)))
    process = sim._after_forward(upstream)
    process(None, "batch", "result")
    assert seen == [("wait", "result"), ("upstream", "result")]


def test_a_simulated_forwards_share_of_the_loop_is_launch_to_ready():
    # NOTE: the call returned at once (wall ~0); the loop's forward is launch to ready
    result = SimpleNamespace(**{forward_timer.SIM_ATTR: 0.005, forward_timer.SPAN_ATTR: 0.012})
    forward_timer.stop(forward_timer.start(SimpleNamespace()), result)
    assert forward_timer.seconds(result) == 0.005  # the fit's: the forward's own time
    assert forward_timer.loop_seconds(result) == 0.012  # queued behind the one before it
