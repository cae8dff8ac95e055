"""Exact fingerprints of token prefixes: what a recurrent state or a KV slot claims to cover.

A state that covers tokens t_0 .. t_{n-1} is fingerprinted as (n, H1, H2) with
H_k = sum((t_i + 1) * R_k**i) mod P_k: two independent position-weighted hashes. Prefix hashes
are then cumulative sums (one vectorised pass per request), and advancing a state by the tokens
at positions p .. q adds their terms to whatever the state held, so a wrong starting state stays
wrong. Fingerprints are stored as 14-bit words: any float or bfloat16 slot holds them bit-exact
(no NaN / Inf pattern), through every copy SGLang makes of a slot.

Pure numpy: no SGLang, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# NOTE: terms are reduced mod P < 2**24, so int64 cumsums are exact for sequences up to 2**21
# tokens. A token enters as (t mod P) + 1: two ids collide in both hashes only if they differ by a
# multiple of P1 * P2 (> 2**47), far beyond any vocabulary (ids are < MAX_TOKEN, the KV words).
_P = (16_777_213, 16_777_199)  # primes below 2**24
_R = (1_000_003, 911_382_323 % 16_777_199)
MAX_TOKEN = 1 << 28
MAX_LEN = 1 << 21
TAG = 0x2A5A  # marks a written fingerprint (a cleared slot reads 0)
WORDS = 7  # TAG, n (2 words), H1 (2), H2 (2)
_MASK14 = (1 << 14) - 1


@dataclass(frozen=True)
class Fp:
    """A state's claim: it covers `n` tokens whose hashes are h1, h2."""

    n: int
    h1: int
    h2: int

    def words(self) -> list[int]:
        out = [TAG]
        for v in (self.n, self.h1, self.h2):
            out += [v & _MASK14, (v >> 14) & _MASK14]
        return out

    @staticmethod
    def from_words(words) -> Fp | None:
        """None when the words hold no fingerprint (a cleared or never written slot)."""
        w = [int(x) for x in words[:WORDS]]
        if w[0] != TAG:
            return None
        return Fp(w[1] | (w[2] << 14), w[3] | (w[4] << 14), w[5] | (w[6] << 14))


EMPTY = Fp(0, 0, 0)


class Hasher:
    """Power tables, grown on demand."""

    def __init__(self) -> None:
        self._pow = [np.ones(1, dtype=np.int64) for _ in _P]

    def powers(self, k: int, end: int) -> np.ndarray:
        table = self._pow[k]
        if len(table) < end:
            if end > MAX_LEN:
                raise ValueError(f"fingerprint: sequence of {end} tokens (at most {MAX_LEN})")
            n = max(end, 2 * len(table))
            out = np.empty(n, dtype=np.int64)
            out[: len(table)] = table
            for i in range(len(table), n):
                out[i] = out[i - 1] * _R[k] % _P[k]
            self._pow[k] = table = out
        return table[:end]

    def terms(self, tokens: np.ndarray, start: int, k: int) -> np.ndarray:
        """(t_i mod P_k + 1) * R_k**(start + i) mod P_k."""
        tok = np.asarray(tokens, dtype=np.int64)
        if len(tok) and (tok.min() < 0 or tok.max() >= MAX_TOKEN):
            raise ValueError(f"fingerprint: token id outside [0, {MAX_TOKEN})")
        return (tok % _P[k] + 1) * self.powers(k, start + len(tok))[start:] % _P[k]

    def of(self, tokens) -> Fp:
        """The fingerprint of exactly `tokens` (from scratch)."""
        if len(tokens) == 0:
            return EMPTY
        h = [int(self.terms(tokens, 0, k).sum() % _P[k]) for k in range(2)]
        return Fp(len(tokens), h[0], h[1])

    def step(self, fp: Fp, token: int, pos: int) -> Fp:
        """`fp` advanced by one token at `pos` (a decode step)."""
        if not 0 <= token < MAX_TOKEN:
            raise ValueError(f"fingerprint: token id {token} outside [0, {MAX_TOKEN})")
        h = [(v + (token % _P[k] + 1) * int(self.powers(k, pos + 1)[pos])) % _P[k]
             for k, v in enumerate((fp.h1, fp.h2))]
        return Fp(fp.n + 1, h[0], h[1])

    def table(self, tokens) -> Prefixes:
        """Every prefix's hashes of `tokens`, from one cumulative pass."""
        return Prefixes([np.cumsum(self.terms(tokens, 0, k)) for k in range(2)])


@dataclass(frozen=True)
class Prefixes:
    """Cumulative hashes of one sequence: entry j covers its first j + 1 tokens."""

    cum: list[np.ndarray]

    def _sum(self, k: int, a: int, b: int) -> int:
        c = self.cum[k]
        return int(c[b - 1]) - (int(c[a - 1]) if a else 0) if b > a else 0

    def at(self, n: int) -> Fp:
        """The from-scratch fingerprint of the first `n` tokens."""
        if n == 0:
            return EMPTY
        return Fp(n, int(self.cum[0][n - 1]) % _P[0], int(self.cum[1][n - 1]) % _P[1])

    def advance(self, fp: Fp, a: int, b: int) -> Fp:
        """`fp` advanced by the tokens at positions a .. b-1 (whatever `fp` was)."""
        return Fp(fp.n + b - a, (fp.h1 + self._sum(0, a, b)) % _P[0],
                  (fp.h2 + self._sum(1, a, b)) % _P[1])


def kv_words(tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The 4 words a full-attention KV slot holds: its token id and its position."""
    t = np.asarray(tokens, dtype=np.int64)
    p = np.asarray(positions, dtype=np.int64)
    return np.stack([t & _MASK14, (t >> 14) & _MASK14, p & _MASK14, (p >> 14) & _MASK14], axis=1)


def kv_decode(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, positions) back from `kv_words`."""
    w = np.asarray(words, dtype=np.int64)
    return w[:, 0] | (w[:, 1] << 14), w[:, 2] | (w[:, 3] << 14)


def next_token(fp: Fp, kv_digest: int, vocab: int) -> int:
    """The witness model's greedy token: a function of the state it computed and of the KV it
    read, so a wrong state or a wrong KV slot changes the output."""
    return (fp.h1 * 31 + fp.h2 * 7 + fp.n + kv_digest) % vocab
