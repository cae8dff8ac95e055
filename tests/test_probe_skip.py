"""The traversal skips its probe match where the cost-aware rule recomputes at every ready prefix
a candidate could have (issue 11: 0.8B RACE cells paid the probe on every visit and then
recomputed anyway, 1.03-1.06x stock with the same rounds and tokens).

The bound is the rule's verdict at the largest gain (nothing ready): the wait side of the rule
does not read the ready prefix and the recompute side grows with the gain, so a recompute there
is a recompute everywhere (docs/design.md, "Skipping the probe"). Where earlier siblings'
recomputes could exhaust the budget the proof does not hold, and the bound gives up.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from radixflow_sglang.adapter import quiet as quiet_mod
from radixflow_sglang.core.cost import (
    CostCoeffs,
    RoundView,
    WaitCase,
    group_wait_wins,
    recomputes_at_every_ready,
)
from radixflow_sglang.core.grid import Grid, Layout
from radixflow_sglang.core.producers import Producer
from radixflow_sglang.core.traversal import Candidate, Traversal, TraversalConfig
from radixflow_sglang.testing.kit import record_matches

THETA = 64


def _sample(rng: random.Random) -> tuple[CostCoeffs, WaitCase, RoundView]:
    c = CostCoeffs(rng.choice([0.0, 1e-3, 8e-3, 5e-2, 0.2]),
                   rng.choice([0.0, 2.8e-6, 1.7e-5, 1e-4]), rng.choice([0.0, 1e-4, 1e-3]),
                   rng.choice([0.0, 1e-10, 1e-9]))
    length = rng.randrange(THETA + 2, 9000)
    depth = rng.randrange(THETA, length)
    case = WaitCase(0, depth, length, rng.choice([1, 2]),
                    rng.choice([0, 0, rng.randrange(1, 2000)]))
    budget = rng.choice([512, 2048, 8192])
    v = RoundView(rows=rng.randrange(0, 20), behind=rng.randrange(1, 80),
                  budget_left=rng.randrange(0, budget + 1), demand_after=rng.randrange(0, 30_000),
                  mean_extend=rng.uniform(30, 3000), rows_left=rng.randrange(0, 64),
                  parked_tokens=rng.randrange(0, 4000), parked_rows=rng.randrange(0, 5),
                  token_budget=budget, row_budget=64, siblings=rng.choice([0, 0, 1, 2, 3, 7]),
                  host_s=rng.choice([0.0, 2e-3]))
    return c, case, v


def _readies(case: WaitCase) -> range:
    """Every ready prefix at which the candidate is still Blocked (gain >= theta)."""
    return range(0, case.depth - THETA + 1, max(1, (case.depth - THETA) // 97))


def test_the_bound_never_skips_a_candidate_that_would_wait() -> None:
    """Where the bound says recompute, the rule recomputes at every ready prefix (random costs,
    views, groups, lags and no_buffer cuts); and the bound is not vacuous."""
    rng = random.Random(11)
    skipped = 0
    for _ in range(5000):
        c, case, v = _sample(rng)
        if not recomputes_at_every_ready(c, case, v):
            continue
        skipped += 1
        for r in _readies(case):
            assert not group_wait_wins(c, replace(case, ready=r), v).wait, (c, case, v, r)
    assert skipped > 150


def _traversal(lag_overlap: bool = False) -> Traversal:
    t = Traversal(TraversalConfig.default(Grid(Layout.EXTRA_BUFFER, 64), lag_overlap,
                                          cost_aware=True))
    t.begin_round([], 1 << 30)
    return t


DOC = list(range(10_000, 12_000))
DEAR = CostCoeffs(0.25, 1e-7, 1e-4)  # a huge fixed cost per round: recomputing always wins
CHEAP = CostCoeffs(1e-3, 1.7e-5, 1e-4)  # the 4B's per-token cost: a 2,000-token wait wins


def _view(**kw) -> RoundView:
    base = dict(rows=1, behind=3, budget_left=8192, demand_after=0, mean_extend=2000.0,
                rows_left=63, token_budget=8192, row_budget=64)
    return RoundView(**{**base, **kw})


def _cand(rid: str, ready: int = 0) -> Candidate:
    tokens = DOC + [hash(rid) % 1000 + 1] * 40
    return Candidate(rid, None, tokens, ready, len(tokens) - 1)


@pytest.mark.parametrize("cost, skip", [(DEAR, True), (CHEAP, False)])
def test_the_traversal_skips_only_where_decide_recomputes(cost, skip) -> None:
    t = _traversal()
    t.admitted(Producer("P", None, DOC + [1] * 50, 0, 2050, 1984, True))
    c0 = _cand("A")
    bs = t.blockings(c0, t.may_block(c0.rid, None, c0.tokens))
    assert [b.depth for b in bs] == [1984]
    assert t.recomputes_unprobed(c0, bs, lambda b: _view(), cost) is skip
    if not skip:  # probed: decide at the real ready prefix waits
        b = t.classify(_cand("A", 640))
        assert t.decide(_cand("A", 640), b, _view(), cost).wait


def test_an_unprobed_recompute_and_a_waiting_group_is_probed() -> None:
    # NOTE: a probed sibling no longer follows its group's unprobed recompute (rule
    # `group_unprobed` went, issue 50: it never fired in 60 measured runs)
    t = _traversal()
    t.admitted(Producer("P", None, DOC + [1] * 50, 0, 2050, 1984, True))
    a = _cand("A")
    assert t.recomputes_unprobed(a, t.blockings(a, t.may_block("A", None, a.tokens)),
                                 lambda b: _view(siblings=1), DEAR)
    # next scan: the group waits first; the bound must not skip a later sibling
    t.begin_round([], 1 << 30)
    t.admitted(Producer("P", None, DOC + [1] * 50, 0, 2050, 1984, True))
    c_ = _cand("C", 640)
    assert t.decide(c_, t.classify(c_), _view(), CHEAP).wait
    d0 = _cand("D")
    assert not t.recomputes_unprobed(d0, t.blockings(d0, t.may_block("D", None, d0.tokens)),
                                     lambda b: _view(), DEAR)


def test_the_always_rule_never_skips() -> None:
    t = Traversal(TraversalConfig.default(Grid(Layout.EXTRA_BUFFER, 64), False))
    t.begin_round([], 1 << 30)
    t.admitted(Producer("P", None, DOC + [1] * 50, 0, 2050, 1984, True))
    a = _cand("A")
    assert not t.recomputes_unprobed(a, t.blockings(a, t.may_block("A", None, a.tokens)),
                                     lambda b: _view(), DEAR)


# --- on SGLang's real scan (the kit) ---------------------------------------------------------


def _run(make_kit, policy: str, skip: bool, monkeypatch, overlap: bool = False):
    with monkeypatch.context() as m:
        if not skip:
            m.setattr(Traversal, "recomputes_unprobed", lambda *a, **k: False)
        # NOTE: this queue would scan quietly (tests/test_quiet_scan.py): the probe skip is
        # what a scan that is not quiet does with such a group
        m.setattr(quiet_mod, "never_waits", lambda *a, **k: False)
        k = make_kit("qwen3.5-4b", "extra_buffer", policy, overlap=overlap)
        k.runtime.use_prior(CostCoeffs(0.25, 1.7e-5, 1.24e-4))  # recomputing wins
        doc = list(range(1000, 1400))
        reqs = [k.req(f"b{i}", doc + list(range(90_000 + 40 * i, 90_000 + 40 * i + 30)))
                for i in range(4)]
        calls = [record_matches(r) for r in reqs]
        k.submit(*reqs)
        rounds = k.drain()
    probes = sum(c.count(False) for c in calls)
    return ([(r.rids, r.scheduled_tokens) for r in rounds], probes, k.runtime.totals,
            k.last_scan)


@pytest.mark.parametrize("overlap", [False, True])
def test_kit_recompute_without_a_probe_schedules_what_the_probed_rule_schedules(
        make_kit, monkeypatch, overlap) -> None:
    """Three branches of a short document under a large fixed cost: the rule recomputes them.
    Before: each was probed (a second radix match), then recomputed; now none is probed, and
    the rounds (rows and tokens) are the same."""
    probed_rounds, probes, totals, _ = _run(make_kit, "traversal", False, monkeypatch, overlap)
    assert probes == 3 and totals.recomputed == 3
    rounds, probes, totals, scan = _run(make_kit, "traversal", True, monkeypatch, overlap)
    assert probes == 0 and totals.recomputed == 3 and totals.blocked == 0
    assert rounds == probed_rounds
    assert scan.probed == 0


def test_kit_the_always_rule_keeps_probing(make_kit, monkeypatch) -> None:
    _, probes, totals, _ = _run(make_kit, "traversal-always", True, monkeypatch)
    assert probes == 3 and totals.blocked == 3


def test_kit_scan_timing_counts_the_probes(make_kit) -> None:
    """A long shared document on the 4B: waiting wins, the branches are probed, and the
    kit's ScanTiming reports the probes the runtime counted."""
    k = make_kit("qwen3.5-4b", "extra_buffer", "traversal")
    doc = list(range(1000, 5000))
    k.submit(*[k.req(f"b{i}", doc + list(range(90_000 + 40 * i, 90_000 + 40 * i + 30)))
               for i in range(4)])
    k.step()
    assert k.last_scan.probed == k.runtime.stats.probed == 3
    assert k.runtime.stats.blocked == 3


def test_the_admission_hold_matches_only_until_the_demand_fills_the_budget(make_kit) -> None:
    """AdmissionHold._demand matched every queued request (O(queue) radix matches per scan,
    35 % of the scan at queue 64) where the gate only asks whether the residual demand fills
    the token budget: it stops at the request that fills it, with the same release."""
    k = make_kit("qwen3.5-4b", "extra_buffer", "flex", tokens=2048)
    reqs = [k.req(f"r{i}", list(range(10_000 * i + 1, 10_000 * i + 601))) for i in range(10)]
    calls = [record_matches(r) for r in reqs]
    k.submit(*reqs)
    rnd = k.step()
    assert rnd is not None and rnd.rids[:3] == ["r0", "r1", "r2"]  # released by tokens
    assert k.runtime.held_iterations == 0
    assert [c.count(False) for c in calls] == [1] * 4 + [0] * 6  # 4 x 600 >= 2048
