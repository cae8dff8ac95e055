"""Flexible admission, timer controls, +Frag and rank agreement (issue: admission controls)."""

from __future__ import annotations

import pytest

from radixflow_sglang.core.admission import Decision, Demand, Gate
from radixflow_sglang.core.cost import CostCoeffs
from radixflow_sglang.core.policy import POLICIES, policy_spec

DOC = list(range(1000, 3000))
# NOTE: a round's fixed cost of 1 s and free tokens: every arrival joining saves 1 s, so the
# cost-aware hold holds (the paper's release rules and the deadline still apply).
EXPENSIVE = CostCoeffs(1.0, 0.0, 0.0, 0.0, "test")


def demand(**kw) -> Demand:
    base = dict(held=2, oldest_arrival=0.0, busy=False, free_rows=16, token_budget=8192,
                residual_tokens=100)
    return Demand(**{**base, **kw})


@pytest.mark.parametrize("kw, reason", [
    (dict(busy=True), "busy"),
    (dict(held=16), "rows"),
    (dict(residual_tokens=8192), "tokens"),
])
def test_flex_releases_early_for_each_rule(kw, reason):
    d = Gate("flex", 5).decide(demand(**kw), now=0.001)
    assert d == Decision(False, reason)


def test_flex_holds_until_the_deadline_then_releases():
    g = Gate("flex", 5)
    assert g.decide(demand(), now=0.0049).hold
    assert g.decide(demand(), now=0.005) == Decision(False, "deadline")
    assert g.wake_in(demand(), now=0.002) == pytest.approx(0.003)


def test_timer_ignores_running_work_and_token_demand():
    g = Gate("timer", 10)
    assert g.decide(demand(busy=True, residual_tokens=10**6), now=0.009).hold
    assert g.decide(demand(held=16), now=0.0).reason == "rows"
    assert g.decide(demand(), now=0.010).reason == "deadline"


def test_empty_queue_changes_nothing(make_kit, clock):
    """Nothing queued, nothing fresh: the hold decides nothing (the gate is asked only with
    requests held; its `none` rule, never reached, went with issue 35's ablation)."""
    k = make_kit(policy="flex", clock=clock)
    assert k.step() is None and k.runtime.summary()["hold_reasons"] == {}


def test_each_policy_composes_exactly_its_pieces():
    comp = {n: (s.native_class, s.traversal, s.admission, s.admission_ms, s.frag, s.cost_aware,
                s.hold_cost) for n in POLICIES for s in [policy_spec(n)]}
    assert comp == {
        "stock": (True, False, None, 0.0, False, False, False),
        "radix": (False, False, None, 0.0, False, False, False),
        "timer5": (False, False, "timer", 5.0, False, False, False),
        "timer10": (False, False, "timer", 10.0, False, False, False),
        "flex": (False, False, "flex", 5.0, False, False, True),
        "traversal": (False, True, None, 0.0, False, True, False),
        "radixflow": (False, True, "flex", 5.0, False, True, True),
        "radixflow-frag": (False, True, "flex", 5.0, True, True, True),
        "traversal-always": (False, True, None, 0.0, False, False, False),
        "radixflow-always": (False, True, "flex", 5.0, False, False, False),
        "flex-always": (False, False, "flex", 5.0, False, False, False),
    }
    assert policy_spec("radixflow", admission_ms=2.0).admission_ms == 2.0


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def held_kit(make_kit, policy, clock, **cfg):
    k = make_kit(policy=policy, clock=clock, **cfg)
    return k


@pytest.fixture
def clock():
    return Clock()


def test_flex_holds_a_lone_arrival_then_releases_at_the_deadline(make_kit, clock):
    k = make_kit(policy="flex-always", clock=clock)  # the paper's rule: hold up to D
    k.submit(k.req("a", DOC + [1]))
    assert k.step() is None and k.runtime.held_iterations == 1
    clock.t = 0.005
    assert k.step().rids == ["a"]
    assert k.runtime.totals.rounds == 1


def test_flex_releases_when_held_requests_fill_the_rows(make_kit, clock):
    k = make_kit(policy="flex", clock=clock, rows=4)
    k.submit(*[k.req(f"r{i}", [i] * 50 + list(range(100, 150))) for i in range(4)])
    assert len(k.step().rids) == 4  # no time passed: released by rows
    assert k.runtime.held_iterations == 0


def test_flex_releases_when_token_demand_fills_the_budget(make_kit, clock):
    k = make_kit(policy="flex", clock=clock, tokens=2048)
    k.submit(k.req("big", list(range(5000, 7100))))
    rnd = k.step()
    assert rnd is not None and rnd.rids == ["big"]


def test_flex_releases_at_once_when_work_is_running(make_kit, clock):
    k = make_kit(policy="flex-always", clock=clock)
    k.submit(k.req("a", DOC + [1], max_new_tokens=8))
    assert k.step() is None
    clock.t = 0.005
    assert k.step().rids == ["a"]  # a decodes now: the running batch
    k.submit(k.req("b", list(range(9000, 9300))))
    assert k.step().rids == ["b"]  # busy: no hold although only 0 ms passed


def test_under_overlap_a_prefill_in_flight_is_no_running_work(make_kit, clock):
    """A round released while the overlap loop's prefill is in flight starts only when that
    forward ends: holding costs nothing until then, so the hold goes on (rule a's `busy`
    counts running and queued work, not a forward in flight)."""
    k = make_kit(policy="flex-always", clock=clock, overlap=True)
    k.submit(k.req("a", DOC + [1]))
    assert k.step() is None
    clock.t = 0.005
    assert k.step().rids == ["a"] and k.sched.result_queue  # a's batch is in flight
    k.submit(k.req("b", list(range(9000, 9300))))
    assert k.step() is None and "a" in k.finished  # b held; a's result processed
    clock.t = 0.010  # b's deadline
    assert k.step().rids == ["b"]


def test_under_overlap_consumers_parked_on_a_forward_in_flight_are_no_queued_work(make_kit,
                                                                                   clock):
    """Parked on a producer still in flight, consumers wait a round for its result: a fresh
    request released beside them would run alone. Once the producer's result is in, they run
    and the fresh one rides along (without overlap that is the next pass already:
    test_a_fresh_arrival_does_not_hold_back_parked_consumers)."""
    k = make_kit(policy="radixflow-always", clock=clock, overlap=True)
    k.submit(*[k.req(f"b{i}", DOC + [i, 9, 9]) for i in range(3)])
    assert k.step() is None
    clock.t = 0.006
    assert k.step().rids == ["b0"]  # b1, b2 parked on b0, in flight
    k.submit(k.req("late", list(range(60_000, 60_400))))  # fresh, 0 ms old
    assert k.step() is None  # late held, b1 and b2 parked again; b0's result processed
    assert not k.runtime.requests["late"].eligible
    assert sorted(k.step().rids) == ["b1", "b2", "late"]  # b0's state is in: work, late joins


def test_traversal_never_holds_and_flex_never_parks(make_kit, clock):
    t = make_kit(policy="traversal", clock=clock)
    t.submit(t.req("a", DOC + [1]))
    assert t.step().rids == ["a"] and t.runtime.held_iterations == 0
    f = make_kit(policy="flex", clock=clock, rows=4)
    f.submit(*[f.req(f"b{i}", DOC + [i, 9]) for i in range(4)])
    rounds = f.drain()
    assert f.runtime.totals.blocked == 0 and f.runtime.traversal is None
    assert sum(r.scheduled_tokens for r in rounds) >= 4 * len(DOC)


def test_parked_requests_are_not_held_again_and_nothing_starves(make_kit, clock):
    k = make_kit(policy="radixflow-always", clock=clock)  # always hold, always wait
    k.submit(*[k.req(f"b{i}", DOC + [i, 9, 9]) for i in range(4)])
    assert k.step() is None  # held: registered now, deadline not reached
    clock.t = 0.006
    first = k.step()
    assert first.rids == ["b0"] and k.runtime.totals.blocked == 3
    second = k.step()  # same clock: the parked siblings are eligible, not held anew
    assert sorted(second.rids) == ["b1", "b2", "b3"]
    assert all(p == 1984 for p in second.prefix.values())
    assert not k.sched.waiting_queue and k.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_timer_counts_deferrals(make_kit, clock):
    k = make_kit(policy="timer10", clock=clock)
    k.submit(k.req("a", DOC + [1]))
    for t in (0.0, 0.004, 0.009):
        clock.t = t
        assert k.step() is None
    clock.t = 0.010
    assert k.step().rids == ["a"]
    assert k.runtime.held_iterations == 3 and k.runtime.summary()["held_iterations"] == 3


def test_frag_defers_a_stateless_fragment_and_fills_with_work_that_fits(make_kit, clock):
    # budget 2100: a 2000-token request leaves 100; the next (300) would be cut to a
    # fragment of 100 >= G? no: use a residual below G=64.
    k = make_kit(policy="radixflow-frag", clock=clock, tokens=2040)
    clock.t = 1.0
    k.submit(k.req("a", list(range(10_000, 12_000))), k.req("b", list(range(20_000, 20_300))),
             k.req("c", list(range(30_000, 30_030))))
    rnd = k.step()
    assert rnd.rids == ["a", "c"]  # b would be cut to 40 < 64 tokens: deferred; c fits
    assert k.runtime.totals.frag_deferred == 1
    stock = make_kit(policy="radix", tokens=2040)
    stock.submit(stock.req("a", list(range(10_000, 12_000))),
                 stock.req("b", list(range(20_000, 20_300))),
                 stock.req("c", list(range(30_000, 30_030))))
    assert stock.step().rids == ["a", "b"]  # native: b becomes a 40-token chunk


def test_frag_deferral_is_capped_then_native_chunking(make_kit, clock):
    from radixflow_sglang.adapter.runtime import RadixFlowConfig

    cfg = RadixFlowConfig(policy="radixflow-frag", frag_cap=1)
    k = make_kit(policy="radixflow-frag", radixflow_config=cfg, clock=clock, tokens=2040)
    clock.t = 1.0
    k.submit(k.req("a", list(range(10_000, 12_000))), k.req("b", list(range(20_000, 20_300))))
    assert k.step().rids == ["a"]
    k.submit(k.req("x", list(range(40_000, 42_000))))
    # b is first in the queue now and fits whole next round; force another cut: x first
    k.sched.waiting_queue.sort(key=lambda r: r.rid != "x")
    rnd = k.step()
    assert rnd.rids == ["x", "b"] and k.sched.chunked_req.rid == "b"  # cap reached: native
    counts = k.runtime.report.reason_counts()
    assert counts["fragment"] == 1 and counts["frag_cap"] == 1  # b deferred once, then cut
    assert "b" not in k.runtime.records.frag_deferred  # NOTE: selected: its record ended


@pytest.mark.parametrize("policy", ["radixflow-always", "timer5"])
def test_skewed_clocks_agree_through_rank_zero(make_kit, policy):
    """Two simulated TP ranks whose clocks disagree (rank 1 jitters by 0-3 ms per iteration):
    with agreement every round is identical."""
    from radixflow_sglang.testing.kit import Kit, KitConfig

    def run(agree: bool):
        clocks = [Clock(), Clock()]
        shared: list[Decision] = []
        agreements = [lambda d: (shared.append(d), d)[1], (lambda d: shared[-1]) if agree else None]
        kits = [Kit(KitConfig(), policy=policy, clock=c, agreement=a)
                for c, a in zip(clocks, agreements, strict=True)]
        trace = [[], []]
        arrivals = {0.0: ["q0"], 0.002: ["q1"], 0.004: ["q2"], 0.007: ["q3"]}
        for it in range(12):
            now = it * 0.001
            for rank, k in enumerate(kits):
                clocks[rank].t = now + 0.003 * rank * (it % 2)
                for rid in arrivals.get(round(now, 4), []):
                    k.submit(k.req(rid, DOC + [int(rid[1:]), 5]))
                rnd = k.step()
                trace[rank].append(rnd.rids if rnd else None)
        return trace

    same = run(agree=True)
    assert same[0] == same[1] and any(same[0])
    differ = run(agree=False)
    assert differ[0] != differ[1]  # without agreement the skewed rank decides differently


def test_a_fresh_arrival_does_not_hold_back_parked_consumers(make_kit, clock):
    k = make_kit(policy="radixflow-always", clock=clock)
    k.submit(*[k.req(f"b{i}", DOC + [i, 9, 9]) for i in range(3)])
    assert k.step() is None
    clock.t = 0.006
    assert k.step().rids == ["b0"]  # b1, b2 parked
    k.submit(k.req("late", list(range(60_000, 60_400))))  # fresh, 0 ms old
    second = k.step()  # parked consumers are eligible work: no hold, late rides along (flex)
    assert sorted(second.rids) == ["b1", "b2", "late"]


def test_timer_runs_eligible_work_while_fresh_requests_wait_their_deadline(make_kit, clock):
    k = make_kit(policy="timer5", clock=clock)
    k.submit(k.req("early", list(range(60_000, 60_400))))
    assert k.step() is None
    clock.t = 0.005
    k.submit(k.req("late", list(range(70_000, 70_400))))  # fresh: its own deadline is 0.010
    k.submit(k.req("early2", list(range(80_000, 80_100))))
    k.sched.waiting_queue.sort(key=lambda r: r.rid != "late")  # late sits first in the queue
    rnd = k.step()
    assert rnd.rids == ["early"]  # the fresh ones are skipped, not selected ahead of time
    assert k.runtime.totals.rounds == 1
    clock.t = 0.010
    assert sorted(k.step().rids) == ["early2", "late"]


@pytest.mark.parametrize("policy", ["timer5", "timer10", "flex-always", "radixflow-always",
                                    "flex"])
def test_a_hold_never_waits_while_a_batch_is_in_flight(policy):
    """Issue 13 item 8: with a batch in flight (overlap) a fresh arrival is held out of the
    scan, but the scheduler never waits for its deadline (the in-flight result is processed)."""
    from radixflow_sglang.testing.kit import Kit, KitConfig

    clock, waits = Clock(), []
    k = Kit(KitConfig(overlap=True), policy=policy, clock=clock, sleep=waits.append)
    if policy == "flex":
        k.runtime.use_prior(EXPENSIVE)  # the cost-aware hold: a setting where holding wins
    k.submit(k.req("a", DOC + [1]))
    assert k.step() is None and len(waits) == 1  # idle: the hold waits for the deadline
    clock.t = 0.010
    assert k.step().rids == ["a"] and k.sched.result_queue  # a's batch is in flight
    k.submit(k.req("b", list(range(9000, 9300))))  # fresh: 0 ms old
    rnd = k.step()
    assert len(waits) == 1  # no wait while a's batch runs
    # NOTE: b held (flex too: a forward in flight is no running work); a's result processed
    assert rnd is None and "a" in k.finished
    clock.t = 1.0  # past its deadline
    assert k.step().rids == ["b"]
    assert len(waits) == 1


@pytest.mark.parametrize("policy", ["timer5", "timer10"])
def test_a_timer_hold_never_waits_while_a_decode_batch_runs(policy):
    """Issue 13 item 8: a timer holds a fresh arrival while a decode batch runs; the pass
    returns no prefill (the decode step goes on) and requests no wait."""
    from radixflow_sglang.testing.kit import Kit, KitConfig

    clock, waits = Clock(), []
    k = Kit(KitConfig(), policy=policy, clock=clock, sleep=waits.append)
    k.submit(k.req("a", DOC + [1], max_new_tokens=8))
    clock.t = 1.0
    assert k.step() is None and len(waits) == 1  # registered now; idle: it waits
    clock.t = 2.0
    decoding = k.scan()  # a's prefill: it stays in the running batch (SGLang merges it)
    assert decoding is not None and [r.rid for r in decoding.reqs] == ["a"]
    k.sched.running_batch = decoding
    k.submit(k.req("b", list(range(9000, 9300))))
    for _ in range(3):
        plan = k.sched.get_new_batch_prefill(k.sched.running_batch)
        assert plan.batch_to_run is None and plan.running_batch is decoding
    assert len(waits) == 1 and k.runtime.held_iterations == 4


def test_the_scheduler_waits_on_its_socket_and_never_under_dp_attention(make_kit):
    """A holding scheduler waits on its tokenizer socket (an arrival wakes it); under DP
    attention it never waits (its DP peers step in lockstep with it)."""
    from types import SimpleNamespace

    from radixflow_sglang.adapter.admission import scheduler_sleep

    sched = make_kit(policy="flex").sched  # SGLang's scheduler class (kit attributes)
    polls: list[int] = []
    sched.recv_from_tokenizer = SimpleNamespace(poll=lambda timeout: polls.append(timeout))
    sched.attn_dp_enabled = False
    scheduler_sleep(sched)(0.004)
    assert polls == [4]
    sched.attn_dp_enabled = True
    scheduler_sleep(sched)(0.004)
    assert polls == [4]
