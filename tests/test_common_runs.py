"""core/boundary.py `common_runs` (template pieces): the pairs it visits and the run lengths it
measures on offsets give the answer of the plain all-pairs scan, on tails full of repeated
tokens (where a run of one token repeated made every pair of positions a candidate)."""

from __future__ import annotations

import random

from radixflow_sglang.core.boundary import _kgram_index, _run_len, common_runs
from radixflow_sglang.core.producers import common_prefix


def _all_pairs(a: tuple[int, ...], b: tuple[int, ...], k: int) -> list[tuple[int, ...]] | None:
    """The reference: every pair of common k-gram positions, in (j, i) order."""
    ia, ib = _kgram_index(a, k), _kgram_index(b, k)
    runs = []
    for j, i in sorted((j, i) for g in set(ia) & set(ib) for j in ib[g] for i in ia[g]):
        if i and j and a[i - 1] == b[j - 1]:
            continue
        if i == 0 or j == 0:
            return None
        n = k + common_prefix(a[i + k:], b[j + k:])
        if i + n < len(a) and j + n < len(b):
            runs.append(a[i:i + n])
    return runs


def _tail(rng: random.Random, vocab: int, shared: tuple[int, ...]) -> tuple[int, ...]:
    head = tuple(rng.randrange(vocab) for _ in range(rng.randrange(3, 60)))
    return head + shared + tuple(rng.randrange(vocab) for _ in range(rng.randrange(0, 60)))


def test_common_runs_match_the_all_pairs_scan() -> None:
    rng = random.Random(0)
    found = 0
    for _ in range(3000):
        vocab = rng.choice([2, 3, 5, 50])
        shared = tuple(rng.randrange(vocab) for _ in range(rng.randrange(0, 40)))
        a, b = _tail(rng, vocab, shared), _tail(rng, vocab, shared)
        ia, ib = _kgram_index(a, 3), _kgram_index(b, 3)
        got = common_runs(a, b, 3, ia, ib, frozenset(ia) & frozenset(ib))
        assert got == _all_pairs(a, b, 3)
        found += bool(got)
    assert found > 100  # NOTE: runs were found, not only None and []


def test_run_len_is_common_prefix_on_offsets() -> None:
    rng = random.Random(1)
    for _ in range(5000):
        a = tuple(rng.randrange(2) for _ in range(rng.randrange(0, 300)))
        b = a[:rng.randrange(len(a) + 1)] + tuple(rng.randrange(2) for _ in range(40))
        i, j = rng.randrange(len(a) + 1), rng.randrange(len(b) + 1)
        assert _run_len(a, i, b, j) == common_prefix(a[i:], b[j:])


def test_a_repeated_token_run_is_not_a_piece() -> None:
    """Two tails that end in the same run of one token (padding): no piece (the run reaches
    both ends), as the all-pairs scan says."""
    a = tuple(range(100, 188)) + (1,) * 40
    b = tuple(range(300, 388)) + (1,) * 40
    ia, ib = _kgram_index(a, 3), _kgram_index(b, 3)
    assert common_runs(a, b, 3, ia, ib, frozenset(ia) & frozenset(ib)) == [] == _all_pairs(a, b, 3)
