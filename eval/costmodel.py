"""Batch cost model of the scheduler twin: how long one prefill forward takes on the GPU.

    c(batch) = alpha + beta * scheduled_tokens + gamma * rows + delta * attn_pairs

    attn_pairs = sum over the batch's requests of extend * (prefix + extend / 2)

`rows` counts the requests in the batch (a continued chunk is a row), `scheduled_tokens` the
tokens it extends (the prefix hit is not recomputed), `attn_pairs` the (query, key) pairs the
causal full-attention layers score (each new token attends to the cached prefix and, on
average, half of its own extend).

Derivation of the defaults (first principles; the paper's Tables 6/9 are not available to us)
--------------------------------------------------------------------------------------------
Hardware assumptions: one H200, dense bf16 peak ~790 TFLOP/s (conservative: NVIDIA lists 989
for the SXM part), prefill model FLOP utilisation MFU = 0.5, HBM bandwidth 4.8 TB/s. Every
number below is an *assumption* of this model, not a measurement; `fit()` replaces
alpha/beta/gamma with a least-squares fit as soon as a GPU trace exists.

beta (s per scheduled token). A dense transformer spends 2 FLOPs per parameter per token in
its matmuls. Parameters that do no matmul per token are left out: the input embedding is a
lookup, and the LM head runs only on each request's last position (charged per row below).
So

    P_tok = P_total - n_tables * vocab * hidden      (n_tables = 1 if tied, else 2)
    beta  = 2 * P_tok / (790e12 * 0.5)

with P_total the published parameter count (the catalog, radixflow_sglang/models.py;
vocab/hidden/tying read from the model's config.json). Example, qwen3.5-4b: P_tok = 4e9 -
248,320 * 2,560 = 3.36e9, beta =
1.70e-5 s/token, i.e. a full T = 8,192-token round computes for ~139 ms. The recurrent (gated
delta net / Mamba2) mixers' own state-update FLOPs are ~1 % of the matmul FLOPs for these
shapes and are ignored.

alpha (s per forward). A fixed per-forward overhead: kernel launches / CUDA graph replay,
the scheduler's own scan and batch preparation, sampling, the result round trip. ASSUMPTION:
8 ms, the same for every model (order of magnitude of SGLang's non-overlapped scheduler step).
alpha and gamma therefore describe a round as observed WITHOUT overlap. The twin's host-cost
model (eval/hostcost.py) takes the scan and batch preparation out of them (GPU time = cost less
the stock scan's s0 + s2 * rows) and charges each arm its own scan's CPU time instead, added to
the round without overlap and hidden behind the previous forward with overlap; nothing is
counted twice. `--host-cost none` keeps the whole cost on the GPU and the scans free.

gamma (s per row). ASSUMPTION: 0.1 ms of per-request bookkeeping (metadata, index tensors,
sampling), plus the LM head on the row's last position (2 * vocab * hidden FLOPs at the same
throughput as beta), plus, for hybrid models, one copy of the request's recurrent state
(read + write of `state_bytes` at 4.8 TB/s: the copy-on-write from the cache or the
checkpoint into the tree). For qwen3.5-4b: 0.1 ms + 3.2 us + 21 us = 0.124 ms.

delta (s per attention pair). Each full-attention layer spends 4 * n_heads * head_dim FLOPs
per (query, key) pair (QK^T and PV, 2 FLOPs per multiply-add), so
delta = 4 * n_full_layers * n_heads * head_dim / (790e12 * 0.5). Only full-attention layers
count: the linear mixers are linear in tokens (already in beta). For qwen3.5-4b a 5,000-token
cold prefill gets ~5 % on top of the beta term; for qwen3-8b (36 attention layers) ~10 %.
`CostModel(delta=0)` turns the term off.

Decode steps (memory-bound)
---------------------------
A decode step of the running batch computes one token per row. At the batch sizes a prefill
budget allows it is bound by HBM reads, not FLOPs, so it has its own term:

    c_dec(step) = dec_alpha + dec_gamma * rows + dec_kv * cached_tokens

`cached_tokens` sums the rows' sequence lengths (the KV entries the step's attention reads).

dec_alpha: the weights are read once per step, whatever the rows: 2 bytes (bf16) per parameter
read, at HBM_BYTES_PER_S * MBU_DECODE (ASSUMPTION: 0.7 of the 4.8 TB/s peak). The input
embedding table is a lookup (rows x hidden, not the whole table), so an untied model reads
P_total - vocab * hidden parameters, a tied one P_total (the table is the LM head). Plus a
fixed DECODE_OVERHEAD_S (ASSUMPTION: 1.5 ms; CUDA-graph replay, sampling, the result round
trip; decode runs under CUDA graphs, so far below the prefill alpha's 8 ms). qwen3.5-4b:
8.0 GB / 3.36 TB/s = 2.38 ms + 1.5 ms = 3.88 ms.

dec_gamma: per row DECODE_ROW_S (ASSUMPTION: 20 us of metadata and sampling) plus, for hybrid
models, one read and one write of the request's recurrent state (`state_bytes`, every layer) at
the same bandwidth: qwen3.5-4b 20 us + 2 x 50.3 MB / 3.36 TB/s = 50 us. The per-row matmul
FLOPs (2 * P_tok, beta's numerator) are left out: below the roofline's ridge (weights' read
time / per-row compute time, ~140 rows for qwen3.5-4b) they hide under the weight reads.

dec_kv: per cached token, its full-attention KV (`kv_bytes_per_token`, every full-attention
layer, K and V) read once at the same bandwidth: qwen3.5-4b 32 KiB -> 9.8 ns per token, so 64
rows of 2,000 tokens add 1.25 ms. Recurrent layers read their constant-size state instead
(dec_gamma).

`fit(jsonl)` reads GPU forward records {rows, scheduled_tokens, duration_s[, attn_pairs]} and
solves the least-squares problem for alpha, beta, gamma; delta is fitted too when every record
carries attn_pairs, else it is 0 (the fitted beta then absorbs the workload's mean attention).
The records are prefill forwards: a fitted model has no decode term unless `decode_from` gives
one (e.g. `default_cost(model)`'s).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from radixflow_sglang import models

# NOTE: the hardware assumptions of the docstring have one home, next to the prior they feed.
from radixflow_sglang.core.cost import (  # noqa: E402, F401
    ALPHA_S,
    HBM_BYTES_PER_S,
    MFU,
    PEAK_FLOPS,
    ROW_OVERHEAD_S,
    CostCoeffs,
    prior_from_geometry,
)
from radixflow_sglang.geometry import Geometry, load_geometry

MBU_DECODE = 0.7  # decode's HBM bandwidth utilisation (assumption, module docstring)
DECODE_OVERHEAD_S = 1.5e-3  # fixed per decode step (assumption)
DECODE_ROW_S = 2e-5  # per decode row (assumption)


@dataclass(frozen=True)
class CostModel(CostCoeffs):
    """The server's round-cost coefficients (core/cost.py CostCoeffs: alpha, beta, gamma, delta,
    source, and `self(rows, tokens, pairs)`), plus the twin's decode-step terms."""

    dec_alpha: float = 0.0  # s per decode step (0: decode is free; default_cost derives it)
    dec_gamma: float = 0.0  # s per decode row
    dec_kv: float = 0.0  # s per cached token a decode step reads
    # NOTE: True for the simulated executor's profiles: its forward sleeps the whole cost and
    # the scheduler's scan comes on top, so a host model (eval/hostcost.py gpu_cost) takes
    # nothing out of alpha/gamma; a GPU model's alpha holds the stock scan (module docstring)
    forward_only: bool = False

    def batch(self, extend: Mapping[str, int], prefix: Mapping[str, int]) -> float:
        """Cost of one round given per-request extend and prefix lengths (a kit Round's)."""
        return self(len(extend), sum(extend.values()), attn_pairs(extend, prefix))

    def decode(self, rows: int, cached_tokens: int) -> float:
        """Cost of one decode step (module docstring, "Decode steps")."""
        return self.dec_alpha + self.dec_gamma * rows + self.dec_kv * cached_tokens

    def step(self, rnd) -> float:
        """A kit round of either mode: a prefill Round or a DecodeRound."""
        if rnd.mode == "decode":
            return self.decode(len(rnd.rids), rnd.cached_tokens)
        return self.batch(rnd.extend, rnd.prefix)


def attn_pairs(extend: Mapping[str, int], prefix: Mapping[str, int]) -> float:
    return float(sum(e * (prefix[r] + e / 2) for r, e in extend.items()))


def default_cost(model: str, *, attention: bool = True) -> CostModel:
    """The first-principles defaults of the module docstring for a model directory name."""
    if model not in models.CATALOG:
        raise ValueError(f"no parameter count for {model!r}; known: {', '.join(models.names())}")
    geo = load_geometry(model)
    t = models.text_config(model)
    heads = t["num_attention_heads"]
    head_dim = t.get("head_dim") or t.get("attention_head_dim") or t["hidden_size"] // heads
    # NOTE: the derivation lives in the core (the server derives its prior the same way).
    tied = t.get("tie_word_embeddings", False)
    c = prior_from_geometry(
        models.get(model).params, t["vocab_size"], t["hidden_size"], tied,
        state_bytes=geo.state_bytes if geo.hybrid else 0,
        full_layers=len(geo.full_layers) if attention else 0, heads=heads, head_dim=head_dim)
    d = decode_terms(models.get(model).params, t["vocab_size"], t["hidden_size"], tied, geo)
    return CostModel(c.alpha, c.beta, c.gamma, c.delta, f"default:{model}", *d)


def decode_terms(params: float, vocab: int, hidden: int, tied: bool,
                 geo: Geometry) -> tuple[float, float, float]:
    """(dec_alpha, dec_gamma, dec_kv) from the model's numbers (module docstring)."""
    bw = HBM_BYTES_PER_S * MBU_DECODE
    weights = 2 * (params - (0 if tied else vocab * hidden))
    state = geo.state_bytes if geo.hybrid else 0
    return (DECODE_OVERHEAD_S + weights / bw, DECODE_ROW_S + 2 * state / bw,
            geo.kv_bytes_per_token / bw)


def cost_with(model: str, *, alpha_ms: float | None = None, beta_us: float | None = None,
              gamma_ms: float | None = None) -> CostModel:
    """`default_cost(model)` with alpha / beta / gamma overridden where given (ms, us, ms)."""
    return override(default_cost(model), alpha_ms=alpha_ms, beta_us=beta_us, gamma_ms=gamma_ms)


def profile_cost(profile: str, model: str, env: Mapping[str, str] | None = None,
                 name: str = "--profile") -> CostModel:
    """The simulated executor's cost at `profile` (radixflow_sglang/profiles.py; `env`: its
    RADIXFLOW_SIM_* overrides) as the twin's: prefill alpha + beta * tokens + gamma * rows, a
    decode step a forward of one token per row (adapter/simulated.py); errors name `name`."""
    from radixflow_sglang.profiles import resolve

    c = resolve(profile, model, env, name)
    return CostModel(c.alpha, c.beta, c.gamma, source=f"simulated executor, {c.describe()}",
                     dec_alpha=c.alpha, dec_gamma=c.beta + c.gamma, forward_only=True)


def override(c: CostModel, *, alpha_ms: float | None = None, beta_us: float | None = None,
             gamma_ms: float | None = None) -> CostModel:
    """`c` with alpha / beta / gamma overridden where given (ms, us, ms)."""
    given = (("alpha", alpha_ms, 1e-3), ("beta", beta_us, 1e-6), ("gamma", gamma_ms, 1e-3))
    over = {k: v * unit for k, v, unit in given if v is not None}
    if not over:
        return c
    tag = ",".join(f"{k}={v:g}" for k, v in over.items())
    return replace(c, **over, source=f"{c.source}+{tag}")


def _records(source: str | Path | Iterable[Mapping]) -> list[Mapping]:
    if isinstance(source, str | Path):
        out = []
        with open(source, encoding="utf-8") as f:
            for n, line in enumerate(f, start=1):
                if line.strip():
                    row = json.loads(line)
                    for key in ("rows", "scheduled_tokens", "duration_s"):
                        if key not in row:
                            raise ValueError(f"{source} line {n}: missing field {key!r}")
                    out.append(row)
        return out
    return list(source)


def fit(source: str | Path | Iterable[Mapping], decode_from: CostModel | None = None
        ) -> CostModel:
    """Least-squares alpha, beta, gamma (and delta if every record has attn_pairs) from GPU
    forward records {rows, scheduled_tokens, duration_s[, attn_pairs]} (a JSONL path or dicts).

    Without attn_pairs the model has delta = 0: the fitted beta absorbs the attention cost of
    the traced workload (subtracting a default delta term is impossible without the pairs).
    """
    rows = _records(source)
    if len(rows) < 3:
        raise ValueError(f"need at least 3 records to fit 3 coefficients, got {len(rows)}")
    y = np.array([float(r["duration_s"]) for r in rows])
    cols = [np.ones(len(rows)), [float(r["scheduled_tokens"]) for r in rows],
            [float(r["rows"]) for r in rows]]
    with_attn = all("attn_pairs" in r for r in rows)
    delta = 0.0
    if with_attn:
        cols.append([float(r["attn_pairs"]) for r in rows])
    a = np.column_stack(cols)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    if with_attn:
        delta = float(coef[3])
    d = decode_from
    dec = (d.dec_alpha, d.dec_gamma, d.dec_kv) if d is not None else (0.0, 0.0, 0.0)
    return CostModel(float(coef[0]), float(coef[1]), float(coef[2]), delta, "fit", *dec)
