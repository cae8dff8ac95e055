"""Exactness runs on the CPU kit with the witness executor (adapter/witness.py).

`branch_questions` builds the paper's shape (a document, a question, one candidate per branch)
with outputs of several tokens, so prefill, resumed states, decode and decode tracking are all
exercised; `run_exact` drives it in two waves (the second arrives while the first runs) and
returns what a comparison between policies needs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from radixflow_sglang.testing.kit import Kit, KitConfig


@dataclass
class ExactRun:
    outputs: dict[str, tuple[int, ...]]  # rid -> the ids SGLang emits (loop.CompletionLog)
    stats: dict  # WitnessStats.as_dict()
    leaks: dict[str, int]
    rounds: int


def branch_questions(kit: Kit, questions: int = 6, branches: int = 4, seed: int = 0,
                     doc: tuple[int, int] = (700, 3000), out: tuple[int, int] = (1, 40)):
    """Requests of `branches` siblings each: document + question + one candidate."""
    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(1000, 20_000) for _ in range(n)]  # noqa: E731
    reqs = []
    for q in range(questions):
        shared = ids(rng.randrange(*doc)) + ids(40)
        for b in range(branches):
            reqs.append(kit.req(f"q{q}b{b}", shared + ids(5),
                                max_new_tokens=rng.randrange(*out)))
    return reqs


def run_exact(policy: str, cfg: KitConfig, seed: int = 0, questions: int = 6,
              early: int = 8, early_steps: int = 3, strict: bool = True) -> ExactRun:
    """Run the questions under `policy`: the first `early` requests, `early_steps` steps, then
    the rest. Raises WitnessMismatch on the first wrong state unless `strict` is off (then the
    run's stats count the mismatched requests)."""
    kit = Kit(cfg, policy=policy)
    kit.witness.strict = strict
    reqs = branch_questions(kit, questions, seed=seed)
    kit.submit(*reqs[:early])
    for _ in range(early_steps):
        kit.step()
    kit.submit(*reqs[early:])
    kit.drain()
    outputs = {rid: tuple(r.output_ids_through_stop) for rid, r in kit.finished.items()}
    return ExactRun(outputs, kit.witness.stats.as_dict(), kit.leaks(), len(kit.rounds))
