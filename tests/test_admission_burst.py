"""The hold expects a burst's followers (issue 51): a client sends a question's branches at
once, but the scheduler sees them ~1 ms apart, and the first, alone on an idle scheduler, ran
before the rest registered (live paper mix at the paper profile: 99 of 144 questions in two
rounds). core/admission.py `Followers` learns how many follow a head; `burst_gain` holds the
head while another is likely to come and its round's fixed cost outweighs the wait."""

from __future__ import annotations

from radixflow_sglang.core.admission import Decision, Demand, Followers, Gate, burst_gain
from radixflow_sglang.core.cost import CostCoeffs

PAPER = CostCoeffs(42.6e-3, 7.1e-6, 1e-4, 0.0)  # qwen3.5-0.8b at the paper profile
BOX = CostCoeffs(5e-3, 2e-6, 1e-4, 0.0)


def demand(**kw) -> Demand:
    base = dict(held=1, oldest_arrival=0.0, busy=False, free_rows=64, token_budget=8192,
                residual_tokens=1500, rate=20.0, mean_extend=1500.0, cost=PAPER, burst=2.0)
    return Demand(**{**base, **kw})


def learned(counts: list[int]) -> Followers:
    """Heads released alone, each followed by `counts[i]` requests in the pass after its
    round."""
    f = Followers()
    for i, n in enumerate(counts):
        f.arrived(f"h{i}", ("ns", i))
        f.passed()  # NOTE: its own pass: none came with it
        f.selected(f"h{i}")
        for j in range(n):
            f.arrived(f"h{i}.{j}", ("ns", i))
        f.passed()
    return f


def test_followers_count_what_came_during_the_heads_forward():
    f = learned([3, 3, 3, 0])
    f.arrived("q", ("ns", "q"))
    assert f.more(("ns", "q")) == 0.75  # NOTE: 3 of 4 heads had at least one
    assert f.size(("ns", "q")) == 3.0  # NOTE: those that had more ended with 3
    assert f.size(("ns", "none")) == 0.0
    for j in range(3):
        f.arrived(f"q.{j}", ("ns", "q"))
    assert f.more(("ns", "q")) == 0.0  # NOTE: every head with 3 had no more
    assert f.more(("ns", "other")) == 0.0 and f.open() == 1
    # NOTE: selected, its window waits for the next pass but holds no request: an idle
    # server whose last round took it keeps no record of it (the kit's stale-record check)
    f.selected("q")
    assert f.open() == 0 and f.more(("ns", "q")) == 0.0
    f.arrived("q.3", ("ns", "q"))  # NOTE: during its forward: still its follower
    f.passed()
    assert f.open() == 0 and f.size(("ns", "x")) == 0.0


def test_a_burst_that_came_together_closes_in_its_own_pass():
    """All of a question's branches in the head's pass: nothing more follows it, and it
    teaches nothing (no lone head to expect anything from it); a later question on the same
    document (same first tokens) is a head of its own, not a follower."""
    f = Followers()
    for r in "ABCD":
        f.arrived(r, ("ns", "doc"))
    f.passed()
    assert f.open() == 0
    f.selected("A")
    f.arrived("E", ("ns", "doc"))
    assert f.open() == 1
    assert f.more(("ns", "doc")) == 0.0


def test_a_held_head_counts_only_what_came_while_it_waited():
    f = learned([3])
    f.arrived("q", ("ns", "q"))
    f.passed()
    f.held(("ns", "q"))
    f.arrived("q.0", ("ns", "q"))
    f.passed()
    f.selected("q")  # NOTE: held: its count ends at its selection
    assert f.open() == 0
    f.arrived("late", ("ns", "q"))  # NOTE: a later question's: a head of its own
    assert f.open() == 1


def test_bursts_that_came_together_teach_nothing_about_a_lone_head():
    """The sibling shape: a lone first request completes, then its siblings arrive together
    (one pass). Only a head alone at its pass is ever asked `more`, so only such heads are
    learned from: the lone first must not expect the siblings' followers (issue 51: p99)."""
    f = Followers()
    for g in range(8):
        f.arrived(f"g{g}", ("ns", g))
        f.passed()  # NOTE: alone at its pass
        f.selected(f"g{g}")
        f.passed()  # NOTE: nothing came during its forward: closes with 0
        for j in range(3):  # NOTE: after it completes, the siblings in one pass
            f.arrived(f"g{g}.{j}", ("ns", g))
        f.passed()
        f.selected(f"g{g}.0")
    f.arrived("next", ("ns", "next"))
    f.passed()
    assert f.more(("ns", "next")) == 0.0


def test_burst_gain_holds_for_a_likely_follower_when_a_round_costs_more_than_the_wait():
    assert burst_gain(1, 1.0, 0.005, 1500.0, PAPER) > 0
    assert burst_gain(1, 0.05, 0.005, 1500.0, PAPER) < 0  # NOTE: 5 % of 42.6 ms < 5 ms
    assert burst_gain(1, 1.0, 0.005, 1500.0, BOX) <= 0  # NOTE: 5 ms round, 5 ms wait
    assert burst_gain(1, 0.0, 0.005, 1500.0, PAPER) == 0.0
    # NOTE: another held question pays the wait and the follower's work
    assert burst_gain(4, 1.0, 0.005, 1500.0, PAPER) < burst_gain(1, 1.0, 0.005, 1500.0, PAPER)


def test_burst_gain_saves_nothing_where_the_follower_would_wait_for_the_state():
    """A follower joins the held round only by recomputing the head's extend; where that
    costs more than the round it saves, it would wait for the head's state (a round later
    either way), and holding only adds the wait."""
    assert burst_gain(1, 1.0, 0.005, 1500.0, PAPER, follower_extend=1500.0) > 0
    assert burst_gain(1, 1.0, 0.005, 1500.0, PAPER, follower_extend=7000.0) < 0  # 49.7 > 42.6 ms
    # NOTE: a cached document leaves only the question to recompute
    assert (burst_gain(1, 1.0, 0.005, 1500.0, PAPER, follower_extend=40.0)
            > burst_gain(1, 1.0, 0.005, 1500.0, PAPER, follower_extend=1500.0))
    g = Gate("flex", 5, cost_aware=True)
    assert g.decide(demand(followers=1.0, follower_extend=7000.0), now=0.0) == Decision(
        False, "cost")
    # NOTE: every follower of the burst recomputes it: three of a 3,000-token document cost
    # 64 ms against the 42.6 ms round (live QuALITY: the traversal makes them wait)
    assert burst_gain(1, 1.0, 0.005, 1500.0, PAPER, follower_extend=3000.0, size=1) > 0
    assert burst_gain(1, 1.0, 0.005, 1500.0, PAPER, follower_extend=3000.0, size=3) < 0
    assert burst_gain(1, 1.0, 0.005, 1500.0, PAPER, follower_extend=300.0, size=3) > 0


def test_the_gate_holds_a_head_whose_burst_is_coming_and_releases_it_once_none_is():
    g = Gate("flex", 5, cost_aware=True)
    assert g.decide(demand(), now=0.0) == Decision(False, "cost")  # NOTE: Poisson alone
    assert g.decide(demand(followers=1.0), now=0.0) == Decision(True, "hold")
    assert g.decide(demand(followers=0.0, held=4), now=0.002) == Decision(False, "cost")
    # NOTE: the deadline still bounds it (no wait left: holding cannot win)
    assert not g.decide(demand(followers=1.0), now=0.005).hold


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def paper_kit():
    """A kit on a virtual clock with the paper profile's round cost already known."""
    from radixflow_sglang.testing.kit import Kit, KitConfig

    clock = Clock()
    k = Kit(KitConfig(), policy="radixflow", clock=clock, sleep=lambda s: None)
    k.runtime.use_prior(PAPER)
    return clock, k


def questions(k, doc_len: int, n: int = 4):
    """`n` questions of four branches, each on a document of its own."""
    for q in range(n):
        doc = list(range(10_000 * (q + 1), 10_000 * (q + 1) + doc_len))
        yield q, [k.req(f"q{q}{b}", doc + [i + 1]) for i, b in enumerate("ABCD")]


def test_kit_branches_arriving_apart_run_in_one_round_once_learned():
    """At the paper's round cost a question's four branches reach an idle scheduler 1 ms
    apart: with nothing learned the first runs alone and the rest, arriving during its
    forward, in the next round; once three followers per head are expected a head is held
    until its branches come, and the question runs in one round."""
    clock, k = paper_kit()
    rounds = []
    for q, reqs in questions(k, 1500):
        clock.t = q * 1.0
        k.submit(reqs[0])
        ran = [k.step()]
        if ran[0] is not None:  # NOTE: released: the others came during its forward
            clock.t += 0.003
            k.submit(*reqs[1:])
        else:  # NOTE: held: each comes while it waits
            for r in reqs[1:]:
                clock.t += 0.001
                k.submit(r)
                ran.append(k.step())
        while k.busy:
            ran.append(k.step())
        rounds.append(sum(r is not None and r.rids != [] for r in ran))
    assert rounds[0] == 2  # NOTE: nothing learned: the head runs alone
    assert rounds[-1] == 1, rounds


def test_kit_a_head_whose_followers_would_wait_is_not_held():
    """The same bursts on 3,000-token documents (live QuALITY's): the three followers
    recomputing one cost more than the round they would save (3 x 3,000 x 7.1 us > 42.6 ms),
    so they would wait for the head's state and the question takes two rounds held or not:
    the head is never held (hold reason `cost`)."""
    clock, k = paper_kit()
    held = []
    for q, reqs in questions(k, 3000):
        clock.t = q * 1.0
        k.submit(reqs[0])
        held.append(k.step() is None)
        clock.t += 0.003
        k.submit(*reqs[1:])
        while k.busy:
            k.step()
    reasons = k.runtime.admission.reasons
    assert held == [False] * 4 and reasons["hold"] == 0, (held, reasons)
