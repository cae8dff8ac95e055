"""Helpers several test files share: token ranges, the no-leak expectation, the coverage check
and a kit whose boundary publisher a test configures. Shared here so no test module imports
another."""

from __future__ import annotations

import random

NO_LEAK = {"kv": 0, "rows": 0, "mamba": 0}
BOUNDARY_MODEL = "qwen3.5-4b"


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def coverage_errors(rounds, lengths: dict[str, int]) -> list:
    """Each request's prompt is computed exactly once: its rounds chain prefix -> prefix+extend
    and the last one ends at its input length."""
    end: dict[str, int] = {}
    errors = []
    for rnd in rounds:
        for rid in rnd.rids:
            if rid in end and rnd.prefix[rid] != end[rid]:
                errors.append((rnd.index, rid, "resumes at", rnd.prefix[rid], "not", end[rid]))
            end[rid] = rnd.prefix[rid] + rnd.extend[rid]
    errors += [(rid, "ends at", end.get(rid), "of", n) for rid, n in lengths.items()
               if end.get(rid) != n]
    return errors


def model_grid(model: str = BOUNDARY_MODEL) -> int:
    """The model's mamba chunk grid (its geometry)."""
    from radixflow_sglang.geometry import load_geometry

    return load_geometry(model).grid


def boundary_kit(policy: str = "radixflow", boundaries: str = "declared",
                 layout: str = "extra_buffer", model: str = BOUNDARY_MODEL, **publisher):
    """A kit; `publisher` replaces the runtime's BoundaryPublisher settings (rule, cost)."""
    from radixflow_sglang.adapter.boundary import BoundaryPublisher
    from radixflow_sglang.config import RadixFlowConfig
    from radixflow_sglang.testing.kit import Kit, KitConfig

    cfg = None if policy == "stock" else RadixFlowConfig(policy=policy, boundaries=boundaries)
    kit = Kit(KitConfig(model=model, layout=layout), policy=policy, radixflow_config=cfg)
    if publisher:
        rt = kit.runtime
        rt.boundary = BoundaryPublisher(boundaries, rt.grid, cost=lambda: rt.cost.coeffs,
                                        **publisher)
    return kit


def doc_questions(kit, docs: int, per_doc: int, seed: int = 0):
    """RACE-shaped: `per_doc` questions of 4 branches per document (documents of 3-11 grid
    units: no learned depth fits two of them), each question drained before the next; template
    tokens fixed (a document ends "\n\n", a question starts "Question:"). (document, question,
    document length, the least ready prefix of its branches, tokens scheduled)."""
    G = model_grid()
    rng = random.Random(seed)

    def rand(n: int) -> list[int]:
        return [rng.randrange(1000, 200_000) for _ in range(n)]

    out = []
    for d in range(docs):
        doc = [5, 6] + rand((3 + 2 * d) * G + rng.randrange(G)) + [11, 12]
        for q in range(per_doc):
            question = [21, 22] + rand(G // 2 + rng.randrange(G // 2)) + [31, 32]
            rids = [f"d{d}q{q}{k}" for k in "ABCD"]
            for k, rid in enumerate(rids):
                kit.submit(kit.req(rid, doc + question + rand(6 + k) + [41, 42, 43], "ns"))
            rounds = kit.drain()
            ready = min(next(r.prefix[x] for r in rounds if x in r.prefix) for x in rids)
            tokens = sum(r.extend.get(x, 0) for r in rounds for x in rids)
            out.append((d, q, len(doc), ready, tokens))
    return out


def old_step(k) -> object | None:
    """The kit's step before decode (commit 15a7bb3): scan, launch, and complete every request
    after its one token (no running batch)."""
    from sglang.srt.mem_cache.common import release_kv_cache

    s = k.sched
    batch = k.scan()
    rnd = k._record(batch) if batch is not None else None
    if batch is not None:
        s.result_queue.append((batch, None))
    if s.result_queue and (not k.cfg.overlap or batch is None or len(s.result_queue) > 1):
        for req in s.result_queue.popleft()[0].reqs:
            if (req.finished() and req.inflight_middle_chunks <= 0) or req.is_retracted:
                continue
            if req.inflight_middle_chunks > 0:
                req.inflight_middle_chunks -= 1
                continue
            req.output_ids.append(7)
            req.update_finish_state()
            release_kv_cache(req, k.pools.cache, checkpoint=True)
            k._completed(req)  # finished, forgotten, on_complete (as the old kit did)
        if s.chunked_req is not None and s.chunked_req.finished():
            s.chunked_req = None
    return rnd
