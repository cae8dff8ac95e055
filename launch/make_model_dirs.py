"""Generate the dummy-weight model directories (radixflow_sglang/model_dirs/) from public configs.

`--load-format dummy` needs only `config.json`, so each directory there is a model's
geometry and nothing else (tokenizers come from `python -m radixflow_sglang.tokenizer`). The
output is committed; this script exists so the files can be re-derived and checked byte for
byte. Which models, their reference file names, titles and budgets: radixflow_sglang/models.py.

    python launch/make_model_dirs.py REFERENCE_DIR [--out radixflow_sglang/model_dirs] [--check]

REFERENCE_DIR holds the public checkpoints' config.json files, one per catalog entry, named as
the entry's `reference` field (e.g. qwen3.5-4b.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from radixflow_sglang import models
from radixflow_sglang.geometry import FLA_CHUNK, NEMOTRON_DEFAULT_CHUNK

DEFAULT_OUT = models.MODEL_DIRS
TOKEN_BUDGET_T = models.TOKENS
# The grid fallbacks SGLang applies (arg_groups/overrides.py::mamba_cache_chunk_size and
# NemotronHConfig): one home, geometry.py.
FLA_CHUNK_SIZE = FLA_CHUNK
SGLANG_NEMOTRON_DEFAULT_CHUNK = NEMOTRON_DEFAULT_CHUNK


def catalog() -> list[models.Model]:
    return list(models.CATALOG.values())


# --------------------------------------------------------------------------- config fixes


def _fix_qwen3_5(cfg: dict) -> dict:
    # Served as a VLM, SGLang always builds the HF image processor (even with
    # --skip-tokenizer-init); the checkpoint field turns that off for any architecture,
    # while the --language-model-only CLI flag rejects Qwen3.5.
    cfg["language_model_only"] = True
    text = cfg["text_config"]
    # Qwen3NextConfig.layers_block_type reads only this attribute and it is not an
    # __init__ parameter, so it must be in the JSON.
    if "full_attention_interval" not in text:
        text["full_attention_interval"] = _interval_from_layer_types(text["layer_types"])
    return cfg


def _interval_from_layer_types(layer_types: list[str]) -> int:
    first = layer_types.index("full_attention") + 1
    expected = ["full_attention" if (i + 1) % first == 0 else "linear_attention"
                for i in range(len(layer_types))]
    if layer_types != expected:
        raise ValueError("layer_types is not a fixed full-attention interval")
    return first


def _fix_nemotron_h(cfg: dict) -> dict:
    # auto_map points at remote code that --trust-remote-code would try to fetch;
    # SGLang and transformers both have native nemotron_h classes.
    cfg.pop("auto_map", None)
    # [0.0, Infinity] is not strict JSON and equals SGLang's default.
    cfg.pop("time_step_limit", None)
    # The mamba cache sizing reads `n_groups` (not an __init__ parameter); the model
    # itself reads `mamba_n_groups` (default 8). Both are 8 for Nano-9B-v2.
    if "n_groups" not in cfg:
        raise ValueError("nemotron_h config must carry n_groups")
    return cfg


_FIXES = {"qwen3_5": _fix_qwen3_5, "nemotron_h": _fix_nemotron_h}


def make_config(reference: dict) -> dict:
    cfg = json.loads(json.dumps(reference))  # deep copy, keeps key order
    fix = _FIXES.get(cfg["model_type"])
    return fix(cfg) if fix else cfg


def dump_json(obj: dict) -> str:
    # Stable text: key order from the source file, 2-space indent, trailing newline.
    return json.dumps(obj, indent=2, ensure_ascii=False) + "\n"


# --------------------------------------------------------------------------- geometry facts


@dataclass(frozen=True)
class Geometry:
    layers: int
    attention: int
    recurrent: int  # GDN (linear attention) or Mamba2 layers
    mlp_only: int  # Nemotron-H's separate MLP layers; 0 elsewhere
    recurrent_kind: str  # "GDN", "Mamba2" or "-"
    grid_g: int | None  # mamba checkpoint grid at page_size 1; None for pure attention


def geometry(cfg: dict) -> Geometry:
    mt = cfg["model_type"]
    if mt in ("qwen3_5", "qwen3_next"):
        text = cfg.get("text_config", cfg)
        n = text["num_hidden_layers"]
        k = text["full_attention_interval"]
        attn = n // k
        # GDN configs have no mamba_chunk_size, so SGLang uses the FLA chunk.
        g = text.get("mamba_chunk_size", FLA_CHUNK_SIZE)
        return Geometry(n, attn, n - attn, 0, "GDN", g)
    if mt == "nemotron_h":
        pattern = cfg["hybrid_override_pattern"]
        # Same precedence as SGLang's NemotronHConfig._resolve_mamba_chunk_size.
        g = cfg.get("mamba_chunk_size") or cfg.get("chunk_size") or SGLANG_NEMOTRON_DEFAULT_CHUNK
        return Geometry(len(pattern), pattern.count("*"), pattern.count("M"),
                        pattern.count("-"), "Mamba2", g)
    n = cfg["num_hidden_layers"]
    return Geometry(n, n, 0, 0, "-", None)


def render_readme(configs: dict[str, dict]) -> str:
    rows = []
    for spec in catalog():
        geo = geometry(configs[spec.name])
        layers = f"{geo.layers} ({geo.attention} attn / {geo.recurrent} {geo.recurrent_kind}"
        layers += f" / {geo.mlp_only} MLP)" if geo.mlp_only else ")"
        if geo.recurrent == 0:
            layers = f"{geo.layers} (all attention)"
        grid = "-" if geo.grid_g is None else str(geo.grid_g)
        rows.append(f"| `{spec.name}` | {spec.title} | {layers} | {grid} | {spec.rows} "
                    f"| {spec.tokens} |")
    table = "\n".join(rows)
    return _README_TEMPLATE.format(table=table, t=TOKEN_BUDGET_T)


_README_TEMPLATE = """\
# Model directories for `--load-format dummy`

Generated by `python launch/make_model_dirs.py`; do not edit by hand. Each directory holds
the public `config.json` of one checkpoint (geometry only, random weights at load time),
adjusted so that SGLang 0.5.23 parses it offline:

* Qwen3.5: top-level `"language_model_only": true` (no vision tower, no image processor);
  `text_config.full_attention_interval` present (SGLang derives the layer layout from it).
* Nemotron-H: `n_groups` present, no `auto_map` (native classes, no remote code).

The models, their budgets and parameter counts are listed in `radixflow_sglang/models.py` (the
catalog); adding a model is one entry there plus its directory here.

Tokenizers are not committed (33 MB); `python -m radixflow_sglang.tokenizer --all` or
`ensure_tokenizer(dir)` writes `tokenizer.json` + `tokenizer_config.json` into each directory
(the launchers use `served_model_dir(name)`: the user cache when this directory is read-only).

| dir | geometry of | layers | G | S | T |
|---|---|---|---|---|---|
{table}

* **G**: the mamba checkpoint grid SGLang derives at page size 1,
  `max(hf_config.mamba_chunk_size or 64, page_size)`: the FLA chunk (64) for gated delta
  net; `mamba_chunk_size`, else `chunk_size`, else 256 for Nemotron-H Mamba2.
* **S**: the paper's row budget, passed as `--max-running-requests`.
* **T**: the paper's token budget per prefill step, passed as `--chunked-prefill-size` and
  `--max-prefill-tokens` ({t}).
"""


# --------------------------------------------------------------------------- driver


def load_reference(reference_dir: Path) -> dict[str, dict]:
    configs = {}
    for spec in catalog():
        with open(reference_dir / spec.reference, encoding="utf-8") as f:
            configs[spec.name] = make_config(json.load(f))
    return configs


def render_all(reference_dir: Path) -> dict[str, str]:
    """Relative path under the models dir -> file text."""
    configs = load_reference(reference_dir)
    files = {f"{name}/config.json": dump_json(cfg) for name, cfg in configs.items()}
    files["README.md"] = render_readme(configs)
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference", type=Path, help="directory of the public config.json files")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if any file differs from the generated text")
    args = ap.parse_args(argv)

    stale = []
    for rel, text in render_all(args.reference).items():
        path = args.out / rel
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(rel)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    verb = "differ" if args.check else "written"
    print(f"{len(stale)} file(s) {verb}: {', '.join(stale) or '-'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
