"""Producer index: which live producer covers the longest prefix of a request, without a queue walk.

Producers are requests admitted earlier in this scan or still in flight (result not processed).
Each is indexed by a hash chain over fixed-size token blocks, keyed by cache namespace, so a
lookup costs O(len(request)) regardless of how many producers or waiting requests there are.
Hash hits are confirmed token by token: a collision can never make two prefixes look shared.
"""

from __future__ import annotations

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
    consumers: list[str] = field(default_factory=list)


def _chain(namespace: Hashable, tokens: Sequence[int], block: int, limit: int) -> Iterator[int]:
    h = hash(namespace)
    for start in range(0, limit - block + 1, block):
        h = hash((h, tuple(tokens[start : start + block])))
        yield h


def common_prefix(a: Sequence[int], b: Sequence[int], step: int = 64) -> int:
    """Length of the shared token prefix; compares slices so the loop runs per block."""
    n = min(len(a), len(b))
    i = 0
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ProducerIndex:
    VERIFY = 4  # sharers of the deepest block confirmed token by token

    def __init__(self, block: int = 64) -> None:
        self.block = block
        self._by_hash: dict[int, list[str]] = {}
        self._producers: dict[str, Producer] = {}
        self._keys: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self._producers)

    def __contains__(self, rid: str) -> bool:
        return rid in self._producers

    def get(self, rid: str) -> Producer | None:
        return self._producers.get(rid)

    def add(self, p: Producer) -> None:
        self.remove(p.rid)
        p.tokens = list(p.tokens)  # NOTE: slice compares need one sequence type
        keys = list(_chain(p.namespace, p.tokens, self.block, len(p.tokens)))
        for k in keys:
            self._by_hash.setdefault(k, []).append(p.rid)
        self._producers[p.rid] = p
        self._keys[p.rid] = keys

    def remove(self, rid: str) -> None:
        if self._producers.pop(rid, None) is None:
            return
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
        self, namespace: Hashable, tokens: Sequence[int], exclude: str | None = None
    ) -> list[tuple[Producer, int]]:
        """Producers sharing the deepest shared block with `tokens`, with their common prefix
        length, longest first (ties in insertion order, so every TP rank sees the same list).

        Walks the request's block chain to the deepest block some producer shares, then
        confirms at most `VERIFY` of those producers token by token (insertion order): the
        cost follows the request's length, not the number of producers sharing the prefix.
        Sharers of the deepest block differ by < one block.
        """
        deepest: list[str] = []
        for k in _chain(namespace, tokens, self.block, len(tokens)):
            rids = self._by_hash.get(k)
            if not rids or rids == [exclude]:
                break
            deepest = rids
        if deepest and not isinstance(tokens, list):
            tokens = list(tokens)  # only on a hit: most lookups stop at the first block
        out = []
        for rid in [r for r in deepest[: self.VERIFY + 1] if r != exclude][: self.VERIFY]:
            p = self._producers[rid]
            if p.namespace != namespace:
                continue
            n = common_prefix(tokens, p.tokens)
            if n >= self.block:
                out.append((p, n))
        out.sort(key=lambda hit: -hit[1])  # NOTE: stable: ties keep insertion order
        return out
