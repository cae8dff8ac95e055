"""Per-scan state has one owner (adapter/scanstate.py): every scan starts from a fresh
Scan, so nothing one scan learnt (its producers, fork cut, released rows, deferred
newcomers, queue view, decision counts) reaches the next. On SGLang's real classes (the kit)."""

from __future__ import annotations

from dataclasses import fields
from types import SimpleNamespace

from radixflow_sglang.adapter.boundary_scan import BoundaryScan
from radixflow_sglang.adapter.queueindex import QueueIndex
from radixflow_sglang.adapter.scanstate import Scan
from radixflow_sglang.config import RadixFlowConfig
from radixflow_sglang.testing.fixtures import toks

DOC = toks(1000, 2000)
# NOTE: begin_scan's own inputs
SET_AT_BEGIN = {"round", "sched", "batch", "requests", "cost", "stats", "quiet", "walk", "queue",
                "boundary", "chunk"}


def test_every_scan_begins_from_a_fresh_state(make_kit):
    k = make_kit(policy="radixflow-always",
                 radixflow_config=RadixFlowConfig(policy="radixflow-always"))
    rt, seen = k.runtime, []
    real = rt.begin_scan

    def begin(sched, adder):
        real(sched, adder)
        seen.append(rt.scan)
        fresh = Scan()
        left = {f.name for f in fields(Scan) if f.name not in SET_AT_BEGIN
                and getattr(rt.scan, f.name) != getattr(fresh, f.name)}
        assert left == set(), left

    rt.begin_scan = begin
    k.submit(k.req("P", DOC + toks(5000, 100)), k.req("A", DOC + toks(6000, 120)),
             k.req("B", DOC + toks(7000, 90)))
    k.drain()
    assert len(seen) >= 2 and len({id(s) for s in seen}) == len(seen)
    # NOTE: the publisher's part is this scan's too: built fresh, held by the Scan
    assert len({id(s.boundary) for s in seen}) == len(seen)
    assert all(s.boundary.number == n for n, s in enumerate(seen, seen[0].boundary.number))
    # NOTE: one index of the queue per scan, which the publisher's scan and the view read
    assert all(s.boundary.index is s.queue and (s.view is None or s.view.index is s.queue)
               for s in seen)
    assert [s.round for s in seen] == list(range(1, len(seen) + 1))
    # NOTE: the first scan used its state: P selected, the siblings parked on it
    assert "P" in seen[0].reqs and seen[0].parked_on.producer == "P"
    assert seen[0].reasons["always_wait"] == 2 and not seen[1].reasons["always_wait"]


def test_the_queue_index_reads_ready_prefixes_at_the_first_demand_question():
    """`BoundaryScan.between`'s demand sums are built at its first call, after the scan matched
    the requests it visited: their ready prefixes then, not later ones."""
    q = [SimpleNamespace(rid=rid, origin_input_ids=[0] * n, output_ids=[], prefix_len=0)
         for rid, n in (("a", 10), ("b", 20), ("c", 30))]
    index = QueueIndex(q)
    scan = BoundaryScan(1, index)
    assert scan.queue == q and scan.rids == {"a", "b", "c"} and len(index) == len(q)
    assert index.pos == {"a": 0, "b": 1, "c": 2} and index.after == [60, 50, 30, 0]
    q[1].prefix_len = 5  # NOTE: matched by the scan before the first question
    assert scan.between(q[0], q[2]) == 45
    q[2].prefix_len = 30  # NOTE: a later match does not move the sums
    assert scan.between(q[0], q[2]) == 45 and scan.between(q[2], q[0]) is None
