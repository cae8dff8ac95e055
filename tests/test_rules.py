"""One test per rule of the rulebook (core/reasons.py), named after it: a situation where the
rule decides, asserted by its reason, and (every rule but a point's default) what changes when
the rule is ablated (`ablating`: its decision point goes on to the next rule). A rule whose
ablation changes nothing here or in eval.ablation's cells is deleted, not kept (issue 35).

Pure core functions where the rule is pure (HOLD, PLACE, PUBLISH, the wait rule's verdict and
bounds); SGLang's real scan on CPU (the kit) for the runtime's VISIT and DEFER points."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from radixflow_sglang.core.admission import Demand, Gate
from radixflow_sglang.core.boundary import place_rule, publish_rule
from radixflow_sglang.core.cost import CostCoeffs, RoundView, Verdict, WaitCase, group_wait_wins
from radixflow_sglang.core.grid import Grid, Layout
from radixflow_sglang.core.reasons import (
    ABLATABLE,
    ABLATE_ENV,
    RULEBOOK,
    RULES,
    Action,
    Reason,
    ablating,
    enabled,
    parse_ablate,
)
from radixflow_sglang.core.traversal import Traversal, TraversalConfig
from radixflow_sglang.testing.fixtures import toks

R = Reason
DOC = toks(1000, 2000)  # 2,000 shared tokens
G = 64


def test_every_rule_has_its_test():
    names = {n for n in globals() if n.startswith("test_rule_")}
    assert names == {f"test_rule_{r.reason.value}" for r in RULEBOOK}
    cases = {n for n in globals() if n.startswith("test_case_")}
    assert cases == {f"test_case_{c.value}" for r in RULEBOOK for c in r.cases}


def rule_of(reason: Reason) -> Reason:
    """The rule a reason decides for: itself, or the rule it is a case of (ablated together)."""
    return RULES[reason].reason


def test_a_case_is_ablated_with_its_rule():
    for rule in RULEBOOK:
        for case in rule.cases:
            with pytest.raises(ValueError, match=f"a case of rule '{rule.reason.value}'"):
                parse_ablate(case.value)
            if not (rule.guard or rule.default):
                with ablating([rule.reason]):
                    assert not enabled(case)
                assert enabled(case)


def test_ablate_names_are_checked():
    assert parse_ablate(" wait_wins,recompute_wins ") == {R.WAIT_WINS, R.RECOMPUTE_WINS}
    for bad in ("nope", "hold"):
        with pytest.raises(ValueError, match=ABLATE_ENV) as e:
            parse_ablate(bad)
        assert "wait_wins" in str(e.value)  # NOTE: lists the ablatable rules
    assert all(r.kept for r in RULEBOOK)  # NOTE: each row says why it stays
    assert {r.reason for r in RULEBOOK if r.default} == {R.HOLD, R.QUEUE_ORDER, R.ALWAYS_WAIT,
                                                        R.NO_BOUNDARY, R.CUT}
    assert len(ABLATABLE) == len(RULEBOOK) - 5 - sum(r.guard for r in RULEBOOK)


def default_rule(reason: Reason) -> None:
    """A point's default decides when no other rule fires; it cannot be ablated."""
    with pytest.raises(ValueError, match="default"):
        parse_ablate(reason.value)


# --- HOLD: core/admission.py Gate.decide ----------------------------------------------------


def demand(**kw) -> Demand:
    base = dict(held=1, oldest_arrival=0.0, busy=False, free_rows=8, token_budget=8192,
                residual_tokens=100)
    return Demand(**{**base, **kw})


def hold(reason: Reason, d: Demand, now: float = 0.0, cost_aware: bool = False) -> None:
    """`reason` releases; ablated, the gate holds (nothing else fires in `d`)."""
    gate = Gate("flex", 5.0, cost_aware=cost_aware)
    got = gate.decide(d, now)
    assert (got.hold, got.reason) == (False, reason)
    with ablating([rule_of(reason)]):
        assert gate.decide(d, now).hold


def test_rule_early():
    """The paper's early release, by its three cases (below); timers release only on rows."""
    timer = Gate("timer", 5.0)
    assert timer.decide(demand(held=8), 0.0).reason is R.ROWS
    assert timer.decide(demand(busy=True, residual_tokens=8192), 0.0).hold


def test_case_rows():
    hold(R.ROWS, demand(held=8))


def test_case_busy():
    hold(R.BUSY, demand(busy=True))


def test_case_tokens():
    hold(R.TOKENS, demand(residual_tokens=8192))


def test_case_cost():
    hold(R.COST, demand(cost=None), cost_aware=True)  # NOTE: no fit yet: holding cannot win


def test_rule_deadline():
    hold(R.DEADLINE, demand(), now=0.005)
    # NOTE: cost-aware, D from its burst's newest request, at most 2D from the oldest (the
    # cost case, its rule ablated, would release first wherever no wait is left)
    g = Gate("flex", 5.0, cost_aware=True)
    with ablating([rule_of(R.COST)]):
        assert g.decide(demand(burst_last=0.004), 0.006).hold
        assert g.decide(demand(burst_last=0.004), 0.0091).reason is R.DEADLINE
        assert g.decide(demand(burst_last=0.009), 0.0101).reason is R.DEADLINE


def test_rule_hold():
    got = Gate("flex", 5.0).decide(demand(), 0.0)
    assert (got.hold, got.reason) == (True, R.HOLD)
    default_rule(R.HOLD)


# --- PLACE, PUBLISH: core/boundary.py place_rule, publish_rule -------------------------------


def place(declared: int | None, branch: bool, sources: tuple, ablate=()) -> tuple:
    srcs = [lambda v=v: v for v in sources]
    decl = None if declared is None else (lambda: declared)
    with ablating(ablate):
        return place_rule(decl, True, branch, *srcs)


def _place_case(reason: Reason) -> None:
    cases = {R.DECLARED: (3, False, (5, 6, 8, 7), (R.MARKER, 5)),
             R.NATIVE_BRANCH: (None, True, (5, 6, 8, 7), (R.MARKER, 5)),
             R.MARKER: (None, False, (5, 6, 8, 7), (R.REPEAT, 6)),
             R.REPEAT: (None, False, (None, 6, 8, 7), (R.QUEUED_FORK, 8)),
             R.QUEUED_FORK: (None, False, (None, None, 8, 7), (R.LEARNED, 7)),
             R.LEARNED: (None, False, (None, None, None, 7), (R.NO_BOUNDARY, None))}
    declared, branch, sources, ablated = cases[reason]
    assert place(declared, branch, sources)[0] is reason
    assert place(declared, branch, sources, [reason]) == ablated


def test_rule_declared():
    _place_case(R.DECLARED)


def test_rule_native_branch():
    _place_case(R.NATIVE_BRANCH)


def test_rule_marker():
    _place_case(R.MARKER)


def test_rule_repeat():
    _place_case(R.REPEAT)


def test_rule_queued_fork():
    _place_case(R.QUEUED_FORK)


def test_rule_learned():
    _place_case(R.LEARNED)


def test_rule_no_boundary():
    assert place(None, False, (None, None, None, None)) == (R.NO_BOUNDARY, None)
    default_rule(R.NO_BOUNDARY)


def yes() -> bool:
    return True


def no() -> bool:
    return False


def publish(reason: Reason, args: tuple, ablated: Reason) -> None:
    """`reason` decides `publish_rule(*args)`; ablated, `ablated` does."""
    assert publish_rule(*args) is reason
    with ablating([rule_of(reason)]):
        assert publish_rule(*args) is ablated


EB, NB = Layout.EXTRA_BUFFER, Layout.NO_BUFFER


def test_rule_outside():
    # NOTE: a guard: without it the rules below would cut at no depth
    assert publish_rule(None, NB, True, True, yes) is R.OUTSIDE
    with pytest.raises(ValueError, match="a guard"):
        parse_ablate(R.OUTSIDE.value)


def test_rule_move():
    # NOTE: without the move, extra_buffer publishes only where it can cut
    publish(R.MOVE, (64, EB, True, True, yes), R.CUT)


def test_case_slot_taken():
    # NOTE: the guard `outside`'s case: past it the cut would be a second chunked request,
    # overwriting SGLang's one; a boundary that moves (extra_buffer) needs no cut
    assert publish_rule(64, NB, False, True, yes) is R.SLOT_TAKEN
    assert publish_rule(64, EB, False, True, yes) is R.MOVE
    with ablating([R.MOVE]):
        assert publish_rule(64, EB, False, True, yes) is R.SLOT_TAKEN
    with pytest.raises(ValueError, match="a case of rule 'outside'"):
        parse_ablate(R.SLOT_TAKEN.value)


def test_rule_cut_unpaid():
    publish(R.CUT_UNPAID, (64, NB, True, True, no), R.CUT)


def test_rule_cut():
    assert publish_rule(64, NB, True, False, no) is R.CUT  # declared: pays unasked
    default_rule(R.CUT)


# --- VISIT's wait rule: core/cost.py group_wait_wins, core/traversal.py decide, park ---------

VIEW = RoundView(rows=1, behind=1, budget_left=8192, demand_after=0, mean_extend=100.0,
                 rows_left=60)
CASE = WaitCase(0, 1984, 2074, 1)  # a 1,984-token gain, 90 tokens after it


def verdict(reason: Reason, cost: CostCoeffs, view: RoundView = VIEW) -> None:
    """`reason` decides the group verdict; ablated, the verdict turns over."""
    v = group_wait_wins(cost, CASE, view)
    assert v.reason is reason
    with ablating([rule_of(reason)]):
        assert group_wait_wins(cost, CASE, view).wait is not v.wait


def test_rule_wait_wins():
    verdict(R.WAIT_WINS, CostCoeffs(0.002, 1e-5, 0.0))  # NOTE: the gain outweighs a 2 ms round


def test_rule_recompute_wins():
    verdict(R.RECOMPUTE_WINS, CostCoeffs(0.2, 1e-7, 0.0))  # NOTE: a 200 ms round outweighs it


def test_case_tail_guard():
    # NOTE: the question arrived with the oldest finishing request, and the round it waits
    # for costs more than the recompute it saves: waiting makes it the tail
    verdict(R.TAIL_GUARD, CostCoeffs(0.002, 1e-6, 0.0), RoundView(
        rows=1, behind=1, budget_left=8192, demand_after=0, mean_extend=100.0, rows_left=60,
        older_by=0.0))


def traversal_with_producer(overlap: bool) -> Traversal:
    from radixflow_sglang.core.producers import Producer

    t = Traversal(TraversalConfig.default(Grid(Layout.EXTRA_BUFFER, G), overlap, cost_aware=True))
    t.begin_round([], 1 << 30)
    t.admitted(Producer("P", None, DOC + toks(5000, 100), 0, 2100, 1984, True))
    return t


def cand(rid: str, tokens: list[int]):
    from radixflow_sglang.core.traversal import Candidate

    return Candidate(rid, None, tokens, 0, len(tokens) - 1)


def test_case_bound_would_cut():
    """Overlap: the producer publishes 2 rounds on; a consumer with 1 park round left would be
    released by the bound first."""
    t = traversal_with_producer(overlap=True)
    late = cand("A", DOC + toks(6000, 120))
    for r in range(2):
        t.waits.park("A", r, "earlier", G)
    cost = CostCoeffs(0.002, 1e-5, 0.0)
    assert t.decide(late, t.classify(late), VIEW, cost).reason is R.BOUND_WOULD_CUT
    with ablating([rule_of(R.BOUND_WOULD_CUT)]):
        assert t.decide(late, t.classify(late), VIEW, cost).wait


def test_rule_bound_spent():
    """core/points.py `visit` over a Blocked request whose group waits and whose park bound is
    spent (the traversal's own wait set says so)."""
    from types import SimpleNamespace

    from radixflow_sglang.core.points import visit

    t = traversal_with_producer(overlap=False)
    for r in range(t.cfg.max_park_rounds):
        t.waits.park("A", r, "P", G)
    f = SimpleNamespace(held=False, traversal=True, quiet=None, session=False, producers=True,
                        sharers=True, blocked_unready=True, recomputes_unprobed=False,
                        blocked=True, cost_aware=True, committed=False, bound_would_cut=False,
                        verdict=Verdict(True, 0.0, 1.0),
                        bound_left=t.waits.may_park("A"))
    assert visit(f) == (Action.NATIVE, R.BOUND_SPENT)  # NOTE: native handling
    with ablating([R.BOUND_SPENT]):
        assert visit(f) == (Action.PARK, R.WAIT_WINS)  # NOTE: past its bound: a wait without end


def test_rule_always_wait():
    t = Traversal(TraversalConfig.default(Grid(Layout.EXTRA_BUFFER, G), False))
    assert t.decide(cand("A", DOC), None, VIEW, CostCoeffs(0.2, 0.0, 0.0)).reason is R.ALWAYS_WAIT
    default_rule(R.ALWAYS_WAIT)


# --- VISIT and DEFER on SGLang's real scan (the kit) -----------------------------------------

Scenario = Callable[[object], None]


def pair(k) -> None:
    """A producer and one consumer sharing 2,000 tokens, together."""
    k.submit(k.req("P", DOC + toks(5000, 100)), k.req("A", DOC + toks(6000, 120)))


def fork(k) -> None:
    """A producer, three consumers of its 2,000 tokens and an unrelated request, together."""
    k.submit(k.req("P", DOC + toks(5000, 100)),
             *[k.req(f"C{i}", DOC + toks(6000 + 500 * i, 120)) for i in range(3)],
             k.req("D", toks(20_000, 300)))


def long_doc(k) -> None:
    """A 6,000-token document's producer and three consumers, and four unrelated prompts."""
    big = toks(1000, 6000)
    k.submit(k.req("P", big + toks(50_000, 100)),
             *[k.req(f"C{i}", big + toks(60_000 + 500 * i, 120)) for i in range(3)],
             *[k.req(f"D{i}", toks(80_000 + 1000 * i, 700)) for i in range(4)])


class Ticking:
    """A clock the test sets (`now`); a hold's sleep moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)


def run(scenario: Scenario, policy: str = "radixflow", ablate=(), config=None,
        **cfg) -> tuple[dict, list]:
    """Decisions by reason (every point) and what the scan did: the prefill schedule (rids,
    extends, prefixes, the chunk) and its work (probe matches, quiet scans: the host time
    eval/hostcost.py charges)."""
    from radixflow_sglang.testing.kit import Kit, KitConfig
    from radixflow_sglang.testing.loop import VirtualClock

    warnings.filterwarnings("ignore", category=UserWarning)
    clock = VirtualClock()
    with ablating(ablate):
        probed: list[int] = []
        k = Kit(KitConfig(**cfg), policy=policy, radixflow_config=config, clock=clock,
                sleep=clock.sleep, on_scan=lambda scan: probed.append(scan.probed))
        scenario(k)
        rounds = k.drain()
        s = k.runtime.summary()
    counts = {**s["hold_reasons"], **s["order_reasons"], **s["reasons"], **s["boundary_reasons"]}
    work = (k.runtime.totals.quiet_scans, k.runtime.quiet_visits, sum(probed))
    return counts, [(r.rids, r.extend, r.prefix, r.chunked) for r in rounds] + [work]


def decides(reason: Reason, scenario: Scenario, *, guard: bool = False, policy="radixflow",
            **cfg) -> None:
    """`reason` decides in `scenario`; ablated, the scan's schedule or work changes (a guard,
    which keeps a later rule from reading a fact it cannot have, cannot be ablated)."""
    counts, schedule = run(scenario, policy, **cfg)
    assert counts.get(reason.value, 0) > 0, counts
    if guard:
        with pytest.raises(ValueError, match="a guard"):
            parse_ablate(rule_of(reason).value)
        return
    assert run(scenario, policy, [rule_of(reason)], **cfg)[1] != schedule


def test_rule_held():
    """timer5: early's deadline passed, late and early2 arrived just now; the scan runs early
    and skips the fresh ones (tests/test_admission.py's shape). Without the rule they run
    ahead of their deadline."""
    from radixflow_sglang.testing.kit import Kit, KitConfig

    def first_round(ablate=()) -> tuple[list[str], dict]:
        clock = Ticking()
        with ablating(ablate):
            k = Kit(KitConfig(), policy="timer5", clock=lambda: clock.now, sleep=clock.sleep)
            k.submit(k.req("early", toks(60_000, 400)))
            assert k.step() is None
            clock.now = 0.005
            k.submit(k.req("late", toks(70_000, 400)), k.req("early2", toks(80_000, 100)))
            k.sched.waiting_queue.sort(key=lambda r: r.rid != "late")
            rids = k.step().rids
        return rids, k.runtime.summary()["reasons"]

    rids, counts = first_round()
    assert rids == ["early"] and counts[R.HELD.value] > 0
    assert first_round([R.HELD])[0] != rids


def test_rule_no_traversal():
    decides(R.NO_TRAVERSAL, pair, policy="radix", guard=True)


def short(k) -> None:
    """Short questions after one 64-token instruction on a small model: no wait can win (a
    quiet scan), though they share a first block (not `unshared_scan`)."""
    k.submit(*[k.req(f"q{i}", toks(500, 64) + toks(1000 + 100 * i, 40)) for i in range(4)])


def test_rule_quiet_scan():
    decides(R.QUIET_SCAN, short, model="qwen3.5-0.8b")


def unrelated(k) -> None:
    """Unrelated long prompts (each its own first block), more than one round's budget: a
    recompute could displace work (not `quiet_scan`), yet no visit can find a sharer."""
    k.submit(*[k.req(f"u{i}", toks(10_000 * (i + 1), 3000)) for i in range(4)])


def test_case_unshared_scan():
    decides(R.UNSHARED_SCAN, unrelated)


def system_prompted(k) -> None:
    """A 1,024-token system prompt whose state is cached (two earlier requests forked after
    it), then four long prompts behind it: each shares only the system prompt with the others
    (no first block of its own: not `unshared_scan`), and it is ready for each."""
    system = toks(300_000, 1024)
    for i in range(2):
        k.submit(k.req(f"s{i}", system + toks(310_000 + 1000 * i, 200)))
        k.drain()
    k.submit(*[k.req(f"u{i}", system + toks(10_000 * (i + 1), 3000)) for i in range(4)])


def test_case_covered_scan():
    decides(R.COVERED_SCAN, system_prompted)


def test_case_session():
    def sessions(k) -> None:
        pair(k)
        for r in k.sched.waiting_queue:
            r.session = SimpleNamespace(streaming=False)  # NOTE: SGLang's Session, in brief

    decides(R.SESSION, sessions, guard=True)


def test_case_no_producer():
    decides(R.NO_PRODUCER, pair, guard=True)


def test_case_no_sharer():
    decides(R.NO_SHARER, long_doc, guard=True)


def test_rule_not_blocked():
    decides(R.NOT_BLOCKED, fork, guard=True)


def test_case_recompute_unprobed():
    def dear_rounds(k) -> None:
        k.runtime.use_prior(CostCoeffs(0.2, 1e-7, 0.0))  # NOTE: a round outweighs any gain
        pair(k)
        k.submit(k.req("D", toks(20_000, 5000)))  # NOTE: the queue overflows: not quiet

    decides(R.RECOMPUTE_UNPROBED, dear_rounds)


def test_case_committed_wait():
    """Overlap: a consumer of a producer admitted this scan waits 2 rounds; its next visit (the
    producer in flight) keeps the wait, where a fresh decision on the rest alone recomputes
    (tests/test_cost.py's shape: that split siblings, 1.36x stock on nemotron-9b race)."""
    from radixflow_sglang.core.producers import Producer
    from radixflow_sglang.core.traversal import Candidate

    mid = CostCoeffs(0.1, 1.7e-5, 1.24e-4)
    deep, short_queue = (RoundView(rows=r, behind=b, budget_left=8192, demand_after=0,
                                   mean_extend=2000.0, rows_left=63) for r, b in ((1, 40), (0, 1)))
    t = Traversal(TraversalConfig.default(Grid(Layout.EXTRA_BUFFER, G), True, cost_aware=True))
    doc = list(range(5000))
    t.begin_round([], 1 << 30)
    t.admitted(Producer("p", "ns", doc, 0, 5000, 4096, False))
    c = Candidate("c", "ns", doc[:4200] + [7] * 50, 0, 4249)
    b = t.classify(c)
    assert t.decide(c, b, deep, mid).wait
    t.park(c, b)
    t.begin_round([t.index.get("p")], 0)  # NOTE: the producer is in flight now
    assert t.decide(c, t.classify(c), short_queue, mid).reason is R.COMMITTED_WAIT
    with ablating([rule_of(R.COMMITTED_WAIT)]):
        assert not t.decide(c, t.classify(c), short_queue, mid).wait


def test_rule_newcomer():
    decides(R.NEWCOMER, long_doc)


def test_rule_no_cut():
    """Chunked prefill off (SGLang's chunked_prefill_size None): nothing is ever cut, so no
    chunk rule may ask for a cut; without the rule the fit check meets no budget."""
    def unchunked(k) -> None:
        k.sched.chunked_prefill_size = None
        fork(k)

    decides(R.NO_CUT, unchunked, guard=True)


def test_rule_boundary_slot():
    def burst(k) -> None:
        import random

        k.runtime.use_prior(CostCoeffs(1e-3, 1e-4, 0.0))  # NOTE: tokens dear: a cut pays
        rng = random.Random(0)
        system = 4 * G + 10
        for g in range(3):
            prompt = [rng.randrange(100, 200_000) for _ in range(system)]
            k.submit(*[k.req(f"g{g}r{i}", prompt + [rng.randrange(100, 200_000)
                                                    for _ in range(G + 3)], boundary=system)
                       for i in range(2)])

    decides(R.BOUNDARY_SLOT, burst, layout="no_buffer")


def test_case_fits():
    decides(R.FITS, long_doc, guard=True, policy="radixflow-frag", tokens=1024)


def test_rule_fork_slot():
    """A guard: without it a native cut displaces the fork-cut producer's chunk and its prompt
    is never finished (tests/test_traversal.py computes every prompt exactly once)."""
    decides(R.FORK_SLOT, long_doc, guard=True, layout="no_buffer", tokens=1024)


def test_rule_native_cut():
    decides(R.NATIVE_CUT, fork, tokens=1024)


def test_case_frag_cap():
    from radixflow_sglang.config import RadixFlowConfig

    def fragment_twice(k) -> None:
        """b would be cut to a 40-token fragment twice; its second time the cap (1) is spent
        (tests/test_admission.py's shape)."""
        k.submit(k.req("a", toks(10_000, 2000)), k.req("b", toks(20_000, 300)))
        k.step()
        k.submit(k.req("x", toks(40_000, 2000)))
        k.sched.waiting_queue.sort(key=lambda r: r.rid != "x")

    decides(R.FRAG_CAP, fragment_twice, policy="radixflow-frag", tokens=2040,
            config=RadixFlowConfig(policy="radixflow-frag", frag_cap=1))


def test_rule_fragment():
    decides(R.FRAGMENT, long_doc, policy="radixflow-frag", tokens=1024)


# --- ORDER: RadixFlowRuntime._order, on SGLang's real scan (the kit) ---------------------------


def interleaved(k) -> None:
    """no_buffer, 2 rows: three groups of a declared 330-token system prompt, submitted group
    by group's turn (g0r0 g1r0 g2r0 g0r1 g1r1 g2r1). g0r0 is cut at its boundary (SGLang's one
    chunk slot), g1r0 and g2r0 wait for the slot, g0r1 parks on g0r0's state; next scan
    g0r1, released, is visited before g1r0 and g2r0, which never waited."""
    import random

    k.runtime.use_prior(CostCoeffs(1e-3, 1e-4, 0.0))  # NOTE: tokens dear: a cut pays
    rng = random.Random(1)
    system = 5 * G + 10
    prompts = [[rng.randrange(100, 200_000) for _ in range(system)] for _ in range(3)]
    k.submit(*[k.req(f"g{g}r{i}", prompts[g] + [rng.randrange(100, 200_000)
                                                for _ in range(G + 3)], boundary=system)
               for i in range(2) for g in range(3)])


def test_rule_rechecked_first():
    decides(R.RECHECKED_FIRST, interleaved, layout="no_buffer", rows=2)


def published_burst(k) -> None:
    """4 rows: a/0 (declared 330-token prompt) beside 3 short fillers; while they decode, b's
    four requests and a/0's three siblings arrive in one pass, b's first. When the fillers
    end, 3 rows are free for 7 requests: a's siblings, published, go first."""
    import random

    rng = random.Random(0)
    system = 5 * G + 10
    prompts = {g: [rng.randrange(100, 200_000) for _ in range(system)] for g in "ab"}

    def group(g, ids, new=16):
        return [k.req(f"{g}/{i}", prompts[g] + [rng.randrange(100, 200_000)
                                                for _ in range(G + 3)],
                      max_new_tokens=new, boundary=system) for i in ids]

    k.submit(*group("a", [0], new=64), *[k.req(f"f/{i}", [rng.randrange(100, 200_000)
                                                          for _ in range(G)], max_new_tokens=8)
                                         for i in range(3)])
    while len(k.sched.running_batch.reqs) < 4:
        k.step()
    k.submit(*group("b", range(4)), *group("a", range(1, 4)))


def test_case_published_first():
    decides(R.PUBLISHED_FIRST, published_burst, rows=4)


def test_order_is_counted_and_traced(make_kit, tmp_path):
    """Each scan that moves waited requests says so: one `order` event, its count of waited
    requests adding up to /server_info's `order_reasons`; the visits that follow are theirs."""
    import json

    from radixflow_sglang.config import RadixFlowConfig

    trace = tmp_path / "trace.jsonl"
    k = make_kit(layout="no_buffer", policy="radixflow", rows=2,
                 radixflow_config=RadixFlowConfig(policy="radixflow", trace=str(trace)))
    interleaved(k)
    k.drain()
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    orders = [e for e in events if e["event"] == "order"]
    assert orders and {e["reason"] for e in orders} == {R.RECHECKED_FIRST.value}
    assert sum(e["waited"] for e in orders) == \
        k.runtime.summary()["order_reasons"][R.RECHECKED_FIRST.value]
    first = orders[0]["round"]
    visits = [e["rid"] for e in events if e["event"] == "park" and e["round"] == first]
    parked = {e["rid"] for e in events if e["event"] == "parked" and e["round"] < first}
    assert visits[0] in parked  # NOTE: a waited request leads the scan


def test_case_priority_order():
    """Priority scheduling: SGLang's priority order stands (a case of the default: never
    ablated), the wait set is not moved first."""
    def prioritized(k) -> None:
        k.sched.enable_priority_scheduling = True  # NOTE: priorities all equal: FCFS order
        interleaved(k)

    counts, schedule = run(prioritized, "radixflow", layout="no_buffer", rows=2)
    assert counts.get(R.PRIORITY_ORDER.value, 0) > 0, counts
    assert R.RECHECKED_FIRST.value not in counts
    assert schedule == run(interleaved, "radixflow", [R.RECHECKED_FIRST], layout="no_buffer",
                           rows=2)[1]  # NOTE: SGLang's order, as without the rule


def test_rule_queue_order():
    """Nothing waited: SGLang's order stands, as with the other ORDER rules ablated."""
    counts, schedule = run(short, "radixflow", model="qwen3.5-0.8b")
    assert not {R.RECHECKED_FIRST.value, R.PRIORITY_ORDER.value} & set(counts)
    ablated = [R.RECHECKED_FIRST]
    assert schedule == run(short, "radixflow", ablated, model="qwen3.5-0.8b")[1]
    default_rule(R.QUEUE_ORDER)
