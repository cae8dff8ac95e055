"""Exactness sweep: the soak's request stream through every policy and configuration with the
witness executor (every resumed state and KV slot checked against its prefix).

    python -m eval.exactness --requests 2500 --out out/exactness [--policies stock,radixflow]
        [--mixed-chunk]

Configurations: Qwen3.5 (GDN) and Nemotron-H (Mamba2) geometries; extra_buffer with and without
overlap, page size 1 and 16; no_buffer; outputs of 1-16 ids without ignore_eos (decode,
retract_decode); with overlap, in-flight retraction; aborts at 5 % (a storm config at 25 %);
`--mixed-chunk` runs every configuration with SGLang's `--enable-mixed-chunk` (decode rows ride
in prefill rounds);
tight pools (a few thousand KV tokens, the minimum mamba slots for the layout,
testing/harness.py `mamba_slots_for`). A mismatch fails that policy's run with the request,
depth and expected vs found fingerprint; so do the soak harness's invariants.
DIR/exactness.json and a table on stdout.
Exit status: 0 when every run verified every request, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from eval import cli
from eval.soak import SoakConfig, run_policy, soak_workload
from radixflow_sglang.core.policy import POLICIES

CONFIGS: dict[str, SoakConfig] = {
    "gdn-extra": SoakConfig(max_new_tokens=16),
    "gdn-extra-overlap": SoakConfig(overlap=True, max_new_tokens=16),
    "gdn-extra-page16-overlap": SoakConfig(overlap=True, page_size=16, max_new_tokens=16),
    "gdn-nobuf": SoakConfig(layout="no_buffer", max_new_tokens=16),
    "mamba2-extra-overlap": SoakConfig(model="nemotron-9b", overlap=True, max_new_tokens=16),
    "mamba2-nobuf": SoakConfig(model="nemotron-9b", layout="no_buffer", max_new_tokens=16),
    "gdn-abort-storm-overlap": SoakConfig(overlap=True, abort_frac=0.25, retract_prob=0.2,
                                          max_new_tokens=16),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.exactness", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=cli.positive(int, "an integer"), default=2500,
                   help="requests per configuration and policy")
    p.add_argument("--out", required=True)
    p.add_argument("--policies", type=cli.policies, default=list(POLICIES))
    p.add_argument("--configs", default=",".join(CONFIGS),
                   help=f"comma-separated, from: {', '.join(CONFIGS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mixed-chunk", action="store_true",
                   help="SGLang's --enable-mixed-chunk in every configuration")
    args = p.parse_args(argv)
    names = args.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        p.error(f"--configs: unknown {unknown} (choose from {', '.join(CONFIGS)})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, totals, failed = [], {"requests": 0, "verified": 0, "mismatched": 0}, 0
    t0 = time.perf_counter()
    for name in names:
        cfg = replace(CONFIGS[name], seed=args.seed, mixed_chunk=args.mixed_chunk)
        arrivals = soak_workload(args.requests, cfg.rate, cfg.seed, cfg.abort_frac)
        for policy in args.policies:
            try:
                res = run_policy(policy, arrivals, cfg)
            except Exception as e:  # noqa: BLE001 - a failed run is reported, the rest go on
                res = {"error": f"{type(e).__name__}: {e}"}
            row = {"config": name, "policy": policy, **_row(res)}
            rows.append(row)
            failed += bool(row["error"] or row["violations"])
            for k in totals:
                totals[k] += row.get(k) or 0
            print(_line(row, args.mixed_chunk), flush=True)
    doc = {"requests_per_run": args.requests, "seed": args.seed,
           "mixed_chunk": args.mixed_chunk, "totals": totals,
           "runs": rows, "wall_s": round(time.perf_counter() - t0, 1)}
    (out / "exactness.json").write_text(json.dumps(doc, indent=1))
    print(f"total: {totals['verified']} of {totals['requests']} computed requests verified, "
          f"{totals['mismatched']} mismatched, {failed} failed runs"
          + (", mixed chunk" if args.mixed_chunk else "") + f" ({doc['wall_s']}s)")
    return 1 if failed or totals["mismatched"] else 0


def _row(res: dict) -> dict:
    if "error" in res:
        return {"error": res["error"], "requests": 0, "verified": 0, "mismatched": 0,
                "mixed_rounds": 0, "violations": 0}
    return {"error": None, "requests": res["witness_requests"],
            "verified": res["witness_verified"], "mismatched": res["witness_mismatched"],
            "resumed": res["witness_resumed"], "retracted": res["retracted"],
            "aborted": res["aborted"], "mixed_rounds": res["mixed_rounds"],
            "violations": res["violations"]}


def _line(row: dict, mixed: bool = False) -> str:
    if row["error"]:
        return f"{row['config']:26} {row['policy']:12} FAILED: {row['error']}"
    return (f"{row['config']:26} {row['policy']:12} verified {row['verified']:>6} of "
            f"{row['requests']:>6}  mismatched {row['mismatched']}  resumed {row['resumed']:>6}"
            f"  retracted {row['retracted']:>5}  aborted {row['aborted']:>4}  "
            + (f"mixed rounds {row['mixed_rounds']:>5}  " if mixed else "")
            + f"violations {row['violations']}")


if __name__ == "__main__":
    sys.exit(main())
