"""The hold expects a burst's followers (issue 51): a client sends a question's branches at
once, but the scheduler sees them ~1 ms apart, and the first, alone on an idle scheduler, ran
before the rest registered (live paper mix at the paper profile: 99 of 144 questions in two
rounds). core/admission.py `Followers` learns how many follow a head; `burst_gain` holds the
head while another is likely to come and its round's fixed cost outweighs the wait."""

from __future__ import annotations

import pytest

from radixflow_sglang.core.admission import (
    Decision,
    Demand,
    Expected,
    Followers,
    Gate,
    burst_gain,
)
from radixflow_sglang.core.cost import CostCoeffs

PAPER = CostCoeffs(42.6e-3, 7.1e-6, 1e-4, 0.0)  # qwen3.5-0.8b at the paper profile
BOX = CostCoeffs(5e-3, 2e-6, 1e-4, 0.0)


def demand(**kw) -> Demand:
    base = dict(held=1, oldest_arrival=0.0, busy=False, free_rows=64, token_budget=8192,
                residual_tokens=1500, rate=20.0, mean_extend=1500.0, cost=PAPER, burst=2.0)
    return Demand(**{**base, **kw})


def learned(counts: list[int], forward: float = 0.040) -> Followers:
    """Heads released alone, each followed by `counts[i]` requests registered in the pass
    after its `forward`-second round (when in it they came is unknown)."""
    f = Followers()
    t = 0.0
    for i, n in enumerate(counts):
        t += 1.0
        f.arrived(f"h{i}", ("ns", i), t)
        f.passed(t)  # NOTE: its own pass: none came with it
        f.selected(f"h{i}")
        for j in range(n):
            f.arrived(f"h{i}.{j}", ("ns", i), t + forward)
        f.passed(t + forward)
    return f


def held_head(f: Followers, key, t: float, follows: list[float], after: list[float],
              forward: float = 0.040) -> None:
    """A head held at `t`: its followers come `follows` seconds after it, each waking the
    hold's wait; it is selected with the last, and `after` come during its forward."""
    f.arrived(f"{key}", ("ns", key), t)
    f.passed(t)
    for j, d in enumerate(follows):
        f.held(("ns", key))
        f.watched(t + d)  # NOTE: the arrival ends the wait
        f.arrived(f"{key}.{j}", ("ns", key), t + d)
        f.passed(t + d)
    f.selected(f"{key}")
    end = t + (follows[-1] if follows else 0.005) + forward
    for j, _ in enumerate(after):
        f.arrived(f"{key}.late{j}", ("ns", key), end)
    f.passed(end)


def test_followers_count_what_came_during_the_heads_forward():
    f = learned([3, 3, 3, 0])
    f.arrived("q", ("ns", "q"), 10.0)
    e = f.expect(("ns", "q"), 10.0, 0.005, 0.005)
    # NOTE: 3 of 4 heads had followers; never held, none says when: on time
    assert e.more == 0.75 and e.joined == 2.25 and e.late == 0.0
    assert f.expect(("ns", "none"), 10.0, 0.005, 0.005) == Expected()
    for j in range(3):
        f.arrived(f"q.{j}", ("ns", "q"), 10.001 * (j + 1))
    assert f.expect(("ns", "q"), 10.003, 0.002, 0.005).more == 0.0  # NOTE: none with 3 had more
    assert f.open() == 1
    # NOTE: selected, its window waits for the next pass but holds no request: an idle
    # server whose last round took it keeps no record of it (the kit's stale-record check)
    f.selected("q")
    assert f.open() == 0 and f.expect(("ns", "q"), 10.003, 0.002, 0.005) == Expected()


def test_a_burst_that_came_together_closes_in_its_own_pass():
    """All of a question's branches in the head's pass: nothing more follows it, and it
    teaches nothing (no lone head to expect anything from it); a later question on the same
    document (same first tokens) is a head of its own, not a follower."""
    f = Followers()
    for r in "ABCD":
        f.arrived(r, ("ns", "doc"), 0.0)
    f.passed(0.0)
    assert f.open() == 0
    f.arrived("E", ("ns", "doc"), 0.1)
    assert f.open() == 1
    assert f.expect(("ns", "doc"), 0.1, 0.005, 0.005).more == 0.0


def test_held_heads_teach_when_followers_come():
    """Siblings released 4.6 ms apart: a held head sees the first follower come in its hold
    and the second only after its forward. A new head expects one on time and one late; near
    its deadline, none on time (the hold's last moments gain nothing)."""
    f = Followers()
    for i in range(8):
        held_head(f, i, float(i), [0.0046], [0.0092])
    f.arrived("q", ("ns", "q"), 10.0)
    e = f.expect(("ns", "q"), 10.0, 0.005, 0.005)
    # NOTE: two followers each; 8 held heads had one on time and one late, and the on-time
    # pseudo-head (TIMING_PRIOR): 2 x 5/9 on time, 2 x 4/9 late
    assert e.more == 1.0 and 1.05 < e.joined < 1.15 and 0.85 < e.late < 0.9, e
    edge = f.expect(("ns", "q"), 10.0049, 0.0001, 0.005)
    assert edge.more < 0.15 and edge.joined < 0.25, edge  # NOTE: only the pseudo-head


def test_an_arrival_during_a_selected_heads_forward_heads_its_own_burst():
    """A later question on the same document arrives while the held head's round runs:
    holding that head delayed it (a late follower of it), and it is a head of its own, asked
    and held for its own branches."""
    f = Followers()
    f.arrived("q", ("ns", "doc"), 0.0)
    f.passed(0.0)
    f.held(("ns", "doc"))
    f.selected("q")
    f.arrived("r", ("ns", "doc"), 0.030)
    f.passed(0.030)
    assert f.open() == 1  # NOTE: r heads its own burst
    f.arrived("s", ("ns", "new"), 1.0)
    assert f.expect(("ns", "new"), 1.0, 0.005, 0.005).late > 0  # NOTE: q's r came late


def test_bursts_that_came_together_teach_nothing_about_a_lone_head():
    """The sibling shape: a lone first request completes, then its siblings arrive together
    (one pass). Only a head alone at its pass is ever asked, so only such heads are learned
    from: the lone first must not expect the siblings' followers (issue 51: p99)."""
    f = Followers()
    t = 0.0
    for g in range(8):
        t += 1.0
        f.arrived(f"g{g}", ("ns", g), t)
        f.passed(t)  # NOTE: alone at its pass
        f.selected(f"g{g}")
        f.passed(t + 0.04)  # NOTE: nothing came during its forward: closes with 0
        for j in range(3):  # NOTE: after it completes, the siblings in one pass
            f.arrived(f"g{g}.{j}", ("ns", g), t + 0.1)
        f.passed(t + 0.1)
        f.selected(f"g{g}.0")
    f.arrived("next", ("ns", "next"), t + 1)
    f.passed(t + 1)
    assert f.expect(("ns", "next"), t + 1, 0.005, 0.005).more == 0.0


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


def test_burst_gain_charges_each_late_follower_the_wait():
    """A follower that comes after the deadline now waits for the held round's end. The
    sibling shape: half the heads (each wave's second) have one sibling on time and one late
    (4.6 ms apart), the rest (the lone firsts) none. At the live box's 13.5 ms round the late
    ones' wait outweighs the round saved; at the paper's 42.6 ms round it does not."""
    box = CostCoeffs(13.5e-3, 2.1e-6, 1e-4, 0.0)
    assert burst_gain(1, 0.5, 0.005, 1088.0, box) > 0
    assert burst_gain(1, 0.5, 0.005, 1088.0, box, late=0.5) < 0
    assert burst_gain(1, 0.5, 0.005, 1088.0, PAPER, late=0.5) > 0


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


def test_a_cost_aware_hold_runs_its_deadline_from_the_bursts_newest_request():
    """A burst still arriving is held as one: the cost-aware deadline runs D from its newest
    registration (`burst_last`), at most 2D from the oldest; timers and the always-hold
    ablation keep the paper's D from the oldest."""
    g = Gate("flex", 5, cost_aware=True)
    assert g.wait_left(0.0, 0.006, 0.004) == pytest.approx(0.003)
    assert g.wait_left(0.0, 0.006) == pytest.approx(-0.001)  # NOTE: no burst: D from it
    assert g.wait_left(0.0, 0.006, 0.009) == pytest.approx(0.004)  # NOTE: capped at 2D
    assert g.decide(demand(followers=1.0, burst_last=0.004), now=0.006).hold
    assert not g.decide(demand(followers=1.0, burst_last=0.004), now=0.0091).hold
    for paper in (Gate("flex", 5), Gate("timer", 5)):
        assert paper.wait_left(0.0, 0.006, 0.004) == pytest.approx(-0.001)
        assert paper.decide(demand(burst_last=0.004), now=0.006).reason == "deadline"


def test_followers_are_timed_from_the_bursts_newest_request():
    """A burst's requests reach the scheduler in turn, a longer prompt later: short prompts'
    bursts (followers 1 ms apart) teach that the next comes ~1 ms after the one before. A
    long prompt's head whose two followers came 2 ms apart expects its third soon after the
    second, though later after the head than any short prompt's third came."""
    f = Followers()
    for i in range(8):
        held_head(f, i, float(i), [0.001, 0.002, 0.003], [])
    f.arrived("q", ("ns", "q"), 10.0)
    f.passed(10.0)
    for j, d in enumerate((0.002, 0.004)):
        f.held(("ns", "q"))
        f.watched(10.0 + d)
        f.arrived(f"q.{j}", ("ns", "q"), 10.0 + d)
        f.passed(10.0 + d)
    assert f.latest(("ns", "q")) == pytest.approx(10.004)
    assert f.latest(("ns", "none")) is None
    e = f.expect(("ns", "q"), 10.0045, 0.0045, 0.005)
    assert e.more > 0.95 and e.joined > 0.95, e  # NOTE: from the head, the third came by 3 ms


def test_kit_a_burst_longer_than_the_deadline_runs_in_one_round_once_learned():
    """Four branches 2 ms apart, the last 6 ms after the first, past the 5 ms deadline (live
    QuALITY's spans exceed 5 ms for a quarter of its questions): once learned, each follower
    renews the hold and the question runs in one round. The scheduler looks every 1 ms while
    it holds; a round's forward takes 45 ms (what comes in it registers after it)."""
    clock, k = paper_kit()
    rounds, waited = [], []
    for q, reqs in questions(k, 1500, n=6):
        t0, due = q * 1.0, {0.002 * j: r for j, r in enumerate(reqs)}
        ran = []
        while due or k.busy:
            for t in [t for t in due if t0 + t <= clock.t + 1e-9]:
                k.submit(due.pop(t))
            r = k.step()
            if r is not None and r.rids:
                ran.append(clock.t - t0)
                clock.t += 0.045
            else:
                clock.t += 0.001
        rounds.append(len(ran))
        waited.append(ran[0])
        clock.t = t0 + 1.0
    assert rounds[0] == 2 and waited[0] == 0.0  # NOTE: nothing learned: the head runs alone
    assert rounds[-1] == 1 and waited[-1] == pytest.approx(0.006), (rounds, waited)


def test_under_overlap_a_head_counts_what_comes_while_its_round_runs():
    """The overlap loop passes again right after a launch, while the forward runs: a
    selected head's count closes at the first pass after its round is processed (not in
    flight), so what registers during the forward still counts (without overlap nothing is
    in flight at a pass: the first pass after the round closes it, as before)."""
    for overlap in (False, True):
        f = Followers()
        t = 0.0
        for i in range(4):
            t += 1.0
            f.arrived(f"h{i}", ("ns", i), t)
            f.passed(t)
            f.selected(f"h{i}")
            f.passed(t + 0.001, {f"h{i}"} if overlap else ())  # the pass after the launch
            f.arrived(f"h{i}.0", ("ns", i), t + 0.020)  # during the forward
            f.passed(t + 0.020, {f"h{i}"} if overlap else ())
            f.passed(t + 0.045)  # processed
        f.arrived("q", ("ns", "q"), 10.0)
        e = f.expect(("ns", "q"), 10.0, 0.005, 0.005)
        assert e.more == (1.0 if overlap else 0.0), overlap
    assert f.running() == 0


def test_a_new_head_of_the_key_ends_the_count_of_one_still_running():
    f = Followers()
    f.arrived("a", ("ns", 0), 0.0)
    f.passed(0.0)
    f.selected("a")
    f.arrived("b", ("ns", 0), 0.010)  # during a's forward: a's follower, and a head
    f.passed(0.010, {"a"})
    f.selected("b")  # under overlap, b's round launches while a's runs
    assert f.running() == 1
    f.passed(0.050, {"b"})
    assert f.running() == 1  # a's count closed (learned: one follower), b's runs on
    f.arrived("q", ("ns", 1), 1.0)
    assert f.expect(("ns", 1), 1.0, 0.005, 0.005).more == 1.0
