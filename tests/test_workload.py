"""Tests for eval/workload.py: tokenizers, loaders, branch layout, regimes and arrivals."""

from __future__ import annotations

import json
import math
import pathlib
import sys
import unicodedata

import pytest

from eval import workload as wl

SHARED = wl.default_data_dir()
needs_data = pytest.mark.skipif(
    SHARED is None or not (SHARED / "race-middle" / "test.jsonl").is_file(),
    reason="shared data directory absent",
)

ARTICLE_1 = "Tom has a red kite. He flies it in the park every Sunday with his sister Ann."
ARTICLE_2 = "The museum opens at nine. Children under six enter free, and adults pay ten dollars."


def race_row(example_id: str, article: str, question: str, answer: str = "A") -> dict:
    options = ["Red", "Blue kite", "On Sunday", f"{question} None"]  # first tokens all differ
    return {
        "example_id": example_id,
        "article": article,
        "question": question,
        "options": options,
        "answer": answer,
    }


def write_jsonl(path: pathlib.Path, rows: list) -> pathlib.Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def race_file(tmp_path: pathlib.Path) -> pathlib.Path:
    rows = [
        race_row("a1.txt", ARTICLE_1, "What colour is the kite?"),
        race_row("a1.txt", ARTICLE_1, "When does Tom fly it?", "B"),
        race_row("a2.txt", ARTICLE_2, "When does the museum open?", "C"),
        race_row("a2.txt", ARTICLE_2, "Who enters free?", "D"),
        race_row("a1.txt", ARTICLE_1, "Who is Ann?"),
    ]
    return write_jsonl(tmp_path / "test.jsonl", rows)


# --- tokenizers ---------------------------------------------------------------------------------


def test_known_tokenization_qwen3() -> None:
    tok = wl.get_tokenizer("qwen3-8b")
    assert tok.encode("Hello, world!") == [9707, 11, 1879, 0]
    assert tok.n_vocab == 151_669


def test_qwen35_vocab_and_roundtrip() -> None:
    tok = wl.get_tokenizer("qwen3.5-9b")
    text = "Déjà vu: naïve café — 北京欢迎你! e\u0301 ✓ <|im_end|>"
    ids = tok.encode(text)
    assert tok.n_vocab == 248_077
    assert max(ids) < 248_077 and max(ids) < tok.embed_rows
    assert tok.decode(ids) == unicodedata.normalize("NFC", text)
    # Special-token text in a document stays text, never a control id.
    assert 248_046 not in ids


def test_tokenizers_cached_and_shared() -> None:
    assert wl.get_tokenizer("qwen3.5-0.8b") is wl.get_tokenizer("qwen3.5-0.8b")
    assert wl.get_tokenizer("qwen3.5-4b").encoding is wl.get_tokenizer("qwen3.5-27b").encoding
    assert wl.get_tokenizer("Qwen/Qwen3-8B").model == "qwen3-8b"
    with pytest.raises(ValueError, match="unknown model"):
        wl.get_tokenizer("llama-7b")


def test_nemotron_ids_in_range() -> None:
    tok = wl.get_tokenizer("nemotron-9b")
    assert tok.n_vocab == 131_026
    text = "".join(chr(c) for c in range(0x4E00, 0x4E00 + 3000)) + " ελληνικά русский 한국어 ✓✓"
    ids = tok.encode(text)
    assert ids and max(ids) < 131_000
    assert tok.decode(ids) == text
    # The same text needs ids >= 131,000 under the full Qwen3 vocabulary, so the cap is real.
    assert max(wl.get_tokenizer("qwen3-8b").encode(text)) >= 131_000


# --- loaders ------------------------------------------------------------------------------------


def test_load_race_records(race_file: pathlib.Path) -> None:
    recs = wl.load_race(race_file)
    assert [r.qid for r in recs] == [f"race-test:{i}" for i in range(1, 6)]
    assert recs[0].doc_id == recs[1].doc_id == recs[4].doc_id != recs[2].doc_id
    assert recs[1].answer == 1 and len(recs[0].options) == 4
    assert str(race_file) in recs[3].ref and "line 4" in recs[3].ref
    assert wl.load_race(race_file.parent)[2].question == recs[2].question  # directory form


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "malformed JSON"),
        ({"example_id": "x", "article": "a", "question": "q", "answer": "A"}, "missing field"),
        ({**race_row("x", "a", "q"), "options": ["1", "2", "3"]}, "exactly 4"),
        ({**race_row("x", "a", "q"), "answer": "E"}, "A-D"),
    ],
)
def test_race_errors_name_file_and_line(tmp_path: pathlib.Path, bad, message: str) -> None:
    path = write_jsonl(tmp_path / "broken.jsonl", [race_row("x", "a", "q"), bad])
    with pytest.raises(wl.DataError, match=message) as err:
        wl.load_race(path)
    assert str(path) in str(err.value) and "line 2" in str(err.value)


def quality_row(instructions: list[str], outputs: list[str]) -> dict:
    return {"input": "A long story.", "instructions": instructions, "outputs": outputs}


def test_load_quality_parses_options(tmp_path: pathlib.Path) -> None:
    q = "Why did he go?\n\n (A) Food \n (B) Money (a lot)\n (C) Love\n (D) None of (A)-(C) "
    path = write_jsonl(
        tmp_path / "leval_quality.jsonl", [quality_row([q, q], ["(B) Money", "(D)"])]
    )
    recs = wl.load_quality(path)
    assert len(recs) == 2 and recs[0].doc_id == recs[1].doc_id == "quality:1"
    assert recs[0].question == "Why did he go?"
    assert recs[0].options == ("Food", "Money (a lot)", "Love", "None of (A)-(C)")
    assert [r.answer for r in recs] == [1, 3]


def test_quality_three_options_names_line_and_question(tmp_path: pathlib.Path) -> None:
    good = "Q?\n\n (A) a\n (B) b\n (C) c\n (D) d"
    bad = "Q?\n\n (A) a\n (B) b\n (C) c"
    path = write_jsonl(
        tmp_path / "q.jsonl",
        [quality_row([good], ["(A) a"]), quality_row([good, bad], ["(A)", "(B)"])],
    )
    with pytest.raises(wl.DataError, match=r"line 2 question 2: expected options") as err:
        wl.load_quality(path)
    assert str(path) in str(err.value)


def test_missing_data_and_offline_hf_are_clear(tmp_path, monkeypatch) -> None:
    with pytest.raises(FileNotFoundError, match="RACE"):
        wl.load_race(tmp_path)
    monkeypatch.setitem(sys.modules, "datasets", None)  # import fails as it would without it
    with pytest.raises(RuntimeError, match="ehovy/race.*local JSONL"):
        wl.load_race(hf=True)


@needs_data
def test_shared_race_counts() -> None:
    recs = wl.load_race(SHARED)
    assert len(recs) == 1436 and len({r.doc_id for r in recs}) == 362


@needs_data
def test_shared_quality_counts() -> None:
    recs = wl.load_quality(SHARED)
    assert len(recs) == 202 and len({r.doc_id for r in recs}) == 15


# --- branches -----------------------------------------------------------------------------------


def common_prefix(lists: list[list[int]]) -> int:
    n = 0
    while all(len(x) > n for x in lists) and len({x[n] for x in lists}) == 1:
        n += 1
    return n


def test_branches_share_exact_prefix(race_file: pathlib.Path) -> None:
    tok = wl.get_tokenizer("qwen3.5-0.8b")
    qs = wl.build_questions(wl.load_race(race_file), tok)
    for q in qs:
        ids = [b.input_ids for b in q.branches]
        assert len(ids) == 4 and common_prefix(ids) == q.prefix_len
        assert q.prefix_len > q.doc_len > 0
        assert all(
            x[-len(tok.encode(wl.CHECK_PROMPT)) :] == tok.encode(wl.CHECK_PROMPT) for x in ids
        )
    doc = tok.encode(wl.DOC_TEMPLATE.format(document=ARTICLE_1))
    question = tok.encode(wl.QUESTION_TEMPLATE.format(question="What colour is the kite?"))
    assert qs[0].branches[0].input_ids[: qs[0].prefix_len] == doc + question
    # Questions of one article share the document tokens exactly, and no more.
    assert common_prefix([qs[0].branches[0].input_ids, qs[1].branches[0].input_ids]) >= len(doc)
    assert qs[0].branches[0].input_ids[: len(doc)] == qs[4].branches[2].input_ids[: len(doc)]


def test_overlength_rejected_not_truncated(race_file: pathlib.Path) -> None:
    tok = wl.get_tokenizer("qwen3-8b")
    recs = wl.load_race(race_file)
    longest = max(max(q.input_lens) for q in wl.build_questions(recs, tok))
    assert wl.build_questions(recs, tok, max_input_len=longest)  # at the limit: fine
    with pytest.raises(ValueError, match=r"line \d+ \(race-test:\d+\): branch [A-D] is \d+ tokens"):
        wl.build_questions(recs, tok, max_input_len=longest - 1)
    with pytest.raises(ValueError, match="synthetic race seed 0 doc 0"):
        wl.synthetic(4, profile="race", max_input_len=50)


# --- synthetic ----------------------------------------------------------------------------------


def test_synthetic_shapes_and_determinism() -> None:
    race = wl.synthetic(40, profile="race", seed=3)
    assert race == wl.synthetic(40, profile="race", seed=3)
    assert race != wl.synthetic(40, profile="race", seed=4)
    assert all(180 <= q.doc_len <= 450 and 15 <= q.prefix_len - q.doc_len <= 40 for q in race)
    assert all(common_prefix([b.input_ids for b in q.branches]) >= q.prefix_len for q in race)
    quality = wl.synthetic(20, profile="quality", seed=3)
    assert all(3000 <= q.doc_len <= 7000 for q in quality)
    mix = wl.synthetic(10, seed=3)
    assert [q.qid.split(":")[0] for q in mix[:4]] == ["syn-race", "syn-quality"] * 2
    lo, hi = wl.SYNTHETIC_ID_RANGE
    assert all(lo <= i < hi for q in mix for b in q.branches for i in b.input_ids)


# --- regimes and arrivals -----------------------------------------------------------------------


def docs_of(qs: list[wl.Question]) -> list[str]:
    return [q.doc_id for q in qs]


def test_regime_namespaces_and_order() -> None:
    base = wl.synthetic(30, profile="race", seed=1)  # 3-5 questions per document
    n_docs = len(set(docs_of(base)))

    cold = wl.arrange(base, "cold")
    assert [q.qid for q in cold] == [q.qid for q in base]
    assert len({q.namespace for q in cold}) == len(cold)
    assert cold[0].namespace == f"cold-forward/q{base[0].qid}"

    mixed = wl.arrange(base, "mixed")
    assert {q.namespace for q in mixed} == {"mixed-forward/shared"}
    assert len(set(docs_of(mixed[:n_docs]))) == n_docs  # first round visits every document once

    reuse = wl.arrange(base, "reuse")
    assert len({q.namespace for q in reuse}) == n_docs
    runs = [d for i, d in enumerate(docs_of(reuse)) if i == 0 or d != reuse[i - 1].doc_id]
    assert len(runs) == n_docs  # each document's questions back-to-back
    assert all(q.namespace == f"reuse-forward/d{q.doc_id}" for q in reuse)

    for regime in wl.REGIMES:
        fwd, rev = wl.arrange(base, regime), wl.arrange(base, regime, "reverse")
        assert [q.qid for q in rev] == [q.qid for q in reversed(fwd)]
        assert sorted(q.qid for q in fwd) == sorted(q.qid for q in base)
        for q in rev:
            assert {b.namespace for b in q.branches} == {q.namespace}
            assert q.namespace.startswith(f"{regime}-reverse/")
    rids = [b.rid for q in wl.arrange(base, "mixed") for b in q.branches]
    assert len(set(rids)) == len(rids) == 4 * len(base)

    with pytest.raises(ValueError, match="regime"):
        wl.arrange(base, "warm")


def test_offered_trace_poisson_and_deterministic() -> None:
    qs = wl.synthetic(2000, profile="race", seed=0)
    a = wl.offered_trace(qs, rate=5.0, seed=7)
    assert a == wl.offered_trace(qs, rate=5.0, seed=7)
    assert a != wl.offered_trace(qs, rate=5.0, seed=8)
    times = [q.arrival_s for q in a]
    assert times[0] == 0.0 and all(x <= y for x, y in zip(times, times[1:], strict=False))
    mean_gap = times[-1] / (len(times) - 1)
    assert abs(mean_gap - 0.2) < 0.02  # 1/rate, within ~4 standard errors
    assert {q.arrival_s for q in wl.offered_trace(qs[:5], rate=math.inf)} == {0.0}
    with pytest.raises(ValueError, match="rate"):
        wl.offered_trace(qs, rate=0)


def test_workload_segments() -> None:
    segs = wl.workload("synthetic", "qwen3.5-9b", questions=24, rate=4.0, seed=5)
    assert [s.name for s in segs] == [f"{r}-{o}" for r in wl.REGIMES for o in wl.ORDERS]
    assert segs == wl.workload("synthetic", "qwen3.5-9b", questions=24, rate=4.0, seed=5)
    qids = sorted(q.qid for q in segs[0])
    gaps = [q.arrival_s for q in segs[0]]
    for s in segs:
        assert len(s) == 24 and sorted(q.qid for q in s) == qids
        assert [q.arrival_s for q in s] == gaps  # same offered load in every segment
    all_ns = [{q.namespace for q in s} for s in segs]
    assert all(a.isdisjoint(b) for i, a in enumerate(all_ns) for b in all_ns[i + 1 :])
    one = wl.workload("synthetic-race", "qwen3-8b", regime="reuse", order="reverse", questions=6)
    assert [s.name for s in one] == ["reuse-reverse"]
    with pytest.raises(ValueError):
        wl.workload("squad", "qwen3-8b")


def test_workload_from_files(race_file: pathlib.Path) -> None:
    segs = wl.workload(
        "race", "nemotron-9b", regime="cold", order="forward", questions=3, data_dir=race_file
    )
    assert [q.qid for q in segs[0]] == ["race-test:1", "race-test:2", "race-test:3"]
    assert max(i for q in segs[0] for b in q.branches for i in b.input_ids) < 131_072
    with pytest.raises(ValueError, match="only 5 available"):
        wl.workload("race", "qwen3-8b", questions=6, data_dir=race_file)


@needs_data
def test_shared_mix_workload() -> None:
    segs = wl.workload("mix", "qwen3.5-0.8b", regime="reuse", order="forward", questions=20)
    qs = segs[0].questions
    assert len(qs) == 20
    assert sum(q.qid.startswith("quality") for q in qs) == 10
    assert max(i for q in qs for b in q.branches for i in b.input_ids) < 248_077


# --- seeded question sets ---------------------------------------------------------------------


def test_seed_zero_keeps_file_order_and_other_seeds_sample_whole_documents(
    race_file: pathlib.Path,
) -> None:
    recs = wl.load_race(race_file)
    by_doc = {d: [r.qid for r in recs if r.doc_id == d] for d in dict.fromkeys(r.doc_id
                                                                             for r in recs)}
    a1, a2 = by_doc.values()  # a1.txt: lines 1, 2, 5; a2.txt: lines 3, 4
    assert [r.qid for r in wl._first(recs, 3, "RACE", 0)] == [r.qid for r in recs[:3]]
    firsts = set()
    for seed in range(1, 9):
        got = [r.qid for r in wl._first(recs, 5, "RACE", seed)]
        assert got in (a1 + a2, a2 + a1), seed  # documents whole, questions in file order
        two = [r.qid for r in wl._first(recs, 2, "RACE", seed)]
        assert two == got[:2]
        firsts.add(got[0])
        segs = wl.workload("race", "qwen3-8b", regime="cold", order="forward", questions=2,
                           seed=seed, data_dir=race_file)
        assert [q.qid for q in segs[0]] == two
    assert firsts == {a1[0], a2[0]}  # the seed changes which document is drawn


@needs_data
def test_seeds_draw_different_quality_questions_grouped_by_document() -> None:
    a = wl.load_questions("quality", "qwen3.5-0.8b", 20, seed=1)
    b = wl.load_questions("quality", "qwen3.5-0.8b", 20, seed=2)
    zero = wl.load_questions("quality", "qwen3.5-0.8b", 20, seed=0)
    assert [q.qid for q in a] != [q.qid for q in b]
    assert [q.qid for q in zero] == [r.qid for r in wl.load_quality()[:20]]
    for qs in (a, b):
        docs = [q.doc_id for q in qs]
        runs = [d for i, d in enumerate(docs) if i == 0 or docs[i - 1] != d]
        assert len(runs) == len(set(runs))  # each document's questions come together
        assert len(set(docs)) < len(docs)  # a document keeps its several questions
