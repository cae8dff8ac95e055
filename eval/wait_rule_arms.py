"""Side-by-side twin arms for the wait rule (issue 11), with an optional fixed cost per round.

    python eval/wait_rule_arms.py '{"model": "qwen3.5-4b", "policies": ["stock",
        "radixflow-always", "radixflow"], "questions": 50, "alpha": 0.05}' out/arms.jsonl

Keys: model, policies (the first is the base of the ratios), questions, rate, alpha (seconds
per round; default: the model's derived cost model), layout, overlap, wl (workload), regime,
order. Prints ratios vs the base (mean, p95, scheduled tokens, per regime) and appends one JSON
line to the output file. The server's prior is the model's default cost model; the runtime's
fit learns `alpha` from the twin's forwards. (eval/replay.py gains --alpha-ms in issue 11's
twin item; this script is the stop-gap used for the wait rule's measurements.)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from eval.costmodel import CostModel, default_cost  # noqa: E402
from eval.twin import replay  # noqa: E402
from eval.workload import workload  # noqa: E402

KEYS = ("latency_mean_s", "latency_p95_s", "scheduled_tokens", "rounds", "blocked", "recomputed")


def run(model: str, policies: list[str], questions: int = 50, rate: float = 5.0,
        alpha: float | None = None, layout: str = "extra_buffer", overlap: bool = False,
        wl: str = "mix", regime: str = "all", order: str = "both",
        data_dir: str = "/work/shared/data") -> tuple[str, dict]:
    segs = workload(wl, model, regime=regime, order=order, questions=questions, rate=rate,
                    seed=0, data_dir=data_dir)
    c = default_cost(model)
    if alpha is not None:
        c = CostModel(alpha, c.beta, c.gamma, c.delta, source=f"alpha={alpha}")
    out: dict[str, dict] = {}
    for p in policies:
        t = time.perf_counter()
        m = replay(segs, model, p, layout=layout, overlap=overlap, cost=c).metrics
        out[p] = {k: m[k] for k in KEYS}
        out[p]["regime"] = {r: (mm["latency_mean_s"], mm["latency_p95_s"])
                            for r, mm in m["per_regime"].items()}
        out[p]["wall_s"] = time.perf_counter() - t
    base = out[policies[0]]
    tag = f"{model} {wl} rate={rate} alpha={alpha} {layout} overlap={overlap} q={questions}"
    print(tag, flush=True)
    for p, m in out.items():
        r = {k: m[k] / base[k] for k in ("latency_mean_s", "latency_p95_s", "scheduled_tokens")}
        print(f"  {p:18s} mean {r['latency_mean_s']:.3f}x p95 {r['latency_p95_s']:.3f}x "
              f"tok {r['scheduled_tokens']:.3f}x  [mean {m['latency_mean_s']:.4f}s rounds "
              f"{m['rounds']} blocked {m['blocked']} recomputed {m['recomputed']}]", flush=True)
        print("      per regime mean/p95: " + ", ".join(
            f"{g} {v[0] / base['regime'][g][0]:.3f}/{v[1] / base['regime'][g][1]:.3f}"
            for g, v in m["regime"].items()), flush=True)
    return tag, out


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    tag, out = run(**args)
    if len(sys.argv) > 2:
        with open(sys.argv[2], "a") as f:
            f.write(json.dumps({"tag": tag, "args": args, "out": out}) + "\n")
