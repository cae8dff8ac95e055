"""Scan cost: SGLang's stock prefill scan vs RadixFlow's traversal, side by side on the CPU kit.

    python -m eval.bench_scan [--sizes 1,4,16,64] [--repeat 30] [--model qwen3.5-4b]
                              [--policies stock,radix,radixflow] [--profile radixflow]

For each queue size and workload (independent requests, or four-branch groups sharing a
document, every document's fourth branch in flight when the scan runs, so the traversal's probe has
producers to find) it times the scan the twin charges, `Kit.step`'s `get_next_batch_to_run`
(prefill scan + batch preparation, process CPU time, `ScanTiming.cpu_s`), once per fresh kit.
The arms are interleaved (repeat r runs every policy, in an order rotated by r) so a load
change on the shared machine hits every arm alike; it prints the median and IQR of CPU time per
scan, the requests the scan loop visited (counted the same way for every scan, kit.ScanTiming)
and each arm's median / stock's median. `--profile POLICY` prints a cProfile of that arm's
scans instead (where the time goes).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
from dataclasses import dataclass

from radixflow_sglang import models
from radixflow_sglang.testing.kit import Kit, KitConfig

DOC, TAIL = 2_000, 40  # shared document and question tokens (a RACE-sized branch)


def _doc(g: int) -> list[int]:
    return [10_000 + (g * 997 + j) % 90_000 for j in range(DOC)]


def queue(kit: Kit, n: int, shared: bool, seed: int) -> list:
    """The `n` requests the measured scan sees: independent, or three branches per document."""
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        if shared:
            ids = _doc(i // 3) + [rng.randrange(1000, 9000) for _ in range(TAIL)]
        else:
            ids = [rng.randrange(1000, 90_000) for _ in range(DOC + TAIL)]
        reqs.append(kit.req(f"r{i}", ids))
    return reqs


def leaders(kit: Kit, n: int) -> list:
    """Each document's fourth branch, launched before the measured scan."""
    return [kit.req(f"lead{g}", _doc(g) + [1] * TAIL) for g in range((n + 2) // 3)]


@dataclass
class Scan:
    cpu_s: float
    visited: int
    rows: int


def one_scan(policy: str, n: int, shared: bool, model: str, seed: int,
             prof: cProfile.Profile | None = None) -> Scan:
    """A fresh kit; with `shared`, one branch of each group is launched first (in flight, as
    under overlap: a producer the rest can wait for); then the measured step."""
    kit = Kit(KitConfig(model=model, kv_tokens=max(400_000, n * 4 * (DOC + TAIL)),
                        overlap=shared), policy=policy)
    if shared:
        kit.submit(*leaders(kit, n))
        kit.step()
    kit.submit(*queue(kit, n, shared, seed))
    if prof is not None:
        prof.enable()
    rnd = kit.step()
    if prof is not None:
        prof.disable()
    scan = kit.last_scan
    return Scan(scan.cpu_s, scan.visited or 0, len(rnd.rids) if rnd is not None else 0)


def _q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p * (len(xs) - 1))))]


def measure(policies: list[str], n: int, shared: bool, model: str, repeat: int
            ) -> dict[str, list[Scan]]:
    runs: dict[str, list[Scan]] = {p: [] for p in policies}
    for r in range(repeat):
        order = policies[r % len(policies):] + policies[:r % len(policies)]
        for pol in order:  # NOTE: interleaved and rotated: load drifts hit every arm alike
            runs[pol].append(one_scan(pol, n, shared, model, seed=r))
    return runs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m eval.bench_scan",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,4,16,64", help="queue sizes, comma-separated")
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--model", choices=models.names(), default="qwen3.5-4b")
    ap.add_argument("--policies", default="stock,radix,radixflow",
                    help="comma-separated, the first is the baseline")
    ap.add_argument("--sharing", choices=("both", "yes", "no"), default="both")
    ap.add_argument("--profile", default=None, metavar="POLICY",
                    help="print a cProfile of this policy's scans (all sizes) instead")
    a = ap.parse_args(argv)
    if a.repeat < 1:
        ap.error(f"--repeat: {a.repeat} (>= 1)")
    sizes = [int(x) for x in a.sizes.split(",")]
    sharing = {"both": (False, True), "yes": (True,), "no": (False,)}[a.sharing]
    if a.profile is not None:
        prof = cProfile.Profile()
        for n in sizes:
            for shared in sharing:
                for r in range(a.repeat):
                    one_scan(a.profile, n, shared, a.model, r, prof)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
        return
    pols = a.policies.split(",")
    base = pols[0]
    print(f"model {a.model}, {a.repeat} interleaved repeats; ms per scan: median [IQR]; "
          f"visited / rows: median")
    print("| queue | sharing | " + " | ".join(f"{p} ms | {p} visited/rows" for p in pols)
          + " | " + " | ".join(f"{p}/{base}" for p in pols[1:]) + " |")
    print("|---|---|" + "---|---|" * len(pols) + "---|" * (len(pols) - 1))
    for n in sizes:
        for shared in sharing:
            runs = measure(pols, n, shared, a.model, a.repeat)
            med = {p: statistics.median(s.cpu_s for s in runs[p]) for p in pols}
            cells = []
            for p in pols:
                xs = [s.cpu_s * 1e3 for s in runs[p]]
                vis = statistics.median(s.visited for s in runs[p])
                rows = statistics.median(s.rows for s in runs[p])
                cells.append(f"{med[p] * 1e3:.2f} [{_q(xs, .25):.2f}-{_q(xs, .75):.2f}] | "
                             f"{vis:g}/{rows:g}")
            ratios = [f"{med[p] / med[base]:.2f}x" for p in pols[1:]]
            print(f"| {n} | {'yes' if shared else 'no'} | " + " | ".join(cells) + " | "
                  + " | ".join(ratios) + " |", flush=True)


if __name__ == "__main__":
    main()
