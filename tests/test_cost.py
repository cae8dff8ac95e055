"""Cost-aware Blocked decisions (issue 11): the round-cost estimator, the wait rule, rank
agreement, and both rules on SGLang's real scan (the kit)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from radixflow_sglang.adapter import quiet as quiet_mod
from radixflow_sglang.adapter.scanstate import Scan
from radixflow_sglang.core.cost import (
    GENERIC_PRIOR,
    CostCoeffs,
    RoundCostEstimator,
    RoundView,
    WaitCase,
    group_wait_wins,
    newcomer_waits,
    prior_from_geometry,
    wait_wins,
)
from radixflow_sglang.core.grid import Grid, Layout
from radixflow_sglang.core.producers import Producer
from radixflow_sglang.core.traversal import Candidate, Traversal, TraversalConfig

QWEN_4B = CostCoeffs(8e-3, 1.7e-5, 1.24e-4)  # eval/costmodel.py's derivation, no delta
QWEN_08B = CostCoeffs(8e-3, 2.8e-6, 1.1e-4)


def view(**kw) -> RoundView:
    base = dict(rows=1, behind=3, budget_left=8192, demand_after=0, mean_extend=2000.0,
                rows_left=63, token_budget=8192, row_budget=64)
    return RoundView(**{**base, **kw})


# --- the rule ----------------------------------------------------------------------------------


def test_long_gain_parks():
    # A 5,000-token shared document on the 4B: recomputing it costs ~85 ms per delayed request,
    # waiting costs one ~10 ms round.
    v = wait_wins(QWEN_4B, WaitCase(ready=0, depth=4992, length=5100, lag=1), view())
    assert v.wait and v.wait_s < v.recompute_s


def test_short_gain_under_a_large_fixed_cost_goes_native():
    big_alpha = CostCoeffs(0.2, QWEN_4B.beta, QWEN_4B.gamma)
    case = WaitCase(ready=0, depth=256, length=300, lag=1)
    v = wait_wins(big_alpha, case, view())
    assert not v.wait and v.wait_s > v.recompute_s
    assert wait_wins(QWEN_4B, WaitCase(0, 4992, 5100, 1), view()).wait  # long gain still waits
    # the same short gain with 8 ms per round waits: the fixed cost decides
    assert wait_wins(CostCoeffs(1e-3, QWEN_4B.beta, QWEN_4B.gamma), case, view()).wait


def test_a_token_bound_round_parks():
    c = CostCoeffs(0.05, QWEN_4B.beta, QWEN_4B.gamma)
    case = WaitCase(ready=0, depth=512, length=600, lag=1)
    free = wait_wins(c, case, view(budget_left=8000, demand_after=1000))
    assert not free.wait  # the budget does not bind: one delayed request vs a 50 ms round
    bound = wait_wins(c, case, view(budget_left=700, demand_after=20_000, mean_extend=600.0))
    assert bound.wait  # recomputing would push the same tokens of queued work a round back
    assert bound.recompute_s > free.recompute_s


def test_a_fork_cut_pays_for_the_chunk_slot_it_takes():
    """no_buffer: the wait whose fork cut takes SGLang's one chunk slot adds what a later group
    would have saved with it (`RoundView.slot_value`) to the wait side, once per group (only
    the first sibling makes the cut); a wait that makes no cut pays nothing for it."""
    from radixflow_sglang.core.cost import group_saving

    case = WaitCase(ready=0, depth=2000, length=2030, lag=1, cut_rest=30)
    free = wait_wins(QWEN_4B, case, view())
    assert free.wait
    taken = wait_wins(QWEN_4B, case, view(slot_value=free.recompute_s - free.wait_s + 1e-3))
    assert not taken.wait
    assert taken.wait_s == pytest.approx(free.recompute_s + 1e-3)
    no_cut = WaitCase(0, 2000, 2030, 1, 0)
    assert wait_wins(QWEN_4B, no_cut, view(slot_value=9.0)) == wait_wins(QWEN_4B, no_cut, view())
    g0 = group_wait_wins(QWEN_4B, case, view(siblings=2))
    g = group_wait_wins(QWEN_4B, case, view(siblings=2, slot_value=0.5))
    assert g.wait_s == pytest.approx(g0.wait_s + 0.5)
    assert g.recompute_s == pytest.approx(g0.recompute_s)
    saved = g0.recompute_s - g0.wait_s
    assert group_saving(QWEN_4B, case, view(siblings=2)) == pytest.approx(saved)
    short = WaitCase(ready=0, depth=256, length=300, lag=1, cut_rest=44)
    assert group_saving(CostCoeffs(0.2, QWEN_4B.beta, QWEN_4B.gamma), short, view()) == 0.0


def test_a_tied_producer_turns_a_marginal_group_wait_into_a_recompute():
    """A question's branches (producer + 3 consumers, 374 shared tokens, 14 own) on the twin's
    qwen3-8b coefficients at alpha 50 ms. Summed over requests the wait wins by ~5 %: it credits
    the producer's early finish. The question ends with its last branch, so a tied producer
    (`RoundView.tied`) is delayed by the wait too, once per group: it recomputes. A long
    document still waits; a cut producer finishes a round later anyway (nothing added)."""
    from eval.costmodel import cost_with

    c = cost_with("qwen3-8b", alpha_ms=50)
    case = WaitCase(ready=0, depth=374, length=388, lag=1)
    untied = group_wait_wins(c, case, view(siblings=2))
    tied = group_wait_wins(c, case, view(siblings=2, tied=1))
    assert untied.wait and untied.recompute_s < 1.1 * untied.wait_s  # the marginal case
    assert not tied.wait
    assert tied.recompute_s == untied.recompute_s
    added = tied.wait_s - untied.wait_s
    assert untied.wait_s / 4 < added < untied.wait_s / 2  # one round, not one per sibling
    long_doc = WaitCase(ready=0, depth=3000, length=3014, lag=1)
    assert group_wait_wins(c, long_doc, view(siblings=2, tied=1)).wait
    cut = WaitCase(ready=0, depth=374, length=388, lag=1, cut_rest=14)
    assert (group_wait_wins(c, cut, view(siblings=2, tied=1))
            == group_wait_wins(c, cut, view(siblings=2)))
    assert wait_wins(c, cut, view(tied=1)) == wait_wins(c, cut, view())


def test_a_recompute_delays_what_finishes_with_the_round_by_its_whole_extend():
    """Waiting moves the candidate's whole extend out of this round: the rows finishing with it
    are delayed by all of it (and its row), what finishes later only by the gain (it runs the
    rest a round later either way). 4 rows instead of 4 later requests: 4 (beta e' + gamma)."""
    c = CostCoeffs(0.025, 1.2e-4, 1e-4)
    case = WaitCase(ready=0, depth=64, length=149, lag=1)
    busy = wait_wins(c, case, view(rows=4, behind=3))
    quiet = wait_wins(c, case, view(rows=0, behind=7))
    assert busy.wait_s == quiet.wait_s
    e2 = case.length - case.depth
    assert busy.recompute_s - quiet.recompute_s == pytest.approx(4 * (c.beta * e2 + c.gamma))


def test_a_tied_producer_waits_for_a_recomputes_spill_too():
    """A candidate the budget left cannot take whole spills into the next round when it
    recomputes: its question, and so its tied producer, ends a round later either way."""
    c = CostCoeffs(0.2, 3e-6, 1e-4)
    case = WaitCase(ready=0, depth=6208, length=6317, lag=1)
    v = view(budget_left=1886, token_budget=8192)
    untied, tied = wait_wins(c, case, v), wait_wins(c, case, view(budget_left=1886, tied=1))
    assert tied.wait_s - untied.wait_s == pytest.approx(untied.wait_s)  # the next round
    assert tied.recompute_s - untied.recompute_s == pytest.approx(untied.wait_s)  # its spill
    assert tied.wait == untied.wait


def test_a_newcomer_waits_out_a_released_consumers_round_only_when_its_work_outweighs_a_round():
    # 3 consumers finish with the round; a 6,000-token document would add ~102 ms to each,
    # while one more round costs its 8 ms fixed cost to the 4 requests that finish later.
    assert newcomer_waits(QWEN_4B, 0, 6000, finishing=3, others=4, parked=0, host_s=0.0)
    assert not newcomer_waits(QWEN_4B, 0, 300, 3, 4, 0, 0.0)  # 3 x 5 ms < 4 x 8 ms
    assert not newcomer_waits(QWEN_4B, 0, 6000, 0, 4, 0, 0.0)  # nothing finishes with it
    big_alpha = CostCoeffs(0.1, QWEN_4B.beta, QWEN_4B.gamma)
    assert not newcomer_waits(big_alpha, 0, 6000, 3, 4, 0, 0.0)  # a round dearer than its work
    assert not newcomer_waits(QWEN_4B, 0, 6000, 3, 40, 0, 0.0)  # 40 requests pay the round
    assert not newcomer_waits(QWEN_4B, 0, 6000, 3, 4, 0, 0.075)  # host time: part of a round
    # parked consumers run in the next round: the newcomer's work lands on them instead
    assert not newcomer_waits(QWEN_4B, 0, 6000, 3, 4, 3, 0.0)
    # requests arriving while this round and the newcomer's run pay the extra round too:
    # ~124 ms of rounds at 100 requests/s is 12 more, at 300/s 37 more
    assert newcomer_waits(QWEN_4B, 0, 6000, 3, 4, 0, 0.0, 100.0, 3, 300)
    assert not newcomer_waits(QWEN_4B, 0, 6000, 3, 4, 0, 0.0, 300.0, 3, 300)
    with_pairs = CostCoeffs(QWEN_4B.alpha, QWEN_4B.beta, QWEN_4B.gamma, 1e-7)
    assert newcomer_waits(with_pairs, 0, 500, 3, 4, 0, 0.0)  # its attention pairs count too
    assert not newcomer_waits(QWEN_4B, 0, 500, 3, 4, 0, 0.0)


def test_more_requests_behind_make_recomputing_dearer():
    c = CostCoeffs(0.05, QWEN_08B.beta, QWEN_08B.gamma)
    case = WaitCase(ready=0, depth=1024, length=1100, lag=1)
    few, many = wait_wins(c, case, view(behind=2)), wait_wins(c, case, view(behind=40))
    assert not few.wait and many.wait
    # NOTE: the 38 more finish after this round: each delayed by the recomputed gain
    assert many.recompute_s - few.recompute_s == pytest.approx(38 * c.beta * 1024)


def test_a_candidate_the_budget_left_cannot_take_whole_finishes_a_round_later_anyway():
    """qwen3.5-0.8b, alpha 100 ms, a 6,300-token document and 1,900 tokens left in the round:
    recomputing chunks the candidate, so it finishes with its rest next round, as it would
    after the wait (traced at alpha 50: the old rule recomputed there, 0.92x -> 1.09x stock
    on quality no_buffer)."""
    c = CostCoeffs(0.1, 2.8e-6, 1.1e-4)
    case = WaitCase(ready=0, depth=6272, length=6317, lag=1)
    tight = view(budget_left=1886, demand_after=12_635, mean_extend=6314.0, rows_left=15)
    assert wait_wins(c, case, tight).wait
    room = view(budget_left=8000, demand_after=0, mean_extend=6314.0, rows_left=15)
    assert not wait_wins(c, case, room).wait  # it fits: recomputing 6 k cheap tokens wins


def test_overlap_lag_counts_the_round_in_between_only_when_it_runs_work():
    c = CostCoeffs(0.02, QWEN_4B.beta, QWEN_4B.gamma)
    case1, case2 = WaitCase(0, 1024, 1100, 1), WaitCase(0, 1024, 1100, 2)
    idle = view()
    assert wait_wins(c, case2, idle).wait_s == wait_wins(c, case1, idle).wait_s
    busy = view(budget_left=1000, demand_after=9000, mean_extend=1000.0)
    assert wait_wins(c, case2, busy).wait_s > wait_wins(c, case1, busy).wait_s


def test_attention_pairs_term_adds_to_the_recompute():
    case = WaitCase(ready=0, depth=4096, length=4200, lag=1)
    flat = wait_wins(QWEN_4B, case, view())
    attn = wait_wins(CostCoeffs(QWEN_4B.alpha, QWEN_4B.beta, QWEN_4B.gamma, 1e-10), case, view())
    assert attn.recompute_s > flat.recompute_s


# --- the traversal with the rule ----------------------------------------------------------------


def blocked_setup(cost_aware: bool, overlap: bool = False, publish: int | None = 4096,
                  movable: bool = False):
    g = Grid(Layout.EXTRA_BUFFER, 64)
    t = Traversal(TraversalConfig.default(g, overlap, cost_aware=cost_aware))
    doc = list(range(5000))
    t.begin_round([], fork_slots=1 << 30)
    t.admitted(Producer("p", "ns", doc, 0, 5000, publish, movable))
    c = Candidate("c", "ns", doc[:4200] + [7] * 50, 0, 4249)
    return t, c


def test_decide_is_always_wait_without_the_cost_rule():
    t, c = blocked_setup(cost_aware=False)
    b = t.classify(c)
    assert b is not None
    huge = CostCoeffs(100.0, 0.0, 0.0)
    assert t.decide(c, b, view(), huge).wait


def test_decide_uses_the_rule_and_the_overlap_lag():
    t, c = blocked_setup(cost_aware=True, overlap=True)
    b = t.classify(c)
    assert b is not None and b.depth == 4096
    assert t.decide(c, b, view(), QWEN_4B).wait
    t, c = blocked_setup(cost_aware=True, overlap=True)  # NOTE: one verdict per group and scan
    assert not t.decide(c, b, view(), CostCoeffs(1.0, QWEN_4B.beta, QWEN_4B.gamma)).wait
    busy = view(budget_left=1000, demand_after=20_000, mean_extend=4000.0, behind=1)
    mid = CostCoeffs(0.03, QWEN_4B.beta, QWEN_4B.gamma)
    t, c = blocked_setup(cost_aware=True, overlap=True)
    fresh = t.decide(c, b, busy, mid)  # producer admitted this scan: 2 rounds under overlap
    t2, c2 = blocked_setup(cost_aware=True, overlap=True)
    t2.begin_round([Producer("p", "ns", list(range(5000)), 0, 5000, 4096, False)], 0)
    inflight = t2.decide(c2, t2.classify(c2), busy, mid)  # in flight: published next round
    assert inflight.wait_s < fresh.wait_s


def test_a_producer_that_publishes_nothing_is_no_reason_to_wait():
    t, c = blocked_setup(cost_aware=True, publish=None, movable=False)
    assert t.classify(c) is None


# --- the estimator ------------------------------------------------------------------------------


TRUE = CostCoeffs(0.05, 2.0e-5, 3.0e-4, 0.0)


def rounds(n: int, seed: int):
    rng = random.Random(seed)
    for _ in range(n):
        rows = rng.randint(1, 64)
        tokens = rng.randint(rows, 8192)
        yield rows, tokens, TRUE(rows, tokens) * (1 + rng.gauss(0, 0.03))


def close(fit: CostCoeffs, rel: float) -> bool:
    return (abs(fit.alpha - TRUE.alpha) <= rel * TRUE.alpha
            and abs(fit.beta - TRUE.beta) <= rel * TRUE.beta
            and abs(fit.gamma - TRUE.gamma) <= 3 * rel * TRUE.gamma)


def test_estimator_starts_at_the_prior_and_converges_on_noisy_rounds():
    est = RoundCostEstimator(GENERIC_PRIOR)
    assert est.coeffs.alpha == GENERIC_PRIOR.alpha and est.observed == 0
    for r in rounds(300, seed=1):
        est.observe(*r)
    assert close(est.coeffs, 0.1), est.coeffs
    assert est.rejected <= 3  # a wrong prior (alpha 8 ms vs 50 ms) is a level shift, learnt


def test_estimator_ignores_outliers():
    clean, dirty = RoundCostEstimator(GENERIC_PRIOR), RoundCostEstimator(GENERIC_PRIOR)
    injected = 0
    for i, (rows, tokens, y) in enumerate(rounds(300, seed=2)):
        clean.observe(rows, tokens, y)
        if i == 40 or i % 37 == 36:  # a CUDA-graph capture, then stalls
            injected += 1
            assert not dirty.observe(rows, tokens, 5.0 if i == 40 else 20 * y)
        dirty.observe(rows, tokens, y)
    assert dirty.rejected >= injected
    assert close(dirty.coeffs, 0.1)
    for f in ("alpha", "beta"):
        assert getattr(dirty.coeffs, f) == pytest.approx(getattr(clean.coeffs, f), rel=0.05)


def test_estimator_learns_a_wrong_priors_level_from_its_third_forward_and_keeps_the_first():
    """Prior alpha 8 ms, true 100 ms: the first forwards all miss by > 10x. A server measures
    SGLang's warmup prefill (16 tokens, 1 row: almost pure alpha), then rounds of one shape.
    The level shift is accepted once 3 residuals vouch for it, and the forwards rejected
    before are fed then (the warmup pins alpha, so a 1-row round is predicted too)."""
    true = CostCoeffs(0.1, 1.6e-5, 1e-3)
    est = RoundCostEstimator(GENERIC_PRIOR)
    assert est.observe(1, 16, true(1, 16)) is False  # a lone miss: rejected, held
    for _ in range(2):
        assert est.observe(4, 1400, true(4, 1400)) is False
    assert est.observe(4, 1400, true(4, 1400)) is True
    assert est.rejected == 0  # the three held forwards were fed with it
    assert est.predict(1, 70) == pytest.approx(true(1, 70), rel=0.4)  # was the prior: 8 ms
    assert est.predict(4, 1400) == pytest.approx(true(4, 1400), rel=0.1)


def test_a_lone_first_outlier_is_never_fed():
    clean, dirty = RoundCostEstimator(GENERIC_PRIOR), RoundCostEstimator(GENERIC_PRIOR)
    assert not dirty.observe(1, 16, 5.0)  # the first forward stalls (a capture, a JIT)
    for r in rounds(40, seed=6):
        clean.observe(*r)
        dirty.observe(*r)
    assert dirty.rejected >= 1
    assert dirty.coeffs.alpha == pytest.approx(clean.coeffs.alpha, rel=0.05)
    assert dirty.coeffs.beta == pytest.approx(clean.coeffs.beta, rel=0.05)


def test_the_fit_is_trusted_only_while_it_predicts_the_measured_forwards():
    est = RoundCostEstimator(GENERIC_PRIOR)
    assert est.trusted  # no measurement yet: the prior decides
    assert est.observe(4, 1000, GENERIC_PRIOR(4, 1000) * 1.1)
    assert est.trusted  # within a factor 1.5
    est.observe(1, 16, 0.1)  # a 12x miss ...
    assert est.trusted  # ... once is a stall: the median of the last 3 still predicts
    est.observe(4, 1400, 0.12)
    assert not est.trusted  # twice: the prior is wrong, the rule goes native
    for _ in range(6):
        est.observe(4, 1400, 0.12)
        est.observe(1, 300, 0.105)
    assert est.trusted  # learnt
    assert est.as_dict()["trusted"] is True


def test_a_mispredicting_fit_decides_on_its_measured_level():
    """Prior alpha 8 ms; SGLang's warmup prefill measures 100 ms. The fit holds that lone miss
    (it may be a stall), but the decision reads the level it measured: a short shared document
    then goes native (a 100 ms round for a 5 ms recompute), a long one still waits."""
    est = RoundCostEstimator(GENERIC_PRIOR)
    assert est.decision_coeffs == est.coeffs == GENERIC_PRIOR  # nothing measured: the prior
    short, long_ = WaitCase(0, 320, 360, 1), WaitCase(0, 4992, 5100, 1)
    assert wait_wins(est.decision_coeffs, short, view()).wait  # the prior would wait
    assert not est.observe(1, 16, 0.1)
    assert not est.trusted and est.coeffs.alpha == GENERIC_PRIOR.alpha
    level = est.decision_coeffs
    assert level.alpha == pytest.approx(0.1, rel=0.05)
    assert not wait_wins(level, short, view()).wait
    assert wait_wins(level, long_, view()).wait
    for _ in range(8):  # learnt: the fit itself predicts, no correction
        est.observe(1, 16, 0.1)
        est.observe(4, 1400, 0.1 + 1.7e-5 * 1400)
    assert est.trusted and est.decision_coeffs == est.coeffs


def test_a_wait_decided_over_two_rounds_is_kept_on_its_second_visit():
    """Overlap: a consumer of a producer admitted in this scan waits 2 rounds. Its next visit
    (producer in flight) keeps the wait; re-deciding on the remaining round alone split the
    siblings (one parked, two recomputed: the question waited for both, 1.36x stock on
    nemotron-9b race, alpha 25 ms)."""
    c_mid = CostCoeffs(0.1, QWEN_4B.beta, QWEN_4B.gamma)
    queue_deep, queue_short = view(behind=40), view(rows=0, behind=1)
    t, c = blocked_setup(cost_aware=True, overlap=True)
    b = t.classify(c)
    first = t.decide(c, b, queue_deep, c_mid)
    assert first.wait
    t.park(c, b)
    p = t.index.get(b.producer)
    t.begin_round([p], fork_slots=0)  # the producer is in flight now
    b2 = t.classify(c)
    assert b2 is not None and b2.producer == b.producer
    other = Candidate("c2", "ns", c.tokens, 0, c.max_prefix)
    fresh = t.decide(other, t.classify(other), queue_short, c_mid)
    assert not fresh.wait  # a fresh decision on this round's view would recompute
    assert t.decide(c, b2, queue_short, c_mid).wait  # the committed wait is kept
    t.begin_round([], fork_slots=0)  # published: a later round decides afresh
    t.admitted(Producer("p", "ns", list(range(5000)), 0, 5000, 4096, False))
    assert not t.decide(c, t.classify(c), queue_short, c_mid).wait


def test_estimator_without_observations_of_a_direction_keeps_the_prior_there():
    est = RoundCostEstimator(QWEN_4B)
    for _ in range(50):
        est.observe(8, 4096, QWEN_4B(8, 4096))  # one shape only: the plane is underdetermined
    assert est.coeffs.alpha == pytest.approx(QWEN_4B.alpha, rel=1e-3)
    assert est.coeffs.beta == pytest.approx(QWEN_4B.beta, rel=1e-3)


def test_estimator_never_inflates_a_term_to_pay_for_a_negative_one():
    """The twin's box sibling replay (no_buffer, exact forwards: 5 ms + 2 us/token + 0.1 ms/row,
    no attention pairs) from the 4B-class prior: its shapes let a ridge fit trade delta < 0
    against beta and gamma, and clamping delta to 0 afterwards left beta 2.4x and gamma 3x their
    cost (a 1-row 1,088-token extend priced 10.2 ms, 7.3 measured): every sibling group waited
    where recomputing was cheaper (twin 1.22x stock). Each term is fitted >= 0 instead."""
    true = CostCoeffs(5e-3, 2e-6, 1e-4)
    prior = CostCoeffs(8e-3, 1.7034e-5, 1.2419e-4, 3.318e-10, "default:qwen3.5-4b")

    def pairs(rows: int, tokens: int) -> float:
        e = tokens // rows
        return rows * e * e / 2  # NOTE: rows of one extend each, nothing cached

    est = RoundCostEstimator(prior)
    shapes = [(1, 16), (1, 1088), (2, 2112), (4, 1216), (3, 192)] + [(1, 1088), (1, 1024),
                                                                      (3, 192)] * 14
    for rows, tokens in shapes:
        est.observe(rows, tokens, true(rows, tokens), pairs(rows, tokens))
    c = est.coeffs
    assert min(c.alpha, c.beta, c.gamma, c.delta) >= 0
    assert c(1, 1088, pairs(1, 1088)) == pytest.approx(true(1, 1088), rel=0.02), c
    assert c.beta == pytest.approx(true.beta, rel=0.2), c


def test_estimator_rejects_nonsense_and_is_deterministic():
    a, b = RoundCostEstimator(GENERIC_PRIOR), RoundCostEstimator(GENERIC_PRIOR)
    assert not a.observe(4, 100, float("nan")) and not a.observe(0, 100, 0.01)
    assert not a.observe(4, 100, -1.0)
    for r in rounds(50, seed=3):
        a.observe(*r)
        b.observe(*r)
    assert a.coeffs == b.coeffs


def test_prior_from_geometry_matches_the_twin_default():
    from eval.costmodel import default_cost

    d = default_cost("qwen3.5-4b")
    assert d.beta == pytest.approx(1.70e-5, rel=0.01)
    p = prior_from_geometry(4e9, 248_320, 2_560, True)
    assert p.beta == pytest.approx(d.beta) and p.alpha == d.alpha


# --- rank agreement -----------------------------------------------------------------------------


def test_two_ranks_with_different_measurements_decide_the_same():
    """Each rank measures its own forward durations (rank 1's host adds ~20 ms per forward and
    noise); with rank 0's value broadcast (the runtime's `share_forward` hook in a server) the
    fits and the decisions agree."""

    def fits(agree: bool):
        shared: list[float] = []
        ests = [RoundCostEstimator(GENERIC_PRIOR), RoundCostEstimator(GENERIC_PRIOR)]
        rng = random.Random(4)
        for rows, tokens, y in rounds(100, seed=4):
            local = [y, y + 0.02 + rng.gauss(0, 0.002)]
            shared.append(local[0])  # rank 0 broadcasts its measurement
            for rank, est in enumerate(ests):
                est.observe(rows, tokens, shared[-1] if agree else local[rank])
        return [e.coeffs for e in ests]

    case = WaitCase(ready=0, depth=320, length=400, lag=1)

    def decisions(c: CostCoeffs) -> list[bool]:
        return [wait_wins(c, case, view(behind=b)).wait for b in range(1, 16)]

    same = fits(agree=True)
    assert same[0] == same[1]
    assert decisions(same[0]) == decisions(same[1])
    differ = fits(agree=False)
    assert differ[0] != differ[1]  # without agreement the slow rank fits other numbers
    assert decisions(differ[0]) != decisions(differ[1])  # ... and decides differently


# --- both rules on SGLang's real scan (the kit) ------------------------------------------------


def branches(k, doc_len: int, n: int = 4, start: int = 1000):
    doc = list(range(start, start + doc_len))
    k.submit(*[k.req(f"b{i}", doc + list(range(90_000 + 40 * i, 90_000 + 40 * i + 30)))
               for i in range(n)])
    return doc_len


@pytest.mark.parametrize("policy", ["traversal", "traversal-always"])
def test_kit_long_shared_document_waits_under_both_rules(make_kit, policy):
    k = make_kit("qwen3.5-4b", "extra_buffer", policy)
    branches(k, 4000)
    rounds = k.drain()
    t = k.runtime.totals
    assert t.blocked == 3 and t.recomputed == 0
    assert rounds[0].rids == ["b0"] and sorted(rounds[1].rids) == ["b1", "b2", "b3"]
    assert sum(r.scheduled_tokens for r in rounds) < 4000 + 4 * 200


@pytest.mark.parametrize("quiet", [True, False])
@pytest.mark.parametrize("policy, parks", [("traversal", False), ("traversal-always", True)])
def test_kit_short_document_under_a_large_fixed_cost(make_kit, monkeypatch, policy, parks,
                                                     quiet):
    """The cost-aware rule recomputes the three siblings: as a quiet scan (no candidate could
    wait: the rule is not asked, tests/test_quiet_scan.py) or, with quiet scans off, branch by
    branch. The always-wait rule parks them either way."""
    if not quiet:
        monkeypatch.setattr(quiet_mod, "never_waits", lambda *a, **kw: False)
    k = make_kit("qwen3.5-4b", "extra_buffer", policy)
    k.runtime.use_prior(CostCoeffs(0.25, QWEN_4B.beta, QWEN_4B.gamma))
    branches(k, 320)
    rounds = k.drain()
    t = k.runtime.totals
    assert (t.blocked > 0) == parks
    assert t.quiet_scans == (1 if quiet and not parks else 0)
    assert (t.recomputed == 3) == (not parks and not quiet)
    if not parks:  # native: one round, every branch recomputes the document (SGLang's way)
        assert len(rounds) == 1 and sorted(rounds[0].rids) == ["b0", "b1", "b2", "b3"]
    assert k.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


@pytest.mark.parametrize("policy", ["traversal", "traversal-always", "radixflow"])
def test_kit_nothing_parks_when_the_cache_shares_nothing(make_kit, policy):
    k = make_kit("qwen3.5-4b", "extra_buffer", policy, disable_radix_cache=True)
    branches(k, 4000)
    k.drain()
    assert k.runtime.totals.blocked == 0 and k.runtime.totals.recomputed == 0
    on = make_kit("qwen3.5-4b", "extra_buffer", policy)  # the same with the cache on parks
    branches(on, 4000)
    on.drain()
    assert on.runtime.totals.blocked > 0


def test_observe_forward_feeds_the_fit_trace_and_summary(make_kit, tmp_path):
    import json

    from radixflow_sglang.adapter.runtime import RadixFlowConfig

    trace = tmp_path / "trace.jsonl"
    k = make_kit("qwen3.5-4b", "extra_buffer", "radixflow",
                 radixflow_config=RadixFlowConfig(policy="radixflow", trace=str(trace)))
    rt = k.runtime
    prior = rt.cost.coeffs
    for rows, tokens, y in rounds(60, seed=5):
        assert rt.observe_forward(rows, tokens, y, pairs=0.0) == y
    s = rt.summary()
    assert s["wait_rule"] == "cost-aware" and "cost-aware wait" in s["composition"]
    assert s["cost"]["observed"] == 60 and s["cost"]["alpha_s"] != prior.alpha
    assert s["cost"]["alpha_s"] == pytest.approx(TRUE.alpha, rel=0.25)
    events = [json.loads(x) for x in trace.read_text().splitlines()]
    fwd = [e for e in events if e["event"] == "forward"]
    assert len(fwd) == 60 and all("duration_s" in e and "rows" in e for e in fwd)
    shared: list[tuple] = []
    rank0 = {3: (0.123, 42.0, 0.006), 4: (0.123, 0.007, 43.0, 0.008)}  # NOTE: rank 0's values
    rt.roundcost.share_forward = lambda *v: (shared.append(v), rank0[len(v)])[1]
    rt.roundcost.clock = lambda: 1.0  # NOTE: the arrival rate reads this clock
    rt.roundcost.arrivals.add(1.0, 0)
    rate = rt.roundcost.arrivals.rate(1.0)
    assert rt.observe_forward(4, 100, 9.9) == 0.123 and shared == [(9.9, 1.0, rate)]
    rc = rt.roundcost
    assert rc.agreed_now == 42.0 and rc.arrival_rate == 0.006  # rank 0's clock and rate
    # NOTE: a round's forward time, host time, clock and arrival rate: one broadcast
    assert rt.observe_forward(4, 100, 9.9, 0.5) == 0.123 and shared[1:] == [(9.9, 0.5, 1.0, rate)]
    assert rt.cost.host_s == 0.007 and rc.agreed_now == 43.0 and rc.arrival_rate == 0.008
    assert make_kit(policy="radixflow-always").runtime.summary()["wait_rule"] == "always"


def test_forward_timer_reads_a_real_batch_and_result(make_kit):
    import math

    import torch
    from sglang.srt.managers.utils import GenerationBatchResult

    from radixflow_sglang.adapter import forward_timer

    k = make_kit("qwen3.5-4b", "extra_buffer", "traversal")  # no admission hold: scan now
    k.submit(k.req("warm", list(range(1000, 1300))))
    k.drain()
    k.submit(k.req("a", list(range(1000, 1300)) + [5] * 100), k.req("b", list(range(5000, 5200))))
    batch = k.scan()
    rows, tokens, pairs = forward_timer.batch_shape(batch)
    ext = {r.rid: r.extend_end - r.prefix_len for r in batch.reqs}
    pre = {r.rid: r.prefix_len for r in batch.reqs}
    assert rows == 2 and tokens == sum(ext.values()) and pre["a"] > 0
    assert pairs == sum(e * (pre[rid] + e / 2) for rid, e in ext.items())
    result = GenerationBatchResult(next_token_ids=torch.tensor([1, 2]), can_run_cuda_graph=False)
    assert math.isnan(forward_timer.seconds(result))  # nothing measured: the fit ignores it
    forward_timer.stop(forward_timer.start(k.sched), result)
    assert 0 <= forward_timer.seconds(result) < 60
    setattr(result, forward_timer.SIM_ATTR, 0.0375)  # the simulated executor's own time wins
    assert forward_timer.seconds(result) == 0.0375


@pytest.mark.parametrize("model", ["qwen3.5-0.8b", "qwen3.5-4b", "nemotron-9b", "qwen3-8b"])
def test_server_prior_from_the_served_config_is_near_the_twin_default(model):

    from eval.costmodel import default_cost
    from radixflow_sglang import models
    from radixflow_sglang.adapter.costprior import prior_from_config

    cfg = models.config(model)
    est, ref = prior_from_config(cfg, name=model), default_cost(model)
    # NOTE: the parameter count is estimated from the config's layer shapes (within 6 % of the
    # published totals of the committed geometries)
    assert est.beta == pytest.approx(ref.beta, rel=0.1)
    assert est.gamma == pytest.approx(ref.gamma, rel=0.1) and est.alpha == ref.alpha
    exact = prior_from_config(cfg, params=ref_params(model), name=model)
    assert exact.beta == pytest.approx(ref.beta) and exact.delta == pytest.approx(ref.delta)


def ref_params(model: str) -> float:
    from radixflow_sglang import models

    return models.get(model).params


def test_a_no_buffer_cut_charges_the_producers_delay_unless_queued_work_backfills_it():
    c = CostCoeffs(0.02, QWEN_4B.beta, QWEN_4B.gamma)
    plain = wait_wins(c, WaitCase(0, 1024, 1100, 1), view())
    cut = wait_wins(c, WaitCase(0, 1024, 1100, 1, cut_rest=400), view())
    assert cut.wait_s > 2 * plain.wait_s  # the producer's rest also finishes a round later
    busy = view(budget_left=1000, demand_after=20_000, mean_extend=400.0)
    cut_busy = wait_wins(c, WaitCase(0, 1024, 1100, 1, cut_rest=400), busy)
    plain_busy = wait_wins(c, WaitCase(0, 1024, 1100, 1), busy)
    assert cut_busy.wait_s == pytest.approx(plain_busy.wait_s, rel=0.05)  # a reorder only


def test_decide_charges_the_cut_only_to_the_consumer_that_makes_it():
    g = Grid(Layout.NO_BUFFER, 64)
    t = Traversal(TraversalConfig.default(g, False, cost_aware=True))
    doc = list(range(3000))
    t.begin_round([], fork_slots=1)
    t.admitted(Producer("p", "ns", doc, 0, 3000, 3000, True))
    c1 = Candidate("c1", "ns", doc[:2000] + [7] * 50, 0, 2049)
    b1 = t.classify(c1)
    assert b1 is not None and b1.fork and b1.depth == 2000
    first = t.decide(c1, b1, view(siblings=1), QWEN_4B)
    t.park(c1, b1)
    c2 = Candidate("c2", "ns", doc[:2000] + [8] * 50, 0, 2049)
    b2 = t.classify(c2)
    assert b2 is not None and not b2.fork  # the producer already publishes at the fork
    assert t.decide(c2, b2, view(), QWEN_4B) == first  # its sibling group's verdict
    cut = wait_wins(QWEN_4B, WaitCase(0, 2000, 2050, 1, cut_rest=1000), view())
    after = wait_wins(QWEN_4B, WaitCase(0, 2000, 2050, 1), view(parked_rows=1, parked_tokens=50))
    assert after.wait_s < cut.wait_s
    assert first.wait_s == pytest.approx(cut.wait_s + after.wait_s)  # the cut counted once


@pytest.mark.parametrize("model", ["qwen3.5-0.8b", "nemotron-9b", "qwen3-8b"])
def test_server_prior_reads_the_hf_config_object_sglang_holds(model):
    from types import SimpleNamespace

    from transformers import AutoConfig

    from eval.costmodel import default_cost
    from radixflow_sglang import models
    from radixflow_sglang.adapter.costprior import scheduler_prior

    hf = AutoConfig.from_pretrained(str(models.model_dir(model)))  # ModelConfig.hf_config's class
    sched = SimpleNamespace(model_config=SimpleNamespace(hf_config=hf, model_path=model),
                            tp_worker=None)
    prior = scheduler_prior(sched)
    assert prior.source == f"prior:{model}"  # not the generic fallback
    assert prior.beta == pytest.approx(default_cost(model).beta, rel=0.1)


def _question(k, name: str, doc_len: int, start: int, max_new_tokens: int = 1, head=()):
    doc = list(head) + list(range(start, start + doc_len))
    return [k.req(f"{name}{i}", doc + list(range(90_000 + 40 * i, 90_000 + 40 * i + 30)),
                  max_new_tokens=max_new_tokens) for i in range(4)]


@pytest.mark.parametrize("policy, newcomer_len, out, shared, deferred", [
    ("radixflow", 6000, 1, False, True),
    ("radixflow-always", 6000, 1, False, False),  # the ablation keeps SGLang's order
    ("radixflow", 300, 1, False, False),  # a short newcomer joins: its work is less than a round
    ("radixflow", 6000, 16, False, False),  # the consumers decode on: none finishes with them
    ("radixflow", 6000, 1, True, False),  # it continues q's document: the traversal's to judge
])
def test_kit_a_newcomer_keeps_out_of_a_released_consumers_round(make_kit, policy, newcomer_len,
                                                               out, shared, deferred):
    """SGLang's real scan: question q waits a round for its first branch (4,000-token
    document); question n arrives while that branch runs. Joining the consumers' round would
    add n's document to the round that finishes q, so n's first branch waits that round out
    (its consumers with it) when the work outweighs one more round's fixed cost; it runs next
    round, and its siblings wait for it as usual. A newcomer that shares a prefix with a live
    producer (here q's document, which q's consumers extend) is not independent: it joins."""
    k = make_kit("qwen3.5-4b", "extra_buffer", policy)
    k.runtime.use_prior(QWEN_4B)
    k.submit(*_question(k, "q", 4000, 1000, out))
    assert k.step().rids == ["q0"]
    k.submit(*_question(k, "n", newcomer_len, 20_000, head=range(1000, 5000) if shared else ()))
    second = k.step()
    assert sorted(second.rids) == (["q1", "q2", "q3"] if deferred
                                   else ["n0", "q1", "q2", "q3"])
    assert k.runtime.totals.newcomer_deferred == (4 if deferred else 0)
    rest = [sorted(r.rids) for r in k.drain() if r.mode == "prefill"]
    assert rest == ([["n0"], ["n1", "n2", "n3"]] if deferred else [["n1", "n2", "n3"]])
    assert k.runtime.totals.recomputed == 0
    assert k.runtime.requests == {}  # no record outlives its request
    assert k.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_kit_overlap_siblings_that_wait_two_rounds_run_together(make_kit):
    """SGLang's real scan under overlap (nemotron-9b, a 400-token document, 4 branches): the
    three consumers wait 2 rounds for the first branch; their second visit used to re-decide
    on the one round left and split them (two recomputed, one ran alone a round later).
    NOTE: 300 tokens until the tied producer (`RoundView.tied`) made that question recompute."""
    k = make_kit("nemotron-9b", "extra_buffer", "traversal", overlap=True)
    k.runtime.use_prior(CostCoeffs(0.02, 4e-5, 9e-5, 1e-10))
    doc = list(range(1000, 1400))
    k.submit(*[k.req(f"b{i}", doc + list(range(90_000 + 40 * i, 90_000 + 40 * i + 90)))
               for i in range(4)])
    rounds = [sorted(r.rids) for r in k.drain()]
    assert rounds == [["b0"], ["b1", "b2", "b3"]]
    assert k.runtime.totals.recomputed == 0
    assert k.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_kit_admission_hold_reads_the_decisions_level_corrected_fit():
    """One home for the fit a decision reads (issue 11 e): the flex hold used `cost.coeffs`,
    which ignores a first measured forward far from the prior (rejected until its level is
    settled), while the wait rule already read `decision_coeffs` (the measured level). A
    1 s round measured against the kit's cheap prior: holding for a joiner now pays."""
    from radixflow_sglang.testing.kit import Kit, KitConfig

    waits: list[float] = []
    k = Kit(KitConfig(), policy="flex", clock=lambda: 0.0, sleep=waits.append)
    rt = k.runtime
    assert not rt.cost.observe(1, 16, 1.0) and not rt.cost.trusted  # held back: untrusted
    assert rt.cost.coeffs.alpha < 0.05 < rt.cost.decision_coeffs.alpha
    k.submit(k.req("a", list(range(1000, 1300))))
    assert k.step() is None  # held: the decision's alpha (~1 s) outweighs the held one's wait
    assert rt.held_iterations > 0 and waits == [pytest.approx(0.005)]


# --- sibling groups (issue 11 c) ----------------------------------------------------------------

SPLIT = CostCoeffs(0.02, 1e-5, 0.0, 0.0)  # alpha 20 ms, 10 ms per 1,000 tokens


def sibling_views() -> list[RoundView]:
    """Three consumers of one producer (gain 1,152, 1,000 tokens after the depth), visited in
    turn: the j-th finds the j before it parked (the runtime's _ScanView)."""
    return [view(rows=1, behind=3, demand_after=(2 - j) * 2152, parked_rows=j,
                 parked_tokens=1000 * j, siblings=2 - j) for j in range(3)]


def test_per_request_verdicts_split_siblings_the_group_verdict_does_not():
    from radixflow_sglang.core.cost import group_wait_wins

    # NOTE: a 600-token gain (a 1,152-token one split them until a recompute's whole extend
    # delayed the rows finishing with it; then each alone waits)
    case = WaitCase(ready=0, depth=600, length=1600, lag=1)
    alone = [wait_wins(SPLIT, case, replace(v, siblings=0)) for v in sibling_views()]
    assert [v.wait for v in alone] == [True, True, False]  # the old rule: the third recomputes
    group = group_wait_wins(SPLIT, case, sibling_views()[0])
    assert group.wait  # 3 waits (30 + 40 + 50 ms) < 3 recomputes, each delaying all four
    assert group.wait_s == pytest.approx(sum(v.wait_s for v in alone))
    assert group.recompute_s > sum(v.recompute_s for v in alone)
    assert group_wait_wins(SPLIT, case, view(siblings=0)) == wait_wins(SPLIT, case, view())


def test_decide_gives_a_sibling_group_one_verdict_per_scan():
    g = Grid(Layout.EXTRA_BUFFER, 64)
    t = Traversal(TraversalConfig.default(g, False, cost_aware=True))
    doc = list(range(1152))
    t.begin_round([], fork_slots=1 << 30)
    t.admitted(Producer("p", "ns", doc + [1] * 1000, 0, 2152, None, True))
    cands = [Candidate(f"c{j}", "ns", doc + [10 + j] * 1000, 0, 2151) for j in range(3)]
    verdicts = []
    for c, v in zip(cands, sibling_views(), strict=True):
        b = t.classify(c)
        assert b is not None and b.depth == 1152
        verdicts.append(t.decide(c, b, v, SPLIT).wait)
        t.park(c, b)
    assert verdicts == [True, True, True]
    t.begin_round([], fork_slots=1 << 30)  # a new scan decides afresh
    assert t.group_verdict(cands[2], b) is None


@pytest.mark.parametrize("overlap", [False, True])
def test_kit_a_question_that_arrives_together_runs_together(make_kit, monkeypatch, overlap):
    """SGLang's real scan (qwen3-8b, alpha 50 ms, the twin's coefficients): a RACE-like question
    arrives whole (374 shared tokens, 14 own per branch). Its producer is tied to its consumers
    (adapter/runtime.py `_tied`): one round of 1,552 tokens, as stock, finishing with stock's
    round. Untied, the request sum waits, and the tail guard stops it (the question would end a
    round later, the slowest of the round: tests/test_tail_guard.py); without the guard too,
    two rounds, the question ends with the second."""
    from eval.costmodel import cost_with

    def run() -> list[tuple[list[str], int]]:
        k = make_kit("qwen3-8b", "extra_buffer", "radixflow", overlap=overlap)
        k.runtime.use_prior(cost_with("qwen3-8b", alpha_ms=50))
        doc = list(range(1000, 1374))
        k.submit(*[k.req(f"b{i}", doc + list(range(50_000 + 40 * i, 50_014 + 40 * i)))
                   for i in range(4)])
        k.drain()
        assert k.leaks() == {"kv": 0, "rows": 0, "mamba": 0}
        return [(sorted(r.rids), r.scheduled_tokens) for r in k.rounds if r.mode == "prefill"]

    assert run() == [(["b0", "b1", "b2", "b3"], 4 * 388)]
    monkeypatch.setattr(Scan, "tied", lambda *a: False)
    assert run() == [(["b0", "b1", "b2", "b3"], 4 * 388)]
    monkeypatch.setattr(Scan, "older_by", lambda *a: math.inf)
    assert run() == [(["b0"], 388), (["b1", "b2", "b3"], 3 * 14)]


@pytest.mark.parametrize("late, aged", [(False, True), (True, True), (True, False)])
def test_kit_a_producer_first_seen_two_scans_before_its_consumers_is_not_tied(make_kit, late,
                                                                              aged):
    """SGLang's real scan (qwen3-8b, alpha 50 ms, T = 4,096): the question of the test above,
    its first branch queued behind a 10,000-token request whose chunks take two rounds' budget.
    Its siblings queued one scan after it: one question (`_tied`), they recompute with it in the
    third round. Queued two scans after it: not tied (another question that shares its
    document), they wait for its state: b0, two rounds older on the agreed clock (`aged`: each
    forward observed as a server does), stays the round's slowest. With no clock (equal
    stamps) the tail guard keeps them in the round."""
    from eval.costmodel import cost_with

    k = make_kit("qwen3-8b", "extra_buffer", "radixflow", tokens=4096)
    c = cost_with("qwen3-8b", alpha_ms=50)
    k.runtime.use_prior(c)

    def step() -> None:
        rnd = k.step()
        if aged:
            s = c(len(rnd.rids), rnd.scheduled_tokens)
            k.clock.now += s
            k.runtime.observe_forward(len(rnd.rids), rnd.scheduled_tokens, s)

    doc = list(range(1000, 1374))
    q = [k.req(f"b{i}", doc + list(range(50_000 + 40 * i, 50_014 + 40 * i))) for i in range(4)]
    k.submit(k.req("x", list(range(200_000, 210_000))), q[0])
    step()  # x's first chunk takes the budget: b0 stays queued
    if not late:
        k.submit(*q[1:])
    step()
    if late:
        k.submit(*q[1:])
    step()  # x's last chunk, b0, and its siblings: Blocked on b0
    third = sorted(k.rounds[2].rids)
    waits = late and aged
    assert third == (["b0", "x"] if waits else ["b0", "b1", "b2", "b3", "x"])
    assert sorted(k.runtime.records.parked()) == (["b1", "b2", "b3"] if waits else [])


def test_kit_a_producer_cut_at_the_fork_is_not_tied(make_kit, tmp_path):
    """no_buffer (qwen3.5-4b, 8 ms rounds): a 600-token document's first consumer waits, which
    cuts its producer at the fork as SGLang's one chunk (`_apply_fork`). The producer then
    finishes its prefill next round whatever its consumers do: no later consumer is tied to it
    (`_tied`'s `new_chunked_req` check; each decide event records its view)."""
    import json

    from eval.costmodel import cost_with
    from radixflow_sglang.config import RadixFlowConfig

    trace = tmp_path / "t.jsonl"
    k = make_kit("qwen3.5-4b", "no_buffer", "radixflow",
                 radixflow_config=RadixFlowConfig(policy="radixflow", trace=str(trace)))
    k.runtime.use_prior(cost_with("qwen3.5-4b", alpha_ms=8))
    doc = list(range(10_000, 10_600))
    k.submit(*[k.req(f"a{i}", doc + list(range(50_000 + 40 * i, 50_020 + 40 * i)))
               for i in range(4)])
    k.step()
    assert k.sched.chunked_req.rid == "a0"  # NOTE: cut at the fork
    decided = [json.loads(line) for line in trace.read_text().splitlines()]
    tied = [(e["rid"], e["view"]["tied"], e["wait"]) for e in decided if e["event"] == "decide"]
    assert tied == [("a1", 1, True), ("a2", 0, True), ("a3", 0, True)]
    k.drain()
    assert k.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_kit_siblings_are_not_split_between_recompute_and_wait(make_kit):
    """SGLang's real scan: 4 branches of a 1,152-token document with 1,000-token suffixes at
    alpha 20 ms. Deciding each alone parked the first two consumers and recomputed the third
    (its next round had grown by the two parked): the question then waited for both rounds."""
    k = make_kit("qwen3.5-4b", "extra_buffer", "traversal")
    k.runtime.use_prior(SPLIT)
    doc = list(range(1000, 2152))
    k.submit(*[k.req(f"b{i}", doc + list(range(50_000 + 1000 * i, 51_000 + 1000 * i)))
               for i in range(4)])
    rounds = [sorted(r.rids) for r in k.drain()]
    assert rounds == [["b0"], ["b1", "b2", "b3"]]
    assert k.runtime.totals.recomputed == 0
    assert k.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_a_group_the_round_cannot_take_prices_the_split_the_budget_forces():
    """Traced on qwen3.5-0.8b quality (RACE validation split, seed 0), alpha 200 ms,
    extra_buffer + overlap: a question's three consumers of a 6,272-token document find 1,886
    tokens left in their producer's round. Recomputing chunks the first and the round takes
    nothing after it; the other two are visited next round, still Blocked, and wait behind the
    chunk's rest, a round the wait leaves empty. The recompute side priced an option that
    does not exist (all three recomputing): wait 1.27 s vs recompute 1.19 s, and the question
    took 0.64 s, 0.43 s waiting."""
    c = CostCoeffs(0.2, 2.8e-6, 1.1e-4)
    case = WaitCase(ready=0, depth=6272, length=6317, lag=2)
    v = view(budget_left=1886, demand_after=12_635, mean_extend=6314.5, rows_left=15,
             row_budget=16, siblings=2, tied=1)
    for lag, round_in_between in ((2, True), (1, False)):
        g = group_wait_wins(c, replace(case, lag=lag), v)
        assert g.wait
        # NOTE: the first recomputes chunked; the two after it wait as the all-wait option
        # prices them, and each of them and the tied producer also pays the rest: its own
        # round under overlap (the one between, empty when all wait), else its tokens
        first = replace(v, siblings=0, tied=0)
        alone = wait_wins(c, replace(case, lag=lag), first)
        rest = c(1, 6317 - 1886) - (0.0 if round_in_between else c.alpha)
        assert g.recompute_s - g.wait_s == pytest.approx(
            alone.recompute_s - alone.wait_s + 3 * rest)
    # NOTE: no_buffer: the wait's fork cut is what publishes the state there; recomputing makes
    # none, so the late siblings wait for the chunked one's own publication, a round after its
    # rest, overlap or not (validation split, the same question in no_buffer: pricing only the
    # rest's tokens recomputed it, 0.717x -> 0.855x stock)
    cut = replace(case, lag=1, cut_rest=45)
    g = group_wait_wins(c, cut, v)
    alone = wait_wins(c, cut, replace(v, siblings=0, tied=0))
    assert g.wait
    assert g.recompute_s - g.wait_s == pytest.approx(
        alone.recompute_s - alone.wait_s + 2 * c(1, 6317 - 1886))
    # NOTE: a round that takes the whole group prices the recompute as before
    roomy = view(budget_left=20_000, token_budget=32_768, demand_after=12_635,
                 mean_extend=6314.5, rows_left=15, siblings=2, tied=1)
    assert not group_wait_wins(c, case, roomy).wait


def test_kit_a_group_the_round_cannot_take_waits_whole(make_kit):
    """SGLang's real scan under overlap (qwen3.5-0.8b, alpha 200 ms): four branches of a
    6,272-token document; the producer's round has 1,886 tokens left. Recomputing the first
    consumer chunked it and the round took nothing after the chunk: three rounds, the third for
    the two siblings that waited anyway. Waiting whole: two."""
    from eval.costmodel import cost_with

    k = make_kit("qwen3.5-0.8b", "extra_buffer", "radixflow", overlap=True, tokens=8192)
    k.runtime.use_prior(cost_with("qwen3.5-0.8b", alpha_ms=200))
    doc = list(range(1000, 7272))
    k.submit(*[k.req(f"b{i}", doc + list(range(50_000 + 100 * i, 50_034 + 100 * i)))
               for i in range(4)])
    rounds = [sorted(r.rids) for r in k.drain() if r.mode == "prefill"]
    assert rounds == [["b0"], ["b1", "b2", "b3"]]
    assert k.runtime.totals.recomputed == 0
    assert k.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_a_cold_fit_extrapolates_from_the_warmup_and_one_shape():
    """Traced on qwen3.5-4b race alpha 50 (issue 11): after the server warmup (1 row, 16 tokens)
    and three alike 4-row rounds, the fit weighed the prior (alpha 8 ms) like a round per
    coefficient and split the measured level between alpha and beta: a 1-row round predicted
    at 0.45x, so a sibling group waited for a round it thought cheap (1.09x stock). The prior
    now weighs a tenth of a round: the warmup pins alpha."""
    truth = CostCoeffs(0.05, 1.8e-5, 1.0e-4)
    e = RoundCostEstimator(CostCoeffs(8e-3, 1.8e-5, 1.24e-4))
    for rows, tokens in [(1, 16), (4, 1420), (4, 1440), (4, 1410)]:
        e.observe(rows, tokens, truth(rows, tokens))
    for rows, tokens in [(1, 300), (1, 70), (3, 210), (8, 6000)]:
        assert e.decision_coeffs(rows, tokens) == pytest.approx(truth(rows, tokens), rel=0.2)


# --- the round's host time (issue 11 b) ---------------------------------------------------------


def test_a_rounds_host_time_adds_to_the_wait_not_to_the_recompute():
    """Traced on qwen3.5-4b race alpha 25 (design.md): wait 20.7 ms vs recompute 24.2 ms, and
    the extra round's scan (~5 ms, not in the forward fit) made waiting the slower choice."""
    c = CostCoeffs(0.02, 1.8e-5, 1.24e-4)
    case = WaitCase(ready=0, depth=320, length=355, lag=1)
    free = wait_wins(c, case, view())
    hosted = wait_wins(c, case, view(host_s=0.005))
    assert free.wait and not hosted.wait
    assert hosted.wait_s == pytest.approx(free.wait_s + 0.005)
    assert hosted.recompute_s == free.recompute_s


def test_host_estimate_is_a_robust_median_of_the_agreed_rounds():
    e = RoundCostEstimator(QWEN_4B)
    assert e.host_s == 0.0
    for s in (0.004, 0.005, 0.006, 9.0, float("nan"), -1.0):
        e.observe_host(s)
    assert e.host_s == 0.006 and e.as_dict()["host_s"] == 0.006  # the stall does not move it


@pytest.mark.parametrize("overlap, expect", [(False, 0.004), (True, 0.0)])
def test_kit_decisions_read_the_host_time_only_without_overlap(make_kit, tmp_path, overlap,
                                                              expect):
    import json

    from radixflow_sglang.adapter.runtime import RadixFlowConfig

    trace = tmp_path / "trace.jsonl"
    k = make_kit("qwen3.5-4b", "extra_buffer", "traversal", overlap=overlap,
                 radixflow_config=RadixFlowConfig(policy="traversal", trace=str(trace)))
    shared: list[float] = []
    # NOTE: rank 0's value wins
    k.runtime.roundcost.share_forward = lambda s: (shared.append(s), (0.004,))[1]
    for s in (0.003, 0.004, 0.005):
        k.runtime.observe_host(s)
    assert shared == [0.003, 0.004, 0.005] and k.runtime.cost.host_s == 0.004
    branches(k, 4000)
    k.drain()
    views = [json.loads(x)["view"] for x in trace.read_text().splitlines()
             if json.loads(x)["event"] == "decide"]
    assert views and all(v["host_s"] == expect for v in views)


def test_siblings_whose_no_buffer_forks_differ_by_a_token_share_one_verdict():
    """Traced on qwen3.5-4b mix no_buffer: RACE options fork from the producer at 343 (B) and
    341 (C, D) tokens (a no_buffer fork is the exact common prefix). Keyed by exact depth, B
    decided alone and recomputed while C and D waited: the question waited for both."""
    g = Grid(Layout.NO_BUFFER, 64)
    t = Traversal(TraversalConfig.default(g, False, cost_aware=True))
    doc = list(range(341))
    t.begin_round([], fork_slots=1)
    t.admitted(Producer("a", "ns", doc + [1, 2] + [3] * 20, 0, 363, 363, True))
    b_ = Candidate("b", "ns", doc + [1, 2] + [4] * 20, 0, 362)
    c_ = Candidate("c", "ns", doc + [5] * 20, 0, 360)
    bb, bc = t.classify(b_), t.classify(c_)
    assert bb is not None and bc is not None and (bb.depth, bc.depth) == (343, 341)
    assert t.group_depth(bb) == t.group_depth(bc) == 320
    first = t.decide(b_, bb, view(siblings=2), QWEN_4B)
    assert t.group_verdict(c_, bc) == first


# --- cold fits of the RACE cells that waited and lost (issue 11) ----------------------------------

# NOTE: eval/costmodel.py's derived priors (alpha the 8 ms assumption) and the twin's measured
# forwards of the traced cells (race, rate 5, seed 0): (rows, tokens, pairs, seconds).
NEMOTRON_9B = CostCoeffs(8e-3, 3.9623e-5, 1.6196e-4, 2.0739e-10)
NEMOTRON_A100 = [(1, 16, 128.0, 0.099079), (4, 1400, 245000.0, 0.153968),
                 (4, 1418, 251341.0, 0.154683)]
NEMOTRON_1ROW = (1, 348, 60552.0, 0.112246)  # the round the cold fit waited for
QWEN35_9B = CostCoeffs(8e-3, 3.5270e-5, 1.2612e-4, 3.3183e-10)
QWEN35_9B_A50 = [(1, 16, 128.0, 0.049009), (4, 1420, 252050.0, 0.098592),
                 (4, 1442, 259921.0, 0.099368)]
QWEN35_9B_NEXT = [(1, 354, 62658.0, 0.061002), (3, 103, 34728.5, 0.052133)]


def test_a_cold_fit_learns_the_level_as_alpha_and_feeds_the_held_warmup():
    """Traced on nemotron-9b race alpha 100 (1.06x mean, 1.24x p95 stock): the warmup (1 row,
    16 tokens, 99 ms against a predicted 9 ms) was held; the first 4-row round (2.4x its
    prediction) was accepted, but the ridge fit spread its level over alpha and the derived
    terms, so the held warmup still missed and was dropped: a 1-row round was predicted at 67 ms
    (112 ms measured) and the next question's siblings waited for it. With the level in alpha
    (no prior weight) the first 4-row round's fit accepts the warmup, which pins alpha."""
    e = RoundCostEstimator(NEMOTRON_9B)
    assert e.observe(*NEMOTRON_A100[0][:2], NEMOTRON_A100[0][3], NEMOTRON_A100[0][2]) is False
    for rows, tokens, pairs, s in NEMOTRON_A100[1:]:
        assert e.observe(rows, tokens, s, pairs)
    assert e.rejected == 0  # the warmup was fed
    rows, tokens, pairs, s = NEMOTRON_1ROW
    assert e.decision_coeffs(rows, tokens, pairs) == pytest.approx(s, rel=0.08)


def test_a_held_lone_outlier_is_never_fed_with_alpha_free():
    """The other side of a free alpha: a first stall is still held out, not learnt as alpha."""
    truth = CostCoeffs(0.05, 1.8e-5, 1.0e-4)
    e = RoundCostEstimator(CostCoeffs(0.05, 1.8e-5, 1.0e-4))
    assert not e.observe(1, 16, 5.0)
    for rows, tokens in [(4, 1400), (4, 1420), (2, 700), (8, 3000), (1, 300)]:
        assert e.observe(rows, tokens, truth(rows, tokens))
    assert e.rejected == 1 and not e._held
    assert e.coeffs.alpha == pytest.approx(0.05, rel=0.01)


def test_a_measured_level_moves_the_assumed_alpha_not_the_derived_terms():
    """Traced on qwen3.5-9b race alpha 50 (1.03x mean, 1.11x p95): after the warmup and two
    alike 4-row rounds, the ridge fit weighed the assumed alpha like the FLOP-derived terms and
    spread the level over all four: a 1-row round predicted 10 % low, so a sibling group waited
    (wait 0.145 s vs recompute 0.150 s; with the measured rounds recomputing wins). Alpha now
    carries no prior weight: the level is alpha's, the derived terms keep the prior until the
    measured shapes span them."""
    e = RoundCostEstimator(QWEN35_9B)
    for rows, tokens, pairs, s in QWEN35_9B_A50:
        e.observe(rows, tokens, s, pairs)
    c = e.decision_coeffs
    for rows, tokens, pairs, s in QWEN35_9B_NEXT:
        assert c(rows, tokens, pairs) == pytest.approx(s, rel=0.03)
    assert c.beta == pytest.approx(QWEN35_9B.beta, rel=0.05)
    # NOTE: the traced group: producer selected, three siblings, the 1-row round after it
    case = WaitCase(ready=0, depth=320, length=354, lag=1)
    v = view(rows=1, behind=3, budget_left=7838, demand_after=709, siblings=2, mean_extend=355,
             host_s=0.0038)
    assert not group_wait_wins(c, case, v).wait


# --- a learned boundary's no_buffer cut must pay for its round (cost.cut_pays) ----------------


def test_a_learned_cut_pays_only_when_the_saved_recompute_outweighs_its_round():
    from radixflow_sglang.core.cost import cut_pays

    # traced (qwen3.5-0.8b race, rate 10, alpha 200 ms, no_buffer): a 327-token document end,
    # 7 requests behind, one expected user: ~0.9 ms of tokens against a ~200 ms round
    slow_round = CostCoeffs(0.2, QWEN_08B.beta, QWEN_08B.gamma)
    assert not cut_pays(slow_round, gain=327, rest=28, behind=7, users=1.0)
    # the same state at the prior's 8 ms round on the 4B's tokens: a 6,208-token document end
    assert cut_pays(QWEN_4B, gain=6208, rest=80, behind=3, users=1.0)
    # a marker inside a sibling's own tail (qwen3.5-27b race: 18 tokens, an 8-token rest)
    big = CostCoeffs(0.2, 1.2e-4, 1e-3)
    assert not cut_pays(big, gain=18, rest=8, behind=7, users=1.0)
    assert not cut_pays(QWEN_4B, gain=6208, rest=80, behind=3, users=0.0)  # nobody to serve
    # monotone: more behind, more users, a longer gain only make it pay more
    assert cut_pays(big, gain=327, rest=28, behind=7, users=1.0)
    assert not cut_pays(big, gain=327, rest=28, behind=0, users=1.0)
    # a cut that only breaks even (saves ~1.04 rounds) moves a round onto one question for
    # nothing in the mean: declined (traced: nemotron-9b race, alpha 50 ms, a 322-token
    # document end, 3 behind: ratio 1.00, p95 1.47x stock); cut without the margin
    nemo = CostCoeffs(0.049, 3.93e-5, 1e-3)
    assert not cut_pays(nemo, gain=340, rest=33, behind=3, users=1.0)
    assert cut_pays(nemo, gain=340, rest=33, behind=3, users=1.0, margin=1.0)
    assert cut_pays(nemo, gain=440, rest=33, behind=3, users=1.0)  # 1.35 rounds: cut
    # under a backlog rounds run full: a recomputed token also carries alpha / T of a round
    # (traced: qwen3.5-0.8b quality rate 10, alpha 100 ms, a ~2,950-token document end)
    doc = CostCoeffs(0.1, QWEN_08B.beta, QWEN_08B.gamma)
    assert not cut_pays(doc, gain=2950, rest=20, behind=5, users=1.0)
    assert cut_pays(doc, gain=2950, rest=20, behind=5, users=1.0, backlog_budget=8192)
    assert not cut_pays(slow_round, gain=327, rest=28, behind=7, users=1.0, backlog_budget=8192)


def test_measured_reads_the_estimator_source():
    from radixflow_sglang.core.cost import measured

    est = RoundCostEstimator(QWEN_4B)
    assert not measured(est.coeffs)
    est.observe(4, 1400, 0.05)
    assert measured(est.coeffs)


@pytest.mark.parametrize("alpha_s, beta, cuts", [(0.2, QWEN_08B.beta, False),
                                                  (8e-3, QWEN_4B.beta, True)])
def test_kit_no_buffer_learned_cut_follows_the_measured_round(alpha_s, beta, cuts):
    """SGLang's real scan (kit), no_buffer, learned document ends: with a measured fit whose
    round is dear against the document's tokens (0.8B tokens, 200 ms rounds) the marker cut is
    not made (its question would finish a round later to save ~1 ms of recompute); with the
    4B's tokens at 8 ms it is (the document end then serves the second question). Fails
    without the gate: both arms cut."""
    from radixflow_sglang.testing.fixtures import boundary_kit as make
    from radixflow_sglang.testing.fixtures import doc_questions

    kit = make("radixflow", "learned", "no_buffer")
    est = kit.runtime.cost
    for rows, tokens in ((1, 16), (4, 1400), (8, 2700), (2, 300), (6, 900), (3, 2000)):
        est.observe(rows, tokens, alpha_s + beta * tokens + QWEN_08B.gamma * rows)
    kit.runtime.boundary.cost = lambda: CostCoeffs(  # NOTE: these tokens, this round
        est.coeffs.alpha, beta, QWEN_08B.gamma, 0.0, est.coeffs.source)
    # NOTE: the gate alone: each question runs alone, so the tail guard would stop every cut
    # (tests/test_tail_guard.py)
    kit.runtime.boundary.older_by = None
    doc_questions(kit, 4, 2)
    b = kit.runtime.boundary
    assert (b.moved["marker"] > 0) is cuts
    if not cuts:
        # NOTE: its siblings recompute (the same dear round): no fork cut, no mark's cut
        assert b.unpaid > 0 and b.moved["fork_mark"] == 0
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_the_trace_is_written_once_per_scan_not_once_per_event(make_kit, tmp_path):
    """A burst scan emits an event per visit; the trace is block-buffered (a line-buffered file
    wrote each event, ~100 writes a no_buffer burst scan on the live loop) and flushed at each
    scan's end, so a reader sees every finished scan's events while the server runs."""
    import io
    import json

    from radixflow_sglang.adapter.runtime import RadixFlowConfig

    trace = tmp_path / "trace.jsonl"
    k = make_kit("qwen3.5-4b", "no_buffer", "radixflow",
                 radixflow_config=RadixFlowConfig(policy="radixflow", trace=str(trace)))
    assert isinstance(k.runtime.trace.file, io.BufferedWriter)  # NOTE: bytes, never per line
    doc = list(range(10_000, 12_000))
    k.submit(*[k.req(f"q{i}", doc + list(range(50_000 + 100 * i, 50_000 + 100 * i + 40)))
               for i in range(6)])
    k.step()
    events = [json.loads(x) for x in trace.read_text().splitlines()]  # NOTE: not closed yet
    assert [e["round"] for e in events if e["event"] == "round"] == [1]
    assert sum(e["event"] in ("park", "defer") for e in events) >= 6
