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

`fit(jsonl)` reads GPU forward records {rows, scheduled_tokens, duration_s[, attn_pairs]} and
solves the least-squares problem for alpha, beta, gamma; delta is fitted too when every record
carries attn_pairs, else it is 0 (the fitted beta then absorbs the workload's mean attention).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
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
    prior_from_geometry,
)
from radixflow_sglang.geometry import load_geometry


@dataclass(frozen=True)
class CostModel:
    alpha: float  # s per forward
    beta: float  # s per scheduled token
    gamma: float  # s per row
    delta: float = 0.0  # s per full-attention (query, key) pair
    source: str = "custom"

    def __call__(self, rows: int, scheduled_tokens: int, attn_pairs: float = 0.0) -> float:
        return (self.alpha + self.beta * scheduled_tokens + self.gamma * rows
                + self.delta * attn_pairs)

    def batch(self, extend: Mapping[str, int], prefix: Mapping[str, int]) -> float:
        """Cost of one round given per-request extend and prefix lengths (a kit Round's)."""
        return self(len(extend), sum(extend.values()), attn_pairs(extend, prefix))

    def as_dict(self) -> dict:
        return asdict(self)


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
    c = prior_from_geometry(
        models.get(model).params, t["vocab_size"], t["hidden_size"],
        t.get("tie_word_embeddings", False),
        state_bytes=geo.state_bytes if geo.hybrid else 0,
        full_layers=len(geo.full_layers) if attention else 0, heads=heads, head_dim=head_dim)
    return CostModel(c.alpha, c.beta, c.gamma, c.delta, source=f"default:{model}")


def cost_with(model: str, *, alpha_ms: float | None = None, beta_us: float | None = None,
              gamma_ms: float | None = None) -> CostModel:
    """`default_cost(model)` with alpha / beta / gamma overridden where given (ms, us, ms)."""
    c = default_cost(model)
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


def fit(source: str | Path | Iterable[Mapping]) -> CostModel:
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
    return CostModel(float(coef[0]), float(coef[1]), float(coef[2]), delta, source="fit")
