"""VISIT (with its wait rule) and DEFER: one ordered function per decision point (the shape of
core/admission.py `Gate.decide`).

Facts in, rules top to bottom, the first that fires decides: `(Action, Reason)` out. The facts
are the caller's, each asked only when a rule reaches it, so a cheap rule that fires spares
the expensive facts behind it (the adapter's `VisitFacts` probes SGLang's cache for `blocked`
only; core/traversal.py `WaitFacts` prices a sibling group's wait for `verdict` only). A fast
path is its rule's, asked in the rule's function, at the hook where it is cheapest (DEFER's
`still_deferred`: at the scan's hook before SGLang's match). The rulebook's VISIT and DEFER
rows are these rules in this order (tests/test_reasons.py reads them off the source). An
ablated rule (core/reasons.py `enabled` False) lets the next decide; a guard (the rule that
keeps a later one from reading a fact it cannot have) is not ablated.
"""

from __future__ import annotations

from typing import Protocol

from .cost import Verdict
from .reasons import Action, Reason, enabled


class WaitFacts(Protocol):
    """A probed Blocked candidate under the cost-aware rule (core/traversal.py `WaitFacts`)."""

    committed: bool  # a 2-round wait (overlap) decided last scan, for this producer
    bound_would_cut: bool  # the park bound releases it before the state publishes
    verdict: Verdict  # its sibling group's cost comparison (one per group and scan)


class VisitFacts(WaitFacts, Protocol):
    """One visited request (adapter/visit.py `VisitFacts`)."""

    held: bool  # the admission hold has not released it
    traversal: bool  # the policy traverses (and the cache can reuse a prefix)
    quiet: Reason | None  # this scan runs with the hooks off, by that rule
    session: bool  # a session request
    producers: bool  # a live producer is indexed
    sharers: bool  # a live producer shares a block with it
    blocked_unready: bool  # Blocked even with nothing ready (no probe; True: ask the probe)
    recomputes_unprobed: bool  # cost-aware: recomputing wins at every ready prefix it could have
    blocked: bool  # Blocked at the ready prefix the probe match finds
    cost_aware: bool  # the cost-aware wait rule (else every Blocked request parks)
    bound_left: bool  # its park bound leaves it a round


def visit(f: VisitFacts) -> tuple[Action, Reason]:
    """VISIT: keep a visited request out of this round (held, parked) or hand it to SGLang."""
    if enabled(Reason.HELD) and f.held:
        return Action.HOLD, Reason.HELD
    if not f.traversal:  # NOTE: a guard: no traversal, no producer to ask
        return Action.NATIVE, Reason.NO_TRAVERSAL
    if f.session:  # NOTE: the guard's case: a park would have to free its session's state
        return Action.NATIVE, Reason.SESSION
    if f.quiet in (Reason.QUIET_SCAN, Reason.UNSHARED_SCAN, Reason.COVERED_SCAN):
        return Action.NATIVE, f.quiet  # NOTE: settled once per scan (`begin_scan`), by case
    # NOTE: the guard `not_blocked`: its fast paths first (no producer, none sharing a block),
    # then with nothing ready (a larger ready prefix only shrinks the gain), after the probe
    if not f.producers:
        return Action.NATIVE, Reason.NO_PRODUCER
    if not f.sharers:
        return Action.NATIVE, Reason.NO_SHARER
    if not f.blocked_unready:
        return Action.NATIVE, Reason.NOT_BLOCKED
    if enabled(Reason.RECOMPUTE_UNPROBED) and f.recomputes_unprobed:
        return Action.NATIVE, Reason.RECOMPUTE_UNPROBED
    if not f.blocked:  # NOTE: the same guard after the probe: nothing to wait for
        return Action.NATIVE, Reason.NOT_BLOCKED
    if not f.cost_aware:
        action, why = Action.PARK, Reason.ALWAYS_WAIT  # NOTE: the paper's rule: every Blocked
    else:
        action, why = wait(f)
    if action is Action.PARK and enabled(Reason.BOUND_SPENT) and not f.bound_left:
        return Action.NATIVE, Reason.BOUND_SPENT  # NOTE: a guard against starvation
    return action, why


def wait(f: WaitFacts) -> tuple[Action, Reason]:
    """The cost-aware wait rule for a probed Blocked request: park, or recompute its gain now.
    The tail guard vetoes a wait that wins on summed latency; a sibling follows its group's
    verdict (`verdict` is computed once per group and scan)."""
    if enabled(Reason.COMMITTED_WAIT) and f.committed:
        return Action.PARK, Reason.COMMITTED_WAIT
    if enabled(Reason.BOUND_WOULD_CUT) and f.bound_would_cut:
        return Action.NATIVE, Reason.BOUND_WOULD_CUT
    v = f.verdict
    if v.tail:
        return Action.NATIVE, Reason.TAIL_GUARD
    if v.wait:
        return Action.PARK, Reason.WAIT_WINS
    return Action.NATIVE, Reason.RECOMPUTE_WINS


class DeferFacts(Protocol):
    """A request native admission is about to take, after SGLang's match, or before it where
    VISIT handed it to SGLang (adapter/facts.py `DeferFacts`)."""

    matched: bool  # SGLang has matched it (False: the scan's hook before the match)
    newcomer: bool  # cost-aware: joining a released consumer's round costs more than a round
    slot_wait: bool  # no_buffer: its boundary cut must wait for SGLang's one chunk slot
    # no_buffer, before the match: its slot deferral of a recent scan holds again (nothing it
    # read changed since), for a request VISIT found no live producer sharing a prefix with
    still_deferred: bool
    chunking: bool  # a chunk budget, and rows taken before it (else nothing can be cut)
    fits: bool  # it fits the residual chunk budget whole (SGLang's `add_one_req` would not cut)
    fork_chunk: bool  # a fork-cut producer holds SGLang's one chunk slot this scan
    fragment: bool  # +Frag: the cut would leave a fragment shorter than G (publishes no state)
    frag_spent: bool  # its fragment deferrals are spent


# NOTE: the paper's +Frag arm defers a fragment at most twice, then chunks natively (a bound on
# its latency); never reached at the measured sizes (notes/2026-12-rule-ablation.md): the
# default of `--radixflow-frag-cap`, which `frag_spent` compares with
FRAG_CAP = 2


def defer(f: DeferFacts) -> tuple[Action, Reason] | None:
    """DEFER: skip this round a request admitting would cut into a chunk it must not be, before
    it consumes anything; else native admission (whole, or cut as SGLang cuts). Asked before
    SGLang's match too (`matched` False), where only `boundary_slot`'s fast path can decide:
    None there sends the request on to the match, after which DEFER is asked again."""
    # NOTE: the newcomer's work is priced from its matched prefix: after the match only
    if f.matched and enabled(Reason.NEWCOMER) and f.newcomer:
        return Action.DEFER, Reason.NEWCOMER
    # NOTE: a slot wait needs a chunk cut this round already (`adder.new_chunked_req`): with
    # no chunk budget (or no row taken) it cannot hold, so it is asked before `no_cut`. Its
    # fast path, before the match: a recent scan's verdict, again, while nothing it read has
    # changed (no match and copy-on-write for a burst's requests waiting for the slot)
    if enabled(Reason.BOUNDARY_SLOT) and (f.slot_wait if f.matched else f.still_deferred):
        return Action.DEFER, Reason.BOUNDARY_SLOT
    if not f.matched:
        return None  # NOTE: every rule below reads the match
    # NOTE: the guard `no_cut`: no chunk budget, no cut to ask about; its case `fits`: the
    # request is not cut (the rules below read its cut)
    if not f.chunking:
        return Action.ADMIT, Reason.NO_CUT
    if f.fits:
        return Action.ADMIT, Reason.FITS
    if f.fork_chunk:  # NOTE: a guard: a native cut would displace the producer's chunk
        return Action.DEFER, Reason.FORK_SLOT
    if enabled(Reason.NATIVE_CUT) and not f.fragment:
        return Action.ADMIT, Reason.NATIVE_CUT
    if enabled(Reason.NATIVE_CUT) and f.frag_spent:  # NOTE: its case: +Frag's bound
        return Action.ADMIT, Reason.FRAG_CAP
    if enabled(Reason.FRAGMENT):
        return Action.DEFER, Reason.FRAGMENT
    return Action.ADMIT, Reason.NATIVE_CUT  # NOTE: the guard ablated: SGLang cuts it
