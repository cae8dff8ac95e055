"""The round-cost prior of a served model (core/cost.py `prior_from_geometry`), from what the
scheduler knows: the loaded model's parameter count (GPU), else an estimate from the config's
layer shapes; the geometry (recurrent state bytes, full-attention layers) from the same config.
A model whose config lacks these numbers (the kit's stand-in) gets `GENERIC_PRIOR`.
"""

from __future__ import annotations

import logging

from radixflow_sglang.core.cost import GENERIC_PRIOR, CostCoeffs, prior_from_geometry

logger = logging.getLogger(__name__)


def _loaded_params(sched) -> float | None:
    model = getattr(getattr(getattr(sched, "tp_worker", None), "model_runner", None), "model",
                    None)
    if model is None or not hasattr(model, "parameters"):
        return None
    n = sum(p.numel() for p in model.parameters())
    # NOTE: tensor-parallel shards: each rank holds ~1/tp of the weights.
    return float(n * max(1, int(getattr(sched, "tp_size", 1) or 1)))


def _attention(t: dict, h: int) -> int:
    hd = t.get("head_dim") or h // t["num_attention_heads"]
    q = t["num_attention_heads"] * hd * (2 if t.get("attn_output_gate") else 1)
    return h * (q + 2 * t["num_key_value_heads"] * hd) + t["num_attention_heads"] * hd * h


def _estimated_params(t: dict) -> float:
    """Matmul weights from the config's layer shapes plus the embedding tables (a prior, not a
    count: Qwen3.5's published totals also hold a vision tower). Qwen3.5: gated delta net
    mixers (q, k, v, z, a, b, out) and every 4th layer gated attention, SwiGLU MLPs; Nemotron-H:
    one of Mamba2 / attention / MLP per layer (`hybrid_override_pattern`); else dense."""
    h, n = t["hidden_size"], t["num_hidden_layers"]
    inter = t.get("intermediate_size") or 4 * h
    tables = (1 if t.get("tie_word_embeddings", False) else 2) * t["vocab_size"] * h
    if "hybrid_override_pattern" in t:
        pat = t["hybrid_override_pattern"]
        heads, hd = t["mamba_num_heads"], t["mamba_head_dim"]
        groups = t.get("n_groups") or t.get("mamba_n_groups") or 1
        mamba = h * (2 * heads * hd + 2 * groups * t["ssm_state_size"] + heads) + heads * hd * h
        per = {"M": mamba, "*": _attention(t, h), "-": 2 * h * inter}
        return float(sum(per.get(c, 0) for c in pat) + tables)
    mlp = 3 * h * inter
    if "full_attention_interval" in t:
        k = t["full_attention_interval"]
        kd = t["linear_num_key_heads"] * t["linear_key_head_dim"]
        vd = t["linear_num_value_heads"] * t["linear_value_head_dim"]
        gdn = h * (2 * kd + 2 * vd + 2 * t["linear_num_value_heads"]) + vd * h
        full = n // k
        return float(full * _attention(t, h) + (n - full) * gdn + n * mlp + tables)
    return float(n * (_attention(t, h) + mlp) + tables)


def prior_from_config(cfg: dict, params: float | None = None, name: str = "model") -> CostCoeffs:
    from radixflow_sglang.geometry import geometry_from_config

    t = dict(cfg.get("text_config", cfg))
    if "layers_block_type" in t and "hybrid_override_pattern" not in t:
        # NOTE: transformers' NemotronHConfig.to_dict() spells config.json's pattern as a list
        kinds = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "-"}
        t["hybrid_override_pattern"] = "".join(kinds.get(k, "-") for k in t["layers_block_type"])
        t.setdefault("num_hidden_layers", len(t["layers_block_type"]))
    geo = geometry_from_config(name, t)
    heads = t["num_attention_heads"]
    head_dim = t.get("head_dim") or t["hidden_size"] // heads
    return prior_from_geometry(
        params or _estimated_params(t), t["vocab_size"], t["hidden_size"],
        bool(cfg.get("tie_word_embeddings", t.get("tie_word_embeddings", False))),
        state_bytes=geo.state_bytes, full_layers=len(geo.full_layers), heads=heads,
        head_dim=head_dim, source=f"prior:{name}")


def scheduler_prior(sched) -> CostCoeffs:
    mc = getattr(sched, "model_config", None)
    hf = getattr(mc, "hf_config", None)
    try:
        cfg = hf.to_dict() if hasattr(hf, "to_dict") else None
        if not cfg:
            return GENERIC_PRIOR
        return prior_from_config(cfg, _loaded_params(sched),
                                 str(getattr(mc, "model_path", "model")).rstrip("/")
                                 .rsplit("/", 1)[-1])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        logger.info("radixflow: generic round-cost prior (%s)", e)
        return GENERIC_PRIOR
