"""An RL rollout through `radixflow_sglang.Engine`: prompts sharing a system prompt, n samples each.

What an RL framework sends in one rollout step: a batch of prompts that share a long system
prompt, n samples per prompt, a fixed number of output tokens. The engine is SGLang's
`sglang.Engine` with RadixFlow's scheduler: on a GPU it runs SGLang's model worker; without one
the simulated witness executor on CPU (its sampling is deterministic: every sample of a
prompt is the same).

    python examples/rl_rollout.py                                # 16 prompts x n=8 x 64 tokens
    python examples/rl_rollout.py --policy stock --small         # a quick look, SGLang's own
    python examples/rl_rollout.py --model-path Qwen/Qwen3.5-0.8B --expand   # a GPU, real weights

It prints one JSON line: the rollout's wall time, the prompt tokens the requests computed
(prompt_tokens - cached_tokens summed over the samples, SGLang's own meta_info), and with the
simulated executor the prefill tokens every forward computed (SGLang's n > 1 warm-ups included)
and the witness's verdict.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

# NOTE: even small, the batch must overflow one prefill round (8,192 tokens here): a queue that
# fits one round and is cheaper to recompute than to wait for runs as stock does (quiet scan)
SMALL = {"prompts": 4, "samples": 4, "output_len": 8, "system_len": 1000}


def make_prompts(prompts: int, system_len: int) -> list[list[int]]:
    """Token-id prompts: one shared system prompt, then a question of its own length each."""
    system = [1000 + (i * 7919) % 50_000 for i in range(system_len)]
    return [system + [60_000 + i * 1_000 + j for j in range(24 + 9 * i)] for i in range(prompts)]


def rollout(engine, prompts: list[list[int]], samples: int, output_len: int,
            expand: bool = False) -> tuple[list[dict[str, Any]], float]:
    """One rollout step: SGLang's own `n` (its prefix warm-up, then n samples per prompt), or
    with `expand` every prompt repeated n times in one batch (frameworks that expand n
    themselves). Returns the outputs (prompt-major) and the wall time."""
    params = {"max_new_tokens": output_len, "ignore_eos": True, "temperature": 1.0}
    t0 = time.perf_counter()
    if expand:
        batch = [p for p in prompts for _ in range(samples)]
        outs = engine.generate(input_ids=batch, sampling_params=params)
    else:
        outs = engine.generate(input_ids=prompts, sampling_params={**params, "n": samples})
    return outs, time.perf_counter() - t0


def summary(engine, outs: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    meta = [o["meta_info"] for o in outs]
    out = {"samples": len(outs), "wall_s": round(wall, 3),
           "computed_prompt_tokens": sum(m["prompt_tokens"] - m["cached_tokens"] for m in meta),
           "output_tokens": sum(len(o["output_ids"]) for o in outs)}
    state = engine.get_server_info()["internal_states"][0]
    if "simulated" in state:  # NOTE: the CPU executor's own counts and the witness
        out["prefill_tokens"] = state["simulated"]["prefill_tokens"]
        out["witness_mismatched"] = state["witness"]["mismatched"]
    if "radixflow" in state:
        out["radixflow"] = {k: state["radixflow"][k] for k in ("policy", "blocked", "rounds")}
    return out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", default="radixflow", help="radixflow_policy (stock: SGLang's own)")
    p.add_argument("--layout", default="extra_buffer", choices=("extra_buffer", "no_buffer"),
                   help="SGLang's --mamba-radix-cache-strategy")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--samples", type=int, default=8, help="n")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--system-len", type=int, default=1000, help="shared system prompt tokens")
    p.add_argument("--expand", action="store_true", help="repeat prompts instead of using n")
    p.add_argument("--model-path", help="default: the embedded Qwen3.5-0.8B geometry (dummy)")
    p.add_argument("--small", action="store_true", help=f"a smoke-test size: {SMALL}")
    args = p.parse_args(argv)
    if args.small:
        vars(args).update(SMALL)
    return args


def engine_kwargs(args: argparse.Namespace, policy: str) -> dict[str, Any]:
    kw = {"radixflow_policy": policy, "mamba_radix_cache_strategy": args.layout,
          # NOTE: SGLang runs no_buffer only without the overlap scheduler
          "disable_overlap_schedule": args.layout == "no_buffer"}
    if args.model_path:
        kw["model_path"] = args.model_path
    return kw


def main(argv: list[str] | None = None) -> None:
    from radixflow_sglang import Engine

    args = parse(argv)
    engine = Engine(**engine_kwargs(args, args.policy))
    try:
        prompts = make_prompts(args.prompts, args.system_len)
        outs, wall = rollout(engine, prompts, args.samples, args.output_len, args.expand)
        print(json.dumps({"policy": args.policy, **summary(engine, outs, wall)}), flush=True)
    finally:
        engine.shutdown()


if __name__ == "__main__":  # NOTE: SGLang's Engine spawns its scheduler: the guard is needed
    main()
