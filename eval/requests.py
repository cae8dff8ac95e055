"""What a workload is made of: Branch (one request), Question (the latency unit), Segment (one
run of questions), and the id range synthetic prompts draw from. The paper's workloads
(eval/workload.py) and the traffic generators (eval/traffic.py) both build them; neither imports
the other for a type.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from radixflow_sglang import models

SYNTHETIC_ID_RANGE = (1_000, 100_000)  # ordinary tokens in every supported vocabulary


def model_key(model: str) -> str:
    key = model.rsplit("/", 1)[-1].lower()
    if key not in models.CATALOG:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(models.names())}")
    return key


@dataclass(frozen=True)
class Branch:
    """One generation request: input ids, a request id and the prefix-cache namespace.

    The paper's branches generate one token. Other traffic (eval/traffic.py) sets
    `max_new_tokens` (0: a prefix-warm request, as SGLang's `n > 1` path sends first) and may
    script the generated ids in `output` (a multi-turn conversation's next prompt contains
    them, so the cache can hit them); `boundary` declares where the shared prefix ends.
    """

    rid: str
    input_ids: list[int]
    namespace: str
    option: int  # index of the candidate answer (0..3 = A..D); the request's index otherwise
    max_new_tokens: int = 1
    output: tuple[int, ...] = ()  # scripted generated ids (len == max_new_tokens) or () = any
    boundary: int | None = None  # declared end of the shared prefix (tokens), if any


@dataclass(frozen=True)
class Question:
    """Branches (four for the paper's workload) that arrive together at `arrival_s` (seconds
    from the segment start). With `after` set they arrive `arrival_s` seconds after question
    `after` (same segment, earlier in send order) has completed: a closed loop (the next turn of
    a conversation, the siblings after a warm request)."""

    qid: str
    doc_id: str
    branches: tuple[Branch, ...]
    prefix_len: int  # tokens shared by all four branches (document + question)
    doc_len: int  # tokens of the document piece, shared by every question of the document
    answer: int | None = None
    arrival_s: float = 0.0
    ref: str = ""
    after: str | None = None  # qid whose completion releases this question

    @property
    def namespace(self) -> str:
        return self.branches[0].namespace

    @property
    def input_lens(self) -> tuple[int, ...]:
        return tuple(len(b.input_ids) for b in self.branches)


@dataclass(frozen=True)
class Segment:
    """One regime x order run: questions in send order, with arrival times."""

    regime: str
    order: str
    questions: tuple[Question, ...]

    @property
    def name(self) -> str:
        return f"{self.regime}-{self.order}"

    def __iter__(self) -> Iterator[Question]:
        return iter(self.questions)

    def __len__(self) -> int:
        return len(self.questions)


def undeclared(segments):
    """The segments with no declared boundary: what a client that sends none (SGLang's
    bench_serving) lets the server see; it learns every boundary."""
    return [replace(s, questions=tuple(
        replace(q, branches=tuple(replace(b, boundary=None) for b in q.branches))
        for q in s.questions)) for s in segments]
