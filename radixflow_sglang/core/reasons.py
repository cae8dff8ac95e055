"""The rulebook: every rule that can decide a request's fate in a prefill scan, in the order it
is applied, each named by one `Reason`.

A scan asks six decision points, in this order (docs/design.md's first page lists the same
rules in the same order with the same names):

1. HOLD (per pass, adapter/admission.py, core/admission.py `Gate.decide`): keep arrived work
   out of the scan a little longer, or release it.
2. ORDER (per scan, adapter/order.py `recheck_first`, after SGLang's
   `calc_priority`): the wait set is rechecked first, or SGLang's order stands.
3. VISIT (per visited request, core/points.py `visit`, asked by the runtime's `park` hook
   before LoRA, preemption or budget see it): held, parked (Blocked and waiting), or native
   handling.
4. DEFER (per request native admission is about to take, core/points.py `defer`, asked by
   the runtime's `defer` hook after SGLang's match, and by `defer_unmatched` right after
   VISIT for the one fast path that needs no match): skip this round, or admit natively.
5. PLACE (per selected request, core/boundary.py `place_rule`, from adapter/boundary.py
   `BoundaryPublisher.admitted`): the boundary it publishes its state at, if any.
6. PUBLISH (per placed boundary, `publish_rule`): move the state, cut the extend, or leave
   SGLang's own depth.

Each decision point applies its rules top to bottom and the first that fires decides: its
`Reason` travels with the decision into the trace (`park` / `defer` / `decide` events; ORDER's
one `order` event per scan that moves or keeps waited requests), the runtime's counts
(`/server_info` `radixflow.reasons`; HOLD decisions, one per scheduler pass, apart in
`radixflow.hold_reasons`, ORDER's, one per waited request, in `radixflow.order_reasons`;
every point's in Prometheus `radixflow_decisions`) and
`python -m radixflow_sglang.explain`. Pure Python, no SGLang import.

Ablation (eval/ablation.py, tests/test_rules.py): `RADIXFLOW_ABLATE="reason,reason"` (read
once, at import) or `ablating(...)` disables named rules: each rule site asks `enabled(reason)`
and, when it is not, the decision point goes on to its next rule. A point's default (the rule
that decides when no other fires: `Rule.default`) cannot be ablated. For eval and tests only:
every rank reads the same environment, so an ablation is rank-identical.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum


class Reason(StrEnum):
    """Why a decision went the way it did. A str: traces and JSON carry the value."""

    # --- HOLD (core/admission.py Gate.decide), checked in this order ---------------------------
    EARLY = "early"  # the paper's early release, by one of its three cases:
    ROWS = "rows"  # held requests fill the rows the round can take: release
    BUSY = "busy"  # work is running: release (flex)
    TOKENS = "tokens"  # held token demand fills the round's budget: release (flex)
    COST = "cost"  # holding cannot win (`hold_gain` <= 0): release (cost-aware flex)
    DEADLINE = "deadline"  # the oldest held request reached the deadline (Gate.wait_left): release
    HOLD = "hold"  # none of the above: hold

    # --- ORDER (adapter/order.py recheck_first), per queued request, in this order ------------
    PRIORITY_ORDER = "priority_order"  # priority scheduling orders the queue: SGLang's order
    RECHECKED_FIRST = "rechecked_first"  # parked in an earlier scan: visited before the rest
    PUBLISHED_FIRST = "published_first"  # rows bind: its prefix is published, before its pass
    QUEUE_ORDER = "queue_order"  # otherwise: SGLang's order

    # --- VISIT (core/points.py visit), checked in this order -----------------------------------
    HELD = "held"  # the admission hold keeps it out of this scan
    NO_TRAVERSAL = "no_traversal"  # the policy (or --disable-radix-cache) has no traversal
    QUIET_SCAN = "quiet_scan"  # no candidate of this scan can wait (core/cost.py never_waits)
    UNSHARED_SCAN = "unshared_scan"  # no queued request shares a first block: none can block
    COVERED_SCAN = "covered_scan"  # what queued requests share is ready within theta: none blocks
    SESSION = "session"  # a session request: native handling
    NO_PRODUCER = "no_producer"  # no live producer indexed: nothing can block it
    NO_SHARER = "no_sharer"  # no live producer shares a block with it
    NOT_BLOCKED = "not_blocked"  # no producer publishes >= theta past its ready prefix in reach
    RECOMPUTE_UNPROBED = "recompute_unprobed"  # recomputing wins at every ready prefix: no probe
    ALWAYS_WAIT = "always_wait"  # the always-wait rule: every Blocked request parks
    COMMITTED_WAIT = "committed_wait"  # a 2-round wait (overlap) kept on its second visit
    BOUND_WOULD_CUT = "bound_would_cut"  # the park bound releases it before the state publishes
    TAIL_GUARD = "tail_guard"  # waiting would make its question the slowest: recompute
    WAIT_WINS = "wait_wins"  # waiting adds less latency than recomputing (group verdict)
    RECOMPUTE_WINS = "recompute_wins"  # recomputing its gain now adds less latency
    BOUND_SPENT = "bound_spent"  # parked its last allowed round: native handling

    # --- DEFER (core/points.py defer), checked in this order -----------------------------------
    NEWCOMER = "newcomer"  # keeps out of a released consumer's round (core/cost.py)
    BOUNDARY_SLOT = "boundary_slot"  # its boundary cut waits for SGLang's one chunk slot
    NO_CUT = "no_cut"  # no chunk budget, or first of its round: native admission
    FITS = "fits"  # fits the residual chunk budget whole: native admission
    FORK_SLOT = "fork_slot"  # a fork-cut producer holds SGLang's one chunk slot
    NATIVE_CUT = "native_cut"  # native chunking (not a fragment, or no fragment guard)
    FRAG_CAP = "frag_cap"  # its fragment deferrals are spent: native chunking
    FRAGMENT = "fragment"  # the cut would leave a fragment shorter than G (+Frag): wait

    # --- PLACE (core/boundary.py place_rule): where a selected request publishes ------------
    DECLARED = "declared"  # a declared boundary (request field, chat system end, fork prefix)
    NATIVE_BRANCH = "native_branch"  # its match carries SGLang's branching depth: keep it
    MARKER = "marker"  # a learned marker or template piece in its extend serves most (`place`)
    REPEAT = "repeat"  # its namespace repeats prompts: length - 1
    QUEUED_FORK = "queued_fork"  # queued requests the round cannot take fork from its extend
    LEARNED = "learned"  # a learned fork depth no queued sibling forks past
    NO_BOUNDARY = "no_boundary"  # none applies: SGLang's own publish depth

    # --- PUBLISH (core/boundary.py publish_rule): how a placed boundary publishes -----------
    OUTSIDE = "outside"  # its grid floor is not inside this extend (ready < d < end)
    SLOT_TAKEN = "slot_taken"  # a cut finds SGLang's one chunk slot taken (or no chunking)
    MOVE = "move"  # extra_buffer: the one tracked state moves there
    CUT_UNPAID = "cut_unpaid"  # no_buffer, not declared: the cut does not pay for its round
    CUT = "cut"  # no_buffer: cut the extend there (SGLang's one chunked request)


class Action(StrEnum):
    """What a decision does with the request (or, for HOLD, with the held queue)."""

    HOLD = "hold"  # kept out of this scan by the admission hold
    RELEASE = "release"  # the hold lets its requests into the scan
    PARK = "park"  # Blocked and waiting: keeps its queue position and row, holds nothing
    NATIVE = "native"  # SGLang's own handling from here on
    DEFER = "defer"  # skipped this round before it consumes anything
    FIRST = "first"  # visited before the requests that never waited (each in SGLang's order)
    ADMIT = "admit"  # SGLang's native admission takes it (whole or cut as SGLang cuts)
    TARGET = "target"  # a boundary is placed: it publishes there if PUBLISH lets it
    MOVE = "move"  # its one tracked state moves to the boundary (extra_buffer)
    CUT = "cut"  # its extend is cut at the boundary; the rest runs next round


@dataclass(frozen=True)
class Rule:
    point: str  # hold | order | visit | defer | place | publish
    reason: Reason
    action: Action  # what the decision does when this rule fires
    says: str  # one line, the rule
    default: bool = False  # the point's otherwise (or a policy's): never ablated
    # keeps a later rule from reading a fact it cannot have (its absence would crash, cut at no
    # depth or starve): never ablated
    guard: bool = False
    # NOTE: the other reasons this one rule decides with, each naming which of its conditions
    # held (the paper's three early releases) or which fast path settled it (a cheaper check of
    # the same fact, asked first): one row, one ablation switch, the trace says which case
    cases: tuple[Reason, ...] = ()
    # NOTE: why it stays (issue 50): what switching it off changed where it is meant to decide
    # ("off:" ablated / kept, `python -m eval.ablation` over the matrix of
    # docs/notes/2026-12-rulebook-pruned.md, or the named shape), or the property it guards
    kept: str = ""

    @property
    def reasons(self) -> tuple[Reason, ...]:
        """Every reason its decisions carry: its own, then its cases."""
        return (self.reason, *self.cases)


HOLD, ORDER, VISIT, DEFER, PLACE, PUBLISH = "hold", "order", "visit", "defer", "place", "publish"
POINTS = (HOLD, ORDER, VISIT, DEFER, PLACE, PUBLISH)

RULEBOOK: tuple[Rule, ...] = (
    Rule(HOLD, Reason.EARLY, Action.RELEASE,
         "release before the deadline: held requests fill the free rows (`rows`), or, flex "
         "only, work is running or queued for this round (`busy`; not a prefill in flight, "
         "nor consumers parked on one), held token demand fills the token "
         "budget (`tokens`), or, cost-aware, holding cannot win (`cost`: hold_gain <= 0)",
         cases=(Reason.ROWS, Reason.BUSY, Reason.TOKENS, Reason.COST),
         kept=("off: mean 1.037x radixflow-always, 1.018x flex-always (4b mix α8); "
               "`cost` alone: 1.017-1.162x (48 of 56 matrix runs)")),
    Rule(HOLD, Reason.DEADLINE, Action.RELEASE,
         "the oldest held request reached the deadline: D after it came, or, cost-aware, D "
         "after its burst's newest request, at most 2D after it came",
         kept="property: no starvation, a hold ends within D ms, 2D cost-aware "
              "(test_rule_deadline)"),
    Rule(HOLD, Reason.HOLD, Action.HOLD, "otherwise: hold", default=True,
         kept="the point's otherwise"),
    Rule(ORDER, Reason.RECHECKED_FIRST, Action.FIRST,
         "parked in an earlier scan (the wait set, rechecked): visited before the rest; where "
         "SGLang's row limit binds under FCFS, also a request whose ready state covers what the "
         "tree shares with it (within theta), before its own arrival pass (`published_first`)",
         cases=(Reason.PUBLISHED_FIRST,),
         kept=("off: mean 1.050x (0.8b gsp burst no_buffer); `published_first`: mean "
               "0.789x -> 0.700x stock (0.8b gsp burst extra_buffer, paper profile)")),
    Rule(ORDER, Reason.QUEUE_ORDER, Action.NATIVE,
         "otherwise, or under priority scheduling (`priority_order`, checked first: SGLang's "
         "priority order stands): SGLang's order", default=True, cases=(Reason.PRIORITY_ORDER,),
         kept=("the point's otherwise; `priority_order` keeps SGLang's priority contract "
               "(test_case_priority_order)")),
    Rule(VISIT, Reason.HELD, Action.HOLD, "the admission hold has not released it",
         kept="property: a held request stays out until released (test_rule_held)"),
    Rule(VISIT, Reason.NO_TRAVERSAL, Action.NATIVE,
         "the policy has no traversal (or no reuse), or a session request (`session`: its state "
         "is its session's, which a park could not free)", guard=True, cases=(Reason.SESSION,),
         kept="guard: nothing to ask without a traversal; a park must free what it holds"),
    Rule(VISIT, Reason.QUIET_SCAN, Action.NATIVE,
         "a quiet scan, settled once per scan: no candidate can wait; fast paths, when none "
         "has waited (nothing can be Blocked): no queued request shares its first block with "
         "another or with a live producer (`unshared_scan`), or every prefix one shares is "
         "ready for it within theta already (`covered_scan`)",
         cases=(Reason.UNSHARED_SCAN, Reason.COVERED_SCAN),
         kept="off: mean 1.001-1.021x (52 of 56): its host time"),
    Rule(VISIT, Reason.NOT_BLOCKED, Action.NATIVE,
         "not Blocked: no producer publishes >= theta past its ready prefix within reach "
         "(checked with nothing ready, then after the probe match); fast paths: no live "
         "producer is indexed (`no_producer`), none shares a block with it (`no_sharer`)",
         guard=True, cases=(Reason.NO_PRODUCER, Reason.NO_SHARER),
         kept="guard: off, the arm fails (AttributeError)"),
    Rule(VISIT, Reason.ALWAYS_WAIT, Action.PARK, "always-wait rule: Blocked parks",
         default=True,
         kept="the always-wait policies' otherwise"),
    Rule(VISIT, Reason.WAIT_WINS, Action.PARK,
         "cost-aware: waiting adds less latency than recomputing (one verdict per sibling "
         "group; at the producer's learned mark where waiting for it still wins); fast path, "
         "asked first: a wait decided over 2 rounds (overlap) is kept on its second visit "
         "(`committed_wait`)", cases=(Reason.COMMITTED_WAIT,),
         kept=("off: mean 1.055-3.504x (40 of 56); `committed_wait` alone: mean 1.035x, "
               "p95 1.135x (27b race α100 extra_buffer + overlap)")),
    Rule(VISIT, Reason.RECOMPUTE_WINS, Action.NATIVE,
         "cost-aware: recomputing now adds less, or waiting wins on summed latency but would "
         "make its question the slowest the choice affects (`tail_guard`, the wait's veto); "
         "fast path, asked before the probe match: recomputing wins at every ready prefix it "
         "could have (`recompute_unprobed`)",
         cases=(Reason.TAIL_GUARD, Reason.RECOMPUTE_UNPROBED),
         kept=("off: mean 1.001-1.428x (20 of 56); `tail_guard` alone: 1.002-1.005x (10 of "
               "56); `recompute_unprobed` alone: 1.001-1.002x (16 of 56: the probe it "
               "skips)")),
    Rule(VISIT, Reason.BOUND_SPENT, Action.NATIVE,
         "the park bound leaves fewer rounds than the wait needs: none (its bound is spent: a "
         "veto of any park), or, cost-aware, fewer than its producer's publish lag "
         "(`bound_would_cut`, asked with the wait: it would park, then recompute)",
         cases=(Reason.BOUND_WOULD_CUT,),
         kept=("property: no starvation, a park ends at its bound (test_rule_bound_spent); "
               "`bound_would_cut` alone: mean 1.014x, p95 1.056x (nemotron-9b race α8 "
               "extra_buffer + overlap, seed 1)")),
    Rule(DEFER, Reason.NEWCOMER, Action.DEFER,
         "cost-aware: joining a released consumer's round costs more than a round (once)",
         kept="off: mean 1.120x (4b mix α8 extra_buffer, seed 2)"),
    Rule(DEFER, Reason.BOUNDARY_SLOT, Action.DEFER,
         "no_buffer: its boundary cut must wait for SGLang's one chunk slot; fast path, asked "
         "before SGLang's match (the scan's hook after VISIT): a recent scan's verdict, "
         "re-priced, while no state was published on its path since",
         kept="off: mean 1.306x (4b gsp no_buffer)"),
    Rule(DEFER, Reason.NO_CUT, Action.ADMIT,
         "admission cuts no chunk: no chunk budget, or the round's first request; or it fits "
         "the residual chunk budget whole (`fits`)", guard=True, cases=(Reason.FITS,),
         kept=("guard: off, the chunk rules meet no budget; `fits` off, the arm fails "
               "(TypeError: the rules below read its cut)")),
    Rule(DEFER, Reason.FORK_SLOT, Action.DEFER,
         "a fork-cut producer holds SGLang's one chunk slot", guard=True,
         kept=("guard: a native cut would displace the producer's chunk, its prompt never "
               "finished (test_traversal_computes_every_prompt_exactly_once)")),
    Rule(DEFER, Reason.NATIVE_CUT, Action.ADMIT,
         "the cut is no fragment, or no fragment guard, or (+Frag) its fragment deferrals are "
         "spent (`frag_cap`)", cases=(Reason.FRAG_CAP,),
         kept="off: mean 1.083-1.233x (6 of 56)"),
    Rule(DEFER, Reason.FRAGMENT, Action.DEFER,
         "+Frag: the cut would leave a fragment shorter than G (publishes no state)",
         kept=("the paper's +Frag arm (radixflow-frag); no fragment was cut at "
               "8,192-token budgets")),
    Rule(PLACE, Reason.DECLARED, Action.TARGET,
         "a declared boundary (request field, chat system end, fork prefix)",
         kept="off: mean 1.011-1.204x (6 of 56)"),
    Rule(PLACE, Reason.NATIVE_BRANCH, Action.NATIVE,
         "its match carries SGLang's branching depth (the tree shows where it diverges)",
         kept=("off: prefill tokens 1.035x (sgl.Engine, SGLang's n = 8, extra_buffer, "
               "testing.engine_run)")),
    Rule(PLACE, Reason.MARKER, Action.TARGET,
         "learned: a marker or template piece in its extend serves most (`place`)",
         kept="off: mean 1.144-1.423x (16 of 56)"),
    Rule(PLACE, Reason.REPEAT, Action.TARGET, "learned: its namespace repeats prompts: length - 1",
         kept=("kit, the live arrival (a copy alone first, tests/test_nsample_burst): off, "
               "each later prompt's second copy recomputes it whole; the twin's bursts send "
               "copies together (`queued_fork` serves them): 1.000x")),
    Rule(PLACE, Reason.QUEUED_FORK, Action.TARGET,
         "queued requests the round cannot take share its extend past its ready prefix (known "
         "demand): where the one state serves most (`place`; no_buffer: no marker in it)",
         kept="off: mean 1.117x, tokens 1.316x (0.8b gsp burst extra_buffer, undeclared)"),
    Rule(PLACE, Reason.LEARNED, Action.TARGET,
         "learned: a fork depth seen in its namespace, unless a queued sibling forks past it",
         kept="off: mean 1.567x, tokens 2.957x (0.8b sibling-after-completion extra_buffer, box)"),
    Rule(PLACE, Reason.NO_BOUNDARY, Action.NATIVE, "otherwise: SGLang's own publish depth",
         default=True,
         kept="the point's otherwise"),
    Rule(PUBLISH, Reason.OUTSIDE, Action.NATIVE,
         "the boundary cannot publish here: its grid floor is not inside this extend, or it "
         "needs a cut (no_buffer, or `move` off) and SGLang's one chunk slot is taken or "
         "chunked prefill is off (`slot_taken`)", guard=True, cases=(Reason.SLOT_TAKEN,),
         kept=("guard: off, the arm fails (TypeError: a cut at no depth); `slot_taken` off, a "
               "cut would overwrite SGLang's one chunked request")),
    Rule(PUBLISH, Reason.MOVE, Action.MOVE, "extra_buffer: move the one tracked state",
         kept="off: mean 0.956-1.754x (26 of 56; lower in 4: mix α8 extra_buffer + overlap)"),
    Rule(PUBLISH, Reason.CUT_UNPAID, Action.NATIVE,
         "no_buffer, not declared: the cut does not pay for its round (cut must pay, tail "
         "guard)", kept="off: mean 1.050-1.316x (8 of 56)"),
    Rule(PUBLISH, Reason.CUT, Action.CUT, "otherwise: cut the extend at the boundary",
         default=True,
         kept="the point's otherwise"),
)


RULES: dict[Reason, Rule] = {why: r for r in RULEBOOK for why in r.reasons}  # each reason's rule


def rules(point: str) -> tuple[Rule, ...]:
    """One decision point's rules, in order."""
    return tuple(r for r in RULEBOOK if r.point == point)


def in_rule_order(counts: Mapping[Reason, int]) -> dict[str, int]:
    """Decision counts by reason value, in the rulebook's order (a rule's cases after it),
    zeros left out (what /server_info reports for each point)."""
    return {why.value: counts[why] for r in RULEBOOK for why in r.reasons if counts.get(why)}


def rulebook_table() -> str:
    """The rulebook as docs/design.md's table (`python -m radixflow_sglang.explain --rulebook`
    prints it; tests/test_reasons.py checks the design carries it verbatim)."""
    head = ["| # | point | rule (reason) | action | says | kept because |",
            "|---|---|---|---|---|---|"]
    rows = [f"| {n} | {r.point} | `{r.reason.value}` | {r.action.value} | {r.says}"
            f"{' (default: not ablatable)' if r.default else ''}"
            f"{' (guard: not ablatable)' if r.guard else ''} | {r.kept} |"
            for n, r in enumerate(RULEBOOK, 1)]
    return "\n".join(head + rows) + "\n"


# --- ablation: disable named rules (eval/ablation.py, tests/test_rules.py) --------------------
ABLATE_ENV = "RADIXFLOW_ABLATE"
ABLATABLE: tuple[Reason, ...] = tuple(r.reason for r in RULEBOOK
                                      if not (r.default or r.guard))


def parse_ablate(names: str | Iterable[str | Reason]) -> frozenset[Reason]:
    """Rules named by value ("a,b" or an iterable); an unknown name, a default, a guard or a
    rule's case is an error that names the variable and lists the rules that can be ablated."""
    items = names.split(",") if isinstance(names, str) else [str(n) for n in names]
    out = set()
    for name in (n.strip() for n in items):
        if not name:
            continue
        if name not in {r.value for r in ABLATABLE}:
            rule = RULES.get(Reason(name)) if name in {r.value for r in Reason} else None
            kind = ("no rule" if rule is None
                    else f"a case of rule {rule.reason.value!r}" if rule.reason.value != name
                    else "a guard" if rule.guard else "a default rule")
            raise ValueError(f"{ABLATE_ENV}: {name!r} is {kind}; ablatable rules: "
                             f"{', '.join(r.value for r in ABLATABLE)}")
        out.add(Reason(name))
    return frozenset(out)


def _with_cases(ablated: frozenset[Reason]) -> frozenset[Reason]:
    # NOTE: a rule's sites ask by the reason they decide with: its cases are off with it
    return frozenset(why for r in ablated for why in RULES[r].reasons)


_ablated: frozenset[Reason] = _with_cases(parse_ablate(os.environ.get(ABLATE_ENV, "")))


def enabled(reason: Reason) -> bool:
    """False while `reason`'s rule is ablated: its site lets the point go on to the next rule."""
    return reason not in _ablated


@contextmanager
def ablating(names: str | Iterable[str | Reason]) -> Iterator[frozenset[Reason]]:
    """Disable the named rules for the block (in-process eval arms and tests)."""
    global _ablated
    chosen = parse_ablate(names)
    before, _ablated = _ablated, _with_cases(chosen)
    try:
        yield chosen
    finally:
        _ablated = before
