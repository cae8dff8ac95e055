"""The cost-aware flex hold (issue 11): hold only while the expected arrivals' saving exceeds
the held requests' wait (core/admission.py `hold_gain`; docs/design.md "The admission hold")."""

from __future__ import annotations

import pytest

from radixflow_sglang.core.admission import ArrivalRate, Decision, Demand, Gate, hold_gain
from radixflow_sglang.core.cost import CostCoeffs

DOC = list(range(1000, 3000))
SMALL = CostCoeffs(8e-3, 2.8e-6, 1e-4, 0.0)  # a 0.8B-class round: 8 ms fixed
SLOW = CostCoeffs(0.2, 2.8e-6, 1e-4, 0.0)  # 200 ms fixed per round


def demand(**kw) -> Demand:
    base = dict(held=4, oldest_arrival=0.0, busy=False, free_rows=64, token_budget=8192,
                residual_tokens=2000, rate=6.0, mean_extend=500.0, cost=SMALL)
    return Demand(**{**base, **kw})


def test_cheap_rounds_and_sparse_arrivals_release_at_once():
    assert hold_gain(4, 6.0, 500.0, SMALL) < 0
    assert Gate("flex", 5, cost_aware=True).decide(demand(), now=0.0) == Decision(False, "cost")


def test_expensive_rounds_and_dense_arrivals_hold_until_the_deadline():
    g = Gate("flex", 5, cost_aware=True)
    d = demand(rate=40.0, cost=SLOW)
    assert hold_gain(4, 40.0, 500.0, SLOW) > 0
    assert g.decide(d, now=0.004) == Decision(True, "hold")
    assert g.decide(d, now=0.005) == Decision(False, "deadline")  # D stays the bound


def test_the_hold_ends_when_the_held_outweigh_the_arrivals():
    g = Gate("flex", 5, cost_aware=True)
    assert g.decide(demand(held=1, rate=40.0, cost=SLOW), now=0.0).hold
    # more held requests: each arrival's work now delays more of them, and their own wait
    # (held per second) grows past what the arrivals save
    assert g.decide(demand(held=60, rate=40.0, cost=SLOW), now=0.0).reason == "cost"
    # a long arrival's work delays the held by more than the round it saves
    assert g.decide(demand(held=4, rate=40.0, cost=SLOW, mean_extend=50_000),
                    now=0.0).reason == "cost"


def test_paper_rules_come_first_and_always_hold_ignores_cost():
    g = Gate("flex", 5, cost_aware=True)
    assert g.decide(demand(busy=True), now=0.0).reason == "busy"
    assert g.decide(demand(held=64), now=0.0).reason == "rows"
    assert g.decide(demand(residual_tokens=8192), now=0.0).reason == "tokens"
    assert g.decide(demand(cost=None), now=0.0).reason == "cost"  # no fit: never hold blind
    assert Gate("flex", 5).decide(demand(), now=0.0).hold  # flex-always: the paper's hold
    timer = Gate("timer", 5, cost_aware=True)  # timers stay the paper's controls
    assert not timer.cost_aware and timer.decide(demand(busy=True), now=0.0).hold


def test_arrival_rate_window_and_start():
    a = ArrivalRate(window_s=5.0, min_s=0.5)
    assert a.rate(0.0) == 0.0 and a.mean_length() == 0.0
    for i in range(4):
        a.add(0.0, 100 * (i + 1))
    assert a.rate(0.0) == pytest.approx(8.0)  # 4 over the 0.5 s floor, not infinite
    assert a.mean_length() == pytest.approx(250.0)
    for i in range(1, 21):
        a.add(i * 0.5, 100)
    assert a.rate(10.0) == pytest.approx(10 / 5.0)  # only (5, 10] counts
    assert a.rate(100.0) == 0.0 and a.mean_length() == 0.0


# --- on SGLang's real scheduler (kit) ---------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def kit(policy: str, clock: Clock, sleep=None):
    from radixflow_sglang.testing.kit import Kit, KitConfig

    return Kit(KitConfig(), policy=policy, clock=clock,
               **({} if sleep is None else {"sleep": sleep}))


def test_kit_cheap_rounds_release_a_lone_arrival_at_once():
    """Regression (issue 11): flex held a lone arrival for D ms whatever it cost; with a cheap
    round (the kit's prior) and no other arrivals, waiting can only lose."""
    clock, waits = Clock(), []
    k = kit("flex", clock, waits.append)
    k.submit(k.req("a", DOC + [1]))
    rnd = k.step()
    assert rnd is not None and rnd.rids == ["a"]
    assert k.runtime.held_iterations == 0 and waits == []
    assert k.runtime.stats.released_by_admission == "cost"


def test_kit_expensive_rounds_hold_then_release_at_the_deadline():
    clock, waits = Clock(), []
    k = kit("flex", clock, waits.append)
    k.runtime.use_prior(CostCoeffs(1.0, 0.0, 0.0, 0.0, "test"))
    k.submit(k.req("a", DOC + [1]))
    assert k.step() is None and waits == [pytest.approx(0.005)]
    clock.t = 0.002
    k.submit(k.req("b", list(range(9000, 9300))))  # joins the held round
    assert k.step() is None
    clock.t = 0.005
    rnd = k.step()
    assert sorted(rnd.rids) == ["a", "b"] and k.runtime.stats.released_by_admission == "deadline"
    # NOTE: one HOLD decision per pass (hold, hold, deadline), apart from the scan's reasons
    s = k.runtime.summary()
    assert s["hold_reasons"] == {"deadline": 1, "hold": 2}
    assert "hold" not in s["reasons"] and "deadline" not in s["reasons"]


def test_kit_a_costly_joiner_ends_the_hold():
    """Each arrival's tokens delay every held request: with a per-token cost that outweighs
    the fixed cost a joiner saves, the hold releases on cost, not at the deadline."""
    clock = Clock()
    k = kit("flex", clock)
    k.runtime.use_prior(CostCoeffs(1.0, 1e-3, 0.0, 0.0, "test"))
    k.submit(k.req("a", DOC + [1]))
    rnd = k.step()
    assert rnd.rids == ["a"] and k.runtime.stats.released_by_admission == "cost"


def test_kit_cost_release_is_agreed_on_every_rank():
    """The cost rule reads the rank-local arrival rate: the release goes through the agreement
    (rank 0's outcome), and every rank calls it in the same iterations."""
    from radixflow_sglang.testing.kit import Kit, KitConfig

    calls: list[list[Decision]] = [[], []]
    shared: list[Decision] = []

    def rank0(d: Decision) -> Decision:
        calls[0].append(d)
        shared.append(d)
        return d

    def rank1(d: Decision) -> Decision:
        calls[1].append(d)
        return shared[-1]

    clocks = [Clock(), Clock()]
    kits = [Kit(KitConfig(), policy="flex", clock=c, agreement=a)
            for c, a in zip(clocks, (rank0, rank1), strict=True)]
    kits[0].runtime.use_prior(CostCoeffs(1.0, 0.0, 0.0, 0.0, "test"))  # rank 0 would hold
    kits[1].runtime.use_prior(CostCoeffs(1.0, 0.0, 0.0, 0.0, "test"))
    kits[1].runtime.admission.arrivals.min_s = 1e9  # rank 1 alone reads a near-zero rate
    out = []
    for it, t in enumerate((0.0, 0.006)):
        for rank, k in enumerate(kits):
            clocks[rank].t = t
            if it == 0:
                k.submit(k.req("a", DOC + [1]))
            rnd = k.step()
            out.append(rnd.rids if rnd else None)
    assert out == [None, None, ["a"], ["a"]]  # rank 1 follows rank 0's hold
    assert [d.reason for d in calls[0]] == ["hold", "deadline"]
    assert [d.reason for d in calls[1]] == ["cost", "cost"]  # its own verdicts differ
    assert len(calls[0]) == len(calls[1]) == 2


def test_requests_arriving_together_save_one_round_not_one_each():
    """40 requests/s as 10 questions of 4 branches (4B-class work, 200 ms rounds): an arrival
    saves alpha once and brings four requests' work. Counted per request the hold held each
    question ~5 ms for nothing (qwen3.5-4b race, rate 10, alpha 200 ms: 1.023x stock)."""
    big = CostCoeffs(0.2, 1.7e-5, 1.24e-4, 0.0)
    g = Gate("flex", 5, cost_aware=True)
    assert hold_gain(4, 40.0, 360.0, big) > 0  # per request: hold
    assert hold_gain(4, 40.0, 360.0, big, burst=4.0) < 0
    d = demand(rate=40.0, mean_extend=360.0, cost=big, burst=4.0)
    assert g.decide(d, now=0.0) == Decision(False, "cost")
    # one request per arrival is the old rule
    assert hold_gain(4, 40.0, 360.0, big, burst=1.0) == hold_gain(4, 40.0, 360.0, big)


def test_the_burst_is_requests_per_registration_time():
    a = ArrivalRate()
    assert a.burst() == 1.0
    for t in (0.0, 0.1):
        for _ in range(4):
            a.add(t, 300)
    a.add(0.2, 300)
    assert a.burst() == pytest.approx(9 / 3)


def test_the_window_totals_match_a_recount_after_every_registration_and_prune():
    """ArrivalRate keeps running totals (O(1) reads on every hold decision): after random
    registrations in clock order (several per instant) and reads at later times, its rate,
    mean length and burst equal a recount of the window's entries."""
    import random

    rng = random.Random(7)
    a = ArrivalRate(window_s=1.0, min_s=0.1)
    log: list[tuple[float, int]] = []
    t = now = 0.0
    for _ in range(400):
        t = max(t, now) + rng.choice((0.0, 0.0, 0.01, 0.05, 0.3))
        n = rng.randint(1, 4000)
        a.add(t, n)
        log.append((t, n))
        now = t + rng.choice((0.0, 0.2, 0.9, 1.5))  # NOTE: the clock never goes back
        live = [(s, m) for s, m in log if s > now - 1.0]
        span = min(1.0, max(0.1, now - log[0][0]))
        assert a.rate(now) == pytest.approx(len(live) / span)
        if live:
            assert a.mean_length() == pytest.approx(sum(m for _, m in live) / len(live))
            assert a.burst() == pytest.approx(len(live) / len({s for s, _ in live}))
        else:
            assert (a.mean_length(), a.burst()) == (0.0, 1.0)
