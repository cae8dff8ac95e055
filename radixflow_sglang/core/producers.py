"""Producer index: which live producer covers the longest prefix of a request, without a queue walk.

Producers are requests admitted earlier in this scan or still in flight (result not processed).
Each is indexed by a hash chain over fixed-size token blocks, keyed by cache namespace, so a
lookup costs O(len(request)) regardless of how many producers or waiting requests there are.
Hash hits are confirmed token by token: a collision can never make two prefixes look shared.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field


@dataclass
class Producer:
    rid: str
    namespace: Hashable
    tokens: Sequence[int]  # the tokens this extend computes state for (fill ids)
    prefix: int  # its ready prefix when admitted
    extend: int  # tokens it computes this round
    publish: int | None  # planned publish depth; None = publishes nothing
    movable: bool  # its publish depth may still be moved (admitted this scan)
    forked: bool = False  # moved to publish at a fork point
    # NOTE: no_buffer: a learned document end below its fork where the one state serves more;
    # a fork cut the traversal makes anyway for waiting consumers goes there (costs no round)
    mark: int | None = None
    consumers: list[str] = field(default_factory=list)
    # NOTE: the request's whole token object (`tokens` is its prefix): its cached chain is reused
    source: Sequence[int] | None = None


def as_tokens(tokens: Sequence[int]) -> array:
    """`tokens` as array('q'): one type for slice compares (array == list is always False) and
    C-speed compares (SGLang's origin_input_ids is one already: no copy)."""
    return tokens if isinstance(tokens, array) and tokens.typecode == "q" else array("q", tokens)


class Chain:
    """One request's block hash chain, computed lazily and kept across rounds (TokenChains).

    Block i's key hashes the chain before it and the block's int64 bytes; a list's block is
    converted as it is hashed (one slice per block), an array's is cut from its bytes."""

    __slots__ = ("source", "namespace", "block", "keys", "_data", "_tokens", "stamp")

    def __init__(self, namespace: Hashable, tokens: Sequence[int], block: int) -> None:
        self.source = tokens  # NOTE: identity: a waiting request's token object never changes
        self.namespace = namespace
        self.block = block
        self.keys: list[int] = []
        self._data = tokens.tobytes() if isinstance(tokens, array) and tokens.typecode == "q" \
            else None
        self._tokens: array | None = None
        self.stamp = 0

    @property
    def tokens(self) -> array:
        if self._tokens is None:
            self._tokens = as_tokens(self.source)
        return self._tokens

    def walk(self, limit: int) -> Iterator[int]:
        """Keys of the blocks inside the first `limit` tokens, in order, computed on demand."""
        keys, b = self.keys, self.block
        n = limit // b
        yield from keys[:n]
        h = keys[-1] if keys else hash(self.namespace)
        src, data, w = self.source, self._data, 8 * b
        for i in range(len(keys), n):
            if data is not None:
                h = hash((h, data[i * w : (i + 1) * w]))
            else:
                h = hash((h, array("q", src[i * b : (i + 1) * b]).tobytes()))
            keys.append(h)
            yield h

    def key(self, limit: int) -> int:
        """The key of the last block inside the first `limit` (>= one block) tokens."""
        n = limit // self.block
        if len(self.keys) < n:
            for _ in self.walk(limit):
                pass
        return self.keys[n - 1]

    def upto(self, limit: int) -> list[int]:
        return list(self.walk(limit))


# NOTE: not measured; chosen as a few scans, so a request revisited each round (parked, or its
# batch in flight under overlap) keeps its chain while one gone for good is dropped soon
CHAIN_KEEP = 4  # scans a request's hash chain is kept after its last use


class TokenChains:
    """Chains of the requests a traversal visits, kept for `keep` scans after the last use: a
    waiting request is visited round after round, and its chain is its producer's when it is
    admitted (and again each round its batch is in flight). Keyed by rid, valid while the
    request's token object (identity) and namespace are the same."""

    def __init__(self, block: int, keep: int = CHAIN_KEEP) -> None:
        self.block = block
        self.keep = keep
        self.round = 0
        self._chains: dict[str, Chain] = {}

    def __len__(self) -> int:
        return len(self._chains)

    def get(self, rid: str, namespace: Hashable, tokens: Sequence[int]) -> Chain:
        c = self._chains.get(rid)
        if c is None or c.source is not tokens or c.namespace != namespace:
            c = self._chains[rid] = Chain(namespace, tokens, self.block)
        c.stamp = self.round
        return c

    def tick(self) -> None:
        """A scan begins (with the traversal's hooks on or off): chains unused for `keep`
        scans are dropped."""
        self.round += 1
        old = self.round - self.keep
        if any(c.stamp < old for c in self._chains.values()):
            self._chains = {r: c for r, c in self._chains.items() if c.stamp >= old}

    def forget(self, rid: str) -> None:
        self._chains.pop(rid, None)


# NOTE: a speed step, not a decision (the length is exact whatever the step): one C compare per
# 64 tokens, SGLang's usual page-aligned block
COMPARE_STEP = 64


def common_prefix(a: Sequence[int], b: Sequence[int], step: int = COMPARE_STEP) -> int:
    """Length of the shared token prefix; compares slices so the loop runs per block. Two
    arrays (or two tuples) compare in C: the block doubles while it matches and halves past
    the first mismatch (O(log) compares)."""
    n = min(len(a), len(b))
    i = 0
    if (isinstance(a, array) and isinstance(b, array)) or (
            isinstance(a, tuple) and isinstance(b, tuple)):
        grow = True
        while step:
            if i + step <= n and a[i : i + step] == b[i : i + step]:
                i += step
                step = step * 2 if grow else step
            else:
                grow, step = False, step // 2
        return i
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


# NOTE: the hash chains' block (design.md's Algorithm 1 table): at most theta (core/traversal.py),
# so a gain of theta spans a whole block; not measured below or above 64
CHAIN_BLOCK = 64
# NOTE: a question's four branches and the next question's first share the deepest block; the
# newest four are verified so that fifth is seen (notes/2026-11-no-buffer-mix.md)
VERIFY = 4  # sharers of the deepest block confirmed token by token


class ProducerIndex:
    def __init__(self, block: int = CHAIN_BLOCK, chains: TokenChains | None = None) -> None:
        self.block = block
        self.chains = chains  # NOTE: per-request chains kept across rounds (the traversal's)
        self._by_hash: dict[int, list[str]] = {}
        self._producers: dict[str, Producer] = {}
        self._keys: dict[str, list[int]] = {}
        self._tokens: dict[str, array] = {}  # rid -> its tokens as array('q') (compares)

    def __len__(self) -> int:
        return len(self._producers)

    def __contains__(self, rid: str) -> bool:
        return rid in self._producers

    def get(self, rid: str) -> Producer | None:
        return self._producers.get(rid)

    def chain(self, rid: str | None, namespace: Hashable, tokens: Sequence[int]) -> Chain:
        """`tokens`' chain: the cached one of request `rid`, else a fresh one."""
        if rid is None or self.chains is None:
            return Chain(namespace, tokens, self.block)
        return self.chains.get(rid, namespace, tokens)

    def add(self, p: Producer) -> None:
        self.remove(p.rid)
        end = len(p.tokens)
        if p.source is not None and len(p.source) >= end:
            c = self.chain(p.rid, p.namespace, p.source)
            toks = c.tokens if end == len(c.tokens) else c.tokens[:end]
        else:
            c = self.chain(None, p.namespace, p.tokens)
            toks = c.tokens
        keys = c.upto(end)
        for k in keys:
            self._by_hash.setdefault(k, []).append(p.rid)
        self._producers[p.rid] = p
        self._keys[p.rid] = keys
        self._tokens[p.rid] = toks

    def remove(self, rid: str) -> None:
        if self._producers.pop(rid, None) is None:
            return
        del self._tokens[rid]
        for k in self._keys.pop(rid):
            rids = self._by_hash[k]
            rids.remove(rid)
            if not rids:
                del self._by_hash[k]

    def longest(
        self, namespace: Hashable, tokens: Sequence[int], exclude: str | None = None
    ) -> tuple[Producer, int] | None:
        """The producer sharing the longest token prefix with `tokens`, and that length."""
        hits = self.sharers(namespace, tokens, exclude)
        return hits[0] if hits else None

    def sharers(
        self, namespace: Hashable, tokens: Sequence[int], exclude: str | None = None,
        chain: Chain | None = None,
    ) -> list[tuple[Producer, int]]:
        """Producers sharing the deepest shared block with `tokens`, with their common prefix
        length, longest first (ties in insertion order, so every TP rank sees the same list).

        Walks the request's block chain to the deepest block some producer shares, then
        confirms at most `VERIFY` of those producers token by token (the newest): the
        cost follows the request's length, not the number of producers sharing the prefix.
        Sharers of the deepest block differ by < one block. `chain`: `tokens`' cached chain
        (`chain()`), else hashed afresh.
        """
        c = chain if chain is not None else Chain(namespace, tokens, self.block)
        deepest: list[str] = []
        for k in c.walk(len(tokens)):
            rids = self._by_hash.get(k)
            if not rids or rids == [exclude]:
                break
            deepest = rids
        if deepest:
            tokens = c.tokens  # only on a hit: most lookups stop at the first block
        out = []
        # NOTE: the newest first: sharers of one block differ by < a block, and an older
        # group's producers (its siblings, in flight or admitted earlier) must not hide a
        # later question's producer on the same document (its longer prefix, movable)
        for rid in [r for r in deepest[-VERIFY - 1 :] if r != exclude][-VERIFY :]:
            p = self._producers[rid]
            if p.namespace != namespace:
                continue
            n = common_prefix(tokens, self._tokens[rid])
            if n >= self.block:
                out.append((p, n))
        out.sort(key=lambda hit: -hit[1])  # NOTE: stable: ties keep insertion order
        return out
