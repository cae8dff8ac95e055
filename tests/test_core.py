"""The engine-free policy core: grid rules, producer index, wait set, traversal, policies.

Pure Python: nothing here imports sglang (checked by the last test), so this file runs in
well under a second.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from radixflow_sglang.core import producers as producers_mod
from radixflow_sglang.core.grid import Grid, Layout
from radixflow_sglang.core.policy import POLICIES, policy_spec
from radixflow_sglang.core.producers import Producer, ProducerIndex, common_prefix
from radixflow_sglang.core.stats import RoundStats, Totals
from radixflow_sglang.core.traversal import Candidate, Traversal, TraversalConfig
from radixflow_sglang.core.waitset import WaitSet

G = 64  # GDN checkpoint grid (FLA chunk)
DOC = list(range(1000, 3000))  # a 2,000-token shared document


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


# --- Grid.planned_depth -------------------------------------------------------------------------


@pytest.mark.parametrize("g", [64, 128, 256])
@pytest.mark.parametrize("prefix, extend", [(0, 2100), (0, 2048), (64, 130), (1984, 66), (0, 64),
                                            (1000, 777)])
def test_extra_buffer_publishes_on_the_grid_relative_to_the_prefix(g, prefix, extend):
    grid = Grid(Layout.EXTRA_BUFFER, g)
    want = prefix + extend // g * g if extend >= g else None
    assert grid.planned_depth(prefix, extend) == want


@pytest.mark.parametrize("g", [64, 128])
def test_extra_buffer_short_extend_publishes_nothing(g):
    grid = Grid(Layout.EXTRA_BUFFER, g)
    for extend in (1, g // 2, g - 1):
        assert grid.planned_depth(0, extend) is None
        assert grid.planned_depth(3 * g, extend) is None
        # a branching point cannot make a short extend publish
        assert grid.planned_depth(0, extend, branching=0) is None
    assert grid.planned_depth(0, 0) is None
    assert grid.planned_depth(5 * g, 0, branching=6 * g) is None
    assert grid.planned_depth(0, -3) is None


@pytest.mark.parametrize("g", [64, 128])
def test_extra_buffer_branching_override_only_when_aligned_and_inside(g):
    grid = Grid(Layout.EXTRA_BUFFER, g)
    prefix, extend = 2 * g, 20 * g + 17
    native = prefix + extend // g * g
    inside = prefix + 7 * g
    assert grid.planned_depth(prefix, extend, branching=inside) == inside  # honoured
    assert grid.planned_depth(prefix, extend, branching=inside + 1) == native  # off the grid
    assert grid.planned_depth(prefix, extend, branching=prefix) == native  # not past the prefix
    assert grid.planned_depth(prefix, extend, branching=prefix - g) == native  # behind it
    assert grid.planned_depth(prefix, extend, branching=native + g) == native  # past the end
    assert grid.planned_depth(prefix, extend, branching=native) == native
    assert grid.planned_depth(prefix, extend, branching=None) == native
    # aligned relative to the prefix, not absolutely: prefix off the absolute grid
    odd = g + 5
    assert grid.planned_depth(odd, 4 * g, branching=odd + 2 * g) == odd + 2 * g
    assert grid.planned_depth(odd, 4 * g, branching=2 * g) == odd + 4 * g
    assert grid.branch_ok(prefix, extend, inside)
    assert not grid.branch_ok(prefix, extend, inside + 1)
    assert not grid.branch_ok(prefix, extend, prefix)


@pytest.mark.parametrize("prefix, extend", [(0, 1), (0, 2100), (1984, 66), (2030, 20)])
def test_no_buffer_publishes_at_the_extend_end(prefix, extend):
    grid = Grid(Layout.NO_BUFFER, G)
    assert grid.planned_depth(prefix, extend) == prefix + extend
    # branching points are never tracked without the extra buffer
    assert grid.planned_depth(prefix, extend, branching=prefix + 1) == prefix + extend


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("prefix, extend", [(0, 1), (0, 100), (16, 200), (64, 2100)])
def test_full_attention_publishes_every_page(page, prefix, extend):
    grid = Grid(Layout.FULL, page)
    assert grid.planned_depth(prefix, extend) == (prefix + extend) // page * page
    assert grid.planned_depth(prefix, 0) is None


# --- Grid.fork_depth ----------------------------------------------------------------------------


@pytest.mark.parametrize("g", [64, 128])
def test_fork_depth_extra_buffer(g):
    grid = Grid(Layout.EXTRA_BUFFER, g)
    extend = len(DOC) + 100
    common = len(DOC)
    assert grid.fork_depth(0, extend, common) == common // g * g
    # reach past the extend: the producer's own grid end
    assert grid.fork_depth(0, extend, 10_000) == extend // g * g
    # relative to a prefix off the absolute grid
    assert grid.fork_depth(5, extend, common) == 5 + (common - 5) // g * g
    # less than a grid step beyond the prefix: no fork
    assert grid.fork_depth(g, extend, g + g - 1) is None
    assert grid.fork_depth(g, extend, g) is None
    assert grid.fork_depth(3 * g, extend, g) is None
    # a fork depth is always something planned_depth honours as a branching point
    for reach in range(g + 1, extend, 97):
        d = grid.fork_depth(0, extend, reach)
        if d is not None:
            assert d <= reach and grid.branch_ok(0, extend, d)
            assert grid.planned_depth(0, extend, branching=d) == d


def test_fork_depth_no_buffer_and_full():
    nb = Grid(Layout.NO_BUFFER, G)
    assert nb.fork_depth(0, 2100, 2000) == 2000  # the divergence itself, as a chunk end
    assert nb.fork_depth(0, 2100, 5000) == 2100
    assert nb.fork_depth(100, 2100, 100) is None
    full = Grid(Layout.FULL, 16)
    assert full.fork_depth(0, 2100, 2000) == 2000 // 16 * 16
    assert full.fork_depth(0, 2100, 2030) == 2030 // 16 * 16
    assert full.fork_depth(0, 100, 2030) == 100 // 16 * 16
    assert full.fork_depth(64, 100, 32) is None


# --- ProducerIndex ------------------------------------------------------------------------------


def prod(rid, tokens, ns=None, prefix=0, publish=None, movable=True, extend=None) -> Producer:
    extend = len(tokens) - prefix if extend is None else extend
    return Producer(rid, ns, tokens, prefix, extend, publish, movable)


def test_common_prefix_matches_a_plain_loop():
    a = DOC + toks(5000, 37)
    for n in (0, 1, 63, 64, 65, 127, 2000, 2030):
        b = a[:n] + [-7] + a[n + 1 :]
        assert common_prefix(a, b) == n
        assert common_prefix(a, a[:n]) == n
    assert common_prefix(a, a) == len(a)


def test_longest_prefix_across_several_producers():
    idx = ProducerIndex(block=64)
    p_short = DOC[:700] + toks(7000, 500)
    p_long = DOC[:1500] + toks(8000, 300)
    p_other = toks(9000, 2000)
    idx.add(prod("short", p_short))
    idx.add(prod("long", p_long))
    idx.add(prod("other", p_other))
    query = DOC + toks(5000, 50)
    p, n = idx.longest(None, query)
    assert (p.rid, n) == ("long", common_prefix(query, p_long)) == ("long", 1500)
    # the deepest sharer wins even when added first
    idx2 = ProducerIndex(block=64)
    for rid, t in [("long", p_long), ("short", p_short), ("other", p_other)]:
        idx2.add(prod(rid, t))
    assert idx2.longest(None, query)[0].rid == "long"
    # a query sharing less than a block with everyone: nothing
    assert idx.longest(None, DOC[:63] + toks(50_000, 100)) is None
    assert idx.longest(None, toks(60_000, 3000)) is None
    assert len(idx) == 3 and "long" in idx and idx.get("short").tokens == p_short


def test_longest_verifies_tails_inside_a_block():
    """Two producers whose tokens differ inside a block: the partial block decides."""
    idx = ProducerIndex(block=64)
    p1 = DOC[:120] + toks(7000, 200)  # differs from DOC at 120, inside block [64, 128)
    p2 = DOC[:100] + toks(8000, 200)  # differs at 100, same block
    idx.add(prod("p1", p1))
    idx.add(prod("p2", p2))
    q = DOC[:125] + toks(9000, 50)
    p, n = idx.longest(None, q)
    assert (p.rid, n) == ("p1", 120)
    p, n = idx.longest(None, p2 + [1])
    assert (p.rid, n) == ("p2", len(p2))


def test_hash_collision_never_makes_prefixes_look_shared():
    """CPython hashes -1 and -2 alike, so these blocks collide in the chain; the token check
    must still report the true common prefix."""
    assert hash(-1) == hash(-2)
    block = toks(100, 64)
    a = block[:10] + [-2] + block[11:]
    b = block[:10] + [-1] + block[11:]
    idx = ProducerIndex(block=64)
    idx.add(prod("p", a * 3))
    assert idx.longest(None, b * 3) is None  # 10 true tokens < one block
    # collision in the 3rd block: the true common prefix is 2 blocks + 10
    idx.add(prod("q", block * 2 + a))
    p, n = idx.longest(None, block * 2 + b, exclude="p")
    assert (p.rid, n) == ("q", 2 * 64 + 10)


def test_namespaces_isolate_and_exclude_self():
    idx = ProducerIndex(block=64)
    tokens = DOC + toks(5000, 100)
    idx.add(prod("a", tokens, ns=("k1", None, None)))
    assert idx.longest(("k2", None, None), tokens) is None
    assert idx.longest(None, tokens) is None
    p, n = idx.longest(("k1", None, None), tokens)
    assert (p.rid, n) == ("a", len(tokens))
    assert idx.longest(("k1", None, None), tokens, exclude="a") is None
    idx.add(prod("b", DOC + toks(6000, 10), ns=("k1", None, None)))
    p, n = idx.longest(("k1", None, None), tokens, exclude="a")
    assert (p.rid, n) == ("b", len(DOC))


def test_remove_and_re_add():
    idx = ProducerIndex(block=64)
    tokens = DOC + toks(5000, 100)
    idx.add(prod("a", tokens))
    idx.add(prod("b", DOC[:640]))
    idx.remove("a")
    assert "a" not in idx and len(idx) == 1
    p, n = idx.longest(None, tokens)
    assert (p.rid, n) == ("b", 640)
    idx.remove("b")
    idx.remove("b")  # idempotent
    assert len(idx) == 0 and idx.longest(None, tokens) is None
    assert idx._by_hash == {}  # no orphaned hash buckets
    # re-adding a rid replaces its entry rather than duplicating it
    idx.add(prod("a", tokens))
    idx.add(prod("a", DOC[:128]))
    assert len(idx) == 1 and idx.longest(None, tokens)[1] == 128


class CountingTokens(Sequence):
    """A token sequence that counts the block slices taken from it (the hash-chain work)."""

    def __init__(self, data):
        self.data = list(data)
        self.slices = 0

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        if isinstance(i, slice):
            self.slices += 1
        return self.data[i]


@pytest.mark.parametrize("n_producers", [20, 2000])
def test_lookup_of_an_unrelated_request_stops_at_the_first_block(n_producers):
    idx = ProducerIndex(block=64)
    for i in range(n_producers):
        idx.add(prod(f"p{i}", toks(10_000 * (i + 1), 1000)))
    q = CountingTokens(toks(100_000_000, 8000))
    assert idx.longest(None, q) is None
    assert q.slices == 1  # one block hashed, regardless of length or producer count
    # a request sharing 10 blocks with one producer hashes 11 blocks
    q2 = CountingTokens(toks(10_000, 640) + toks(7_000_000, 5000))
    p, n = idx.longest(None, q2)
    assert (p.rid, n) == ("p0", 640)
    assert q2.slices == 640 // 64 + 1


class CountingDict(dict):
    """The index's hash table, counting probes (what a lookup's time is made of)."""

    probes = 0

    def get(self, key, default=None):
        self.probes += 1
        return super().get(key, default)


def test_lookup_work_does_not_grow_with_unrelated_producers(monkeypatch):
    # NOTE: counted operations, not wall time: hash probes, hashed blocks and token compares.
    compares = {"n": 0}
    real = producers_mod.common_prefix

    def counting(a, b, step=64):
        compares["n"] += 1
        return real(a, b, step)

    monkeypatch.setattr(producers_mod, "common_prefix", counting)

    def work(n):
        idx = ProducerIndex(block=64)
        for i in range(n):
            idx.add(prod(f"p{i}", toks(10_000 * (i + 1), 200)))
        idx._by_hash = CountingDict(idx._by_hash)
        compares["n"] = slices = 0
        for j in range(1000):
            q = CountingTokens(toks(100_000_000 + 3000 * j, 2000))
            assert idx.longest(None, q) is None
            slices += q.slices
        return idx._by_hash.probes, slices, compares["n"]

    assert work(2000) == work(20) == (1000, 1000, 0)  # one probe, one block, no compare each


def test_lookup_cost_does_not_grow_with_producers_sharing_the_prefix(monkeypatch):
    calls = {"n": 0}
    real = producers_mod.common_prefix

    def counting(a, b, step=64):
        calls["n"] += 1
        return real(a, b, step)

    monkeypatch.setattr(producers_mod, "common_prefix", counting)
    work = {}
    for n in (4, 256):
        idx = ProducerIndex(block=64)
        for i in range(n):
            idx.add(prod(f"p{i}", DOC + [i] * 40))
        calls["n"] = 0
        p, common = idx.longest(None, DOC + [-5] * 30)
        assert common == len(DOC)
        work[n] = calls["n"]
    assert work[256] < 3 * work[4], work


# --- WaitSet ------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_rounds", [1, 2, 3])
def test_waitset_bound_and_total_rounds(max_rounds):
    w = WaitSet(max_rounds)
    for r in range(1, max_rounds + 1):
        assert w.may_park("a")
        p = w.park("a", r, "P", 1984)
        assert p.rounds == r and p.first_round == 1
    assert not w.may_park("a")
    assert w.may_park("b")
    assert w.total_rounds == {"a": max_rounds}
    assert "a" in w and len(w) == 1 and w.rids() == ["a"]
    assert w.release("a").rounds == max_rounds
    assert "a" not in w and w.release("a") is None
    assert w.total_rounds == {"a": max_rounds}  # kept for metrics after release
    w.park("b", 9, "Q", 64)
    w.forget("a")
    w.forget("b")
    assert len(w) == 0 and w.total_rounds == {}


def test_waitset_park_records_latest_producer():
    w = WaitSet(3)
    w.park("a", 1, "P", 1984)
    p = w.park("a", 2, "Q", 640)
    assert (p.producer, p.depth, p.first_round, p.rounds) == ("Q", 640, 1, 2)
    assert w.get("a") is p


# --- Traversal ----------------------------------------------------------------------------------


def traversal(layout=Layout.EXTRA_BUFFER, g=G, overlap=False, theta=None, slots=1 << 30):
    t = Traversal(TraversalConfig.default(Grid(layout, g), overlap, theta=theta))
    t.begin_round([], slots)
    return t


def producer_for(t: Traversal, rid, tokens, prefix=0, movable=True, branching=None):
    extend = len(tokens) - prefix
    return Producer(rid, None, list(tokens), prefix, extend,
                    t.cfg.grid.planned_depth(prefix, extend, branching), movable)


def cand(rid, tokens, ready=0):
    return Candidate(rid, None, tokens, ready, len(tokens) - 1)


P_TOK = DOC + toks(5000, 100)
A_TOK = DOC + toks(6000, 120)


def test_default_config_theta_and_bound():
    c = TraversalConfig.default(Grid(Layout.EXTRA_BUFFER, 128), overlap=False)
    assert (c.theta, c.max_park_rounds) == (128, 2)
    c = TraversalConfig.default(Grid(Layout.EXTRA_BUFFER, 64), overlap=True)
    assert (c.theta, c.max_park_rounds) == (64, 3)
    c = TraversalConfig.default(Grid(Layout.FULL, 1), overlap=False, margin=2, theta=300)
    assert (c.theta, c.max_park_rounds) == (300, 3)
    assert TraversalConfig.default(Grid(Layout.FULL, 1), overlap=False).theta == 64
    assert Traversal(c).index.block == 64
    small = TraversalConfig.default(Grid(Layout.FULL, 1), overlap=False, theta=16)
    assert Traversal(small).index.block == 16


@pytest.mark.parametrize("g", [64, 128])
def test_blocked_when_publish_within_reach_and_gain_at_least_theta(g):
    t = traversal(g=g)
    # the producer already publishes at a depth the consumer can match (e.g. its branch point)
    fork = len(DOC) // g * g
    p = producer_for(t, "P", P_TOK, branching=fork)
    assert p.publish == fork
    t.admitted(p)
    b = t.classify(cand("A", A_TOK))
    assert b is not None
    assert (b.producer, b.depth, b.ready, b.fork) == ("P", fork, 0, False)
    # gain measured from the consumer's ready prefix: exactly theta still blocks
    assert t.classify(cand("A", A_TOK, ready=fork - t.cfg.theta)) is not None
    assert t.classify(cand("A", A_TOK, ready=fork - t.cfg.theta + 1)) is None
    assert t.classify(cand("A", A_TOK, ready=fork)) is None
    assert t.stats.blocked == 0  # classify has no side effects


def test_not_blocked_when_gain_below_theta():
    theta = 500
    t = traversal(theta=theta)
    t.admitted(producer_for(t, "P", DOC[:600] + toks(5000, 100)))
    assert 600 // G * G >= theta  # the producer can fork at 576: gain >= theta blocks
    assert t.classify(cand("A", DOC[:600] + toks(6000, 50))).depth == 600 // G * G
    t2 = traversal(theta=theta)
    t2.admitted(producer_for(t2, "P", DOC[:450] + toks(5000, 100)))
    assert 450 // G * G < theta  # sharing 450 tokens: a fork at 448 gains too little
    assert t2.classify(cand("A", DOC[:450] + toks(6000, 50))) is None


def test_reach_is_capped_at_input_length_minus_one():
    t = traversal()
    doc = toks(1000, 32 * G)
    p = producer_for(t, "P", doc + toks(5000, 100), branching=len(doc))
    assert p.publish == len(doc)
    t.admitted(p)
    # an exact repeat of a grid-length prompt can match at most len - 1: fork one step earlier
    b = t.classify(cand("A", doc))
    assert b is not None and b.depth == (len(doc) - 1) // G * G and b.fork


@pytest.mark.parametrize("g", [64, 128])
def test_fork_moves_producer_publish_to_the_fork_depth(g):
    t = traversal(g=g)
    p = producer_for(t, "P", P_TOK)
    assert p.publish == len(P_TOK) // g * g  # its own end on the grid: past the divergence
    t.admitted(p)
    c = cand("A", A_TOK)
    b = t.classify(c)
    fork = len(DOC) // g * g
    assert (b.depth, b.fork) == (fork, True)
    t.park(c, b)
    assert p.publish == fork and p.forked and p.consumers == ["A"]
    assert (t.stats.blocked, t.stats.forks) == (1, 1)
    assert "A" in t.waits and t.waits.get("A").depth == fork
    # a second consumer reaching as deep is blocked on the (now within reach) publish
    b2 = t.classify(cand("B", DOC + toks(7000, 10)))
    assert (b2.depth, b2.fork) == (fork, False)
    t.park(cand("B", DOC + toks(7000, 10)), b2)
    assert t.stats.forks == 1 and p.consumers == ["A", "B"]
    # a consumer sharing less moves the fork shallower (one state per extend)
    short = DOC[:1000] + toks(8000, 10)
    b3 = t.classify(cand("C", short))
    assert (b3.depth, b3.fork) == (1000 // g * g, True)
    t.park(cand("C", short), b3)
    assert p.publish == 1000 // g * g and t.stats.forks == 1  # still one forked producer


def test_no_fork_when_producer_not_movable():
    t = traversal()
    t.begin_round([producer_for(t, "P", P_TOK, movable=True)], 1 << 30)  # in flight
    p = t.index.get("P")
    assert p is not None and not p.movable
    assert t.classify(cand("A", A_TOK)) is None  # publishes at 2048 > reach 2000
    # an in-flight producer whose publish is within reach still blocks, without a fork
    t.begin_round([producer_for(t, "Q", P_TOK, branching=1984)], 1 << 30)
    b = t.classify(cand("A", A_TOK))
    assert (b.producer, b.depth, b.fork) == ("Q", 1984, False)


def test_no_fork_when_the_fork_is_not_a_grid_step_past_the_producer_prefix():
    t = traversal()
    # producer resumes at 1960; the divergence at 2000 is less than G past it
    p = producer_for(t, "P", P_TOK, prefix=1960)
    t.admitted(p)
    assert t.classify(cand("A", A_TOK, ready=0)) is None


def test_a_producer_extending_less_than_a_grid_step_is_no_reason_to_wait():
    t = traversal()
    t.admitted(producer_for(t, "P", DOC[:2030], prefix=2000))  # extend 30 < G: publishes nothing
    assert t.classify(cand("A", DOC[:2030] + toks(6000, 120), ready=1984)) is None


def test_no_buffer_fork_slots_one_producer_per_round():
    t = traversal(Layout.NO_BUFFER, slots=1)
    p1 = producer_for(t, "P1", P_TOK)
    other_doc = toks(40_000, 1500)
    p2 = producer_for(t, "P2", other_doc + toks(5000, 100))
    t.admitted(p1)
    t.admitted(p2)
    c1 = cand("A1", A_TOK)
    b1 = t.classify(c1)
    assert (b1.depth, b1.fork) == (len(DOC), True)  # no_buffer forks at the divergence itself
    t.park(c1, b1)
    assert t.fork_slots == 0 and p1.publish == len(DOC)
    c2 = cand("A2", other_doc + toks(6000, 10))
    assert t.classify(c2) is None  # the only slot is spent: P2 keeps its end
    assert p2.publish == len(other_doc) + 100 and not p2.forked
    # the forked producer can still be moved for another consumer (shallower)
    c3 = cand("A3", DOC[:1200] + toks(9000, 5))
    b3 = t.classify(c3)
    assert (b3.depth, b3.fork) == (1200, True)
    t.park(c3, b3)
    assert p1.publish == 1200 and t.stats.forks == 1
    # a new round restores the slot
    t.begin_round([], 1)
    assert t.fork_slots == 1


def test_no_buffer_fork_cut_goes_to_the_producers_mark_below_the_fork():
    """A learned document end (Producer.mark) below the consumers' fork takes the cut the
    traversal makes for them anyway; a mark at or past the fork, or none, leaves the fork."""
    doc_end = len(DOC) - 200
    for mark, want in ((doc_end, doc_end), (len(DOC), len(DOC)), (len(DOC) + 50, len(DOC)),
                       (None, len(DOC)), (0, len(DOC))):
        t = traversal(Layout.NO_BUFFER, slots=1)
        p = producer_for(t, "P", P_TOK)
        p.mark = mark
        t.admitted(p)
        c = cand("A", A_TOK)
        b = t.classify(c)
        assert (b.depth, b.fork) == (want, True)
        t.park(c, b)
        assert p.publish == want
        # NOTE: a later sibling is Blocked on the published depth, no second fork
        b2 = t.classify(cand("A2", DOC + toks(7000, 90)))
        assert (b2.depth, b2.fork) == (want, False) and t.stats.forks == 1
    # NOTE: a mark less than theta past the consumer's ready prefix keeps the fork: there the
    # consumer would not be Blocked at all and would recompute the whole fork instead of waiting
    t = traversal(Layout.NO_BUFFER, slots=1)
    p = producer_for(t, "P", P_TOK)
    p.mark = t.cfg.theta - 1
    t.admitted(p)
    b = t.classify(cand("A", A_TOK))
    assert (b.depth, b.fork) == (len(DOC), True)


def test_cost_aware_cut_goes_to_the_mark_only_where_waiting_for_it_still_wins():
    """The cost-aware rule decides at the consumers' fork; the cut moves to the producer's mark
    only where the group waits for it too (a smaller gain and a longer rest there). A marginal
    wait at the fork that recomputes at the mark keeps the fork: moving there turned a waiting
    question into four cold branches (nemotron-9b race, alpha 25 ms, no_buffer, seed 1: tokens
    0.24x -> 0.42x stock)."""
    from radixflow_sglang.core.cost import CostCoeffs, RoundView

    doc_end = len(DOC) - 200
    view = RoundView(rows=1, behind=1, budget_left=8192, demand_after=0, mean_extend=100.0,
                     rows_left=60)
    # NOTE: beta 10 us/token, no per-row cost: at the fork wait 2 x (alpha + 220 beta) vs
    # recompute 2 x 2,000 beta; at the mark 2 x (alpha + 620 beta) vs 2 x 1,800 beta
    for alpha, waits, depth in ((0.005, True, doc_end), (0.015, True, len(DOC)),
                                (0.025, False, None)):
        t = Traversal(TraversalConfig.default(Grid(Layout.NO_BUFFER, G), False,
                                              cost_aware=True))
        t.begin_round([], 1)
        p = producer_for(t, "P", P_TOK)
        p.mark = doc_end
        t.admitted(p)
        c = cand("A", A_TOK)
        b = t.classify(c)
        assert (b.depth, b.mark, b.fork) == (len(DOC), doc_end, True)
        v = t.decide(c, b, view, CostCoeffs(alpha, 1e-5, 0.0))
        assert v.wait is waits
        if not waits:
            continue
        placed = t.placed(c, b)
        assert (placed.depth, placed.mark) == (depth, None)
        t.park(c, placed)
        assert p.publish == depth
        # NOTE: a later sibling is Blocked on the published depth and follows the verdict
        c2 = cand("A2", DOC + toks(7000, 90))
        b2 = t.classify(c2)
        assert (b2.depth, b2.fork) == (depth, False)
        assert t.decide(c2, b2, view, CostCoeffs(alpha, 1e-5, 0.0)).wait


def test_no_buffer_zero_slots_blocks_only_on_planned_publish():
    t = traversal(Layout.NO_BUFFER, slots=0)
    t.admitted(producer_for(t, "P", DOC))  # publishes at its end = the whole doc
    b = t.classify(cand("A", A_TOK))
    assert (b.depth, b.fork) == (len(DOC), False)
    t.admitted(producer_for(t, "Q", toks(40_000, 900) + toks(5000, 100)))
    assert t.classify(cand("B", toks(40_000, 900) + toks(6000, 9))) is None


def test_full_attention_waits_for_pages_without_forks():
    t = traversal(Layout.FULL, 1)
    p = producer_for(t, "P", P_TOK)
    t.admitted(p)
    b = t.classify(cand("A", A_TOK))
    assert (b.depth, b.fork) == (len(DOC), False)
    t.park(cand("A", A_TOK), b)
    assert t.stats.forks == 0 and not p.forked and p.publish == len(P_TOK)


def test_park_bound_releases_to_native_handling():
    t = traversal()
    p = producer_for(t, "P", P_TOK, branching=1984)
    bound = t.cfg.max_park_rounds
    c = cand("A", A_TOK)
    for r in range(bound):
        t.begin_round([], 1 << 30)
        t.admitted(p)
        assert t.waits.may_park("A"), r
        t.park(c, t.classify(c))
        t.waits.release("A")  # NOTE: rechecked next round
    t.begin_round([], 1 << 30)
    t.admitted(p)
    # NOTE: core/points.py `visit` reads it as `bound_left` (tests/test_rules.py bound_spent)
    assert not t.waits.may_park("A") and t.waits.rounds_left("A") == 0
    assert "A" not in t.waits and t.waits.total_rounds["A"] == bound


def test_cost_aware_wait_the_bound_would_cut_before_publication_recomputes():
    """Overlap: a producer admitted this scan publishes 2 rounds later, the bound is 3 rounds
    in all. A consumer that already parked 2 rounds (for an earlier producer) would park once
    more and be released by the bound before the state exists: it recomputes now. A fresh
    consumer of the same producer, in the same view, waits."""
    from radixflow_sglang.core.cost import CostCoeffs, RoundView

    t = Traversal(TraversalConfig.default(Grid(Layout.EXTRA_BUFFER, G), True, cost_aware=True))
    assert (t.cfg.lag, t.cfg.max_park_rounds) == (2, 3)
    view = RoundView(rows=1, behind=1, budget_left=8192, demand_after=0, mean_extend=100.0,
                     rows_left=60)
    cost = CostCoeffs(0.002, 1e-5, 0.0)  # NOTE: a 2,000-token gain against a 2 ms round
    late, fresh = cand("A", A_TOK), cand("B", DOC + toks(7000, 90))
    for r in range(2):
        t.waits.park("A", r, "earlier", G)
    t.begin_round([], 1 << 30)
    t.admitted(producer_for(t, "P", P_TOK))
    assert t.waits.rounds_left("A") == 1 and t.waits.rounds_left("B") == 3
    assert not t.decide(late, t.classify(late), view, cost).wait
    assert t.decide(fresh, t.classify(fresh), view, cost).wait


def test_round_lifecycle_releases_selected_and_counts_wait_set():
    t = traversal()
    t.admitted(producer_for(t, "P", P_TOK))
    for i, rid in enumerate(("A", "B")):
        c = cand(rid, DOC + toks(10_000 + 100 * i, 50))
        t.park(c, t.classify(c))
    s = t.end_round(["P"])
    assert s.wait_set == 2 and s.blocked == 2 and s.forks == 1 and s.round == 1
    t.begin_round([], 1 << 30)
    s = t.end_round(["A"])
    assert s.wait_set == 1 and t.waits.rids() == ["B"]
    t.forget("B")
    assert len(t.waits) == 0 and "B" not in t.waits.total_rounds


def test_may_block_is_a_cheap_pre_check():
    t = traversal()
    assert not t.may_block("A", None, A_TOK)  # no producers at all
    t.admitted(producer_for(t, "P", P_TOK))
    assert t.may_block("A", None, A_TOK)
    assert not t.may_block("P", None, P_TOK)  # itself
    assert not t.may_block("X", None, toks(90_000, 3000))
    assert not t.may_block("A", ("other", None, None), A_TOK)


def test_admitted_consumer_leaves_the_wait_set_and_becomes_a_producer():
    t = traversal()
    t.admitted(producer_for(t, "P", P_TOK))
    c = cand("A", A_TOK)
    t.park(c, t.classify(c))
    t.begin_round([], 1 << 30)
    t.admitted(producer_for(t, "A", A_TOK, prefix=1984))
    assert "A" not in t.waits and "A" in t.index


# --- stats --------------------------------------------------------------------------------------


def test_totals_add_rounds():
    tot = Totals()
    tot.add(RoundStats(1, blocked=3, forks=1, scheduled_tokens=2550, hit_tokens=0))
    tot.add(RoundStats(2, blocked=0, released_by_bound=1, scheduled_tokens=198, hit_tokens=5952))
    assert (tot.rounds, tot.blocked, tot.forks, tot.released_by_bound) == (2, 3, 1, 1)
    assert (tot.scheduled_tokens, tot.hit_tokens) == (2748, 5952)
    assert RoundStats(4, rows=2).as_dict()["rows"] == 2


# --- policies -----------------------------------------------------------------------------------


def test_policy_spec_errors_are_neutral_and_list_choices():
    """The core names no flag or variable: radixflow_sglang/config.py names what the user set."""
    with pytest.raises(ValueError) as e:
        policy_spec("fastest")
    msg = str(e.value)
    assert msg.startswith("invalid policy 'fastest' (choose from ") and "--radixflow" not in msg
    for name in POLICIES:
        assert name in msg
    with pytest.raises(ValueError, match=r"^admission_ms -1 is outside \[0, 1000\]$"):
        policy_spec("flex", admission_ms=-1)
    with pytest.raises(ValueError, match=r"^admission_ms 1000.5 is outside"):
        policy_spec("radixflow", admission_ms=1000.5)


@pytest.mark.parametrize("name", POLICIES)
def test_each_policy_composition(name):
    s = policy_spec(name)
    assert s.name == name
    assert s.native_class == (name == "stock")
    assert s.traversal == (name in ("traversal", "radixflow", "radixflow-frag",
                                    "traversal-always", "radixflow-always"))
    assert s.cost_aware == (name in ("traversal", "radixflow", "radixflow-frag"))
    want_adm = {"timer5": "timer", "timer10": "timer", "flex": "flex", "radixflow": "flex",
                "radixflow-frag": "flex", "radixflow-always": "flex",
                "flex-always": "flex"}.get(name)
    assert s.admission == want_adm
    assert s.frag == (name == "radixflow-frag")
    if name.startswith("timer"):
        assert s.admission_ms == float(name[len("timer"):])
    elif want_adm == "flex":
        assert s.admission_ms == 5.0
        assert policy_spec(name, admission_ms=2.5).admission_ms == 2.5
    else:
        assert s.admission_ms == 0.0
    text = s.describe()
    assert ("state-ready traversal" in text) == s.traversal
    assert ("flexible admission" in text) == (want_adm == "flex")
    assert ("fragmentation guard" in text) == s.frag
    assert ("cost-aware wait" in text) == (s.traversal and s.cost_aware)
    assert ("always wait" in text) == (s.traversal and not s.cost_aware)


def test_flex_never_traverses_and_traversal_never_holds():
    assert not policy_spec("flex").traversal
    assert policy_spec("traversal").admission is None
    assert policy_spec("traversal", admission_ms=7).admission_ms == 0.0
    assert not policy_spec("stock").traversal and policy_spec("stock").admission is None
    assert not policy_spec("radix").traversal and not policy_spec("radix").native_class


def test_core_does_not_import_sglang():
    """Every module of core/ (listed from the directory, so a new one is covered too)."""
    core = Path(producers_mod.__file__).parent
    mods = sorted(f"radixflow_sglang.core.{p.stem}" for p in core.glob("*.py")
                  if p.stem != "__init__")
    assert "radixflow_sglang.core.cost" in mods
    code = (f"import sys, {', '.join(mods)}; "
            "print(any(m == 'sglang' or m.startswith('sglang.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
