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

import itertools
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixflow_sglang.core.boundary import (
    CONTINUATION,
    BoundaryLearner,
    MarkerLearner,
    UsageRate,
    consumers,
    defer_wins,
    place,
    place_rule,
    publish_at,
    publish_rule,
    wants,
)
from radixflow_sglang.core.cost import CostCoeffs, cut_pays, cut_raises_tail, measured
from radixflow_sglang.core.grid import Grid, Layout
from radixflow_sglang.core.producers import as_tokens, common_prefix
from radixflow_sglang.core.reasons import Reason

from . import check_sglang_version
from .reqs import budget_left, compute_charge, namespace, req_len, req_tokens

check_sglang_version()

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import PrefillAdder

FIELD = "radixflow_boundary"
KEYS = 16_384  # boundary publications remembered (a group already served)
MAX_DEFER = 16  # rounds a request may be deferred for the chunk slot (bounds its latency)
STALE = 2  # scans a slot deferral is remembered without a match (`still_deferred`)
PARAMS_PATH = "sampling_params.custom_params"
FIELD_PATH = f"{PARAMS_PATH}.{FIELD}"


def declared_boundary(req: Req, native_branch: bool = False) -> int | None:
    """The request's declared boundary (tokens from the start), or None. A prefix warm-up's
    implicit one (`max_new_tokens` 0) yields to SGLang's own branching checkpoint
    (`native_branch`: the match carries the depth where this prompt leaves a cached one):
    extra_buffer tracks one state per extend, and moved to the warm-up's end it left every
    later prompt on the same system prompt to recompute it (n = 8 rollouts on a 1,000-token
    system prompt: 2.1x stock's prefill tokens; tests/test_engine.py)."""
    sp = req.sampling_params
    params = getattr(sp, "custom_params", None)
    if isinstance(params, dict):
        b = params.get(FIELD)
        if isinstance(b, int) and not isinstance(b, bool) and b > 0:
            return b
    if getattr(sp, "max_new_tokens", None) == 0 and not native_branch:
        # NOTE: a frontend fork's prefix / n>1 warm-up; its identical copies match at most
        # len - 1 tokens (SGLang keeps one token to compute), so the state must lie below len
        return len(req.origin_input_ids) - 1 or None
    return None


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
    if isinstance(b, float) and math.isfinite(b) and b.is_integer() and abs(b) >= 2 ** 63:
        # NOTE: SGLang's JSON parser (orjson) reads an integer beyond 64 bits as a float
        return f"{FIELD_PATH}: {b:g} is outside {allowed}"
    if not isinstance(b, int) or isinstance(b, bool):
        return (f"{FIELD_PATH}: {b!r} is not an integer token count; allowed: an integer "
                f"in {allowed}")
    if b < 0 or (n is not None and b > n):
        return f"{FIELD_PATH}: {b} is outside {allowed}"
    return None


LEARNED_SOURCES = (Reason.MARKER, Reason.REPEAT, Reason.LEARNED)
SHARERS = 32  # NOTE: queued sharers a placement reads (a bound on a scan's LCP work)


@dataclass(frozen=True)
class Placed:
    """A learned boundary placed on a request: who placed it, its own publish depth and that
    prefix's key (a later request sharing it is a continuation), the siblings queued then."""

    rid: str
    end: int | None
    end_key: tuple | None
    sibs: frozenset[str]


@dataclass(frozen=True)
class Placement:
    """The last selected request's boundary decision: the PLACE rule, the PUBLISH rule (None
    when nothing was placed), the depth published (None: SGLang's own) and its no_buffer mark."""

    placed: Reason
    how: Reason | None
    depth: int | None
    mark: int | None


class BoundaryPublisher:
    """Moves an admitted request's one state to its declared or learned boundary."""

    def __init__(self, mode: str, grid: Grid, rule: str = "optimal",
                 keep_end: bool | None = None, cost: Callable[[], CostCoeffs] | None = None,
                 ) -> None:
        """`keep_end` (extra_buffer): True: cut the extend at the boundary (when SGLang's one
        chunk slot is free) so its end state is published too, one round later; False: move
        the one tracked state (the end state is lost); None: cut only when recomputing the
        lost tail costs more than the extra round (`cost`: the runtime's round-cost fit)."""
        self.mode = mode
        self.grid = grid
        self.declared = wants(mode, "declared")
        self.learned = wants(mode, "learned")
        self.learner = BoundaryLearner(grid.size, rule=rule) if self.learned else None
        # NOTE: document ends, learned from exact divergence depths (core/boundary.py)
        self.markers = MarkerLearner() if self.learned else None
        self._marked: dict[tuple, tuple] = {}  # key -> (marker, siblings queued then)
        self._chosen: dict = {}  # depth -> marker, of the last marker target
        self._fork_marks: dict[str, tuple[int, object]] = {}  # rid -> (depth, marker), a scan
        self._selected: set[str] = set()  # rids selected this scan
        self.keep_end = keep_end
        self.cost = cost
        # NOTE: (req, adder) -> seconds the oldest request finishing with this round arrived
        # before it (the runtime's `_older_by`; None: no tail guard)
        self.older_by: Callable[[Req, PrefillAdder], float] | None = None
        self.moved = {"declared": 0, "learned": 0, "marker": 0, "repeat": 0, "queued_fork": 0,
                      "fork_mark": 0}
        self.deferred = 0  # rounds requests were deferred for the chunk slot (no_buffer)
        self.skipped = 0  # no_buffer cuts not made: no user expected, the slot wanted by others
        self.unpaid = 0  # no_buffer learned cuts not made: the round costs more than they save
        self.cut: Req | None = None  # the request cut at its boundary this scan
        self.decided: Placement | None = None  # the last `admitted` call's rules (the trace)
        self._queue: list = []  # this scan's waiting queue (rank-identical)
        self._queue_rids: set[str] = set()
        self._groups: dict[int, dict[tuple, int]] = {}  # depth -> key -> queued requests
        self._heads: dict[tuple, list] | None = None  # key at one grid step -> queued (a scan)
        self._pos: dict[str, int] = {}  # rid -> queue position (a scan)
        self._cum: list[int] | None = None  # demand prefix sums of the queue (`_between`)
        self._slot_keys: dict[tuple, None] = {}  # keys deferred for the slot this scan, in order
        self._serving: set[tuple] = set()  # keys published at their boundary this scan
        self._hashes: dict[str, dict[int, tuple]] = {}  # rid -> depth -> key, across scans
        self._defers: dict[str, int] = {}  # rid -> rounds deferred
        # NOTE: rid -> (scan, ready prefix, cut depth, key, users) of its last slot deferral
        self._slot_waits: dict[str, tuple[int, int, int, tuple, float]] = {}
        self._scans = 0
        # NOTE: (scan, [(namespace, tokens, extend end)]) of the last scans' extends: no_buffer
        # publishes each one's state at its end
        self._extends: deque[tuple[int, list[tuple]]] = deque(maxlen=STALE)
        self._done: dict[tuple, None] = {}  # keys published at a boundary (bounded, ordered)
        self.usage = UsageRate()  # how often a boundary state was reused (future users)
        # NOTE: per learned PLACE source, how often a later request shared a placed prefix to
        # its depth but not to the placing request's own end (what only that state serves),
        # published or not: a learned cut's expected users, with evidence after declining
        self.placed = {r: UsageRate() for r in LEARNED_SOURCES}
        self._placements: dict[tuple, Placed] = {}  # key (ns, depth, prefix hash) -> record

    @property
    def active(self) -> bool:
        return self.declared or self.learned

    def begin_scan(self, queue=()) -> None:
        self._scans += 1
        self.cut = None
        self.decided: Placement | None = None
        self._queue = list(queue)
        self._queue_rids = {r.rid for r in self._queue}
        self._groups = {}
        self._heads = None
        self._pos = {}
        self._cum = None
        self._serving = set()
        self._selected = set()
        self._fork_marks = {}
        self._slot_keys = {}
        if len(self._hashes) > 8 * len(self._queue) + 4096:
            live = self._queue_rids
            self._hashes = {k: v for k, v in self._hashes.items() if k in live}
            self._defers = {k: v for k, v in self._defers.items() if k in live}
            self._slot_waits = {k: v for k, v in self._slot_waits.items() if k in live}

    def admitted(self, req: Req, tokens, ns, adder: PrefillAdder, cut_ok: bool,
                 tree=None) -> int | None:
        """Publish `req`'s state at its boundary if one applies; returns the depth or None.
        `tokens`: its token ids; `cut_ok`: a cut may take SGLang's one chunk slot this scan;
        `tree`: the scheduler's tree cache (a fork's exact depth, for `MarkerLearner`)."""
        self.decided = None
        if not self.active or self.grid.layout is Layout.FULL:
            return None
        prefix, end = req.prefix_len, req.extend_end
        branching = req.mamba_branching_seqlen
        native_branch = self._native_branch(prefix, end - prefix, branching)
        if self.learner is not None:
            key = _key(ns, tokens, prefix) if prefix > 0 else None
            self.learner.observe(ns, prefix, key, branching,
                                 self._is_repeat(tokens, ns, prefix, key))
            self._observe_fork(req, tokens, tree, prefix, branching)
            if self.markers is not None:
                self.markers.infer(tokens, ns)  # NOTE: template pieces, before a tree fork
        if prefix > 0 and self.usage.watching(prefix):
            self.usage.hit(_key(ns, tokens, prefix))
        if prefix > 0 and self.markers is not None:
            self._marker_hit(req, tokens, ns, prefix)
        if self._placements:
            self._placement_hits(req, tokens, ns, prefix)
        self._selected.add(req.rid)
        placed, depth = self._target(req, ns, prefix, end - prefix, native_branch, adder)
        source = placed if placed not in (Reason.NO_BOUNDARY, Reason.NATIVE_BRANCH) else None
        if source in self.placed and depth is not None:
            self._place(req, tokens, ns, depth, source,
                        self.grid.planned_depth(prefix, end - prefix, None))
        how = None if source is None else self._publish(req, tokens, ns, depth, adder, cut_ok,
                                                        source)
        if how in (Reason.KEEP_END, Reason.MOVE, Reason.CUT):
            marker = self._chosen.get(depth) if source == Reason.MARKER else None
            self._published(req, tokens, ns, depth, source, marker)
        else:
            depth = None
            self._fork_mark(req, ns, prefix, end - prefix, native_branch)
        self.decided = Placement(placed, how, depth, self.fork_mark(req.rid))
        if self.learner is not None:
            self._record(req, tokens, ns, depth, native_branch, source)
        return depth

    def _fork_mark(self, req: Req, ns, prefix: int, extend: int, native_branch: bool) -> None:
        """no_buffer, nothing published: the marker depth (template pieces included) where a
        fork cut would serve more than at the fork, for `fork_mark` (docs/design.md, "A cut the
        traversal makes anyway")."""
        if (self.grid.layout is not Layout.NO_BUFFER or self.markers is None or native_branch
                or (self.declared and declared_boundary(req, native_branch) is not None)):
            return
        native = self.grid.planned_depth(prefix, extend, None)
        d = self._marker_target(req, ns, prefix, extend, native, pieces=True)
        if d is not None and d in self._chosen:
            self._fork_marks[req.rid] = (d, self._chosen[d])

    def fork_mark(self, rid: str) -> int | None:
        """The depth a fork cut of `rid` should go to instead of its consumers' fork (core
        Producer.mark), or None."""
        m = self._fork_marks.get(rid)
        return None if m is None else m[0]

    def fork_cut(self, req: Req, tokens, ns, depth: int) -> None:
        """The traversal cut `req` at its fork mark for waiting consumers: book it as a
        marker publication (its later reuse teaches the marker's usage rate)."""
        m = self._fork_marks.pop(req.rid, None)
        if m is not None and m[0] == depth:
            self._published(req, tokens, ns, depth, "fork_mark", m[1])

    def _published(self, req: Req, tokens, ns, depth: int, source: str, marker) -> None:
        """Book a state `req` publishes at `depth` (`source` counts it in `moved`; a `marker`
        watches its reuse)."""
        self.moved[source] += 1
        key = self._key_of(req, tokens, ns, depth)
        if marker is not None:
            self._mark(req, tokens, ns, depth, key, marker)
        self._serving.add(key)
        self._done[key] = None
        self.usage.published(key, depth)
        if len(self._done) > KEYS:
            self._done.pop(next(iter(self._done)))

    def _is_repeat(self, tokens, ns, prefix: int, key: tuple | None) -> bool:
        """Was this request's whole matchable prompt (length - 1) cached already? Its ready
        prefix reaches it, it resumes from a state placed for repeats, or an earlier request
        of the same tokens published its state at this exact length (which no identical copy
        can match: the live nsample burst's first copy, alone in its round)."""
        n = len(tokens)
        if key is not None and (prefix >= n - 1 or self.learner.kind(key) == "repeat"):
            return True
        return self.learner.publishes_at(n) and self.learner.kind(_key(ns, tokens, n)) is not None

    def _target(self, req: Req, ns, prefix: int, extend: int, native_branch: bool,
                adder: PrefillAdder) -> tuple[Reason, int | None]:
        """Where this extend should publish: the PLACE rule that fired and its depth (core/
        boundary.py `place_rule`: declared, else learned: a marker first, since it finds this
        request's own document end, where a depth learned from other paths is only right when
        their documents are as long)."""
        b = declared_boundary(req, native_branch) if self.declared else None
        native = (self.grid.planned_depth(prefix, extend, None)
                  if self.learner is not None and not native_branch else None)

        def learned() -> int | None:
            guess = self.learner.predict(ns, prefix, native)
            d = None if guess is None else publish_at(self.grid, guess, prefix, extend)
            return d if d is not None and not self._queued_past(req, ns, d) else None

        return place_rule(
            None if b is None else lambda: publish_at(self.grid, b, prefix, extend),
            self.learner is not None, native_branch,
            lambda: self._marker_target(req, ns, prefix, extend, native),
            lambda: self._repeat_target(req, ns, prefix, extend, native),
            lambda: self._queued_target(req, ns, prefix, extend, native, adder), learned)

    def _queued_past(self, req: Req, ns, depth: int) -> bool:
        """An unselected queued request shares `req`'s tokens past `depth`: its fork, deeper,
        is known demand the traversal publishes for; a depth learned from other paths is a
        guess and must not take the one state from it (a 2,000-token document's siblings
        found only the 1,152 learned from shorter documents and recomputed the rest)."""
        tokens = req_tokens(req)
        d = depth + self.grid.size
        if d >= len(tokens):
            return False
        key = self._key_of(req, tokens, ns, d)
        n = self._groups_at(d).get(key, 0) - (1 if req.rid in self._queue_rids else 0)
        return n > 0

    def _repeat_target(self, req: Req, ns, prefix: int, extend: int,
                       native: int | None) -> int | None:
        """Identical copies of this prompt are expected (the namespace repeats prompts): the
        deepest depth they can match, length - 1 (its grid floor), instead of the prompt's end
        (core/boundary.py `BoundaryLearner.repeat_wins`). no_buffer cuts there (the rest, one
        token, publishes the end next round); extra_buffer moves its one tracked state."""
        n = len(req_tokens(req))
        if prefix + extend != n:
            return None  # NOTE: a chunk that does not reach the end: nothing to move
        d = publish_at(self.grid, n - 1, prefix, extend)
        if d is None or not self.learner.repeat_wins(ns, prefix, native, d):
            return None
        return d

    def _queued_target(self, req: Req, ns, prefix: int, extend: int, native: int | None,
                       adder: PrefillAdder) -> int | None:
        """The depth where the one state serves most (core/boundary.py `place`) among the
        forks of the queued requests this round cannot take that share this extend past its
        ready prefix (known demand, 1 each) and the continuations of its end (the namespace's
        share); None: its end serves most, or no such request. The scan's traversal moves a
        producer to the fork of each consumer it visits (`_apply_fork`); this serves those a
        full budget leaves unvisited (a burst: the budget fills with each group's first
        requests before their siblings are reached)."""
        if native is None or (self.grid.layout is Layout.NO_BUFFER and self._has_mark(
                req, ns, prefix, extend, native)):
            return None
        tokens = req_tokens(req)
        left, siblings = budget_left(adder), 0
        points = []
        for r, overlap in self._queued_sharers(req, tokens, ns):
            need = req_len(r) - r.prefix_len
            # NOTE: the round may reach and take it (the traversal's case): the demand queued
            # between them fits, less the other sharers between (Blocked by `req`, they park)
            reach = self._between(req, r)
            if reach is not None:
                reachable = reach - siblings <= left
                siblings += need
                if reachable:
                    continue
            if overlap <= max(prefix, r.prefix_len):
                continue  # NOTE: its own ready prefix reaches the fork: no state needed
            d = publish_at(self.grid, overlap, prefix, extend)
            points.append((native if d is None else d, 1.0))
        if not points:
            return None
        points.append((native, self._continuations(ns)))
        return place(prefix, native, points)

    def _between(self, req: Req, r: Req) -> int | None:
        """The demand (input lengths less ready prefixes: an upper bound) queued after `req` up
        to and including `r`; None when `r` comes before it (the scan has passed it)."""
        if self._cum is None:
            self._pos = {q.rid: i for i, q in enumerate(self._queue)}
            self._cum = list(itertools.accumulate(
                (req_len(q) - q.prefix_len for q in self._queue), initial=0))
        i, j = self._pos.get(req.rid, -1), self._pos.get(r.rid)
        return None if j is None or j < i else self._cum[j + 1] - self._cum[i + 1]

    def _has_mark(self, req: Req, ns, prefix: int, extend: int, native: int) -> bool:
        """no_buffer: a learned marker or piece lies in the extend, so a request that cuts
        nothing at admission gets it as its mark (`_fork_mark`): the traversal's fork cut at
        it serves the document's later questions too; a cut at the siblings' fork, made now,
        would not (docs/notes/2026-12-queued-forks.md: the paper mix, 4 %)."""
        return self.markers is not None and self._marker_target(
            req, ns, prefix, extend, native, pieces=True) is not None

    def _queued_sharers(self, req: Req, tokens, ns) -> list[tuple[Req, int]]:
        """(request, the prefix it can match of `req`'s tokens) for the queued requests not
        selected this scan that share `req`'s first grid step, at most SHARERS, in queue
        order (rank-identical)."""
        if len(tokens) <= self.grid.size:
            return []
        out, mine = [], as_tokens(tokens)
        for r in self._head_sharers(req, tokens, ns):
            t = req_tokens(r)
            # NOTE: a request matches at most its length - 1 (SGLang keeps one token to run)
            out.append((r, min(common_prefix(as_tokens(t), mine), len(t) - 1)))
            if len(out) >= SHARERS:
                break
        return out

    def _head_sharers(self, req: Req, tokens, ns):
        """The queued requests, not `req` and not selected this scan, longer than one grid
        step and sharing `req`'s first one (its namespace included), in queue order: one
        index per scan instead of a pass over the queue per request."""
        g = self.grid.size
        if self._heads is None:
            self._heads = {}
            for r in self._queue:
                t = req_tokens(r)
                if len(t) > g:
                    self._heads.setdefault(self._key_of(r, t, namespace(r), g), []).append(r)
        return (r for r in self._heads.get(self._key_of(req, tokens, ns, g), ())
                if r is not req and r.rid not in self._selected)

    # --- learned document ends (core/boundary.py MarkerLearner) ---------------------------------
    def _observe_fork(self, req: Req, tokens, tree, prefix: int, branching: int | None) -> None:
        """A request that leaves a cached path past its ready prefix: learn the text before
        its exact divergence depth (SGLang keeps only its grid floor: one more tree walk)."""
        if branching is None or branching <= prefix or tree is None:
            return
        hit = kv_hit_length(tree, req, tokens)
        if hit is not None and hit < req._compute_max_prefix_len(len(tokens)):
            self.markers.observe(tokens, hit)  # NOTE: capped at len - 1: a repeat, no fork

    def _marker_target(self, req: Req, ns, prefix: int, extend: int,
                       native: int | None, pieces: bool | None = None) -> int | None:
        """A depth right after a learned marker, where the one state serves more requests than
        where it would go (core/boundary.py `place`), or None. `pieces`: template pieces are
        candidates too (default: extra_buffer only)."""
        if native is None:
            return None
        tokens = req_tokens(req)
        # NOTE: template pieces are guesses: extra_buffer moves its one state for free, a
        # no_buffer cut costs the request a round (docs/design.md, "A guess never costs a round")
        if pieces is None:
            pieces = self.grid.layout is Layout.EXTRA_BUFFER
        cands = self.markers.candidates(tokens, prefix, prefix + extend, pieces=pieces)
        if not cands:
            return None
        points = []
        self._chosen = {}
        for pos, m in cands:
            d = publish_at(self.grid, pos, prefix, extend)
            if d is not None:
                points.append((d, m.usage.rate))
                self._chosen.setdefault(d, m)
        if not points:
            return None
        low = min(d for d, _ in points)
        for common in self._sibling_depths(req, tokens, ns, low):
            d = publish_at(self.grid, common, prefix, extend)
            points.append((native if d is None else d, 1.0))
        points.append((native, self._continuations(ns)))
        return place(prefix, native, points)

    def _sibling_depths(self, req: Req, tokens, ns, low: int) -> list[int]:
        """Common prefix with each queued request (not selected) that shares `low` tokens."""
        # NOTE: sharing `low` >= one grid step, it shares the first: `_head_sharers` has it
        pool = (self._head_sharers(req, tokens, ns) if low >= self.grid.size else
                (r for r in self._queue if r is not req and r.rid not in self._selected))
        head = tokens[:low]
        out = []
        for r in pool:
            t = req_tokens(r)
            if len(t) > low and namespace(r) == ns and t[:low] == head:
                out.append(common_prefix(t, tokens))
        return out

    def _continuations(self, ns) -> float:
        """The share of this namespace's reuse events that continued an end state."""
        ev = self.learner.events(ns)
        return sum(1 for _, k in ev if k == CONTINUATION) / len(ev) if ev else 0.0

    def _mark(self, req: Req, tokens, ns, depth: int, key: tuple, marker) -> None:
        """Watch a state published after `marker`: used when a later request (not a sibling
        queued now) resumes from it."""
        sibs = frozenset(r.rid for r in self._queue if r is not req
                         and req_tokens(r)[:depth] == tokens[:depth])
        marker.usage.published(key, depth)
        self._marked[key] = (marker, sibs)
        if len(self._marked) > KEYS:
            self._marked.pop(next(iter(self._marked)))

    # --- learned placements' reuse (a learned cut's expected users) ----------------------------
    def _place(self, req: Req, tokens, ns, depth: int, source: Reason, end: int | None) -> None:
        """Watch a learned boundary placed on `req` at `depth` (its own publish depth `end`),
        whatever PUBLISH then does: a later request that shares its prefix to `depth` (not a
        sibling queued now: `_users` counts those) uses it (`_placement_hits`)."""
        key = self._key_of(req, tokens, ns, depth)
        if key in self._placements:
            return  # NOTE: the prefix was placed before: one placement, one outcome
        self._groups_at(depth)  # NOTE: keys every queued request at this depth
        sibs = frozenset(r.rid for r in self._queue if r is not req
                         and self._hash(r.rid, depth) == key)
        end_key = (self._key_of(req, tokens, ns, end)
                   if end is not None and depth < end <= len(tokens) else None)
        self._placements[key] = Placed(req.rid, end, end_key, sibs)
        self.placed[source].published(key, depth)
        if len(self._placements) > KEYS:
            self._placements.pop(next(iter(self._placements)))

    def _placement_hits(self, req: Req, tokens, ns, prefix: int) -> None:
        """`req` uses each open placement whose prefix it shares (its ready prefix not past
        it: no deeper state served it) but not to the placing request's own publish depth
        (there SGLang's own state serves it without any boundary)."""
        n = len(tokens)
        for rate in self.placed.values():
            for d in rate.open_depths():
                if not prefix <= d < n:
                    continue
                key = self._key_of(req, tokens, ns, d)
                p = self._placements.get(key)
                if p is None or p.rid == req.rid or req.rid in p.sibs:
                    continue
                if p.end_key is not None and p.end < n and \
                        self._key_of(req, tokens, ns, p.end) == p.end_key:
                    continue  # NOTE: a continuation of its end: served natively
                rate.hit(key)

    def _marker_hit(self, req: Req, tokens, ns, prefix: int) -> None:
        hit = self._marked.get(_key(ns, tokens, prefix)) if self._marked else None
        if hit is not None and req.rid not in hit[1]:
            hit[0].usage.hit(_key(ns, tokens, prefix))

    def defer(self, req: Req, tokens, ns, adder: PrefillAdder, slot_next: bool, running: int,
              cap: int = MAX_DEFER) -> bool:
        """no_buffer: whether to skip `req` this round (before it consumes anything) because its
        boundary cut cannot get SGLang's one chunk slot now (`adder.new_chunked_req` is taken)
        but can next round (`slot_next`: no native chunk continues past this round), and
        waiting for it pays (core/boundary.py `defer_wins`; behind it: the unselected queue
        and the `running` requests). At most `cap` rounds each."""
        if (not self.active or self.grid.layout is not Layout.NO_BUFFER or not slot_next
                or adder.new_chunked_req is None):
            return False
        prefix = req.prefix_len
        extend = len(tokens) - prefix
        source, depth = self._target(req, ns, prefix, extend, False, adder)
        if depth is None or self._defers.get(req.rid, 0) >= cap:
            return False
        key = self._key_of(req, tokens, ns, depth)
        if key in self._serving:
            return False  # NOTE: a sibling publishes there this round: traversal's case
        users = self._users(req, tokens, ns, depth, key, adder, source)
        if not self._defer_wins(req, tokens, prefix, depth, key, users, adder, running):
            return False
        return self._deferred(req.rid, prefix, depth, key, users)

    def _deferred(self, rid: str, prefix: int, depth: int, key: tuple, users: float) -> bool:
        """Book a slot deferral (counted, capped, remembered for `still_deferred`); True."""
        self._defers[rid] = self._defers.get(rid, 0) + 1
        self.deferred += 1
        self._slot_keys[key] = None
        self._slot_waits[rid] = (self._scans, prefix, depth, key, users)
        return True

    def _defer_wins(self, req: Req, tokens, prefix: int, depth: int, key: tuple,
                    users: float, adder: PrefillAdder, running: int) -> bool:
        """core/boundary.py `defer_wins`; behind the request: the unselected queue and the
        `running` requests; ahead of it: the other groups deferred for the slot this scan, when
        its users are queued now (docs/design.md, "The chunk slot")."""
        c = self.cost() if self.cost is not None else None
        if c is None:
            return False
        picked = sum(1 for r in adder.can_run_list if r.rid in self._queue_rids)
        behind = max(len(self._queue) - picked - 1, 0) + running
        # NOTE: the slot serves one group's cut a round, in queue order, so the groups deferred
        # before it delay its cut a round each. A group queued together saves that wait by not
        # deferring (its members run now, recomputing, as stock's do); siblings still to come
        # wait for a cut whenever they arrive, so a lone request's deferral costs its usual
        # two rounds. A group: requests with its key in this scan's queue, selected or not.
        ahead = 0
        if self._groups_at(depth).get(key, 0) > 1:
            ahead = sum(1 for k in self._slot_keys if k != key)
        return defer_wins(c, depth - prefix, len(tokens) - depth, behind, users, ahead)

    def end_scan(self, run: Sequence[Req]) -> None:
        """The scan's extends (no_buffer: each publishes its state at its end), for
        `still_deferred`."""
        if self.grid.layout is Layout.NO_BUFFER and self.active:
            self._extends.append((self._scans, [(namespace(r), req_tokens(r), r.extend_end)
                                                for r in run]))

    def still_deferred(self, req: Req, tokens, ns, adder: PrefillAdder, slot_next: bool,
                       running: int, cap: int = MAX_DEFER) -> bool:
        """`defer`'s verdict of a recent scan, again, before SGLang's match (docs/design.md,
        "The chunk slot"): the slot is taken again and no state was published on `req`'s path
        since (its boundary's key, or an extend of a scan since: `end_scan`), so its ready
        prefix, its cut and its users are what that scan found, and no sibling ran since; the
        queue behind it and the round's cost are read again (`_defer_wins`). A live burst
        visits every group waiting for the slot every round (~50 deferrals a round, a match
        and a copy-on-write each: ~0.3 ms of host time per visit). NOTE: a request that
        finished since published its output's end too; only a later turn extends that, and
        it arrives after it."""
        w = self._slot_waits.get(req.rid)
        if (w is None or w[0] < self._scans - STALE or not slot_next
                or adder.new_chunked_req is None or self.grid.layout is not Layout.NO_BUFFER):
            return False
        since, prefix, depth, key, users = w
        if key in self._serving or key in self._done or self._defers.get(req.rid, 0) >= cap:
            return False
        for scan, extends in self._extends:
            if scan < since:
                continue
            for s, t, end in extends:
                d = min(end, depth)
                if s == ns and d > prefix and tokens[:16] == t[:16] and tokens[:d] == t[:d]:
                    return False  # NOTE: a state on its path, or a sibling ran: the full rule
        if not self._defer_wins(req, tokens, prefix, depth, key, users, adder, running):
            return False
        return self._deferred(req.rid, prefix, depth, key, users)

    def _users(self, req: Req, tokens, ns, depth: int, key: tuple, adder,
               source: Reason | None = None) -> float:
        """Requests expected to reuse a state at `depth` (core/boundary.py `consumers`): its
        queued siblings, and future ones at the reuse share of `source`'s placements (a
        learned PLACE rule; repeats: at most the namespace's repeat share) or of boundary
        states (`usage`)."""
        # NOTE: itself and its siblings selected this scan excluded (they run now)
        queued = self._groups_at(depth).get(key, 0) - 1
        queued -= sum(1 for r in adder.can_run_list
                      if r is not req and self._hash(r.rid, depth) == key)
        # NOTE: SGLang's branching depth is the KV hit floored to the grid
        b = req.mamba_branching_seqlen
        rate = self.placed[source].exposed_rate if source in self.placed else self.usage.rate
        if source == Reason.REPEAT and self.learner is not None:
            # NOTE: the measured rate starts at its prior (1) and falls with unused placements;
            # the namespace's repeat share bounds it from the first placement (a retry now and
            # then: every distinct prompt cut at length - 1 until the rate fell)
            rate = min(rate, self.learner.repeat_share(ns))
        return consumers(max(queued, 0), b is not None and b >= depth // self.grid.size
                         * self.grid.size, rate)

    def _contested(self, depth: int, key: tuple, adder) -> bool:
        """Another group of >= 2 unselected queued requests wants a boundary at `depth`."""
        selected = {r.rid for r in adder.can_run_list}
        counts = dict(self._groups_at(depth))
        for r in self._queue:
            k = self._hash(r.rid, depth)
            if r.rid in selected and k in counts:
                counts[k] -= 1
        return any(n >= 2 for k, n in counts.items()
                   if k != key and k not in self._serving and k not in self._done)

    def _groups_at(self, depth: int) -> dict[tuple, int]:
        """This scan's queued requests per key (namespace, depth, prefix hash) at `depth`."""
        g = self._groups.get(depth)
        if g is None:
            g = {}
            for r in self._queue:
                toks = req_tokens(r)
                if len(toks) > depth and r.prefix_len < depth:
                    k = self._key_of(r, toks, namespace(r), depth)
                    g[k] = g.get(k, 0) + 1
            self._groups[depth] = g
        return g

    def _key_of(self, req: Req, tokens, ns, depth: int) -> tuple:
        keys = self._hashes.setdefault(req.rid, {})
        k = keys.get(depth)
        if k is None:
            k = keys[depth] = _key(ns, tokens, depth)
        return k

    def _hash(self, rid: str, depth: int) -> tuple | None:
        keys = self._hashes.get(rid)
        return None if keys is None else keys.get(depth)

    def records(self) -> int:
        """Requests with a record kept across scans (prefix keys, slot deferrals)."""
        return len(self._hashes.keys() | self._defers.keys() | self._slot_waits.keys())

    def forget(self, rid: str) -> None:
        """`rid` left the queue (selected, aborted, retracted): drop what is kept of it across
        scans (its prefix keys, chunk-slot deferrals). Called by the runtime's `forget`."""
        self._hashes.pop(rid, None)
        self._defers.pop(rid, None)
        self._slot_waits.pop(rid, None)

    def _record(self, req: Req, tokens, ns, moved: int | None, native_branch: bool,
                source: str | None = None) -> None:
        """What this extend publishes, for classifying later hits (core/boundary.py)."""
        if moved is not None:
            kind = "repeat" if source == "repeat" else "boundary"
            self.learner.published(_key(ns, tokens, moved), kind, moved)
            if self.cut is not req:
                return  # NOTE: the moved state replaces the end state
            # NOTE: cut: the rest runs next round as a chunk and publishes the end
            q, kind = self.grid.planned_depth(moved, len(tokens) - moved), "end"
        else:
            if req.extend_end < len(tokens):
                return  # NOTE: a middle chunk: neither a fork nor a request's end
            q = self.grid.planned_depth(req.prefix_len, req.extend_end - req.prefix_len,
                                        req.mamba_branching_seqlen)
            kind = "branch" if native_branch else "end"
        if q is not None:
            self.learner.published(_key(ns, tokens, q), kind, q)

    def _native_branch(self, prefix: int, extend: int, branching: int | None) -> bool:
        # NOTE: SGLang already publishes where this request leaves a cached path: keep it.
        return branching is not None and self.grid.layout is Layout.EXTRA_BUFFER and \
            self.grid.branch_ok(prefix, extend, branching)

    def _publish(self, req: Req, tokens, ns, depth: int | None, adder: PrefillAdder,
                 cut_ok: bool, source: Reason = Reason.DECLARED) -> Reason:
        """Publish at a placed `depth` (placed by PLACE rule `source`) as the PUBLISH rule that
        fires says (core/boundary.py `publish_rule`); that rule."""
        can_cut = cut_ok and adder.new_chunked_req in (None, req)

        def key() -> tuple:
            return self._key_of(req, tokens, ns, depth)

        how = publish_rule(
            depth, self.grid.layout, can_cut, lambda: self._keep(req, depth),
            # NOTE: its siblings already ran and none is queued: the one chunk slot goes to a
            # queued group whose first can be cut and the rest wait for it
            lambda: (self._users(req, tokens, ns, depth, key(), adder) <= 0
                     and self._contested(depth, key(), adder)),
            source != Reason.DECLARED,
            lambda: self._cut_pays(req, tokens, ns, depth, key(), adder, source))
        if how is Reason.MOVE:
            req.mamba_branching_seqlen = depth  # NOTE: read by prepare_for_extend
        elif how in (Reason.KEEP_END, Reason.CUT):
            cut_chunk(req, depth, adder)
            self.cut = req
        elif how is Reason.CUT_UNUSED:
            self.skipped += 1
        elif how in (Reason.CUT_UNPAID, Reason.KEEP_UNPAID):
            self.unpaid += 1  # NOTE: a guessed boundary's cut must pay for its round
        return how

    def _cut_pays(self, req: Req, tokens, ns, depth: int, key: tuple, adder,
                  source: Reason) -> bool:
        """A learned boundary (PLACE rule `source`): the cut's state saves more than the round
        the cut adds to `req` (core/cost.py `cut_pays`; behind it: the unselected queue; its
        future users: the placements of `source` a later request used, `placed`)."""
        c = self.cost() if self.cost is not None else None
        if c is None or not measured(c):
            return True  # NOTE: the prior's alpha is an assumption: gate on measured rounds
        picked = {r.rid for r in adder.can_run_list}
        rest = [r for r in self._queue if r.rid not in picked and r is not req]
        left = budget_left(adder)
        # NOTE: queued input lengths: an upper bound of the demand, as the wait rule's
        backlog = sum(req_len(r) for r in rest) > left
        budget = int(left + adder.log_input_tokens) if backlog else 0
        users = self._users(req, tokens, ns, depth, key, adder, source)
        if (not backlog and self.older_by is not None
                and cut_raises_tail(c, len(tokens) - depth, self.older_by(req, adder))):
            return False
        return cut_pays(c, depth - req.prefix_len, len(tokens) - depth, len(rest), users,
                        budget)

    def _keep(self, req: Req, depth: int) -> bool:
        """Whether to cut at `depth` so the displaced end state is published too."""
        end = self.grid.planned_depth(req.prefix_len, req.extend_end - req.prefix_len)
        lost = (end or depth) - depth  # NOTE: what a continuation would recompute
        if lost <= 0 or self.keep_end is False:
            return False
        if self.keep_end or self.cost is None:
            return bool(self.keep_end)
        c = self.cost()
        # NOTE: the cut finishes this request one round later (a round's fixed cost and a row)
        return c.beta * lost >= c.alpha + c.gamma

    def summary(self) -> dict:
        return {"mode": self.mode, "moved_declared": self.moved["declared"],
                "moved_learned": self.moved["learned"], "moved_marker": self.moved["marker"],
                "moved_repeat": self.moved["repeat"],
                "moved_queued_fork": self.moved["queued_fork"],
                "fork_marks": self.moved["fork_mark"],
                "deferred": self.deferred,
                "cuts_skipped": self.skipped, "cuts_unpaid": self.unpaid,
                "reused_share": round(self.usage.rate, 3),
                "placed_reused_share": {str(r): round(u.exposed_rate, 3)
                                        for r, u in self.placed.items()}}


def _key(ns, tokens, depth: int) -> tuple:
    # NOTE: the prefix's int64 bytes, hashed in C (a tuple of an array's ints cost ~50 ns per
    # token: most of a selected request's boundary bookkeeping); one encoding for every type
    return (ns, depth, hash(as_tokens(tokens[:depth]).tobytes()))


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
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    core = getattr(tree, "tree_core", None)
    if core is None or getattr(tree, "disable", False) or depth <= 0 or within <= 0:
        return False
    matched, node, pinned = core.match_full_device_prefix(_req_radix_key(tree, req, tokens,
                                                                         depth))
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
