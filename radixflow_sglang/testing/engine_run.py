"""An RL-style rollout through `radixflow_sglang.Engine` on CPU, one engine per policy in turn.

    python -m radixflow_sglang.testing.engine_run --layout extra_buffer --out run.json \
        [--policies stock,radixflow --prompts 4 --samples 4 --output-len 8 --system-len 1000]

Each engine runs two phases, each on its own shared system prompt (so one phase's cache cannot
serve the other's): `expanded`, a synchronous `generate` on input ids with every prompt repeated
`samples` times in one batch (what a framework that expands n itself sends), and `parallel`, an
`async_generate` on text with SGLang's own `n` (its prefix warm-up, then the samples). Per phase
the JSON holds the output ids and the prefill tokens the executor computed
(internal_states[0].simulated); per engine a bad batch's error (then a good request), the
witness, SGLang's idle leak check (pools, once the loop is idle), the sections get_server_info
carries, and the child processes left after shutdown().

Runs in its own process: SGLang's Engine spawns its schedulers (a `__main__` guard is needed)
and its shutdown() kills every child of the calling process.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

IDLE_TRIES = 50  # scheduler round trips to reach a fully idle loop (a bound, not a wait)
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()


def id_prompts(base: int, prompts: int, system_len: int) -> list[list[int]]:
    """Prompts sharing a `system_len`-token prefix, each with its own question (lengths vary,
    so neither the fork nor the ends sit on one grid)."""
    system = list(range(base, base + system_len))
    return [system + list(range(base + 50_000 + i * 997, base + 50_000 + i * 997 + 20 + 7 * i))
            for i in range(prompts)]


def text_prompts(prompts: int, system_words: int) -> list[str]:
    system = "You are a grader. " + " ".join(WORDS[i % len(WORDS)] for i in range(system_words))
    return [f"{system}\nQuestion {i}: " + " ".join(WORDS[(i * 7 + j) % len(WORDS)]
                                                  for j in range(8 + 3 * i))
            for i in range(prompts)]


def prefill_tokens(engine) -> int:
    return engine.get_server_info()["internal_states"][0]["simulated"]["prefill_tokens"]


def idle_pools(engine) -> dict[str, Any]:
    """SGLang's leak check, answered once the scheduler is fully idle (adapter/simulated.py
    `pool_check`); each try is one scheduler round trip."""
    for _ in range(IDLE_TRIES):
        pools = engine.get_server_info()["internal_states"][0]["pools"]
        if pools["idle"]:
            return pools
    return pools


def run_phases(engine, args) -> dict[str, Any]:
    sp = {"max_new_tokens": args.output_len, "ignore_eos": True, "temperature": 1.0}
    phases = {}
    before = prefill_tokens(engine)
    ids = id_prompts(1000, args.prompts, args.system_len)
    expanded = [p for p in ids for _ in range(args.samples)]
    t0 = time.perf_counter()
    outs = engine.generate(input_ids=expanded, sampling_params=sp)
    phases["expanded"] = _phase(engine, outs, before, time.perf_counter() - t0)
    before = prefill_tokens(engine)
    texts = text_prompts(args.prompts, args.system_len // 2)
    t0 = time.perf_counter()
    outs = engine.loop.run_until_complete(
        engine.async_generate(prompt=texts, sampling_params={**sp, "n": args.samples}))
    phases["parallel"] = _phase(engine, outs, before, time.perf_counter() - t0)
    return phases


def _phase(engine, outs: list[dict], before: int, wall: float) -> dict[str, Any]:
    return {"outputs": [o["output_ids"] for o in outs], "requests": len(outs),
            "prefill_tokens": prefill_tokens(engine) - before, "wall_s": wall}


def bad_batch(engine) -> dict[str, Any]:
    """A batch whose second item asks for more top logprobs than the vocabulary has: the
    engine raises naming the item, field and limit; then it still serves a good request."""
    vocab = engine.tokenizer_manager.model_config.vocab_size
    sp = {"max_new_tokens": 2, "ignore_eos": True}
    try:
        engine.generate(input_ids=[[5, 6], [7, 8]], sampling_params=sp, return_logprob=True,
                        top_logprobs_num=[1, vocab + 1])
        error = None
    except ValueError as e:
        error = str(e)
    after = engine.generate(input_ids=[5, 6, 7], sampling_params=sp)
    return {"vocab": vocab, "error": error, "after": after["output_ids"]}


def run_policy(policy: str, args) -> dict[str, Any]:
    import psutil

    from radixflow_sglang import Engine

    kwargs = {"radixflow_policy": policy, "radixflow_executor": "simulated",
              "mamba_radix_cache_strategy": args.layout,
              "disable_overlap_schedule": args.layout == "no_buffer"}  # NOTE: SGLang's rule
    engine = Engine(**kwargs)
    try:
        phases = run_phases(engine, args)
        bad = bad_batch(engine)
        pools = idle_pools(engine)
        state = engine.get_server_info()["internal_states"][0]
    finally:
        engine.shutdown()
    left = [p.pid for p in psutil.Process().children(recursive=True)
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    return {"phases": phases, "bad_batch": bad, "pools": pools, "witness": state.get("witness"),
            "radixflow": state.get("radixflow"), "children_after_shutdown": left}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layout", choices=("extra_buffer", "no_buffer"), required=True)
    p.add_argument("--policies", default="stock,radixflow")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--output-len", type=int, default=8)
    # NOTE: 16 prompts of ~1,040 tokens overflow one round's budget (the catalog's T = 8,192):
    # a queue that fits one round, whose recompute costs less than a round, runs quiet (README)
    p.add_argument("--system-len", type=int, default=1000)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    out = {pol: run_policy(pol, args) for pol in args.policies.split(",")}
    args.out.write_text(json.dumps(out))


if __name__ == "__main__":
    main()
