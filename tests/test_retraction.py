"""A retracted request re-enters the queue as a new candidate (issue: harden item 1).

SGLang 0.5.23 re-queues what `retract_decode` retracts through `Scheduler._add_request_to_queue`
(`update_running_batch`); RadixFlowScheduler's override forgets the request's park history
there, so its wait bound starts afresh. The kit's event loop runs that same method.
"""

from __future__ import annotations

import pytest

DOC = list(range(1000, 3000))  # 2,000 shared tokens
NO_LEAK = {"kv": 0, "rows": 0, "mamba": 0}


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


@pytest.fixture
def retract_every_decode(monkeypatch):
    """SGLang's own test switch: `update_running_batch` retracts at every decode step (one
    request of two); prefill is never skipped for it."""
    import sglang.srt.managers.scheduler as sched_mod

    import radixflow_sglang.adapter.scan  # noqa: F401  NOTE: loaded before the patch
    monkeypatch.setattr(sched_mod, "TEST_RETRACT", True)
    monkeypatch.setattr(sched_mod, "TEST_RETRACT_INTERVAL", 1)
    monkeypatch.setattr(sched_mod, "TEST_RETRACT_NO_PREFILL_BS", 1 << 30)


@pytest.mark.parametrize("model, layout", [("qwen3.5-4b", "extra_buffer"),
                                           ("nemotron-9b", "no_buffer")])
def test_a_retracted_consumer_forgets_its_park_history(make_kit, model, layout,
                                                        retract_every_decode):
    k = make_kit(model, layout, "traversal-always")
    k.keep_finished = True
    at_retraction: dict[str, tuple[bool, bool]] = {}

    def seen(req) -> None:  # NOTE: runs after the scheduler re-queued it
        rt = k.runtime
        at_retraction.setdefault(req.rid, (req.rid in rt.records.parked_rounds(),
                                           rt.traversal.waits.may_park(req.rid)))

    k.on_retract = seen
    # A is longer than P: with equal output counts SGLang retracts the longer input first
    k.submit(k.req("P", DOC + toks(5000, 100), max_new_tokens=4),
             k.req("A", DOC + toks(6000, 300), max_new_tokens=4))
    r1 = k.step()
    assert r1.rids == ["P"] and k.runtime.records.parked_rounds() == {"A": 1}  # A waited for P
    k.drain()
    assert "A" in at_retraction  # the consumer was retracted, and re-queued
    assert at_retraction["A"] == (False, True)  # no stale history: a fresh wait bound
    assert set(k.finished) == {"P", "A"} and k.leaks() == NO_LEAK


def test_the_harness_requeues_a_retracted_request_through_the_scheduler(make_kit):
    """The step harness's in-flight retraction (overlap, `release_req`) re-queues through the
    same door (`_add_request_to_queue`, as retract-all does): the park history goes too."""
    from radixflow_sglang.testing.harness import Harness

    k = make_kit("qwen3.5-4b", "extra_buffer", "traversal-always", overlap=True)
    h = Harness(k)
    h.submit("P", DOC + toks(5000, 100))
    h.submit("A", DOC + toks(6000, 120))
    h.submit("D", toks(20_000, 300))
    for _ in range(10):
        rnd = h.step()
        if rnd is not None and "A" in rnd.rids:
            break
    assert rnd is not None and "A" in rnd.rids and k.runtime.totals.parked_max_rounds == 2
    assert "A" not in k.runtime.records.parked_rounds()  # selection ends its wait history
    h.retract(next(r for r in h.retractable() if r.rid == "A"))
    for _ in range(10):
        h.step()
        if any(r.rid == "A" for r in k.sched.waiting_queue):
            break
    assert [r.rid for r in k.sched.waiting_queue] == ["A"]
    assert "A" not in k.runtime.records.parked_rounds()  # re-queued as a new candidate
    h.drain(max_steps=100)
    assert not h.violations, h.violations.examples
    assert h.finish() == NO_LEAK
