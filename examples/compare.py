"""Stock vs RadixFlow on one RL rollout, side by side in one process: same prompts, same engine
settings, one engine after the other (SGLang's own scheduler class, then RadixFlow's).

    python examples/compare.py                     # 16 prompts x n=8 x 64 tokens, extra_buffer
    python examples/compare.py --expand --layout no_buffer
    python examples/compare.py --small             # the CI smoke size

Prints one JSON line per arm (examples/rl_rollout.py's summary) and a last one with the ratios
radixflow / stock (prefill tokens, computed prompt tokens, wall time) and whether every output
is identical to stock's (RadixFlow changes when a request runs, never what it computes). On CPU
the wall time is the simulated executor's cost model plus this host's scheduling time.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # NOTE: run as a script or by path

from rl_rollout import engine_kwargs, make_prompts, parse, rollout, summary  # noqa: E402


def arm(args, policy: str) -> tuple[dict[str, Any], list[list[int]]]:
    from radixflow_sglang import Engine

    engine = Engine(**engine_kwargs(args, policy))
    try:
        prompts = make_prompts(args.prompts, args.system_len)
        outs, wall = rollout(engine, prompts, args.samples, args.output_len, args.expand)
        return {"policy": policy, **summary(engine, outs, wall)}, [o["output_ids"] for o in outs]
    finally:
        engine.shutdown()


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 4)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    stock, stock_ids = arm(args, "stock")
    print(json.dumps(stock), flush=True)
    rf, rf_ids = arm(args, "radixflow")
    print(json.dumps(rf), flush=True)
    keys = ("prefill_tokens", "computed_prompt_tokens", "wall_s")
    print(json.dumps({"ratio_radixflow_over_stock": {k: ratio(rf.get(k), stock.get(k))
                                                     for k in keys},
                      "outputs_identical": rf_ids == stock_ids,
                      "shape": {k: getattr(args, k) for k in ("prompts", "samples", "output_len",
                                                               "system_len", "layout", "expand")}}),
          flush=True)


if __name__ == "__main__":
    main()
