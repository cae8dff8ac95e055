"""Publication boundaries when SGLang's one chunk slot is contended (issue 15, no_buffer).

A no_buffer request publishes its boundary only as SGLang's one chunked request (a cut), so
when several groups' requests meet in one scan only one of them can cut there. Shape: groups
whose firsts all arrive at once (the gsp burst), then each group's siblings together; the
kit runs SGLang's real cache, pools, Req and scan on CPU. Depths derive from the grid.
"""

from __future__ import annotations

import random

import pytest

from radixflow_sglang.core.boundary import UsageRate, consumers, defer_wins
from radixflow_sglang.core.cost import CostCoeffs
from radixflow_sglang.testing.fixtures import boundary_kit as make
from radixflow_sglang.testing.fixtures import model_grid as grid_of

SYSTEM_UNITS = 4  # system prompt: 4 grid units + 10
# NOTE: tokens dear (0.1 ms each, 1 ms a round): a short prompt's recompute outweighs a round,
# as a 2,048-token one does at the generic prior; the kit's scans stay small and fast.
DEAR_TOKENS = CostCoeffs(alpha=1e-3, beta=1e-4, gamma=0.0)
# NOTE: rounds dear too (100 ms, as a live 0.8B server's wall round against its cheap tokens):
# a 266-token recompute outweighs a round only while few groups wait ahead for the slot
DEAR_ROUNDS = CostCoeffs(alpha=0.1, beta=1e-4, gamma=0.0)


def kit_for(mode: str, cost: CostCoeffs = DEAR_TOKENS):
    kit = make("radixflow", mode, "no_buffer")
    kit.runtime.use_prior(cost)
    return kit


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 200_000) for _ in range(n)]


def burst_then_siblings(kit, groups: int, siblings: int, system: int, question: int,
                        declare_first: bool = True, seed: int = 0) -> dict[tuple[int, int], int]:
    """Every group's first at once; once all finished, every group's siblings at once.
    Returns (group, index) -> ready prefix when first scheduled."""
    rng = random.Random(seed)
    prompts = [_ids(rng, system) for _ in range(groups)]
    b = system

    def req(g: int, i: int, declare: bool):
        return kit.req(f"g{g}r{i}", prompts[g] + _ids(rng, question),
                       boundary=b if declare else None)

    kit.submit(*[req(g, 0, declare_first) for g in range(groups)])
    rounds = kit.drain()
    kit.submit(*[req(g, i, True) for g in range(groups) for i in range(1, siblings + 1)])
    rounds += kit.drain()
    out = {}
    for r in rounds:
        for rid, p in r.prefix.items():
            g, i = rid[1:].split("r")
            out.setdefault((int(g), int(i)), p)
    return out


def zero_hit_followers(res: dict[tuple[int, int], int]) -> int:
    return sum(1 for (_, i), p in res.items() if i > 0 and p == 0)


# --- the engine-free rule --------------------------------------------------------------------


def test_defer_pays_when_the_recompute_delays_more_than_the_deferral():
    c = CostCoeffs(alpha=8e-3, beta=1.7e-5, gamma=1e-4)
    # deferring: the request finishes two rounds later (its cut, then its rest)
    delay = c(1, 2048) + c(1, 64)
    assert not defer_wins(c, 2048, 64, 0, 1)  # nobody behind: the recompute delays itself only
    assert defer_wins(c, 2048, 64, 15, 1)  # a backlog: the recompute delays all of it
    first = next(n for n in range(100) if defer_wins(c, 2048, 64, n, 1))
    assert c.beta * 2048 * first <= delay < c.beta * 2048 * (1 + first)
    assert not defer_wins(c, 2048, 64, 15, 0)  # no user: nothing to save
    assert defer_wins(c, 2048, 64, 15, 3) == defer_wins(c, 2048, 64, 15, 1)  # one recomputes
    assert not defer_wins(c, 2048, 64, 15, 0.05)  # rarely reused: not worth the wait
    # groups deferred before it take the slot first: a round each (about c(1, gain))
    assert defer_wins(c, 2048, 64, 15, 1, ahead=0) == defer_wins(c, 2048, 64, 15, 1)
    flips = next(a for a in range(100) if not defer_wins(c, 2048, 64, 15, 1, ahead=a))
    assert 0 < flips and not any(defer_wins(c, 2048, 64, 15, 1, ahead=a)
                                 for a in range(flips, flips + 20))
    assert (1 + flips) * c(1, 2048) + c(1, 64) >= c.beta * 2048 * 16 > flips * c(1, 2048)
    assert consumers(2, computed=True) == 2 and consumers(0, computed=False) == 1
    assert consumers(0, computed=True) == 0 and consumers(1, False, 0.25) == 1.25


def test_usage_rate_counts_a_state_unused_once_the_window_passed_it():
    u = UsageRate(window=2)
    assert u.rate == 1.0  # no evidence: a declaration says the prefix is shared
    u.published("a", 64)
    assert u.watching(64) and not u.watching(128)
    u.hit("a")
    u.hit("a")  # once per state
    u.published("b", 128)
    u.published("c", 64)  # "a" leaves the window, used
    assert (u.used, u.unused) == (1, 0)
    u.published("d", 64)  # "b" leaves unused
    u.hit("b")  # too late: no longer open
    assert (u.used, u.unused) == (1, 1) and u.rate == pytest.approx(2 / 3)
    assert not u.watching(128)
    for k in range(20):
        u.published(("x", k), 64)
    assert u.rate < 0.15


# --- kit: firsts at once, declared --------------------------------------------------------------


def test_burst_firsts_each_publish_their_boundary_in_turn():
    """no_buffer, every first at once: only one can be cut at its boundary per round. The
    others wait for the slot (deferred, one round each) while the queue behind them makes it
    pay, so every group publishes at its boundary and every sibling hits there. Without the
    deferral the firsts that missed the slot publish only their end, and their siblings
    recompute the system prompt."""
    G = grid_of()
    system = SYSTEM_UNITS * G + 10
    kit = kit_for("declared")
    res = burst_then_siblings(kit, 6, 3, system, G + 3)
    # NOTE: the last first has nobody behind it: waiting would only delay it (the rule says
    # no), so it publishes its end and its group loses the one sibling that is cut
    assert zero_hit_followers(res) == 1 and res[5, 1] + res[5, 2] + res[5, 3] == 2 * system
    assert [p for (g, i), p in sorted(res.items()) if i > 0 and g < 5] == [system] * 15
    b = kit.runtime.boundary
    assert b.moved["declared"] == 6 and b.deferred == 5 + 4 + 3 + 2
    assert kit.runtime.summary()["boundaries"]["deferred"] == b.deferred
    assert b.usage.used == 6  # every boundary state was reused
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}
    # the firsts ran one cut per round, in queue order; the last group's cut is a sibling's
    cuts = [r.chunked for r in kit.rounds if r.chunked is not None]
    assert cuts == [f"g{g}r0" for g in range(5)] + ["g5r1"]


@pytest.mark.parametrize("why", ["tokens cheap", "states unused"])
def test_no_deferral_when_it_does_not_pay(why):
    """Tokens cheap (a small model), or boundary states rarely reused so far: waiting a round
    for the slot costs more than the recompute it expects to save; the firsts that miss the
    slot publish their ends, as before."""
    G = grid_of()
    system = SYSTEM_UNITS * G + 10
    kit = kit_for("declared")
    if why == "tokens cheap":
        kit.runtime.use_prior(CostCoeffs(alpha=1e-3, beta=1e-6, gamma=0.0))
    else:
        kit.runtime.boundary.usage = UsageRate(unused=99)
    res = burst_then_siblings(kit, 4, 1, system, G + 3)
    assert kit.runtime.boundary.deferred == 0
    assert res[0, 1] == system and res[1, 1] == res[2, 1] == 0


# --- kit: every group's requests at once (a gsp burst) --------------------------------------


def _whole_burst(groups: int, ahead: bool, monkeypatch) -> tuple[list, list, dict]:
    """`groups` groups of 4, every request queued at once, declared, rounds dear: the kit's
    rounds, the slot-deferral verdicts of the first scan as (groups ahead, verdict), and the
    round in which each request was first scheduled. `ahead` False: the rule without the
    groups ahead (one round per deferral, as before)."""
    from radixflow_sglang.adapter import slotdefer as adapter_boundary

    G = grid_of()
    system = SYSTEM_UNITS * G + 10
    rng = random.Random(4)
    verdicts: list[tuple[int, bool]] = []

    def recorded(c, gain, rest, behind, users, n=0):
        ok = defer_wins(c, gain, rest, behind, users, n if ahead else 0)
        verdicts.append((n, ok))
        return ok

    kit = kit_for("declared", DEAR_ROUNDS)
    prompts = [_ids(rng, system) for _ in range(groups)]
    kit.submit(*[kit.req(f"g{g}r{i}", prompts[g] + _ids(rng, G + 3), boundary=system)
                 for g in range(groups) for i in range(4)])
    with monkeypatch.context() as m:
        m.setattr(adapter_boundary, "defer_wins", recorded)
        kit.step()
        first = list(verdicts)
        rounds = [kit.rounds[-1]] + kit.drain()
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}
    started: dict = {}
    for k, r in enumerate(rounds):
        for rid in r.prefix:
            started.setdefault(rid, k)
    return rounds, first, started


def test_groups_far_back_in_the_slot_queue_run_now_with_their_queued_siblings(monkeypatch):
    """Every group's requests queued at once: the slot serves one group's cut a round, so a
    deferral waits a round for each group deferred before it. The first groups wait for the
    slot; from the group where that wait costs more than the recompute it saves, the groups
    run now, every member recomputing (as stock's do). Without the groups ahead in the rule
    (one round per deferral), every group waits its turn in the first scan, and the burst
    takes more rounds and its last request starts later. (The kit's witness executor checks
    every state either way.)"""
    groups = 8
    rounds, first, started = _whole_burst(groups, True, monkeypatch)
    old_rounds, old_first, old_started = _whole_burst(groups, False, monkeypatch)
    # NOTE: the first scan: g0r0 cut, its siblings parked on it; every member of g1.. asked
    assert len(old_first) == len(first) == 4 * (groups - 1) and all(ok for _, ok in old_first)
    flip = next(i for i, (_, ok) in enumerate(first) if not ok)
    assert flip > 0 and not any(ok for _, ok in first[flip:])  # none after the first no
    assert [n for n, _ in first] == sorted(n for n, _ in first)
    declined = range(groups - (len(first) - flip) // 4, groups)
    assert len(declined) >= 1
    assert rounds[0].prefix == {"g0r0": 0, **{f"g{g}r{i}": 0 for g in declined
                                               for i in range(4)}}
    assert len(rounds) < len(old_rounds)
    assert max(started.values()) < max(old_started.values())


# --- kit: the firsts published nothing usable; their siblings arrive together ----------------


def test_siblings_arriving_together_lose_one_per_group():
    """The firsts declared nothing (their one state is at their end). Each group's siblings
    arrive together with the whole system prompt to recompute: one of them is cut at the
    boundary and the rest wait for it; a group that misses the slot waits a round for it
    rather than recomputing every sibling."""
    G = grid_of()
    system = SYSTEM_UNITS * G + 10
    kit = kit_for("declared")
    res = burst_then_siblings(kit, 4, 3, system, G + 3, declare_first=False)
    assert zero_hit_followers(res) == 4  # exactly the one cut per group
    for g in range(4):
        assert sorted(res[g, i] for i in (1, 2, 3)) == [0, system, system]
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


@pytest.mark.parametrize("mode", ["learned", "both"])
def test_learned_siblings_arriving_together_lose_at_most_one_per_group(mode):
    """Learned, firsts at once: nothing has forked yet, so the firsts publish their ends;
    once the first group's siblings taught the fork depth, each later group loses one sibling
    (its cut) and the rest wait for it."""
    G = grid_of()
    system = SYSTEM_UNITS * G + 10
    kit = kit_for(mode)
    res = burst_then_siblings(kit, 5, 3, system, G + 3, declare_first=False, seed=2)
    if mode == "both":
        assert zero_hit_followers(res) == 5  # the siblings declared: one cut per group
    else:
        assert zero_hit_followers(res) <= 5 + 1  # the first group teaches it (support 2)
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


# --- the slot deferral without a match (a live burst's host time) ----------------------------


def _burst_schedule(fast: bool, monkeypatch) -> tuple[list, int, dict, int]:
    """The declared burst of `test_burst_firsts_each_publish_their_boundary_in_turn`: its
    rounds, SGLang matches made, decisions by reason and the deferrals."""
    from sglang.srt.managers.schedule_batch import Req

    from radixflow_sglang.adapter.boundary import BoundaryPublisher

    G = grid_of()
    matches = []
    with monkeypatch.context() as m:
        if not fast:
            m.setattr(BoundaryPublisher, "still_deferred", lambda *a, **k: False)
        match = Req.init_next_round_input
        m.setattr(Req, "init_next_round_input",
                  lambda self, *a, **k: (matches.append(self.rid), match(self, *a, **k))[1])
        kit = kit_for("declared")
        burst_then_siblings(kit, 6, 3, SYSTEM_UNITS * G + 10, G + 3)
    rounds = [(r.chunked, sorted(r.extend.items()), sorted(r.prefix.items()))
              for r in kit.rounds]
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}
    return rounds, len(matches), kit.runtime.report.reason_counts(), kit.runtime.boundary.deferred


def test_a_request_still_waiting_for_the_slot_is_deferred_again_without_a_match(monkeypatch):
    """A first deferred for the slot last scan, with nothing published on its path since, is
    deferred again before SGLang's match (`BoundaryPublisher.still_deferred`): the same rounds,
    the same decisions by reason, fewer matches (each a tree walk and a copy-on-write)."""
    full = _burst_schedule(False, monkeypatch)
    fast = _burst_schedule(True, monkeypatch)
    assert fast[0] == full[0] and fast[2] == full[2] and fast[3] == full[3] == 5 + 4 + 3 + 2
    # NOTE: each first's deferrals after its first one are made without a match
    assert full[1] - fast[1] == full[3] - 5


def test_a_state_published_on_its_path_or_a_sibling_run_asks_the_full_rule_again():
    """The remembered verdict stands only while what it read stands: an extend of a later
    scan that shares the request's prefix past its ready prefix (a state on its path, or a
    sibling that ran: its users changed) sends it back to SGLang's match and the full rule;
    so does a scan with the slot free, or a verdict more than STALE scans old."""
    from types import SimpleNamespace

    from radixflow_sglang.adapter.boundary import STALE
    from radixflow_sglang.adapter.queueindex import QueueIndex
    from radixflow_sglang.adapter.reqs import namespace, req_tokens

    G = grid_of()
    system = SYSTEM_UNITS * G + 10
    rng = random.Random(3)
    kit = kit_for("declared")
    prompts = [_ids(rng, system) for _ in range(3)]
    firsts = [kit.req(f"g{g}r0", prompts[g] + _ids(rng, G + 3), boundary=system)
              for g in range(3)]
    kit.submit(*firsts)
    kit.step()  # NOTE: g0r0 cut at its boundary; g1r0 and g2r0 wait for the slot
    b = kit.runtime.boundary
    assert b.deferred == 2
    taken = SimpleNamespace(new_chunked_req=firsts[0], can_run_list=[firsts[0]])  # NOTE: read
    x = firsts[2]

    def again() -> bool:
        return b.still_deferred(x, req_tokens(x), namespace(x), taken, True, 0)

    b.begin_scan(QueueIndex(kit.sched.waiting_queue))
    b.end_scan([firsts[0]])  # NOTE: another group's extend: not on its path
    b.begin_scan(QueueIndex(kit.sched.waiting_queue))
    assert not b.still_deferred(x, req_tokens(x), namespace(x), SimpleNamespace(
        new_chunked_req=None, can_run_list=[]), True, 0)  # the slot is free: the full rule
    assert not b.still_deferred(x, req_tokens(x), namespace(x), taken, False, 0)
    assert again() and b.deferred == 3
    sibling = kit.req("g2r1", prompts[2] + _ids(rng, G + 3))
    sibling.extend_end = len(req_tokens(sibling))  # NOTE: as a scan that ran it leaves it
    b.end_scan([sibling])
    b.begin_scan(QueueIndex(kit.sched.waiting_queue))
    assert not again()  # a sibling ran: its users changed
    for _ in range(STALE + 1):
        b.begin_scan(QueueIndex(kit.sched.waiting_queue))
    y = firsts[1]
    assert not b.still_deferred(y, req_tokens(y), namespace(y), taken, True, 0)  # too old
