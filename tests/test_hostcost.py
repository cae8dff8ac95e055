"""The twin's host-cost model charges the traversal per visited request (issue 12, sweep).

Its coefficients were fitted where the traversal visited every queued request; under load a
scan stops at the first full budget, so charging the whole queue made the traversal's scan
cost grow with the backlog (~0.1-0.5 s per scan at 20 q/s, 30x the kit's measured time) and
turned overload into a runaway queue for the traversal only.
"""

from __future__ import annotations

import pytest

from eval.hostcost import DEFAULT_HOST, HostCoef, HostCost
from radixflow_sglang.testing.kit import Round, ScanTiming

HOST = HostCost(HostCoef(1e-3, 1e-6, 1e-4), HostCoef(2e-3, 1e-3, 1e-4), source="test")


def _round(rows: int) -> Round:
    rids = [f"r{i}" for i in range(rows)]
    return Round(0, rids, dict.fromkeys(rids, 10), dict.fromkeys(rids, 0),
                 dict.fromkeys(rids), None)


@pytest.mark.parametrize("policy", ["traversal", "radixflow", "radixflow-always"])
def test_traversal_pays_per_visited_request(policy: str) -> None:
    h = HOST.host_fn(policy)(_round(4), ScanTiming(queued=100, cpu_s=0.0, visited=10))
    assert h == pytest.approx(HOST.traversal(10, 4))


@pytest.mark.parametrize("policy", ["stock", "radix", "flex"])
def test_the_native_scan_keeps_its_per_queued_term(policy: str) -> None:
    h = HOST.host_fn(policy)(_round(4), ScanTiming(queued=100, cpu_s=0.0, visited=10))
    assert h == pytest.approx(HOST.native(100, 4))


def test_a_scan_without_a_visit_count_falls_back_to_the_queue() -> None:
    h = HOST.host_fn("traversal")(_round(2), ScanTiming(queued=7, cpu_s=0.0))
    assert h == pytest.approx(HOST.traversal(7, 2))


def test_the_kit_reports_what_the_scan_visited(make_kit) -> None:
    """A backlog the budget cannot take: the traversal's scan stops early (visited < queued),
    and the kit's ScanTiming says how far it went, as the runtime counted it."""
    k = make_kit("qwen3.5-4b", "extra_buffer", "radixflow", tokens=2048)
    k.submit(*[k.req(f"q{i}", list(range(10_000 * i + 1, 10_000 * i + 1001))) for i in range(20)])
    k.step()
    scan = k.last_scan
    assert scan.queued == 20
    assert scan.visited == k.runtime.stats.visited
    assert 0 < scan.visited < scan.queued
    assert DEFAULT_HOST.host_fn("radixflow")(k.rounds[-1], scan) == pytest.approx(
        DEFAULT_HOST.traversal(scan.visited, len(k.rounds[-1].rids)))


def test_the_kit_counts_stocks_visits_as_the_runtime_counts_them(make_kit) -> None:
    """SGLang's own scan has no runtime; the kit counts its loop's visits at the same place
    (`radix` runs our scan with hooks that change nothing: same selection, runtime's count)."""
    seen = {}
    for policy in ("stock", "radix"):
        k = make_kit("qwen3.5-4b", "extra_buffer", policy, tokens=2048)
        k.submit(*[k.req(f"q{i}", list(range(10_000 * i + 1, 10_000 * i + 1001)))
                   for i in range(20)])
        k.step()
        seen[policy] = (k.last_scan.queued, k.last_scan.visited, k.rounds[-1].rids)
        k.step()  # NOTE: a pass that admits nothing new visits nothing new
        assert k.last_scan.visited is not None
    assert seen["stock"] == seen["radix"]
    assert 0 < seen["stock"][1] < seen["stock"][0]


# --- the traversal's per-visit probe: work it no longer repeats (issue 11) --------------------

from array import array  # noqa: E402
from random import Random  # noqa: E402

from radixflow_sglang.core import producers as producers_mod  # noqa: E402
from radixflow_sglang.core.grid import Grid, Layout  # noqa: E402
from radixflow_sglang.core.producers import Producer, common_prefix  # noqa: E402
from radixflow_sglang.core.traversal import Candidate, Traversal, TraversalConfig  # noqa: E402


def _toks(start: int, n: int) -> array:
    return array("q", range(start, start + n))


def test_common_prefix_of_arrays_matches_a_plain_loop() -> None:
    rng = Random(0)
    a = array("q", (rng.randrange(1000, 90_000) for _ in range(3000)))
    for n in (0, 1, 7, 8, 63, 64, 65, 127, 128, 1000, 2047, 2999):
        b = array("q", a)
        b[n] = -7
        plain = next(i for i in range(len(a)) if a[i] != b[i])
        assert common_prefix(a, b) == common_prefix(list(a), list(b)) == plain == n
        assert common_prefix(a, a[:n]) == n
    assert common_prefix(a, array("q", a)) == len(a)


class CountingBlocks(list):
    """Token blocks hashed: the chain converts one slice of a list per block."""

    slices = 0

    def __getitem__(self, i):
        if isinstance(i, slice):
            CountingBlocks.slices += 1
        return super().__getitem__(i)


def _traversal() -> Traversal:
    t = Traversal(TraversalConfig.default(Grid(Layout.EXTRA_BUFFER, 64), overlap=False))
    t.begin_round([], 1 << 30)
    return t


def test_a_waiting_requests_chain_is_hashed_once_across_rounds() -> None:
    """Before: every visit re-hashed the request's blocks twice (may_block, then classify) and
    again each round; now its chain is cached by rid while its token object is the same."""
    doc = list(range(10_000, 12_000))
    t = _traversal()
    t.admitted(Producer("P", None, doc + [1] * 50, 0, 2050, 1984, True))
    tokens = CountingBlocks(doc + [2] * 40)
    CountingBlocks.slices = 0
    hits = t.may_block("A", None, tokens)
    first = CountingBlocks.slices
    assert first == 2040 // 64  # every block shared: the walk hashes all of them once
    b = t.classify(Candidate("A", None, tokens, 0, len(tokens) - 1), hits)
    assert b is not None and b.producer == "P"
    for _ in range(3):  # later rounds: the same producer in flight again
        t.begin_round([Producer("P", None, doc + [1] * 50, 0, 2050, 1984, False)], 0)
        assert t.may_block("A", None, tokens)
    assert CountingBlocks.slices == first  # nothing hashed again
    t.forget("A")
    assert t.may_block("A", None, tokens) and CountingBlocks.slices == 2 * first


def test_a_new_token_object_is_hashed_afresh() -> None:
    """The cache is keyed by the token object: a request whose tokens changed (output ids
    appended after a retraction) never reuses a stale chain."""
    doc = list(range(10_000, 12_000))
    t = _traversal()
    t.admitted(Producer("P", None, doc + [1] * 50, 0, 2050, 1984, True))
    assert t.may_block("A", None, doc + [2] * 40)
    other = list(range(50_000, 52_040))
    assert not t.may_block("A", None, other)  # same rid, other tokens: no stale hit


def test_may_block_hits_are_what_classify_finds(monkeypatch) -> None:
    """classify with may_block's hits decides as classify alone, without a second lookup."""
    doc = list(range(10_000, 12_000))
    t = _traversal()
    t.admitted(Producer("P", None, doc + [1] * 50, 0, 2050, 1984, True))
    c = Candidate("A", None, doc + [2] * 40, 0, 2039)
    hits = t.may_block(c.rid, c.namespace, c.tokens)
    alone = t.classify(c)
    calls = {"n": 0}
    real = producers_mod.ProducerIndex.sharers

    def counting(self, *a, **k):
        calls["n"] += 1
        return real(self, *a, **k)

    monkeypatch.setattr(producers_mod.ProducerIndex, "sharers", counting)
    assert t.classify(c, hits) == alone and alone is not None
    assert calls["n"] == 0


def test_a_producer_reuses_the_chain_hashed_while_it_waited() -> None:
    doc = list(range(10_000, 12_000))
    t = _traversal()
    t.admitted(Producer("P", None, doc + [1] * 50, 0, 2050, 1984, True))
    tokens = CountingBlocks(doc + [2] * 40)
    assert t.may_block("A", None, tokens)
    CountingBlocks.slices = 0
    t.admitted(Producer("A", None, tokens[:1984], 0, 1984, 1984, True, source=tokens))
    assert CountingBlocks.slices == 1  # its prefix slice, no block re-hashed
    p, n = t.index.longest(None, doc + [3] * 10, exclude="P")
    assert (p.rid, n) == ("A", 1984)
