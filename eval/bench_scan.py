"""Scan cost: SGLang's stock prefill scan vs RadixFlow's traversal, side by side on the CPU kit.

    python -m eval.bench_scan [--sizes 1,4,16,64] [--repeat 30] [--model qwen3.5-4b]
                              [--policies stock,radix,radixflow] [--profile radixflow]
                              [--steady WAVES] [--hooks]

For each queue size and workload (independent requests, or four-branch groups sharing a
document, every document's fourth branch in flight when the scan runs, so the traversal's probe has
producers to find) it times the scan the twin charges, `Kit.step`'s `get_next_batch_to_run`
(prefill scan + batch preparation, process CPU time, `ScanTiming.cpu_s`), once per fresh kit.
The arms are interleaved (repeat r runs every policy, in an order rotated by r) so a load
change on the shared machine hits every arm alike; it prints the median and IQR of CPU time per
scan, the requests the scan loop visited (counted the same way for every scan, kit.ScanTiming)
and each arm's median / stock's median. `--profile POLICY` prints a cProfile of that arm's
scans instead (where the time goes).

A fresh kit's first scan also pays what a server pays once (the learners' and the tree's first
use). `--steady WAVES` measures a serving kit instead: one kit per arm takes WAVES waves of the
same queue shape (each wave its own documents, drained before the next, so the tree evicts as a
busy server's does) and every scan of the last four fifths of the waves that visited a request
is timed; `--hooks` adds, for each radixflow-class arm, the wall time per scan of each of the
runtime's scan hooks (adapter/runtime.py; `hold` is the admission hold, `after_add` includes
the boundary publisher's `admitted`), timed only inside those scans.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial

from radixflow_sglang import models
from radixflow_sglang.testing.kit import Kit, KitConfig

DOC, TAIL = 2_000, 40  # shared document and question tokens (a RACE-sized branch)


HOOKS = ("hold", "begin_scan", "park", "defer_unmatched", "defer", "after_add", "end_scan")


def _doc(g: int) -> list[int]:
    return [10_000 + (g * 997 + j) % 90_000 for j in range(DOC)]


def queue(kit: Kit, n: int, shared: bool, seed: int, wave: int = 0) -> list:
    """The `n` requests the measured scan sees: independent, or three branches per document
    (`wave`: a steady run's wave, with documents and request ids of its own)."""
    rng = random.Random(seed)
    reqs = []
    docs = wave * ((n + 2) // 3)
    for i in range(n):
        if shared:
            ids = _doc(docs + i // 3) + [rng.randrange(1000, 9000) for _ in range(TAIL)]
        else:
            ids = [rng.randrange(1000, 90_000) for _ in range(DOC + TAIL)]
        reqs.append(kit.req(f"w{wave}.r{i}" if wave else f"r{i}", ids))
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


class HookTimer:
    """Wall seconds spent in each of the runtime's scan hooks (`HOOKS`), per arm: `arm` names
    the arm being timed (None: nothing is timed)."""

    def __init__(self) -> None:
        self.arm: str | None = None
        self.seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    @contextmanager
    def installed(self) -> Iterator[HookTimer]:
        """The hooks of RadixFlowRuntime timed (the class's own methods restored after)."""
        from radixflow_sglang.adapter.runtime import RadixFlowRuntime as rt

        saved = {name: rt.__dict__[name] for name in HOOKS if name in rt.__dict__}
        for name, fn in saved.items():
            setattr(rt, name, self._timed(name, fn))
        try:
            yield self
        finally:
            for name, fn in saved.items():
                setattr(rt, name, fn)

    def _timed(self, name: str, fn):
        def timed(*args, **kwargs):
            arm = self.arm
            if arm is None:
                return fn(*args, **kwargs)
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[arm][name] += time.perf_counter() - t
        return timed

    def lines(self, runs: dict[str, list[Scan]]) -> list[str]:
        """Per timed arm: each hook's wall time per measured scan, largest first."""
        out = []
        for pol, seconds in self.seconds.items():
            scans = len(runs.get(pol, ()))
            if scans:
                parts = sorted(seconds.items(), key=lambda kv: -kv[1])
                out.append(f"  {pol} hooks, us per scan: " + ", ".join(
                    f"{name} {sec / scans * 1e6:.0f}" for name, sec in parts))
        return out


def steady(policy: str, n: int, shared: bool, model: str, waves: int, seed: int,
           hooks: HookTimer | None = None, layout: str = "extra_buffer") -> list[Scan]:
    """The scans of a serving kit (`--steady`): `waves` waves of `n` requests, each drained
    before the next; the scans of the last four fifths of the waves that visited a request
    (`hooks` timed only in those)."""
    kit = Kit(KitConfig(model=model, layout=layout,
                        kv_tokens=max(400_000, n * 4 * (DOC + TAIL))), policy=policy)
    scans: list[Scan] = []
    for w in range(waves):
        kit.submit(*queue(kit, n, shared, seed * 100_003 + w, wave=w + 1))
        timed = w >= waves // 5
        if hooks is not None:
            hooks.arm = policy if timed else None
        try:
            for _ in range(10_000):
                if not kit.busy:
                    break
                rnd = kit.step()
                t = kit.last_scan
                if timed and t.visited:
                    rows = len(rnd.rids) if rnd is not None and rnd.mode == "prefill" else 0
                    scans.append(Scan(t.cpu_s, t.visited, rows))
            else:
                raise RuntimeError(f"{policy}: wave {w} not drained after 10,000 steps")
        finally:
            if hooks is not None:
                hooks.arm = None
    return scans


def _q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p * (len(xs) - 1))))]


def measure(policies: list[str], repeat: int, scans: Callable[[str, int], list[Scan]]
            ) -> dict[str, list[Scan]]:
    """`scans(policy, seed)` for every arm, `repeat` times: interleaved and rotated, so load
    drifts on the shared machine hit every arm alike."""
    runs: dict[str, list[Scan]] = {p: [] for p in policies}
    for r in range(repeat):
        order = policies[r % len(policies):] + policies[:r % len(policies)]
        for pol in order:
            runs[pol] += scans(pol, r)
    return runs


def _arm_scans(a: argparse.Namespace, n: int, shared: bool, hooks: HookTimer | None,
               policy: str, seed: int) -> list[Scan]:
    """One arm's scans for `measure`: a serving kit's (`--steady`), else a fresh kit's first."""
    if a.steady:
        return steady(policy, n, shared, a.model, a.steady, seed, hooks, a.layout)
    return [one_scan(policy, n, shared, a.model, seed)]


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
    ap.add_argument("--steady", type=int, default=0, metavar="WAVES",
                    help="time a serving kit's scans over WAVES waves (>= 5) instead of a "
                         "fresh kit's first scan; --repeat then counts kits per arm")
    ap.add_argument("--layout", choices=("extra_buffer", "no_buffer"), default="extra_buffer",
                    help="with --steady: the mamba radix cache strategy")
    ap.add_argument("--hooks", action="store_true",
                    help="with --steady: each runtime scan hook's wall time per scan")
    a = ap.parse_args(argv)
    if a.repeat < 1:
        ap.error(f"--repeat: {a.repeat} (>= 1)")
    if a.steady and a.steady < 5:
        ap.error(f"--steady: {a.steady} waves (>= 5: the first fifth warms the kit)")
    for flag, given in (("--hooks", a.hooks), ("--layout", a.layout != "extra_buffer")):
        if given and not a.steady:
            ap.error(f"{flag}: needs --steady WAVES")
    if a.profile is not None and a.steady:
        ap.error("--profile: profiles a fresh kit's first scan; leave out --steady")
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
    mode = (f"steady: {a.steady} waves per kit, the last four fifths timed, {a.layout}"
            if a.steady
            else "a fresh kit's first scan")
    print(f"model {a.model}, {a.repeat} interleaved repeats, {mode}; ms per scan: median "
          f"[IQR]; visited / rows: median")
    print("| queue | sharing | " + " | ".join(f"{p} ms | {p} visited/rows" for p in pols)
          + " | " + " | ".join(f"{p}/{base}" for p in pols[1:]) + " |")
    print("|---|---|" + "---|---|" * len(pols) + "---|" * (len(pols) - 1))
    for n in sizes:
        for shared in sharing:
            hooks = HookTimer() if a.hooks else None
            with hooks.installed() if hooks is not None else nullcontext():
                runs = measure(pols, a.repeat, partial(_arm_scans, a, n, shared, hooks))
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
            if hooks is not None:
                print("\n".join(hooks.lines(runs)), flush=True)


if __name__ == "__main__":
    main()
