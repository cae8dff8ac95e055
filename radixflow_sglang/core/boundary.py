"""Publication boundaries (issue 15): publish a request's state where its siblings will branch.

Engine-free. A producer publishes one state per extend (extra_buffer) near its own end, inside
its unique suffix; a sibling arriving after it finished then finds no usable state. A boundary
moves that one state to where the shared prefix ends:

- declared: the request says where (a request field, the end of the system message, an SGLang
  frontend fork's prefix); `publish_at` floors it to the grid;
- learned: `BoundaryLearner` predicts it from the depths at which earlier requests of the same
  cache namespace reused cached paths, and moves the state only when the expected reuse at the
  predicted depth beats what the displaced end-of-extend state would have served.

Placement over a distribution of overlap depths is the sparse prefix caching problem (arXiv
2605.05219): with M states per path and overlap depth X, maximise E[deepest state <= X].
`optimal_placement` solves it exactly for any M by dynamic programming; SGLang 0.5.23 keeps one
tracked state per extend, so the adapter asks for M = 1 (argmax_d (d - p) * P(X >= d)).
"""

from __future__ import annotations

from array import array
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from .cost import CostCoeffs
from .grid import Grid, Layout
from .producers import COMPARE_STEP, common_prefix
from .reasons import Reason, enabled

MODES = ("off", "declared", "learned", "both")
RULES = ("optimal", "mode")


def wants(mode: str, source: str) -> bool:
    """Whether boundary mode `mode` uses `source` ("declared" or "learned")."""
    if mode not in MODES:
        raise ValueError(f"invalid boundary mode {mode!r} (choose from {', '.join(MODES)})")
    return mode in (source, "both")


def publish_at(grid: Grid, boundary: int, prefix: int, extend: int) -> int | None:
    """Depth at which this extend should publish to serve `boundary` (its grid floor, counted
    from the ready prefix as SGLang tracks states); None when nothing should move: the boundary
    is already ready (a state at or beyond its floor), lies past this extend's end, or the
    layout publishes every page anyway (full attention)."""
    if grid.layout is Layout.FULL or extend <= 0 or boundary >= prefix + extend:
        return None
    d = grid.fork_depth(prefix, extend, boundary)
    if d is None or d >= prefix + extend:
        return None  # NOTE: at the extend end it is the native publish depth already
    if grid.layout is Layout.EXTRA_BUFFER and not grid.branch_ok(prefix, extend, d):
        return None
    return d


def optimal_placement(depths: Sequence[int], weights: Sequence[float], m: int,
                      base: int = 0) -> tuple[list[int], float]:
    """Exact sparse-prefix-caching placement of `m` states among candidate `depths` given the
    probability mass `weights[i]` of overlap depth `depths[i]`: maximise the expected reused
    depth beyond `base` (a request with overlap X resumes from the deepest chosen depth <= X).
    O(N^2 M) dynamic program over sorted candidates; returns (chosen depths, expected reuse)."""
    pts = sorted({d for d in depths if d > base})
    if m <= 0 or not pts:
        return [], 0.0
    tail = _tails(pts, depths, weights)
    if m == 1:
        # NOTE: one state (every call PLACE makes, per selected request): of the best depths
        # the shallowest, as `_table` picks it, without building the table
        values = [(p - base) * t for p, t in zip(pts, tail, strict=False)]
        i = values.index(max(values))
        return [pts[i]], values[i]
    return _table(pts, tail, m, base)


def _tails(pts: list[int], depths: Sequence[int], weights: Sequence[float]) -> list[float]:
    """tail[i]: the mass of overlaps >= pts[i] (`pts`: the distinct depths past the base,
    sorted; one more entry, 0)."""
    mass = Counter()
    for d, w in zip(depths, weights, strict=True):
        mass[d] += w
    tail = [0.0] * (len(pts) + 1)
    for i in range(len(pts) - 1, -1, -1):
        tail[i] = tail[i + 1] + mass[pts[i]]  # NOTE: each pts[i] is one depth of `mass`
    return tail


def _table(pts: list[int], tail: list[float], m: int, base: int) -> tuple[list[int], float]:
    """`optimal_placement`'s dynamic program over `pts` and their `tail` masses."""
    n, neg = len(pts), float("-inf")
    # best[k][i]: best reuse with k states, the deepest at pts[i] (states at shallower depths)
    best = [[neg] * n for _ in range(m + 1)]
    prev: list[list[int | None]] = [[None] * n for _ in range(m + 1)]
    for i in range(n):
        best[1][i] = (pts[i] - base) * tail[i]
    for k in range(2, m + 1):
        for i in range(n):
            for j in range(i):
                # NOTE: a state at pts[i] adds (pts[i] - pts[j]) to every overlap >= pts[i]
                v = best[k - 1][j] + (pts[i] - pts[j]) * tail[i]
                if v > best[k][i]:
                    best[k][i], prev[k][i] = v, j
    k_best, i_best = max(((k, i) for k in range(1, m + 1) for i in range(n)),
                         key=lambda ki: (best[ki[0]][ki[1]], -ki[0]))
    chosen, k, i = [], k_best, i_best
    while i is not None and k >= 1:
        chosen.append(pts[i])
        i, k = prev[k][i], k - 1
    return sorted(chosen), best[k_best][i_best]


def consumers(queued: int, computed: bool, future: float = 1.0) -> float:
    """Requests expected to reuse a boundary state: the siblings queued now (same namespace,
    same prefix to the boundary, not selected), plus `future` ones (the share of earlier
    boundary states that were reused, `UsageRate`) unless the prefix to the boundary was
    computed before without a state there (SGLang's match found KV beyond the ready prefix,
    `mamba_branching_seqlen`): then the siblings it was declared for have already run and
    none is expected beyond the queue."""
    return queued + (0.0 if computed else future)


def defer_wins(c: CostCoeffs, gain: int, rest: int, behind: int, users: float,
               ahead: int = 0) -> bool:
    """no_buffer: defer a request when its boundary cut cannot get SGLang's one chunk slot this
    round (another cut holds it), so that it is cut when the slot comes to it.

    Not deferring, it publishes only its end, and the first of its `users` (if any: at most
    one, with probability min(users, 1)) recomputes the `gain` tokens, work that delays every
    request finishing after it, estimated by the `behind` ones now (queued or running, the
    candidate excluded), and itself; the other users wait for that one's cut either way.
    Deferring delays the request itself: the cuts of the `ahead` groups deferred before it
    take the slot first, one round each (each about c(1, gain)), then its cut and its rest
    the round after: (1 + ahead)·c(1, gain) + c(1, rest). Pure, rank-identical inputs."""
    if users <= 0 or gain <= 0:
        return False
    return (min(users, 1.0) * c.beta * gain * (1 + behind)
            > (1 + ahead) * c(1, gain) + c(1, rest))


# NOTE: not measured; chosen as a few bursts' worth of states: an open state counts unused in
# proportion to its age over this window (notes/2026-12-cuts-that-pay.md)
USAGE_WINDOW = 64


@dataclass
class UsageRate:
    """The share of boundary states that a later request reused: a state counts as used at
    its first hit, as unused once `window` later states were published without a hit.
    Laplace-smoothed (1 before any evidence: a declaration says the prefix is shared)."""

    window: int = USAGE_WINDOW
    used: int = 0
    unused: int = 0
    _open: deque = field(default_factory=deque)  # (key, depth) of recent states, oldest first
    _state: dict = field(default_factory=dict)  # key -> hit yet
    _depths: Counter = field(default_factory=Counter)  # depths of the open states

    def published(self, key: Hashable, depth: int) -> None:
        if key in self._state:
            return
        self._open.append((key, depth))
        self._state[key] = False
        self._depths[depth] += 1
        while len(self._open) > self.window:
            old, d = self._open.popleft()
            self._depths[d] -= 1
            if not self._depths[d]:
                del self._depths[d]
            if not self._state.pop(old):
                self.unused += 1

    def watching(self, depth: int) -> bool:
        """Whether a state at `depth` is open (a cheap test before hashing a prefix)."""
        return depth in self._depths

    def open_depths(self) -> list[int]:
        """The depths of the open states (each once)."""
        return list(self._depths)

    def hit(self, key: Hashable) -> None:
        if self._state.get(key) is False:
            self._state[key] = True
            self.used += 1

    @property
    def rate(self) -> float:
        return (self.used + 1) / (self.used + self.unused + 1)

    @property
    def exposed_rate(self) -> float:
        """`rate` with each open state not hit yet counted unused in proportion to its age
        (later states published since, over `window`): a hit rate that falls as states go
        unused, not only once `window` more were published (the first `window` guesses would
        otherwise all be made on the prior). Laplace-smoothed as `rate`."""
        n, exposure = len(self._open), 0.0
        for i, (key, _) in enumerate(self._open):
            if not self._state[key]:
                exposure += (n - 1 - i) / self.window
        return (self.used + 1) / (self.used + self.unused + exposure + 1)


FORK, CONTINUATION, REPEAT = "fork", "continuation", "repeat"
# NOTE: a request's native end, SGLang's branch, ours (declared/learned), ours for repeats
PUBLISH_KINDS = ("end", "branch", "boundary", "repeat")


# NOTE: events (and admissions: `repeat_share`) kept per namespace: not measured; chosen as
# recent traffic, long enough that 2 retries among distinct prompts read as a low share (the
# Mooncake trace: 8 of 548; notes/2026-12-conversation-trace.md)
LEARN_WINDOW = 256
# NOTE: a fork depth seen this often is learned. One: under shuffled arrivals the second fork
# came after most groups' first member had published at its end (notes/2026-12-first-fork.md);
# a wrong move is weighed by the optimal rule's continuations, and a cut must pay (`UsageRate`)
LEARN_SUPPORT = 1
REPEAT_SUPPORT = 2  # NOTE: repeats seen before `repeat_wins` moves a state: a retry is one
NAMESPACES = 1024  # NOTE: namespaces kept (a memory bound; not measured)
# NOTE: publication records kept (a memory bound, also adapter/reuse.py's served groups; not
# measured: far above a queue's requests)
PUBLICATION_KEYS = 16_384


@dataclass
class BoundaryLearner:
    """Per cache namespace, the recent reuse events, each a grid-floored depth and a kind:

    - fork: a request left a cached path at that depth: SGLang's branching depth (the path's
      KV goes on past it without a state there), or a hit on a state published at a branch or
      a boundary;
    - continuation: a hit on the state an earlier request published at its own end (the next
      turn of a conversation);
    - repeat: a request whose whole matchable prompt (its length - 1: SGLang computes at least
      the last token) was cached already: an identical prompt ran before (n samples sent as
      separate requests, RL rollouts). The adapter tells (`observe(repeat=True)`).

    Which state a hit landed on is known from `published` (the adapter records every selected
    request's planned publication under an opaque key of the published prefix; bounded).

    `predict` moves a producer's one state from its native depth e to a learned depth d in
    (prefix, e). rule "optimal" (the sparse-prefix-caching optimum for one state, arXiv
    2605.05219, with continuations as the displaced state's value): move when
    (d - prefix) * forks(>= d) > (e - d) * continuations; d = argmax of the left side over
    depths seen `support` times. rule "mode": the most frequent fork depth seen `support` times,
    without the comparison. `repeat_wins` moves it to the prompt's length - 1 (grid floor)
    when repeats were seen: an identical copy can match at most length - 1 tokens, so a state
    at the prompt's end serves none of them."""

    grid: int
    window: int = LEARN_WINDOW  # events kept per namespace (recent traffic)
    support: int = LEARN_SUPPORT
    repeat_support: int = REPEAT_SUPPORT  # repeats seen before `repeat_wins` moves a state
    rule: str = "optimal"
    namespaces: int = NAMESPACES  # namespaces kept (least recently observed dropped)
    keys: int = PUBLICATION_KEYS  # publication records kept
    _events: dict[Hashable, deque[tuple[int, str]]] = field(default_factory=dict)
    # NOTE: per namespace, whether each recent admitted request was a repeat (`repeat_share`)
    _admits: dict[Hashable, deque[bool]] = field(default_factory=dict)
    _published: dict[Hashable, tuple[str, int | None]] = field(default_factory=dict)
    _depths: Counter = field(default_factory=Counter)  # depths of the records (cheap test)

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"invalid learned-boundary rule {self.rule!r} "
                             f"(choose from {', '.join(RULES)})")

    def published(self, key: Hashable, kind: str, depth: int | None = None) -> None:
        """A state will be published under `key` (namespace + prefix), of kind PUBLISH_KINDS,
        at `depth` (known: `publishes_at` answers for it without hashing a prefix)."""
        self._forget(key)
        self._published[key] = (kind, depth)
        if depth is not None:
            self._depths[depth] += 1
        if len(self._published) > self.keys:
            self._forget(next(iter(self._published)))

    def _forget(self, key: Hashable) -> None:
        old = self._published.pop(key, None)
        if old is not None and old[1] is not None:
            self._depths[old[1]] -= 1
            if not self._depths[old[1]]:
                del self._depths[old[1]]

    def kind(self, key: Hashable) -> str | None:
        rec = self._published.get(key)
        return None if rec is None else rec[0]

    def publishes_at(self, depth: int) -> bool:
        """Whether a recorded state (with its depth given) lies at `depth`."""
        return depth in self._depths

    def observe(self, namespace: Hashable, ready: int, ready_key: Hashable | None,
                branching: int | None, repeat: bool = False) -> str | None:
        """One admitted request's match: its ready prefix (and the key of that prefix) and
        SGLang's branching depth; `repeat`: its whole matchable prompt was cached already.
        Returns the event kind recorded, or None."""
        self._recent(self._admits, namespace).append(repeat)
        if repeat:
            return self._add(namespace, ready, REPEAT)
        if branching is not None and branching > ready:
            return self._add(namespace, branching, FORK)
        if ready <= 0 or ready_key is None:
            return None
        kind = self.kind(ready_key)
        if kind is None:
            return None  # NOTE: a chunk stash or a forgotten record: no evidence either way
        if kind == "repeat":
            return self._add(namespace, ready, REPEAT)
        return self._add(namespace, ready, CONTINUATION if kind == "end" else FORK)

    def _add(self, namespace: Hashable, depth: int, kind: str) -> str:
        self._recent(self._events, namespace).append((depth // self.grid * self.grid, kind))
        return kind

    def _recent(self, by_ns: dict[Hashable, deque], namespace: Hashable) -> deque:
        """`namespace`'s window in `by_ns`, created if new (the least recently observed
        namespace dropped past `namespaces`)."""
        q = by_ns.pop(namespace, None)
        if q is None:
            q = deque(maxlen=self.window)
            if len(by_ns) >= self.namespaces:
                by_ns.pop(next(iter(by_ns)))
        by_ns[namespace] = q  # NOTE: re-inserted: most recently observed last
        return q

    def repeat_share(self, namespace: Hashable) -> float:
        """The share of the namespace's recent admitted requests (`window`) that repeated an
        earlier prompt: how likely a new prompt is to be repeated, the base rate of a repeat
        placement's use (1 before any admission). A retry now and then among distinct prompts
        (the Mooncake conversation trace: 8 of 548) is not n samples (7 of 8)."""
        q = self._admits.get(namespace)
        return sum(q) / len(q) if q else 1.0

    def events(self, namespace: Hashable) -> tuple[tuple[int, str], ...]:
        return tuple(self._events.get(namespace, ()))

    def predict(self, namespace: Hashable, prefix: int, native: int | None) -> int | None:
        """The learned depth in (prefix, native) to publish at instead of `native` (the depth
        this extend publishes at natively; None: it publishes nothing), or None to keep it."""
        q = self._events.get(namespace)
        if not q or native is None:
            return None
        forks = Counter(d for d, k in q if k == FORK and d > prefix)
        inside = {d: c for d, c in forks.items() if d < native and c >= self.support}
        if not inside:
            return None
        if self.rule == "mode":
            return max(inside, key=lambda d: (inside[d], d))
        conts = sum(1 for _, k in q if k == CONTINUATION)

        def gain(d: int) -> int:
            return (d - prefix) * sum(c for e, c in forks.items() if e >= d)

        best = max(inside, key=lambda d: (gain(d), d))
        return best if gain(best) > (native - best) * conts else None

    def repeat_wins(self, namespace: Hashable, prefix: int, native: int | None,
                    depth: int) -> bool:
        """Move this extend's one state from `native` to `depth` (its prompt's length - 1,
        floored) for identical copies to come? The namespace has seen `repeat_support` repeats
        and, as `predict`'s optimal rule weighs forks, repeats x (depth - prefix) beat the
        continuations that would resume at `native` x (native - depth)."""
        q = self._events.get(namespace)
        if not q or native is None or not prefix < depth < native:
            return False
        repeats = sum(1 for _, k in q if k == REPEAT)
        conts = sum(1 for _, k in q if k == CONTINUATION)
        return (repeats >= self.repeat_support
                and repeats * (depth - prefix) > conts * (native - depth))


# --- learned document ends: the text after which different requests diverge ----------------
def common_suffix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common suffix of `a` and `b`."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[-1 - i] == b[-1 - i]:
        i += 1
    return i


@dataclass
class Marker:
    """Tokens that preceded divergence points of different paths (a template's text at a
    document's end, e.g. "\\n\\nQuestion:"), how often seen, and how often a state published
    right after it was reused by a later request (not a sibling queued at the time)."""

    tokens: tuple[int, ...]
    support: int = 1
    usage: UsageRate = field(default_factory=UsageRate)
    _needle: bytes = b""

    def needle(self) -> bytes:
        if not self._needle:
            self._needle = array("q", self.tokens).tobytes()
        return self._needle


# NOTE: the tokens before a fork that make its marker: a template's text before a question
# ("\n\nQuestion:") with room to spare (notes/2026-11-learned-document-ends.md); not measured
MARKER_SPAN = 16
# NOTE: contexts (and pieces) sharing this many tokens merge: the template's text, while a
# token or two in common is chance (notes/2026-11-learned-document-ends.md); not measured
MARKER_MIN_LEN = 3
MARKER_SUPPORT = 1  # NOTE: one fork's 16 tokens are specific; merged markers have >= 2
MARKER_LIMIT = 16  # NOTE: markers kept (the least supported replaced): a memory bound
# NOTE: template pieces: a request's last 128 tokens compared with one kept tail per unrelated
# request (8) (notes/2026-12-template-pieces.md: its cost per request); not measured
PIECE_WINDOW = 128
PIECE_KEEP = 8
PIECE_SUPPORT = 1  # NOTE: pairs of unrelated requests a piece was seen in before it is used


@dataclass
class MarkerLearner:
    """The document end, learned from the tree's branching (issue 11: a second question on a
    document recomputes it, because its first question's one state lies past the document).

    Each fork (a request's Full-KV hit runs past its ready prefix, so it leaves a cached path
    where no state is) gives the exact divergence depth h; the `span` tokens before h are its
    context. Contexts whose common suffix is at least `min_len` tokens merge into one marker
    (the suffix: what different documents share there is the template's text, not the
    document's); a marker seen `support` times is learned. Namespace-free: it learns the
    template, not the content (no cached content crosses a namespace: only where a request
    publishes its own state). `candidates` finds, in a new request, the last occurrence of each
    learned marker: a depth where later requests are expected to diverge."""

    span: int = MARKER_SPAN
    min_len: int = MARKER_MIN_LEN
    support: int = MARKER_SUPPORT
    limit: int = MARKER_LIMIT  # markers kept (the least supported replaced)
    markers: list[Marker] = field(default_factory=list)
    # template pieces (`infer`): text that unrelated requests share between their variable parts
    window: int = PIECE_WINDOW  # tokens at a request's end compared
    keep: int = PIECE_KEEP  # tails kept, one per unrelated request
    piece_support: int = PIECE_SUPPORT  # pairs of unrelated requests a piece was seen in
    pieces: list[Marker] = field(default_factory=list)
    _tails: deque = field(default_factory=deque)
    _spaces: deque = field(default_factory=deque)  # the namespace of each kept tail
    _grams: deque = field(default_factory=deque)  # the k-grams of each kept tail
    _index: deque = field(default_factory=deque)  # their positions (`_kgram_index`), or None
    # NOTE: the kept tails' k-grams, all in one set (`_keep_tail` keeps it exact): a tail
    # disjoint from it is unrelated to every kept one, one set probe instead of one per tail
    _union: set = field(default_factory=set)
    _fresh: deque = field(default_factory=deque)  # each kept tail was disjoint from `_union`
    # NOTE: `candidates` by the caller's key while nothing is learned (`observe` and `infer`
    # clear it): PLACE, the no_buffer mark and a slot deferral ask it of one request in turn
    _found: dict = field(default_factory=dict, repr=False, compare=False)

    def observe(self, tokens: Sequence[int], hit: int) -> Marker | None:
        """A fork at exact depth `hit` of `tokens`; returns the marker it joined or started."""
        self._found.clear()
        if hit < self.min_len:
            return None
        return self._merge_suffix(self.markers, tuple(tokens[max(0, hit - self.span):hit]))

    def _merge_suffix(self, into: list[Marker], ctx: tuple[int, ...]) -> Marker:
        """A fork's context joins the entry of `into` whose tokens end as it does (>= `min_len`
        tokens, shrinking to that common suffix), else starts one (the least supported
        replaced past `limit`)."""
        best = max(into, key=lambda m: common_suffix(m.tokens, ctx), default=None)
        n = 0 if best is None else common_suffix(best.tokens, ctx)
        if n >= self.min_len:
            if n < len(best.tokens):
                best.tokens, best._needle = best.tokens[-n:], b""
            best.support += 1
            return best
        if len(into) >= self.limit:
            del into[min(range(len(into)), key=lambda i: into[i].support)]
        m = Marker(ctx)
        into.append(m)
        return m

    def infer(self, tokens: Sequence[int], namespace: Hashable = None) -> list[Marker]:
        """Template pieces from a request's last `window` tokens, before any fork shows them
        (a document's first question, when no earlier question shared a document): the runs
        of >= `min_len` tokens it shares with the tail of an unrelated earlier request, with
        different text on both sides of the run in both (a template's fixed text between
        its variable parts: "\n\n" + "Question:" after a document). A run merges into the
        piece it shares >= `min_len` consecutive tokens with (shrinking to them: the text a
        variable part happens to start or end with falls away); a piece seen in
        `piece_support` pairs is used as a marker. A tail that shares text reaching the start
        of the window with a kept one (a sibling, the same document's next question, a chunk
        of the same request, an identical prompt) is related and teaches nothing, except
        where it is in another `namespace` (not None): where their shared text ends, both
        going on differently, is a fork the tree cannot show across namespaces (a document
        asked again in another namespace: the text before its question), kept as a piece
        (merged by common suffix, as `observe` merges the tree's forks). Returns the pieces
        this request touched."""
        self._found.clear()
        tail = tuple(tokens[-self.window:])
        if len(tail) <= self.min_len or tail in self._tails:
            return []
        # NOTE: its k-grams at C speed (zip stops at the shortest: tail[i:i + k] for each i)
        grams = frozenset(zip(*(tail[i:] for i in range(self.min_len)), strict=False))
        # NOTE: no common k-gram with any kept tail (the usual request): no pair to scan
        fresh = grams.isdisjoint(self._union)
        pairs, index, related = (([], None, None) if fresh else
                                 self._runs_with_kept(tail, grams, namespace))
        if related is not None:
            return related
        self._keep_tail(tail, namespace, grams, index, fresh)
        touched: list[Marker] = []
        for runs in pairs:
            seen: set[int] = set()  # NOTE: a piece counts once per pair
            for run in runs:
                m = self._piece(run, seen)
                if m is not None and all(m is not t for t in touched):
                    touched.append(m)
        return touched

    def _runs_with_kept(self, tail: tuple[int, ...], grams: frozenset, namespace: Hashable,
                        ) -> tuple[list[list[tuple[int, ...]]], dict | None,
                                   list[Marker] | None]:
        """`tail`'s common runs with each unrelated kept tail, newest first; `tail`'s k-gram
        index if built; and, when a kept tail is related, what `infer` returns at once (its
        cross-namespace fork's piece, or nothing), else None."""
        index = None
        pairs = []
        k = self.min_len
        for n in range(len(self._tails) - 1, -1, -1):  # NOTE: newest first: a sibling relates
            old, space, kept = self._tails[n], self._spaces[n], self._grams[n]
            if grams.isdisjoint(kept):
                # NOTE: no common k-gram, no common run (the usual unrelated pair): skip the
                # Python scan (~0.2 ms per admitted request on the live 2-core host)
                continue
            # NOTE: a common run touching either window's start: related (common_runs' None
            # at its first such k-gram); else only the common k-grams are visited, both
            # windows' indexes kept (a pass over the old tail cost ~0.1 ms per request)
            if old[:k] in grams or tail[:k] in kept:
                runs = None
            else:
                index = index or _kgram_index(tail, k)
                runs = common_runs(tail, old, k, index, self._old_index(n), grams & kept)
            if runs is None:
                return pairs, index, self._related(tail, old, space, namespace)
            pairs.append(runs)
        return pairs, index, None

    def _related(self, tail: tuple[int, ...], old: tuple[int, ...], space: Hashable,
                 namespace: Hashable) -> list[Marker]:
        """`tail` relates to kept tail `old`: no piece, unless they lie in different namespaces
        and fork (then the text before the fork, merged as a piece)."""
        if namespace is not None and space is not None and space != namespace:
            fork = shared_run_end(tail, old, self.min_len)
            if fork is not None:
                # NOTE: a guess, so a piece: extra_buffer moves its one state there for free,
                # no_buffer cuts there only where its traversal cuts anyway
                return [self._merge_suffix(self.pieces, tail[max(0, fork - self.span):fork])]
        return []

    def _keep_tail(self, tail: tuple[int, ...], namespace: Hashable, grams: frozenset,
                   index: dict | None, fresh: bool) -> None:
        """Keep `tail` (its namespace, k-grams and index) for later requests, the oldest
        dropped past `keep`; `fresh`: its k-grams were disjoint from the kept ones'."""
        self._tails.append(tail)
        self._spaces.append(namespace)
        self._grams.append(grams)
        self._index.append(index)
        self._fresh.append(fresh)
        self._union |= grams
        if len(self._tails) > self.keep:
            self._tails.popleft()
            self._spaces.popleft()
            self._index.popleft()
            self._fresh.popleft()
            self._drop_grams(self._grams.popleft())

    def _drop_grams(self, old: frozenset) -> None:
        """`_union` less the dropped (oldest) tail's k-grams. NOTE: a tail kept fresh shares no
        k-gram with any tail kept before it, so when every tail left was kept fresh none of
        `old`'s is theirs (and the union drops its k-grams, which pymalloc reuses for the next
        tail's); else it is rebuilt from the kept tails."""
        if all(self._fresh):
            self._union -= old
        else:
            self._union = set().union(*self._grams)

    def _old_index(self, n: int) -> dict:
        """Kept tail `n`'s k-gram index, built on first use."""
        if self._index[n] is None:
            self._index[n] = _kgram_index(self._tails[n], self.min_len)
        return self._index[n]

    def _piece(self, run: tuple[int, ...], seen: set[int]) -> Marker | None:
        best, n, at = None, 0, 0
        for m in self.pieces:
            k, i = longest_common_run(m.tokens, run)
            if k > n:
                best, n, at = m, k, i
        if best is not None and n >= self.min_len:
            if id(best) in seen:
                return None
            seen.add(id(best))
            if n < len(best.tokens):
                best.tokens, best._needle = best.tokens[at:at + n], b""
            best.support += 1
            return best
        if len(self.pieces) >= self.limit:
            low = min(range(len(self.pieces)), key=lambda i: self.pieces[i].support)
            del self.pieces[low]
        m = Marker(run)
        self.pieces.append(m)
        seen.add(id(m))
        return m

    def candidates(self, tokens, lo: int, hi: int, pieces: bool = True,
                   key: Hashable = None) -> list[tuple[int, Marker]]:
        """(depth right after the marker's last occurrence in tokens[lo:hi], marker) for each
        learned marker, then (`pieces`) each learned template piece at a depth no marker
        gave, that occurs there. `key`: the caller's name for `tokens` (a request's rid and
        length): asked again before anything is learned, the answer is the one found then
        (without `pieces`, its markers' part: they come first)."""
        if key is None:
            return self._find(tokens, lo, hi, pieces)[0]
        found = self._found.get((key, lo, hi))
        if found is None:
            found = self._found[(key, lo, hi)] = self._find(tokens, lo, hi, True)
        out, of_markers = found
        return out[:] if pieces else out[:of_markers]

    def _find(self, tokens, lo: int, hi: int, pieces: bool
              ) -> tuple[list[tuple[int, Marker]], int]:
        """`candidates`, and how many of them are markers' (the first ones)."""
        out: list[tuple[int, Marker]] = []
        hay = None
        learned = [m for m in self.markers if m.support >= self.support]
        n_markers = len(learned)
        if pieces:
            learned += [m for m in self.pieces if m.support >= self.piece_support]
        found_markers = 0
        for i, m in enumerate(learned):
            if hay is None:
                arr = tokens[:hi]
                if not (isinstance(arr, array) and arr.typecode == "q"):
                    arr = array("q", arr)
                hay = arr.tobytes()
            pos = _rfind_aligned(hay, m.needle(), lo * TOKEN_BYTES)
            at = None if pos is None else pos // TOKEN_BYTES + len(m.tokens)
            if at is not None and all(d != at for d, _ in out):
                out.append((at, m))
            if i + 1 == n_markers:
                found_markers = len(out)
        return out, found_markers


def _kgram_index(a: tuple[int, ...], k: int) -> dict[tuple[int, ...], list[int]]:
    index: dict[tuple[int, ...], list[int]] = {}
    for i, g in enumerate(zip(*(a[s:] for s in range(k)), strict=False)):
        index.setdefault(g, []).append(i)
    return index


_START = object()  # NOTE: the "token before" position 0: equal to no token


def _pairs(a: tuple[int, ...], a_index: dict, b: tuple[int, ...], k: int,
           b_index: dict | None, common: frozenset | None) -> Iterable[tuple[int, int]]:
    """(j, i) with b[j:j + k] == a[i:i + k], j then i ascending: every position of `b` looked
    up, or (`b_index` and `common`, the k-grams both hold) only those of the common k-grams
    where a run may start: not both preceded by one token (`common_runs` skips those, inside
    a run found at an earlier j)."""
    if b_index is None or common is None:
        return ((j, i) for j in range(len(b) - k + 1) for i in a_index.get(b[j:j + k], ()))
    out = []
    for g in common:
        # NOTE: a's positions of g by the token before each: a run of one repeated token has
        # g at every position, and all pairs of them cost |a| x |b| (~0.7 ms a tail pair)
        before: dict = {}
        for i in a_index[g]:
            before.setdefault(a[i - 1] if i else _START, []).append(i)
        for j in b_index[g]:
            t = b[j - 1] if j else _START
            out.extend((j, i) for p, ii in before.items() if p is _START or p != t
                       for i in ii)
    out.sort()
    return out


def _run_len(a: tuple[int, ...], i: int, b: tuple[int, ...], j: int) -> int:
    """common_prefix(a[i:], b[j:]) (core/producers.py: its block doubles while it matches and
    halves past the first mismatch, slices compared in C) on offsets: neither tail is copied
    first (`common_runs` asks once per diagonal, ~75 times a kept tail on a repeated token)."""
    n = min(len(a) - i, len(b) - j)
    x, step, grow = 0, COMPARE_STEP, True
    while step:
        if x + step <= n and a[i + x:i + x + step] == b[j + x:j + x + step]:
            x += step
            step = step * 2 if grow else step
        else:
            grow, step = False, step // 2
    return x


def common_runs(a: tuple[int, ...], b: tuple[int, ...], k: int,
                index: dict | None = None, b_index: dict | None = None,
                common: frozenset | None = None) -> list[tuple[int, ...]] | None:
    """The maximal common runs of >= k tokens of `a` and `b` that are followed by different
    tokens in both (something variable comes after them), in `b`'s order; None when a common
    run touches the start of either (the two share text that may reach further back: they
    are related, not two instances of a template). `index`: `_kgram_index(a, k)`; `b_index`
    and `common` (`b`'s index, the k-grams both hold): visit only the common k-grams (the
    same answer, without a Python pass over `b`)."""
    index = _kgram_index(a, k) if index is None else index
    runs = []
    for j, i in _pairs(a, index, b, k, b_index, common):
        if i and j and a[i - 1] == b[j - 1]:
            continue  # NOTE: inside a run found at an earlier j
        if i == 0 or j == 0:
            return None
        n = k + _run_len(a, i + k, b, j + k)
        if i + n < len(a) and j + n < len(b):
            runs.append(a[i:i + n])
    return runs


def _positions(a: tuple[int, ...], g: tuple[int, ...]) -> list[int]:
    """Where the k-gram `g` starts in `a` (tuple.index finds its first token at C speed)."""
    out, i = [], -1
    try:
        while True:
            i = a.index(g[0], i + 1)
            if a[i:i + len(g)] == g:
                out.append(i)
    except ValueError:
        return out


def shared_run_end(a: tuple[int, ...], b: tuple[int, ...], k: int) -> int | None:
    """Where in `a` the longest common run of >= k tokens that touches the start of either
    window ends, both going on differently after it: the fork of two requests that share
    content reaching back past their windows (None: no such run, or it ends one of them:
    an identical prompt, a prefix). Only runs starting at `a[0]` or `b[0]` count: the
    positions of those two k-grams in the other window, in `b`'s order."""
    pairs = sorted({(j, 0) for j in _positions(b, a[:k])} | {(0, i) for i in _positions(a, b[:k])})
    best, at = 0, None
    for j, i in pairs:
        n = k + common_prefix(a[i + k:], b[j + k:])  # NOTE: slices compared in C
        if i + n < len(a) and j + n < len(b) and n > best:
            best, at = n, i + n
    return at


def longest_common_run(a: Sequence[int], b: Sequence[int]) -> tuple[int, int]:
    """(length, start in `a`) of the longest run of tokens `a` and `b` both contain."""
    best, at = 0, 0
    prev = [0] * (len(b) + 1)
    for i, x in enumerate(a):
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b):
            if x == y:
                cur[j + 1] = prev[j] + 1
                if cur[j + 1] > best:
                    best, at = cur[j + 1], i + 1 - cur[j + 1]
        prev = cur
    return best, at


TOKEN_BYTES = 8  # a token in array("q") bytes: needles match at token boundaries only


def _rfind_aligned(hay: bytes, needle: bytes, start: int) -> int | None:
    """Last 8-byte-aligned occurrence of `needle` in hay[start:] (a token boundary)."""
    end = len(hay)
    while True:
        i = hay.rfind(needle, start, end)
        if i < 0:
            return None
        if i % TOKEN_BYTES == 0:
            return i
        end = i + len(needle) - 1


def place(prefix: int, native: int | None, points: Sequence[tuple[int, float]]) -> int | None:
    """Where one state serves most: `points` are (overlap depth, expected requests) of the
    later users: siblings queued now (1 each, to their common depth), future requests after a
    learned marker (its `UsageRate`), continuations of the end (at `native`). The exact M = 1
    sparse-prefix-caching placement (`optimal_placement`); None to keep `native`."""
    if native is None or not points:
        return None
    chosen, value = optimal_placement([d for d, _ in points], [w for _, w in points], 1,
                                      base=prefix)
    if not chosen or chosen[0] >= native or value <= 0:
        return None
    return chosen[0]


# --- the order boundary publication applies its rules (core/reasons.py PLACE, PUBLISH) -------
Depth = Callable[[], int | None]  # a depth, computed only when its rule is asked


def place_rule(declared: Depth | None, learning: bool, native_branch: bool, marker: Depth,
               repeat: Depth, queued: Depth, learned: Depth) -> tuple[Reason, int | None]:
    """PLACE: the boundary a selected request publishes at, first rule that fires, and its
    depth. `declared`: None without a declaration, else its depth on the grid (None when
    outside the extend: the rule still fires and PUBLISH says `outside`). The undeclared
    sources are asked lazily, in order, only while `learning` and the match has no branching
    depth."""
    if declared is not None and enabled(Reason.DECLARED):
        return Reason.DECLARED, declared()
    if not learning:
        return Reason.NO_BOUNDARY, None
    if native_branch and enabled(Reason.NATIVE_BRANCH):
        return Reason.NATIVE_BRANCH, None
    for reason, depth in ((Reason.MARKER, marker), (Reason.REPEAT, repeat),
                          (Reason.QUEUED_FORK, queued), (Reason.LEARNED, learned)):
        d = depth() if enabled(reason) else None
        if d is not None:
            return reason, d
    return Reason.NO_BOUNDARY, None


def publish_rule(depth: int | None, layout: Layout, can_cut: bool, learned: bool,
                 pays: Callable[[], bool]) -> Reason:
    """PUBLISH: how a placed boundary at `depth` publishes, first rule that fires. `can_cut`:
    SGLang's one chunk slot is free for it (and chunked prefill on); `learned`: not declared;
    `pays`: a learned no_buffer cut pays for its round (asked lazily, last)."""
    if depth is None:  # NOTE: the guard `outside`: nothing to publish in this extend
        return Reason.OUTSIDE
    eb = layout is Layout.EXTRA_BUFFER
    moves = eb and enabled(Reason.MOVE)
    # NOTE: its case `slot_taken`: the boundary needs a cut (no_buffer; extra_buffer with
    # `move` ablated publishes only where it cuts) and a cut would overwrite SGLang's one
    # chunked request
    if not moves and not can_cut:
        return Reason.SLOT_TAKEN
    if moves:
        return Reason.MOVE  # NOTE: the one tracked state moves inside its forward: free
    # NOTE: a guessed state that saves less than its round is not worth the cut
    if learned and not eb and enabled(Reason.CUT_UNPAID) and not pays():
        return Reason.CUT_UNPAID
    return Reason.CUT
