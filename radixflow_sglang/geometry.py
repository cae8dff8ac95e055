"""Model geometry read from a config.json: layer layout, recurrent-state kind and checkpoint grid.

Pure Python (json only) so the policy core, the twin and the tests share one reading of a model.
The grid follows SGLang 0.5.23's `mamba_cache_chunk_size` (arg_groups/overrides.py): the model's
`mamba_chunk_size` (Nemotron-H `chunk_size`) when present, else FLA's 64, at page size 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from radixflow_sglang import models

FLA_CHUNK = 64  # FLA's GDN chunk: SGLang's grid when a config has no mamba_chunk_size
NEMOTRON_DEFAULT_CHUNK = 256  # SGLang's NemotronHConfig default without (mamba_)chunk_size


@dataclass(frozen=True)
class Geometry:
    name: str
    kind: str  # "gdn" | "mamba2" | "full"
    num_layers: int
    full_layers: tuple[int, ...]
    grid: int  # mamba checkpoint grid G (page size 1 for full attention)
    state_bytes: int  # one request's recurrent state, all layers (0 for full attention)
    kv_bytes_per_token: int  # full-attention KV of one token, all layers
    hidden: int
    rows: int  # paper's S (radixflow_sglang.models)
    tokens: int  # paper's T (radixflow_sglang.models)
    vocab_size: int  # embedding rows: token ids are in [0, vocab_size)

    @property
    def hybrid(self) -> bool:
        return self.kind != "full"

    @property
    def mamba_layers(self) -> tuple[int, ...]:
        full = set(self.full_layers)
        return tuple(i for i in range(self.num_layers) if i not in full)


def model_names() -> list[str]:
    return models.names()


def load_geometry(name_or_dir: str | Path) -> Geometry:
    path = Path(name_or_dir)
    if not (path / "config.json").exists():
        path = models.model_dir(str(name_or_dir))
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise ValueError(
            f"unknown model {name_or_dir!r}: no config.json; known: {', '.join(model_names())}"
        )
    try:
        return geometry_from_config(path.name, json.loads(cfg_file.read_text()))
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_file}: malformed JSON ({e})") from None
    except (KeyError, TypeError) as e:
        raise ValueError(f"{cfg_file}: missing or invalid model field {e}") from None


def geometry_from_config(name: str, cfg: dict) -> Geometry:
    t = cfg.get("text_config", cfg)
    rows, tokens = models.rows_for(name), models.TOKENS
    if "hybrid_override_pattern" in t:  # Nemotron-H: M = Mamba2, * = attention
        pattern = t["hybrid_override_pattern"]
        full = tuple(i for i, c in enumerate(pattern) if c == "*")
        mamba = [i for i, c in enumerate(pattern) if c == "M"]
        heads, hd, st = t["mamba_num_heads"], t["mamba_head_dim"], t["ssm_state_size"]
        grid = t.get("mamba_chunk_size") or t.get("chunk_size") or NEMOTRON_DEFAULT_CHUNK
        state = len(mamba) * heads * hd * st * 4
        kv = 2 * len(full) * t["num_key_value_heads"] * t["head_dim"] * 2
        return Geometry(name, "mamba2", len(pattern), full, grid, state, kv,
                        t["hidden_size"], rows, tokens, t["vocab_size"])
    n = t["num_hidden_layers"]
    hd = t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"]
    if "full_attention_interval" in t:  # Qwen3.5 / Qwen3-Next gated delta net
        k = t["full_attention_interval"]
        full = tuple(i for i in range(n) if (i + 1) % k == 0)
        vh, kd = t["linear_num_value_heads"], t["linear_key_head_dim"]
        vd = t["linear_value_head_dim"]
        state = (n - len(full)) * vh * kd * vd * 4
        kv = 2 * len(full) * t["num_key_value_heads"] * hd * 2
        return Geometry(name, "gdn", n, full, FLA_CHUNK, state, kv, t["hidden_size"], rows, tokens,
                        t["vocab_size"])
    kv = 2 * n * t["num_key_value_heads"] * hd * 2
    return Geometry(name, "full", n, tuple(range(n)), 1, 0, kv, t["hidden_size"], rows, tokens,
                    t["vocab_size"])
