"""The witness executor: a model stand-in whose states are exact fingerprints of their prefix.

Each forward reads the state SGLang handed a request, checks it against a from-scratch
fingerprint of the tokens it should cover, advances *what it read* over the extend, and writes
the results exactly where SGLang's metadata says a real forward writes them:

- recurrent layers (first and last mamba layer's temporal tensor): the request's working slot
  after the deferred clear / copy-on-write (model_runner.py
  `ModelRunner._maybe_execute_deferred_mamba_cow_and_clear`, ported below); the extra_buffer
  track slot at the depth the kernel actually snapshots (layers/attention/mamba/
  prefill_track_metadata.py `build_prefill_track_plan`, SGLang's own function: an aligned
  track length takes the last state, an unaligned one the `h` snapshot at its last chunk
  boundary, hybrid_linear_attn_backend.py `_init_track_ssm_indices`); on decode, the state after
  the step into `mamba_track_indices` where `mamba_track_mask_cpu` is set (schedule_batch.py
  `prepare_for_decode`: seq_lens % mamba_track_interval == 0);
- full-attention layers (first full layer's key buffer): each KV slot holds its token id and
  position; every forward reads the request's whole row back.

The next token is a function of the state the forward computed and of the KV it read, so a wrong
state changes the output as a real model's would. Tests and eval runs are strict (a mismatch
raises); the served executor counts and logs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..core.fingerprint import EMPTY, WORDS, Fp, Hasher, kv_decode, kv_words, next_token
from . import check_sglang_version

check_sglang_version()

import torch  # noqa: E402
from sglang.srt.layers.attention.mamba.prefill_track_metadata import (  # noqa: E402
    build_prefill_track_plan,
)
from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool  # noqa: E402

logger = logging.getLogger(__name__)
_ATTR = "_radixflow_witness"
KEEP_MISMATCHES = 20  # mismatch reports kept for /server_info and the run's error


class WitnessMismatch(AssertionError):
    """A request was handed state that is not the state of its prefix."""


@dataclass
class WitnessStats:
    requests: int = 0  # distinct requests the witness computed
    mismatched: int = 0  # of those, requests handed at least one wrong state
    states_checked: int = 0  # recurrent states read and checked (every decode, every resume)
    resumed: int = 0  # of those, extends that resumed a cached or chunked prefix (prefix > 0)
    kv_checked: int = 0  # KV slots read back and checked
    reports: list[str] = field(default_factory=list)

    @property
    def verified(self) -> int:
        return self.requests - self.mismatched

    def as_dict(self) -> dict:
        return {"requests": self.requests, "verified": self.verified,
                "mismatched": self.mismatched, "states_checked": self.states_checked,
                "resumed": self.resumed,
                "kv_checked": self.kv_checked, "first_mismatches": list(self.reports)}


@dataclass
class _Seq:
    """What one request's state should cover: `toks[:-1]` after its last sampled token."""

    toks: np.ndarray
    expect: Fp  # fingerprint of toks[:-1] (from the witness's own bookkeeping, not the pool)
    bad: bool = False


# override(req, k) -> the id to emit as the request's k-th output token, or None for the
# witness's own (a scripted kit output).
Override = Callable[[object, int], int | None]


class Witness:
    """Runs a batch's forward over SGLang's real pools (CPU tensors)."""

    def __init__(self, req_to_token_pool, kv_pool, vocab: int, state_chunk: int,
                 strict: bool = True, metrics: WitnessMetrics | None = None) -> None:
        self.r2t = req_to_token_pool
        self.metrics = metrics
        self._published = (0, 0, 0)
        self.vocab, self.state_chunk, self.strict = vocab, state_chunk, strict
        self.hasher = Hasher()
        self.stats = WitnessStats()
        self.hybrid = isinstance(req_to_token_pool, HybridReqToTokenPool)
        # NOTE: numpy views share the pools' memory (CPU tensors): what SGLang copies, the
        # witness reads. A KV slot's first 4 int16 words; a state slot's first WORDS words.
        key = kv_pool.get_key_buffer(_first_full_layer(kv_pool))
        self._kv = key.view(torch.int16).reshape(key.shape[0], -1)[:, :4].numpy()
        self._rows = req_to_token_pool.req_to_token.numpy()
        if self.hybrid:
            t = req_to_token_pool.mamba_pool.mamba_cache.temporal
            self._state = [t[i].view(torch.int16).reshape(t.shape[1], -1)[:, :WORDS].numpy()
                           for i in sorted({0, t.shape[0] - 1})]

    # --- the forward ---------------------------------------------------------------------
    def forward(self, batch, override: Override | None = None) -> list[int]:
        """The batch's sampled ids (one per row), after checking and writing every state."""
        if batch.forward_mode.is_extend():
            run_deferred_mamba_cow(self.r2t, batch)
            return self._extend(batch, override)
        if batch.forward_mode.is_decode():
            return self._decode(batch, override)
        return [0] * len(batch.reqs)  # idle

    def _extend(self, batch, override: Override | None) -> list[int]:
        track = self._track_depths(batch)
        out = []
        for i, req in enumerate(batch.reqs):
            pre, ext = int(batch.prefix_lens[i]), int(batch.extend_lens[i])
            out.append(self._extend_one(req, pre, pre + ext, track[i], batch, i, override))
        return out

    def _extend_one(self, req, pre: int, end: int, track: int | None, batch, row: int,
                    override: Override | None) -> int:
        rec = self._seq(req)
        fill = _row_tokens(req, rec, end)
        tab = self.hasher.table(fill)
        expect = tab.at(pre)
        fp = Fp(end, 0, 0)
        if self.hybrid:
            slot = self._mamba_slot(req)
            read = EMPTY
            if pre > 0:  # NOTE: no initial state at prefix 0 (gdn_backend: extend_prefix_lens > 0)
                self.stats.resumed += 1
                read = self._read_state(req, slot, expect, pre, "resumed state")
            fp = tab.advance(read, pre, end)  # NOTE: from what was read, right or wrong
            self._write_state(slot, fp)
            if track is not None:
                self._write_state(int(batch.mamba_track_indices[row]), tab.advance(read, pre,
                                                                                    track))
        digest = self._kv_pass(req, fill, pre, end)
        if end < len(req.full_untruncated_fill_ids):
            return 0  # NOTE: a chunk: nothing is sampled (the result path skips the row)
        tok = self._choose(req, end - len(req.origin_input_ids), fp, digest, override)
        rec.toks = np.append(fill, tok)
        rec.expect = tab.at(end)
        return tok

    def _decode(self, batch, override: Override | None) -> list[int]:
        seq_lens = batch.seq_lens_cpu.tolist()
        track = getattr(batch, "mamba_track_mask_cpu", None)
        out = []
        for i, req in enumerate(batch.reqs):
            rec = getattr(req, _ATTR, None)
            if rec is None or len(rec.toks) != seq_lens[i]:
                self._mismatch(req, "decode", seq_lens[i], "a sequence of "
                               f"{seq_lens[i]} tokens", "the witness saw "
                               f"{None if rec is None else len(rec.toks)}")
                out.append(0)
                continue
            pos, x = seq_lens[i] - 1, int(rec.toks[-1])
            fp = Fp(seq_lens[i], 0, 0)
            if self.hybrid:
                slot = self._mamba_slot(req)
                read = self._read_state(req, slot, rec.expect, pos, "decode state")
                fp = self.hasher.step(read, x, pos)
                self._write_state(slot, fp)
                dst = int(batch.mamba_track_indices[i]) if track and track[i] else -1
                if dst >= 0:
                    self._write_state(dst, fp)
            digest = self._kv_pass(req, rec.toks, pos, pos + 1)
            tok = self._choose(req, len(rec.toks) - len(req.origin_input_ids), fp, digest,
                               override)
            rec.expect = self.hasher.step(rec.expect, x, pos)
            rec.toks = np.append(rec.toks, tok)
            out.append(tok)
        return out

    def amend(self, batch, ids: list[int], final) -> None:
        """The tokens SGLang finally samples where they differ from the witness's (a grammar's
        mask replaced them, sim_outputs.py): the next decode step reads the final one."""
        for req, mine, got in zip(batch.reqs, ids, [int(x) for x in final], strict=True):
            rec = getattr(req, _ATTR, None)
            if got != mine and rec is not None and len(rec.toks) and int(rec.toks[-1]) == mine:
                rec.toks = np.append(rec.toks[:-1], got)

    def publish_metrics(self) -> None:
        """Move the Prometheus counters by what changed since the last call."""
        if self.metrics is None:
            return
        now = (self.stats.requests, self.stats.mismatched, self.stats.states_checked)
        for counter, new, old in zip(self.metrics.counters(), now, self._published, strict=True):
            if new > old:
                counter.inc(new - old)
        self._published = now

    # --- pieces ----------------------------------------------------------------------------
    def _seq(self, req) -> _Seq:
        rec = getattr(req, _ATTR, None)
        if rec is None:
            rec = _Seq(np.empty(0, dtype=np.int64), EMPTY)
            setattr(req, _ATTR, rec)
            self.stats.requests += 1
        return rec

    def _choose(self, req, k: int, fp: Fp, digest: int, override: Override | None) -> int:
        forced = override(req, k) if override is not None else None
        return forced if forced is not None else next_token(fp, digest, self.vocab)

    def _track_depths(self, batch) -> list[int | None]:
        """Per row, the depth the state written to its track slot covers (None: no track)."""
        mask = getattr(batch, "mamba_prefill_track_mask_cpu", None)
        if not self.hybrid or mask is None or not any(mask):
            return [None] * len(batch.reqs)
        pre = [int(x) for x in batch.prefix_lens]
        ext = [int(x) for x in batch.extend_lens]
        plan = build_prefill_track_plan(mask, list(batch.mamba_track_seqlens_cpu), ext, pre,
                                        self.state_chunk, mamba2=False)
        out: list[int | None] = [None] * len(batch.reqs)
        for row in plan.final_rows:
            out[row] = pre[row] + ext[row]  # the last state
        for row in plan.unaligned_rows:  # the h snapshot (or Mamba2's recompute) at a boundary
            out[row] = pre[row] + plan.chunk_indices[row] * self.state_chunk
        return out

    def _mamba_slot(self, req) -> int:
        return int(self.r2t.req_index_to_mamba_index_mapping[req.kv.req_pool_idx])

    def _read_state(self, req, slot: int, expect: Fp, depth: int, what: str) -> Fp:
        got = [Fp.from_words(t[slot]) for t in self._state]
        self.stats.states_checked += 1
        if got[0] != expect or any(g != got[0] for g in got[1:]):
            self._mismatch(req, what, depth, expect, got[0] if len(set(got)) == 1 else got)
        return got[0] or EMPTY

    def _write_state(self, slot: int, fp: Fp) -> None:
        words = fp.words()
        for t in self._state:
            t[slot] = words

    def _kv_pass(self, req, toks: np.ndarray, pre: int, end: int) -> int:
        """Write positions [pre, end) into the request's KV slots, read its row [0, end) back,
        check it, and return a digest of what was read."""
        locs = self._rows[req.kv.req_pool_idx, :end]
        self._kv[locs[pre:end]] = kv_words(toks[pre:end], np.arange(pre, end))
        tok, pos = kv_decode(self._kv[locs])
        self.stats.kv_checked += end
        want = toks[:end]
        bad = (tok != want) | (pos != np.arange(end))
        if bad.any():
            j = int(np.argmax(bad))
            self._mismatch(req, "KV slot", j, f"token {int(want[j])} at {j}",
                           f"token {int(tok[j])} at {int(pos[j])} "
                           f"(slot {int(locs[j])}; {int(bad.sum())} wrong)")
        return int((((tok & 0xFFFF) + 1) * (pos % 65_521 + 1)).sum() % 1_000_003)

    def _mismatch(self, req, what: str, depth: int, expected, found) -> None:
        rec = self._seq(req)
        if not rec.bad:
            rec.bad = True
            self.stats.mismatched += 1
        msg = (f"witness: request {req.rid!r}: {what} at depth {depth}: expected {expected}, "
               f"found {found}")
        if len(self.stats.reports) < KEEP_MISMATCHES:
            self.stats.reports.append(msg)
        if self.strict:
            raise WitnessMismatch(msg)
        logger.error(msg)


@dataclass
class WitnessMetrics:
    """Prometheus counters of a served witness (radixflow_witness_*_total)."""

    requests: object
    mismatched: object
    states_checked: object

    def counters(self) -> tuple:
        return self.requests, self.mismatched, self.states_checked


def witness_metrics(enabled: bool) -> WitnessMetrics | None:
    """The counters, when the server exports metrics (--enable-metrics)."""
    if not enabled:
        return None
    from prometheus_client import Counter

    return WitnessMetrics(
        Counter("radixflow_witness_requests", "Requests the witness executor computed"),
        Counter("radixflow_witness_mismatched", "Requests handed a state that is not the state "
                "of their prefix (witness executor)"),
        Counter("radixflow_witness_states_checked", "Recurrent states the witness checked"))


def run_deferred_mamba_cow(pool, batch) -> None:
    """model_runner.py `ModelRunner._maybe_execute_deferred_mamba_cow_and_clear` (0.5.23), on
    CPU: clear, then copy-on-write, before the mamba layers read the pool."""
    if not isinstance(pool, HybridReqToTokenPool):
        return
    if batch.mamba_clear_indices is not None and len(batch.mamba_clear_indices):
        pool.mamba_pool.clear_slots(pool.translate_mamba_indices(batch.mamba_clear_indices))
    if batch.mamba_cow_src_indices is not None and len(batch.mamba_cow_src_indices):
        pool.copy_mamba_state(pool.translate_mamba_indices(batch.mamba_cow_src_indices),
                              pool.translate_mamba_indices(batch.mamba_cow_dst_indices))
    # NOTE: as upstream (it clears them on the forward batch): a second forward copies nothing.
    batch.mamba_clear_indices = batch.mamba_cow_src_indices = batch.mamba_cow_dst_indices = None


def _first_full_layer(kv_pool) -> int:
    mapping = getattr(kv_pool, "full_attention_layer_id_mapping", None)
    return min(mapping) if mapping else 0


def _row_tokens(req, rec: _Seq, end: int) -> np.ndarray:
    """An extend row's tokens up to `end`. A decoding request's row in an extend batch
    (`--enable-mixed-chunk`: schedule_batch.py `mix_with_running`; DP attention's
    `convert_decode_to_extend`) extends one token at seq_len - 1, which under overlap is still
    in flight: `end` runs one past full_untruncated_fill_ids (upstream's own note there). The
    witness sampled that token itself: its record has it."""
    ids = req.full_untruncated_fill_ids
    if end > len(ids) and len(rec.toks) >= end:
        return rec.toks[:end]
    return np.frombuffer(ids, dtype=np.int64)[:end]
