"""The model catalog: the one home of every per-model fact that is not in a model's config.json.

Adding a model is one `Model` entry in CATALOG plus its directory `model_dirs/<name>/config.json`
(geometry only: `--load-format dummy` needs nothing else). Everything else reads this module:
geometry.py (S, T), the tokenizer builder (`python -m radixflow_sglang.tokenizer`), the launcher's
embedded default, the GPU launch scripts (through the CLI below), the eval tools' `--model`
choices and the twin's cost model (parameter counts). Facts that *are* in config.json (layers,
grid, vocabulary size = embedding rows, hidden size, tying) are read from there, never copied.

    python -m radixflow_sglang.models names                  # one name per line
    python -m radixflow_sglang.models get NAME FIELD...      # e.g. `get qwen3.5-4b rows tokens dir`

Pure Python (json only): the core, the twin, the shell scripts and the tests import it cheaply.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from radixflow_sglang.core.cost import PAPER_ROWS, PAPER_TOKENS

# Shipped as package data (pyproject.toml [tool.setuptools.package-data]).
MODEL_DIRS = Path(__file__).resolve().parent / "model_dirs"
# The paper's token budget T per round: every model, every arm (--chunked-prefill-size and
# --max-prefill-tokens).
TOKENS = PAPER_TOKENS
# Rows S for a config loaded by path that is not in the catalog.
DEFAULT_ROWS = PAPER_ROWS
CONTEXT_LENGTH = 32768  # what the launch scripts and the embedded default serve
DEFAULT = "qwen3.5-0.8b"  # the launcher's embedded default (no --model-path)


@dataclass(frozen=True)
class Model:
    name: str  # directory name under model_dirs/, the --model value everywhere
    title: str  # the public checkpoint the geometry comes from
    reference: str  # its config file name in the reference model-configs (make_model_dirs.py)
    rows: int  # the paper's row budget S (--max-running-requests)
    params: float  # published total parameter count, embeddings included (the twin's cost)
    tokenizer: str  # offline vocabulary: a key of radixflow_sglang.tokenizer.SPECS

    @property
    def tokens(self) -> int:
        return TOKENS

    @property
    def context(self) -> int:
        return CONTEXT_LENGTH

    @property
    def dir(self) -> Path:
        return model_dir(self.name)

    @property
    def text_only(self) -> bool:
        """The checkpoint is a VLM served text-only (its dummy config says so): real weights
        need `--json-model-override-args '{"language_model_only": true}'`."""
        return bool(config(self.name).get("language_model_only", False))


CATALOG: dict[str, Model] = {m.name: m for m in (
    Model("qwen3.5-0.8b", "Qwen/Qwen3.5-0.8B", "qwen3.5-0.8b.json", 16, 0.8e9, "qwen3_5"),
    Model("qwen3.5-4b", "Qwen/Qwen3.5-4B", "qwen3.5-4b.json", 64, 4e9, "qwen3_5"),
    Model("qwen3.5-9b", "Qwen/Qwen3.5-9B", "qwen3.5-9b.json", 64, 9e9, "qwen3_5"),
    Model("qwen3.5-27b", "Qwen/Qwen3.5-27B", "qwen3.5-27b.json", 64, 27e9, "qwen3_5"),
    Model("nemotron-9b", "nvidia/NVIDIA-Nemotron-Nano-9B-v2", "nemotron-nano-9b-v2.json", 16,
          9e9, "nemotron"),
    Model("qwen3-8b", "Qwen/Qwen3-8B", "qwen3-8b.json", 16, 8e9, "qwen3"),
)}


def names() -> list[str]:
    """Catalog order (the order of tables and `--model` choices)."""
    return list(CATALOG)


def get(name: str) -> Model:
    try:
        return CATALOG[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(CATALOG)}") from None


def model_dir(name: str) -> Path:
    return MODEL_DIRS / name


def config(name: str) -> dict:
    """The model's config.json (the catalog entry's directory)."""
    path = model_dir(get(name).name) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"model {name!r} is in the catalog but {path} is missing") from None


def text_config(name: str) -> dict:
    cfg = config(name)
    return cfg.get("text_config", cfg)


def rows_for(name: str) -> int:
    """S for a model name; DEFAULT_ROWS for a config loaded by path outside the catalog."""
    return CATALOG[name].rows if name in CATALOG else DEFAULT_ROWS


def budget_args(name: str) -> list[str]:
    """The paper's budgets as SGLang server arguments (every arm gets the same)."""
    m = get(name)
    return ["--max-running-requests", str(m.rows), "--chunked-prefill-size", str(m.tokens),
            "--max-prefill-tokens", str(m.tokens)]


# --------------------------------------------------------------------------- CLI (shell scripts)

FIELDS = ("name", "title", "reference", "rows", "tokens", "context", "params", "tokenizer",
          "text_only", "dir")


def _field(m: Model, key: str) -> str:
    value = getattr(m, key)
    return str(int(value)) if key in ("params", "text_only") else str(value)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    usage = (f"usage: python -m radixflow_sglang.models names | get NAME FIELD... "
             f"(FIELD: {', '.join(FIELDS)})")
    if args == ["names"]:
        print("\n".join(names()))
        return 0
    if len(args) < 3 or args[0] != "get":
        print(usage, file=sys.stderr)
        return 2
    bad = [f for f in args[2:] if f not in FIELDS]
    if bad:
        print(f"unknown field {bad[0]!r}; known: {', '.join(FIELDS)}", file=sys.stderr)
        return 2
    try:
        m = get(args[1])
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    # NOTE: space-separated on one line; put `dir` last so `read` keeps a path with spaces.
    print(" ".join(_field(m, f) for f in args[2:]))
    return 0


if __name__ == "__main__":
    # NOTE: run the imported module's main, not this __main__ copy, so a catalog extended at
    # import time (a test, a site hook) is the one answering.
    from radixflow_sglang import models as _catalog

    sys.exit(_catalog.main())
