"""Soak: thousands of requests per policy through SGLang's real scan on the CPU kit.

    python -m eval.soak --requests 10000 --out out/soak [--policies stock,radix,...]
        [--model qwen3.5-4b] [--layout extra_buffer] [--seed 0] [--overlap]
        [--mamba-slots N | --mamba-extra N] [--mixed-chunk]

For each policy a fresh `Kit` (SGLang 0.5.23's pools, UnifiedRadixCache, Req and prefill scan,
stock or ours) replays the same seeded request stream in virtual time:

* Questions of 1-4 branches (a shared document from a sliding window of recent documents +
  a question + a branch suffix, a few hundred tokens) or unrelated one-off requests arrive as a
  Poisson process (`--rate` requests/s); a batch takes `eval/costmodel.py`'s time; an
  admission hold sleeps in virtual time until its deadline or the next arrival (as
  eval/twin.py).
* About 5 % of requests (`--abort-frac`) get an abort 0-3 steps after they arrive; it goes
  through `Kit.abort_waiting` when the request is still queued (held, parked or waiting) and
  comes too late otherwise (the request then completes).
* With `--overlap`, requests whose batch is in flight are sometimes retracted as SGLang's
  `release_req` does (KV released without insert, `reset_for_retract`) and re-queued once
  their batch's result is processed.
* With `--mixed-chunk` (SGLang's `--enable-mixed-chunk`, `KitConfig.mixed_chunk`), a prefill
  that forms while requests decode carries their decode rows (needs `--max-new-tokens` > 1
  for anything to decode); the harness counts those rows as decode steps, not chunks.
* The pools are tight (a few thousand KV tokens, a few dozen mamba slots), so published states
  are evicted all the time.

After every step the `Harness` checks that no waiting request holds a KV row, a mamba slot, a
copy-on-write source or a tree lock, that parked requests stay within the park bound, that
each round fits its row and token budgets, and that every request's chunks chain. After the
drain it checks that every request completed or was aborted exactly once and, with the whole
tree evicted, that no KV, row or mamba slot leaked.

DIR/soak.json holds, per policy: requests, completed, aborted, leaked_kv_slots,
leaked_mamba_slots, stale_cow_sources, longest_wait_rounds, the scan's process CPU time per
round in the first and last decile of the run (the scan's cost must not grow), and more.
Exit status: 0 when every policy ran clean, 1 when any invariant broke, 2 for bad arguments;
a SIGTERM (e.g. `timeout`) stops the run after writing soak.json with the policies that finished
and an "interrupted" note (exit 143).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval import cli
from radixflow_sglang import models
from radixflow_sglang.core.policy import POLICIES
from radixflow_sglang.testing.harness import Harness, VirtualClock, mamba_slots_for
from radixflow_sglang.testing.loop import VirtualLoop

MODEL_CHOICES = tuple(models.names())
LAYOUT_CHOICES = ("extra_buffer", "no_buffer")
SOAK_KEYS = (
    "requests", "completed", "aborted", "leaked_kv_slots", "leaked_mamba_slots",
    "stale_cow_sources", "longest_wait_rounds", "scan_cpu_ms_per_round_first_decile",
    "scan_cpu_ms_per_round_last_decile",
)


# --------------------------------------------------------------------------------------------
# The soak workload
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arrival:
    t: float  # virtual seconds
    rids: tuple[str, ...]
    ids: tuple[tuple[int, ...], ...]
    namespace: str
    abort_after: tuple[int | None, ...]  # scans after arrival to abort at (None: never)


def soak_workload(n_requests: int, rate: float, seed: int, abort_frac: float = 0.05,
                  window: int = 24) -> list[Arrival]:
    """Seeded arrivals: questions of 1-4 branches over a sliding window of recent documents
    (150-400 tokens), 10-40 question tokens, 3-30 branch tokens; one in eight arrivals is an
    unrelated request of 40-500 tokens. Four namespaces. About `abort_frac` of the requests
    are marked to be aborted 0-3 scans after they arrive."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(1_000, 100_000) for _ in range(n)]

    docs: deque[tuple[list[int], str]] = deque(maxlen=window)
    out: list[Arrival] = []
    t, made, q = 0.0, 0, 0
    while made < n_requests:
        if rng.random() < 1 / 8:
            n = 1
            texts = [ids(rng.randint(40, 500))]
            ns = f"ns{rng.randrange(4)}"
        else:
            if not docs or rng.random() < 0.15:
                docs.append((ids(rng.randint(150, 400)), f"ns{rng.randrange(4)}"))
            doc, ns = rng.choice(docs)
            question = ids(rng.randint(10, 40))
            n = min(rng.randint(1, 4), n_requests - made)
            texts = [doc + question + ids(rng.randint(3, 30)) for _ in range(n)]
        n = min(n, n_requests - made)
        t += rng.expovariate(rate / n)  # NOTE: `rate` counts requests, an arrival brings n
        rids = tuple(f"q{q}/{b}" for b in range(n))
        aborts = tuple(rng.randint(0, 3) if rng.random() < abort_frac else None
                       for _ in range(n))
        out.append(Arrival(t, rids, tuple(tuple(x) for x in texts[:n]), ns, aborts))
        made += n
        q += 1
    return out


@dataclass
class SoakConfig:
    model: str = "qwen3.5-4b"
    layout: str = "extra_buffer"
    overlap: bool = False
    rows: int = 16
    tokens: int = 2048
    kv_tokens: int = 6000
    mamba_slots: int | None = None  # default: tight for the layout (see mamba_slots_for)
    rate: float = 150.0  # requests/s offered (virtual time)
    abort_frac: float = 0.05
    retract_prob: float = 0.05  # per in-flight request and step, with overlap only
    seed: int = 0
    page_size: int = 1  # KV page (extra_buffer only, as SGLang)
    max_new_tokens: int = 1  # each request generates 1..this many ids (decode, retract_decode)
    mixed_chunk: bool = False  # --enable-mixed-chunk: decode rows ride in prefill rounds



def run_policy(policy: str, arrivals: list[Arrival], cfg: SoakConfig,
               progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Replay `arrivals` through a fresh kit under `policy`; return its soak figures.

    The virtual-time loop is the twin's (radixflow_sglang/testing/loop.py) with free scans."""
    import torch

    from eval.costmodel import default_cost
    from radixflow_sglang.geometry import load_geometry
    from radixflow_sglang.testing.kit import Kit, KitConfig

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # NOTE: tiny CPU tensors; intra-op threads only add noise
    t_wall = time.perf_counter()
    try:
        clock = VirtualClock()
        geo_hybrid = load_geometry(cfg.model).hybrid
        slots = cfg.mamba_slots or mamba_slots_for(cfg.layout, cfg.rows, cfg.overlap)
        kit = Kit(KitConfig(model=cfg.model, layout=cfg.layout, rows=cfg.rows, tokens=cfg.tokens,
                            kv_tokens=cfg.kv_tokens, mamba_slots=slots if geo_hybrid else None,
                            overlap=cfg.overlap, page_size=cfg.page_size,
                            mixed_chunk=cfg.mixed_chunk),
                  policy=policy, clock=clock, sleep=clock.sleep)
        h = Harness(kit, clock)
        cost = default_cost(cfg.model)
        rng = random.Random(cfg.seed + 1)
        abort_at: dict[str, int] = {}  # rid -> step to abort it at
        state = {"ended": 0, "attempts": 0}

        def submit(a: Arrival) -> None:
            for rid, ids, after in zip(a.rids, a.ids, a.abort_after, strict=True):
                # NOTE: outputs without ignore_eos: SGLang's admission reserves its new-token
                # ratio only, so decode can run out of KV and retract_decode sends requests back
                new = 1 + zlib.crc32(rid.encode()) % cfg.max_new_tokens
                h.submit(rid, ids, a.namespace, max_new_tokens=new,
                         ignore_eos=cfg.max_new_tokens == 1)
                if after is not None:
                    abort_at[rid] = h.steps + after

        def ended(*_: Any) -> None:
            if progress is None:
                return
            done = sum(h.completions.count.values()) + sum(h.aborted.values())
            progress(done - state["ended"])
            state["ended"] = done

        def before_step() -> None:
            for rid in [r for r, s in abort_at.items() if s <= h.steps]:
                del abort_at[rid]
                state["attempts"] += 1
                if h.abort(rid):  # NOTE: already selected: too late, it completes
                    ended()
            if cfg.overlap and cfg.retract_prob > 0:
                for req in h.retractable():
                    if rng.random() < cfg.retract_prob:
                        h.retract(req)

        loop = VirtualLoop(kit, lambda rnd: round_cost(cost, rnd), stepper=h,
                           clock=clock, log=h.completions, before_step=before_step,
                           on_complete=ended, label=policy)
        now = loop.run(arrivals, lambda a: a.t, submit)
        leaks = h.finish()
    finally:
        torch.set_num_threads(threads)
    out = summarize(policy, h, leaks, kit, cfg, time.perf_counter() - t_wall, now)
    out["abort_attempts"] = state["attempts"]
    return out


def round_cost(cost: Any, rnd: Any) -> float:
    """A kit round's cost: a decode step, or a prefill batch whose mixed decode rows
    (`Round.decoding`) are the one-token extends at seq_len - 1 that SGLang runs them as."""
    if rnd.mode == "decode":
        return cost.step(rnd)
    if not rnd.decoding:
        return cost.batch(rnd.extend, rnd.prefix)
    extend = {**rnd.extend, **dict.fromkeys(rnd.decoding, 1)}
    prefix = {**rnd.prefix, **{rid: n - 1 for rid, n in rnd.decoding.items()}}
    return cost.batch(extend, prefix)


def deciles(xs: Sequence[float]) -> list[float]:
    """Means of xs in ten consecutive parts of (nearly) equal size."""
    if not xs:
        return []
    n = len(xs)
    parts = [xs[i * n // 10:(i + 1) * n // 10] for i in range(10)]
    return [sum(p) / len(p) for p in parts if p]


def summarize(policy: str, h: Harness, leaks: dict[str, int], kit: Any, cfg: SoakConfig,
              wall_s: float, virtual_s: float) -> dict[str, Any]:
    rt = kit.runtime
    scan_ms = [1e3 * x for x in deciles(h.scan_cpu_s)] or [0.0]
    first, last = scan_ms[0], scan_ms[-1]
    q = deciles(h.queue_lens) or [0.0]
    return {
        "requests": len(h.lengths),
        "completed": sum(1 for c in h.completions.count.values() if c),
        "aborted": sum(1 for c in h.aborted.values() if c),
        "retracted": h.retractions,
        "leaked_kv_slots": leaks.get("kv", 0),
        "leaked_mamba_slots": leaks.get("mamba", 0),
        "leaked_rows": leaks.get("rows", 0),
        "stale_cow_sources": h.stale_cow_sources,
        "stalled_chunk_steps": h.stalled_chunks,
        "longest_wait_rounds": h.longest_wait_rounds,
        "most_parked_rounds_per_request": h.most_parked_rounds,
        "park_bound": h.park_bound,
        "scan_cpu_ms_per_round_first_decile": round(first, 4),
        "scan_cpu_ms_per_round_last_decile": round(last, 4),
        "scan_cost_last_over_first": round(last / first, 3) if first else None,
        "scan_cpu_ms_per_round_by_decile": [round(x, 4) for x in scan_ms],
        "scans": len(h.scan_cpu_s),
        "rounds": h.rounds,
        "decode_steps": h.decode_steps,
        "mixed_rounds": h.mixed_rounds,  # prefill rounds that carried decode rows
        "mixed_decode_rows": h.mixed_decode_rows,
        "queue_len_first_decile": round(q[0], 2),
        "queue_len_last_decile": round(q[-1], 2),
        "queue_len_by_decile": [round(x, 2) for x in q],
        "queue_len_max": max(h.queue_lens, default=0),
        "scheduled_tokens": h.scheduled_tokens,
        "hit_tokens": h.hit_tokens,
        "blocked": rt.totals.blocked if rt is not None else 0,
        "forks": rt.totals.forks if rt is not None else 0,
        "released_by_bound": rt.totals.released_by_bound if rt is not None else 0,
        "held_iterations": rt.held_iterations if rt is not None else 0,
        "frag_deferred": rt.totals.frag_deferred if rt is not None else 0,
        "kv_tokens": cfg.kv_tokens,
        "peak_kv_used": h.peak_kv_used,
        "mamba_slots": kit.mamba_total,
        "peak_mamba_used": h.peak_mamba_used,
        "virtual_s": round(virtual_s, 3),
        **_witness(kit),
        "violations": h.violations.total(),
        "violation_kinds": dict(h.violations.count),
        "violation_examples": h.violations.examples,
        "wall_s": round(wall_s, 2),
    }


def _witness(kit: Any) -> dict[str, Any]:
    """The witness executor's counts (a mismatch has already failed the run: it is strict)."""
    if kit.witness is None:
        return {}
    w = kit.witness.stats
    return {"witness_requests": w.requests, "witness_verified": w.verified,
            "witness_mismatched": w.mismatched, "witness_resumed": w.resumed,
            "witness_states_checked": w.states_checked}


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _fraction(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= x <= 1:
        raise argparse.ArgumentTypeError(f"must lie in [0, 1], got {text!r}")
    return x


def _count(text: str) -> int:
    try:
        x = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if x < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return x


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.soak", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=cli.positive(int, "an integer"), default=10_000)
    p.add_argument("--out", required=True, help="output directory (writes DIR/soak.json)")
    p.add_argument("--policies", type=cli.policies, default=list(POLICIES),
                   help=f"comma-separated, from: {', '.join(POLICIES)} (default: all)")
    p.add_argument("--model", choices=MODEL_CHOICES, default="qwen3.5-4b")
    p.add_argument("--layout", choices=LAYOUT_CHOICES, default="extra_buffer",
                   help="mamba cache layout of hybrid models (ignored for full attention)")
    p.add_argument("--overlap", action="store_true",
                   help="overlap scheduling (publish lag 2), with retractions of in-flight rows")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", type=cli.positive(float, "a number"), default=SoakConfig.rate,
                   help="offered requests/s in virtual time (default %(default)s)")
    p.add_argument("--abort-frac", type=_fraction, default=SoakConfig.abort_frac)
    p.add_argument("--kv-tokens", type=cli.positive(int, "an integer"),
                   default=SoakConfig.kv_tokens)
    mamba = p.add_mutually_exclusive_group()
    mamba.add_argument("--mamba-slots", type=cli.positive(int, "an integer"), default=None,
                       help="mamba pool size (default: the minimum for the layout, rows and "
                            "overlap: testing.harness.mamba_slots_for)")
    mamba.add_argument("--mamba-extra", type=_count, default=0,
                       help="mamba pool = that minimum + this many slots (default 0)")
    p.add_argument("--page-size", type=cli.positive(int, "an integer"), default=1,
                   help="KV page size (extra_buffer only, as SGLang)")
    p.add_argument("--max-new-tokens", type=cli.positive(int, "an integer"), default=1,
                   help="each request generates 1..N ids (N > 1: decode, without ignore_eos, "
                        "so retract_decode runs when KV runs out)")
    p.add_argument("--mixed-chunk", action="store_true",
                   help="SGLang's --enable-mixed-chunk: running requests' decode rows ride in "
                        "prefill rounds (with --max-new-tokens > 1)")
    p.add_argument("--rows", type=cli.positive(int, "an integer"), default=SoakConfig.rows)
    p.add_argument("--tokens", type=cli.positive(int, "an integer"), default=SoakConfig.tokens)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    from eval.run_arms import sigterm_exits

    sigterm_exits()  # NOTE: a killed soak (`timeout`) still writes the policies it finished
    args = build_parser().parse_args(argv)
    if args.overlap and args.layout == "no_buffer" and args.model != "qwen3-8b":
        print("eval/soak.py: error: --overlap needs --layout extra_buffer (SGLang turns overlap "
              "scheduling off for no_buffer)", file=sys.stderr)
        return 2
    mamba_slots = args.mamba_slots
    if args.mamba_extra:
        mamba_slots = mamba_slots_for(args.layout, args.rows, args.overlap) + args.mamba_extra
    cfg = SoakConfig(model=args.model, layout=args.layout, overlap=args.overlap, rows=args.rows,
                     tokens=args.tokens, kv_tokens=args.kv_tokens, mamba_slots=mamba_slots,
                     rate=args.rate, abort_frac=args.abort_frac, seed=args.seed,
                     page_size=args.page_size, max_new_tokens=args.max_new_tokens,
                     mixed_chunk=args.mixed_chunk)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    arrivals = soak_workload(args.requests, cfg.rate, cfg.seed, cfg.abort_frac)
    results: dict[str, Any] = {}
    try:
        run_all(args, cfg, arrivals, results)
        stopped = None
    except SystemExit as e:  # NOTE: SIGTERM (sigterm_exits); Ctrl-C stays a traceback
        stopped = e.code if isinstance(e.code, int) else 1
    from radixflow_sglang.geometry import load_geometry

    slots = cfg.mamba_slots or mamba_slots_for(cfg.layout, cfg.rows, cfg.overlap)
    doc = {
        "config": {**cfg.__dict__, "requests": args.requests, "policies": args.policies,
                   "mamba_slots": slots if load_geometry(cfg.model).hybrid else None},
        "policies": results,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    if stopped is not None:
        doc["interrupted"] = f"stopped by a signal (exit {stopped}) before " + ", ".join(
            p for p in args.policies if p not in results)
    (out / "soak.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out / 'soak.json'} ({doc['wall_s']:.1f}s wall)", file=sys.stderr)
    if stopped is not None:
        return stopped
    bad = [p for p, r in results.items() if "error" in r or r["violations"]]
    return 1 if bad else 0


def run_all(args: argparse.Namespace, cfg: SoakConfig, arrivals: list[Arrival],
            results: dict[str, Any]) -> None:
    """Every policy in turn; `results` fills as each one finishes."""
    show = not args.no_progress
    for policy in args.policies:
        bar = None
        if show:
            from tqdm import tqdm

            bar = tqdm(total=args.requests, desc=f"{args.model} {policy}", unit="req",
                       file=sys.stderr, mininterval=1.0)
        try:
            res = run_policy(policy, arrivals, cfg, bar.update if bar is not None else None)
        except Exception as e:  # noqa: BLE001 - recorded per policy, the others still run
            res = {"error": f"{type(e).__name__}: {e}"}
        finally:
            if bar is not None:
                bar.close()
        results[policy] = res
        if "error" in res:
            print(f"[{policy}] FAILED: {res['error']}", file=sys.stderr)
        else:
            print(f"[{policy}] completed={res['completed']} aborted={res['aborted']} "
                  f"leaks kv={res['leaked_kv_slots']} mamba={res['leaked_mamba_slots']} "
                  f"stale_cow={res['stale_cow_sources']} wait={res['longest_wait_rounds']} "
                  f"scan ms {res['scan_cpu_ms_per_round_first_decile']:.3f}->"
                  f"{res['scan_cpu_ms_per_round_last_decile']:.3f} "
                  f"witness {res.get('witness_verified', '-')} verified "
                  f"{res.get('witness_mismatched', '-')} mismatched "
                  + (f"mixed rounds={res['mixed_rounds']} " if args.mixed_chunk else "")
                  + f"violations={res['violations']} ({res['wall_s']:.1f}s)", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
