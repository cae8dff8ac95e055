"""Publication boundaries on SGLang 0.5.23 (issue 15; the decisions are core/boundary.py's).

Where a request's boundary comes from (`declared`):
- the request field `sampling_params.custom_params.radixflow_boundary` (an integer token
  count: where the prompt's shared prefix ends). SGLang passes `custom_params` untouched to the
  scheduler's Req (`/generate` `sampling_params`, the OpenAI endpoints' `custom_params` extra
  body: protocol.py `ChatCompletionRequest.custom_params` / `CompletionRequest.custom_params`);
  checked in the tokenizer manager (`boundary_problem`, adapter/validate.py): a bad value is a
  400 naming the field;
- the end of the system message when the server applies the chat template (adapter/chat.py
  `install_chat`: wraps serving_chat.py `OpenAIServingChat._convert_to_internal_request`);
- an SGLang frontend program's fork prefix, and n > 1 sampling's prefix warm-up: both reach the
  scheduler as a `max_new_tokens=0` request (lang/backend/runtime_endpoint.py `cache_prefix`,
  tokenizer_manager.py parallel sampling), whose whole input is the boundary.

How the state is published there (`BoundaryPublisher.admitted`, called from the scan right after
`add_one_req` selected the request, before `prepare_for_extend`):
- extra_buffer: `req.mamba_branching_seqlen` = the boundary's grid floor, SGLang's own
  branching checkpoint (schedule_batch.py `_mamba_radix_cache_v2_req_prepare_for_extend`
  tracks it instead of the extend's last grid depth: one tracked state per extend);
- no_buffer: the extend ends at the boundary as SGLang's one chunked request (the chunk stash
  publishes its state there; the rest runs next round and publishes its end as usual);
- full attention: nothing to do (every page is published).
The state is SGLang's own tracked state and SGLang's match decides every later reuse.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from radixflow_sglang.core.boundary import BoundaryLearner, MarkerLearner, UsageRate, wants
from radixflow_sglang.core.grid import Grid, Layout
from radixflow_sglang.core.reasons import Reason

from . import check_sglang_version
from .boundary_scan import BoundaryScan, Placement, PrefixKeys
from .placement import FIELD, PlacementTargets, PublishFacts, RoundCosts
from .placement import declared_boundary as declared_boundary
from .reqs import compute_charge
from .reuse import ReuseBook
from .slotdefer import MAX_DEFER, SlotDeferral
from .slotdefer import STALE as STALE

check_sglang_version()

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import PrefillAdder

    from radixflow_sglang.core.cost import CostCoeffs

    from .queueindex import QueueIndex

PARAMS_PATH = "sampling_params.custom_params"
FIELD_PATH = f"{PARAMS_PATH}.{FIELD}"
# NOTE: PUBLISH rules that publish the placed depth (the others leave SGLang's own)
PUBLISHED = (Reason.MOVE, Reason.CUT)

# NOTE: SGLang's JSON parser (orjson) reads an integer beyond 64 bits as a float: a bound of the
# format, not a tuning
INT64_BOUND = 2 ** 63


def boundary_problem(obj: Any, input_ids: list[int] | None) -> str | None:
    """Why this (sub-)request's boundary field is invalid, or None (no field, or a good one)."""
    sp = getattr(obj, "sampling_params", None)
    params = sp.get("custom_params") if isinstance(sp, dict) else None
    if params is not None and not isinstance(params, dict):
        # NOTE: SGLang passes any value on and every reader skips a non-object
        return (f"{PARAMS_PATH}: {params!r} is not an object; allowed: a JSON object (e.g. "
                f'{{"{FIELD}": 2048}}) or null')
    if params is None or FIELD not in params:
        return None
    b = params[FIELD]
    n = len(input_ids) if input_ids is not None else None
    allowed = f"[0, {n}] (the input's token count)" if n is not None else ">= 0"
    if isinstance(b, float) and math.isfinite(b) and b.is_integer() and abs(b) >= INT64_BOUND:
        return f"{FIELD_PATH}: {b:g} is outside {allowed}"
    if not isinstance(b, int) or isinstance(b, bool):
        return (f"{FIELD_PATH}: {b!r} is not an integer token count; allowed: an integer "
                f"in {allowed}")
    if b < 0 or (n is not None and b > n):
        return f"{FIELD_PATH}: {b} is outside {allowed}"
    return None

# NOTE: the prefix-key records are swept when they outgrow the queue this much (requests gone
# from a long queue): a memory bound, not a decision; not measured
KEYS_PER_QUEUED = 8
KEYS_SLACK = 4096


class BoundaryPublisher:
    """Moves an admitted request's one state to its declared or learned boundary. The parts,
    one concern each: `scan` (this scan's queue, adapter/boundary_scan.py, built fresh by
    `begin_scan`), `targets` and `facts` (PLACE's sources and PUBLISH's tests,
    adapter/placement.py), `book` (publications and their reuse, adapter/reuse.py), `slot`
    (chunk-slot deferrals, adapter/slotdefer.py)."""

    def __init__(self, mode: str, grid: Grid, rule: str = "optimal",
                 cost: Callable[[], CostCoeffs] | None = None) -> None:
        """`cost`: the round-cost fit a learned cut must pay for (adapter/placement.py)."""
        self.mode = mode
        self.grid = grid
        self.declared = wants(mode, "declared")
        self.learned = wants(mode, "learned")
        self.learner = BoundaryLearner(grid.size, rule=rule) if self.learned else None
        # NOTE: document ends, learned from exact divergence depths (core/boundary.py)
        self.markers = MarkerLearner() if self.learned else None
        self.costs = RoundCosts(cost)
        self.keys = PrefixKeys()  # NOTE: queued requests' prefix keys, across scans
        self.scan = BoundaryScan(keys=self.keys, step=grid.size)
        self.targets = PlacementTargets(grid, self.declared, self.learner, self.markers)
        self.book = ReuseBook(grid, self.learner)
        self.facts = PublishFacts(grid, self.costs, self.book)
        self.slot = SlotDeferral(grid, self.costs, self.targets, self.book)
        self.unpaid = 0  # learned cuts not made: the round costs more than they save

    @property
    def active(self) -> bool:
        return self.declared or self.learned

    # NOTE: read and set by the runtime and tests; each lives in the part that uses it
    @property
    def cost(self) -> Callable[[], CostCoeffs] | None:
        return self.costs.fit

    @cost.setter
    def cost(self, fit: Callable[[], CostCoeffs] | None) -> None:
        self.costs.fit = fit

    @property
    def older_by(self) -> Callable[[Req, PrefillAdder], float] | None:
        """(req, adder) -> seconds the oldest request finishing with this round arrived before
        it (the runtime's `_older_by`; None: no tail guard)."""
        return self.costs.older_by

    @older_by.setter
    def older_by(self, fn: Callable[[Req, PrefillAdder], float] | None) -> None:
        self.costs.older_by = fn

    @property
    def usage(self) -> UsageRate:
        return self.book.usage

    @usage.setter
    def usage(self, rate: UsageRate) -> None:
        self.book.usage = rate

    @property
    def placed(self) -> dict[Reason, UsageRate]:
        return self.book.placed

    @property
    def moved(self) -> dict[str, int]:
        return self.book.moved

    @property
    def deferred(self) -> int:
        return self.slot.deferred

    @property
    def cut(self) -> Req | None:
        """The request cut at its boundary this scan."""
        return self.scan.cut

    @property
    def decided(self) -> Placement | None:
        """The last `admitted` call's rules (the trace)."""
        return self.scan.decided

    def begin_scan(self, queue: QueueIndex) -> BoundaryScan:
        """A new scan over `queue` (the scan's index of SGLang's waiting queue as it begins): a
        fresh BoundaryScan, which the runtime's Scan holds; the records of requests gone from a
        long queue are dropped now and then."""
        self.scan = BoundaryScan(self.scan.number + 1, queue, self.keys, self.grid.size)
        if len(self.keys) > KEYS_PER_QUEUED * len(self.scan.queue) + KEYS_SLACK:
            self.keys.keep_only(self.scan.rids)
            self.slot.keep_only(self.scan.rids)
        return self.scan

    def end_scan(self, run: Sequence[Req]) -> None:
        """The scan's extends, for `still_deferred`."""
        if self.active:
            self.slot.end_scan(self.scan, run)

    def admitted(self, req: Req, tokens, ns, adder: PrefillAdder, cut_ok: bool,
                 tree: Any = None) -> int | None:
        """Publish `req`'s state at its boundary if one applies; returns the depth or None.
        `tokens`: its token ids; `cut_ok`: a cut may take SGLang's one chunk slot this scan;
        `tree`: the scheduler's tree cache (a fork's exact depth, for `MarkerLearner`).
        Learn from its match, decide (PLACE, PUBLISH), book and apply the decision."""
        self.scan.decided = None
        if not self.active or self.grid.layout is Layout.FULL:
            return None
        native_branch = self._native_branch(req)
        self._learn(req, tokens, ns, tree)
        decision = self._decide(req, tokens, ns, adder, cut_ok, native_branch)
        return self._book(req, tokens, ns, adder, native_branch, decision)

    def _learn(self, req: Req, tokens, ns, tree: Any) -> None:
        """What this selected request's match teaches: the learner's event, a fork's exact
        depth, template pieces, and the published states and placements it resumes from."""
        prefix, branching = req.prefix_len, req.mamba_branching_seqlen
        if self.learner is not None:
            self.book.observe(tokens, ns, prefix, branching)
            self._observe_fork(req, tokens, tree, prefix, branching)
            if self.markers is not None:
                self.markers.infer(tokens, ns)  # NOTE: template pieces, before a tree fork
        self.book.hits(self.keys, req, tokens, ns, prefix, self.markers is not None)
        self.scan.selected.add(req.rid)

    def _decide(self, req: Req, tokens, ns, adder: PrefillAdder, cut_ok: bool,
                native_branch: bool) -> Placement:
        """PLACE, then PUBLISH (core/boundary.py `place_rule`, `publish_rule`) on the match
        and the scan's queue: the placement (`depth`: where PLACE put it; no mark yet)."""
        prefix, extend = req.prefix_len, req.extend_end - req.prefix_len
        placed, depth = self.targets.target(self.scan, req, ns, prefix, extend, native_branch,
                                            adder)
        source = _source(placed)
        if source is None:
            return Placement(placed, None, depth, None)
        if source in self.book.placed and depth is not None:
            # NOTE: watched whatever PUBLISH does, and before it: a learned cut's expected
            # users read the rate of its source's placements, this one included
            self.book.place(self.scan, req, tokens, ns, depth, source,
                            self.grid.planned_depth(prefix, extend, None))
        how = self.facts.rule(self.scan, req, tokens, ns, depth, adder, cut_ok, source)
        return Placement(placed, how, depth, None)

    def _book(self, req: Req, tokens, ns, adder: PrefillAdder, native_branch: bool,
              decision: Placement) -> int | None:
        """Apply the decision to `req` and the round, book what it publishes (or, nothing
        published, its fork mark) and what the learner should expect; the depth published."""
        source, depth = _source(decision.placed), decision.depth
        prefix, extend = req.prefix_len, req.extend_end - req.prefix_len
        self._apply(req, depth, decision.how, adder)
        if decision.how in PUBLISHED:
            marker = self.targets.chosen.get(depth) if source == Reason.MARKER else None
            self.book.published(self.scan, req, tokens, ns, depth, source, marker)
        else:
            depth = None
            m = self.targets.fork_mark(self.scan, req, ns, prefix, extend, native_branch)
            if m is not None:
                self.scan.fork_marks[req.rid] = m
        self.scan.decided = Placement(decision.placed, decision.how, depth,
                                      self.fork_mark(req.rid))
        if self.learner is not None:
            self.book.record(self.scan.cut, req, tokens, ns, depth, native_branch, source)
        return depth

    def _apply(self, req: Req, depth: int | None, how: Reason | None,
               adder: PrefillAdder) -> None:
        """What PUBLISH rule `how` does to `req` and the round."""
        if how is Reason.MOVE:
            req.mamba_branching_seqlen = depth  # NOTE: read by prepare_for_extend
        elif how is Reason.CUT:
            cut_chunk(req, depth, adder)
            self.scan.cut = req
        elif how is Reason.CUT_UNPAID:
            self.unpaid += 1  # NOTE: a guessed boundary's cut must pay for its round

    def _native_branch(self, req: Req) -> bool:
        # NOTE: SGLang already publishes where this request leaves a cached path: keep it.
        prefix, branching = req.prefix_len, req.mamba_branching_seqlen
        return branching is not None and self.grid.layout is Layout.EXTRA_BUFFER and \
            self.grid.branch_ok(prefix, req.extend_end - prefix, branching)

    def _observe_fork(self, req: Req, tokens, tree: Any, prefix: int,
                      branching: int | None) -> None:
        """A request that leaves a cached path past its ready prefix: learn the text before
        its exact divergence depth (SGLang keeps only its grid floor: one more tree walk)."""
        if branching is None or branching <= prefix or tree is None:
            return
        hit = kv_hit_length(tree, req, tokens)
        if hit is not None and hit < req._compute_max_prefix_len(len(tokens)):
            self.markers.observe(tokens, hit)  # NOTE: capped at len - 1: a repeat, no fork

    def fork_mark(self, rid: str) -> int | None:
        """The depth a fork cut of `rid` should go to instead of its consumers' fork (core
        Producer.mark), or None."""
        m = self.scan.fork_marks.get(rid)
        return None if m is None else m[0]

    def fork_cut(self, req: Req, tokens, ns, depth: int) -> None:
        """The traversal cut `req` at its fork mark for waiting consumers: book it as a
        marker publication (its later reuse teaches the marker's usage rate)."""
        m = self.scan.fork_marks.pop(req.rid, None)
        if m is not None and m[0] == depth:
            self.book.published(self.scan, req, tokens, ns, depth, "fork_mark", m[1])

    def defer(self, req: Req, tokens, ns, adder: PrefillAdder, slot_next: bool, running: int,
              cap: int = MAX_DEFER) -> bool:
        """no_buffer: skip `req` this round for SGLang's one chunk slot (adapter/slotdefer.py
        `SlotDeferral.defer`)."""
        if not self.active:
            return False
        return self.slot.defer(self.scan, req, tokens, ns, adder, slot_next, running, cap)

    def still_deferred(self, req: Req, tokens, ns, adder: PrefillAdder, slot_next: bool,
                       running: int, cap: int = MAX_DEFER) -> bool:
        """A recent scan's slot deferral, again, before SGLang's match (adapter/slotdefer.py
        `SlotDeferral.still_deferred`)."""
        return self.slot.still_deferred(self.scan, req, tokens, ns, adder, slot_next, running,
                                        cap)

    def records(self) -> int:
        """Requests with a record kept across scans (prefix keys, slot deferrals)."""
        return len(self.keys.rids() | self.slot.rids())

    def forget(self, rid: str) -> None:
        """`rid` left the queue (selected, aborted, retracted): drop what is kept of it across
        scans (its prefix keys, chunk-slot deferrals). Called by the runtime's `forget`."""
        self.keys.forget(rid)
        self.slot.forget(rid)

    def summary(self) -> dict:
        return {"mode": self.mode, "moved_declared": self.moved["declared"],
                "moved_learned": self.moved["learned"], "moved_marker": self.moved["marker"],
                "moved_repeat": self.moved["repeat"],
                "moved_queued_fork": self.moved["queued_fork"],
                "fork_marks": self.moved["fork_mark"],
                "deferred": self.deferred,
                "cuts_unpaid": self.unpaid,
                "reused_share": round(self.usage.rate, 3),
                "placed_reused_share": {str(r): round(u.exposed_rate, 3)
                                        for r, u in self.placed.items()}}


def _source(placed: Reason) -> Reason | None:
    """The PLACE rule that placed a boundary, or None (nothing placed)."""
    return placed if placed not in (Reason.NO_BOUNDARY, Reason.NATIVE_BRANCH) else None


def cut_chunk(req: Req, depth: int, adder: PrefillAdder) -> None:
    """End `req`'s extend at `depth` as SGLang's one chunked request, returning the compute
    budget the cut frees: a boundary's cut, and a no_buffer fork's (adapter/runtime.py
    `_apply_fork`)."""
    assert depth % adder.page_size == 0 and req.prefix_len < depth < req.extend_end
    old = req.extend_end - req.prefix_len
    cut = req.extend_end - depth
    req.extend_end = depth
    adder.new_chunked_req = req
    # NOTE: KV stays reserved for the whole request: conservative, never short.
    refund = compute_charge(adder, old) - compute_charge(adder, depth - req.prefix_len)
    adder.rem_input_tokens += refund
    if adder.rem_chunk_tokens is not None:
        adder.rem_chunk_tokens += refund
    adder.log_input_tokens -= cut


def kv_hit_length(tree, req: Req, tokens) -> int | None:
    """The request's Full-KV hit (SGLang's `MatchResult.full_kv_hit_length`, which
    `match_kv_cache` does not keep on the Req): a tree walk as unified_radix_cache.py
    `UnifiedRadixCache.touch_prefix` does it (no finalizers, no copy-on-write); None for a
    cache without a tree core."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.common import _req_radix_key

    core = getattr(tree, "tree_core", None)
    if core is None or getattr(tree, "disable", False):
        return None
    key = _req_radix_key(tree, req, tokens, req._compute_max_prefix_len(len(tokens)))
    res = core.match_prefix(MatchPrefixParams(key=key))
    tree._apply_cache_actions(res.cache_actions)
    return getattr(res, "full_kv_hit_length", None)


def state_near(tree, req: Req, tokens, depth: int, within: int, mamba: bool) -> bool:
    """Whether the tree holds on the device a node on `req`'s path that ends in (depth -
    within, depth] and (`mamba`) keeps a mamba state: SGLang's match then gives a ready prefix
    past depth - within. Read-only (no split, no LRU refresh: SGLang's
    `match_full_device_prefix`, `collect_path_info` and `get_component_device_value`,
    mem_cache/unified_cache/unified_tree_core_interface.py, both tree cores), so a request
    SGLang's scan does not visit is left as stock leaves it."""
    from sglang.srt.mem_cache.common import _req_radix_key

    core = getattr(tree, "tree_core", None)
    if core is None or getattr(tree, "disable", False) or depth <= 0 or within <= 0:
        return False
    match = core.match_full_device_prefix(_req_radix_key(tree, req, tokens, depth))
    return _state_within(core, match, depth, within, mamba)


def _state_within(core, match: tuple[int, Any, int], depth: int, within: int,
                  mamba: bool) -> bool:
    """`state_near` past its walk: `match` is `match_full_device_prefix`'s (matched, node,
    pinned) for the request's path cut at `depth`."""
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    matched, node, pinned = match
    if matched <= depth - within:
        return False  # NOTE: not cached that far

    def kept(n) -> bool:
        return not mamba or core.get_component_device_value(n, ComponentType.MAMBA) is not None

    if matched == depth == pinned and kept(node):
        return True  # NOTE: the usual case, a state exactly there: no path walk
    # NOTE: only nodes wholly on the request's path count (matched <= depth: the key stops
    # there): the deepest one may run past the depth asked, or leave the path inside it
    for info in reversed(core.collect_path_info([node])[0]):
        if info.path_end <= depth - within:
            return False
        if info.path_end <= matched and kept(info.node_id):
            return True
    return False


def state_covers(tree, req: Req, tokens, within: int, mamba: bool) -> bool:
    """Whether `req`'s ready prefix covers what the tree shares with it: the device KV it
    matches (to SGLang's max prefix) is >= `within` deep and a state sits within `within` of
    its end (`state_near`), so its extend is what no request computed. Read-only."""
    from sglang.srt.mem_cache.common import _req_radix_key

    core = getattr(tree, "tree_core", None)
    if core is None or getattr(tree, "disable", False):
        return False
    depth = req._compute_max_prefix_len(len(tokens))
    if depth < within:
        return False
    match = core.match_full_device_prefix(_req_radix_key(tree, req, tokens, depth))
    # NOTE: `state_near` at the matched depth, on this walk: the path cut there (page-aligned,
    # as the walk's) ends at the same node with the same counts, so a second walk adds nothing
    return within > 0 and match[0] >= within and _state_within(core, match, match[0], within,
                                                               mamba)
