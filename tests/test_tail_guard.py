"""The tail guard (docs/design.md, "The tail guard"): a wait, or a learned cut, that the request
sum prefers but that would make its own question the slowest of the requests the choice affects
is not made. Core rule on the traced numbers, then SGLang's real scan (kit)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from radixflow_sglang.adapter.scanstate import Scan
from radixflow_sglang.core.cost import (
    RoundView,
    WaitCase,
    cut_raises_tail,
    group_wait_wins,
    raises_tail,
)

# NOTE: traced (qwen3.5-27b race, rate 10, alpha 200 ms, no_buffer, seed 2, round 6): three
# consumers of a 365-token document (29 own tokens each) behind their producer, and the four
# branches of a question that arrived 6 ms later still queued.
CASE = WaitCase(ready=0, depth=365, length=394, lag=1)
VIEW = RoundView(rows=1, behind=8, budget_left=7827, demand_after=1381, mean_extend=390.0,
                 rows_left=62, siblings=2)


@pytest.fixture(scope="module")
def c27():
    from eval.costmodel import cost_with

    return cost_with("qwen3.5-27b", alpha_ms=200)


def _net_delay(c, case: WaitCase, k: int) -> float:
    """What waiting adds to the group's question: the next round (its k short extends), less
    what its k recomputes would have added to this one."""
    e, e2 = case.length - case.ready, case.length - case.depth
    saved = k * (c.beta * e + c.gamma + c.delta * e * (case.ready + e / 2))
    return c(k, k * e2) - saved


def test_a_wait_that_makes_its_question_the_slowest_recomputes(c27):
    """The request sum waits (0.62 s against 1.27 s: the later question's four rows finish
    0.14 s sooner), but the group's own question then finishes a 0.2 s round later, +0.07 s:
    the cell's slowest question (p95 1.057x stock). Recomputing keeps it in the round."""
    net = _net_delay(c27, CASE, 3)
    assert 0.05 < net < 0.1
    v = group_wait_wins(c27, CASE, replace(VIEW, older_by=0.0))
    assert not v.wait and v.tail and v.wait_s < v.recompute_s  # the sum alone would wait
    assert group_wait_wins(c27, CASE, VIEW).wait and not group_wait_wins(c27, CASE, VIEW).tail


def test_an_older_request_in_the_round_lets_the_wait_stand(c27):
    """The guard compares with the oldest request finishing with this round: one that arrived
    more than the net delay before the question stays the slowest, whatever the group does."""
    net = _net_delay(c27, CASE, 3)
    assert raises_tail(c27, CASE, replace(VIEW, older_by=0.99 * net))
    assert not raises_tail(c27, CASE, replace(VIEW, older_by=1.01 * net))
    assert group_wait_wins(c27, CASE, replace(VIEW, older_by=1.01 * net)).wait


def test_the_guard_stays_out_where_the_choice_reaches_beyond_the_round(c27):
    """Queued work the round cannot take (its requests finish later: the tail is theirs, and
    waiting shortens the work before them), and a group the round cannot take whole (it ends
    a round later either way)."""
    over = replace(VIEW, older_by=0.0, demand_after=9000)
    assert not raises_tail(c27, CASE, over) and group_wait_wins(c27, CASE, over).wait
    big = WaitCase(ready=0, depth=6000, length=6030, lag=1)
    split = replace(VIEW, older_by=0.0, demand_after=0, budget_left=8000)
    assert 3 * (big.length - big.ready) > split.budget_left
    assert not raises_tail(c27, big, split)


def test_a_wait_that_shortens_its_own_question_is_not_guarded(c27):
    """A long gain: recomputing it lengthens the round by more than the next round costs, so
    the question itself finishes sooner by waiting."""
    long = WaitCase(ready=0, depth=6000, length=6030, lag=1)
    alone = replace(VIEW, older_by=0.0, demand_after=0, siblings=0, budget_left=8000)
    assert _net_delay(c27, long, 1) < 0
    assert not raises_tail(c27, long, alone) and group_wait_wins(c27, long, alone).wait


def test_a_learned_cut_that_makes_its_question_the_slowest_is_not_made(c27):
    """A cut runs the rest next round: the question finishes that round later, less the rest's
    tokens this round no longer runs."""
    late = c27(1, 29) - c27.beta * 29
    assert cut_raises_tail(c27, 29, 0.99 * late)
    assert not cut_raises_tail(c27, 29, 1.01 * late)


# --- SGLang's real scan ------------------------------------------------------------------------


def _question(k, name: str, doc: int, n: int = 280) -> list:
    body = list(range(10_000 * doc, 10_000 * doc + n))
    return [k.req(f"{name}{i}", body + list(range(50_000 + 1000 * doc + 40 * i,
                                                  50_014 + 1000 * doc + 40 * i)))
            for i in range(4)]


@pytest.mark.parametrize("guard", [True, False])
def test_kit_questions_arriving_together_run_together(make_kit, monkeypatch, guard):
    """qwen3.5-27b, no_buffer, alpha 200 ms: two RACE-like questions queued in the same scan
    (equal agreed stamps). Without the guard the second question's consumers wait for its
    producer's fork cut: a second round, which only that question waits for. With it both
    questions finish with the first round, as stock's."""
    from eval.costmodel import cost_with

    k = make_kit("qwen3.5-27b", "no_buffer", "radixflow")
    k.runtime.use_prior(cost_with("qwen3.5-27b", alpha_ms=200))
    if not guard:
        monkeypatch.setattr(Scan, "older_by", lambda *a: math.inf)
    k.submit(*_question(k, "a", 1), *_question(k, "b", 2))
    k.drain()
    rounds = [sorted(r.rids) for r in k.rounds if r.mode == "prefill"]
    if guard:
        assert rounds == [["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"]]
    else:
        assert rounds == [["a0", "a1", "a2", "a3", "b0"], ["b0", "b1", "b2", "b3"]]
    assert k.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_kit_stamps_read_the_agreed_clock(make_kit):
    """A request's stamp is rank 0's clock at the last prefill forward (one broadcast with the
    forward time), not this rank's clock when it was first scanned."""
    k = make_kit("qwen3.5-4b", "extra_buffer", "radixflow")
    rt = k.runtime
    rt.roundcost.share_forward = lambda *v: (v[0], 7.0, *v[2:])  # NOTE: rank 0's clock read 7.0
    k.clock.now = 3.0
    k.submit(*_question(k, "a", 1))
    k.step()
    rt.observe_forward(4, 1176, 0.05)
    k.submit(*_question(k, "b", 2, n=6000))  # NOTE: a long document: queued past this round
    k.clock.now = 9.5
    k.step()
    assert rt.roundcost.agreed_now == 7.0
    stamps = {rs.stamp for rid, rs in rt.requests.items() if rid.startswith("b")}
    assert stamps == {7.0}  # NOTE: b1-b3 wait for b0's document: still registered


@pytest.mark.parametrize("guard", [True, False])
def test_kit_a_lone_questions_learned_cut_is_not_made(guard):
    """no_buffer, learned document ends, 4B tokens at 8 ms rounds (the cut pays for itself:
    tests/test_cost.py `test_kit_no_buffer_learned_cut_follows_the_measured_round`), each
    question alone in the server: the cut would end it a round later, and nothing older
    finishes with its round. With the guard no marker cut is made."""
    from radixflow_sglang.core.cost import CostCoeffs
    from radixflow_sglang.testing.fixtures import boundary_kit as make
    from radixflow_sglang.testing.fixtures import doc_questions

    kit = make("radixflow", "learned", "no_buffer")
    est = kit.runtime.cost
    for rows, tokens in ((1, 16), (4, 1400), (8, 2700), (2, 300), (6, 900), (3, 2000)):
        est.observe(rows, tokens, 8e-3 + 1.7e-5 * tokens + 1.1e-4 * rows)
    kit.runtime.boundary.cost = lambda: CostCoeffs(est.coeffs.alpha, 1.7e-5, 1.1e-4, 0.0,
                                                   est.coeffs.source)
    if not guard:
        kit.runtime.boundary.older_by = None
    doc_questions(kit, 4, 2)
    b = kit.runtime.boundary
    assert (b.moved["marker"] > 0) is not guard
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_kit_a_quiet_scan_reads_no_earlier_scans_view(make_kit):
    """The scan view (queue positions the tail check's `passed_over` reads) belongs to one scan:
    a quiet scan after a scan that built one starts without it (it was kept, and a learned
    cut's tail check in the quiet scan read the earlier queue)."""
    from eval.costmodel import cost_with

    k = make_kit("qwen3.5-27b", "no_buffer", "radixflow")
    rt = k.runtime
    rt.use_prior(cost_with("qwen3.5-27b", alpha_ms=200))
    k.submit(*_question(k, "a", 1), *_question(k, "b", 2))
    k.step()
    assert not rt.stats.quiet and rt.scan.view is not None  # NOTE: b1-b3 were priced
    k.drain()
    # NOTE: 40 shared tokens (< a block: nothing to wait for), > the hold's 32-token burst key:
    # the branches are one burst that came together, so the hold does not wait for more
    k.submit(*_question(k, "c", 3, n=40))
    k.step()
    assert rt.stats.quiet and rt.scan.view is None
    assert k.leaks() == {"kv": 0, "rows": 0, "mamba": 0}
