"""Scan cost: SGLang's stock prefill scan vs RadixFlow's traversal, side by side on the CPU kit.

    python -m eval.bench_scan [--sizes 64,512,4096] [--repeat 3] [--model qwen3.5-4b]

For each queue size and workload (independent requests, or four-branch groups sharing a
document) it times one scan per fresh kit (process CPU time), repeated, and prints CPU time per
scan, per visited request (visited counted by our runtime; stock visits the same prefix of the
queue as `radix`), and the traversal/stock ratio.
"""

from __future__ import annotations

import argparse
import random
import time

from radixflow_sglang import models
from radixflow_sglang.testing.kit import Kit, KitConfig


def queue(kit: Kit, n: int, shared: bool, seed: int) -> list:
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        if shared:
            g = i // 4
            doc = [10_000 + (g * 997 + j) % 90_000 for j in range(300)]
            ids = doc + [rng.randrange(1000, 9000) for _ in range(20)]
        else:
            ids = [rng.randrange(1000, 90_000) for _ in range(320)]
        reqs.append(kit.req(f"r{i}", ids))
    return reqs


def one_scan(policy: str, n: int, shared: bool, model: str, seed: int) -> tuple[float, int]:
    kit = Kit(KitConfig(model=model, kv_tokens=max(400_000, n * 400)), policy=policy)
    kit.submit(*queue(kit, n, shared, seed))
    t = time.process_time()
    kit.scan()
    dt = time.process_time() - t
    visited = kit.runtime.stats.visited if kit.runtime is not None else 0
    return dt, visited


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m eval.bench_scan",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,512,4096")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--model", choices=models.names(), default="qwen3.5-4b")
    a = ap.parse_args(argv)
    print("| queue | sharing | stock ms/scan | radix ms/scan | traversal ms/scan | "
          "visited (radix/trav) | stock us/visited | trav us/visited | trav/stock per scan | "
          "trav/stock per visited |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n in [int(x) for x in a.sizes.split(",")]:
        for shared in (False, True):
            res = {}
            for pol in ("stock", "radix", "traversal"):
                runs = [one_scan(pol, n, shared, a.model, s) for s in range(a.repeat)]
                res[pol] = (min(r[0] for r in runs), runs[0][1])
            rv, tv = res["radix"][1], res["traversal"][1]
            stock_v = res["stock"][0] / max(rv, 1)  # NOTE: stock visits what radix visits
            trav_v = res["traversal"][0] / max(tv, 1)
            print(f"| {n} | {'yes' if shared else 'no'} | {res['stock'][0] * 1e3:.2f} | "
                  f"{res['radix'][0] * 1e3:.2f} | {res['traversal'][0] * 1e3:.2f} | {rv}/{tv} | "
                  f"{stock_v * 1e6:.0f} | {trav_v * 1e6:.0f} | "
                  f"{res['traversal'][0] / res['stock'][0]:.2f}x | {trav_v / stock_v:.2f}x |")


if __name__ == "__main__":
    main()
