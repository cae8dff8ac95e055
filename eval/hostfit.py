"""The host-cost model's fitting tool: measure the kit's scan CPU time on replays and fit
eval/hostcost.py's coefficients (its docstring says how; `python -m eval.hostfit --fit`).

Apart from the model so the twin, which charges the model, and this tool, which replays the
twin, do not import each other.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from eval.hostcost import DEFAULT_HOST, HostCoef, HostCost, scan_visited


@dataclass(frozen=True)
class Rounds:
    """One scan's launched prefill rounds in a replay: (visited, rows[, probed]) each, and the
    CPU seconds of every repeat (rounds recur identically: the replay is deterministic)."""

    x: list[tuple[int, ...]]
    cpu: list[list[float]]  # [repeat][round]
    quiet: list[bool] = field(default_factory=list)  # the round's scan was quiet

    def part(self, quiet: bool) -> Rounds:
        """The quiet (or not quiet) scans' rounds."""
        keep = [i for i in range(len(self.x)) if bool(self.quiet and self.quiet[i]) == quiet]
        return Rounds([self.x[i] for i in keep], [[row[i] for i in keep] for row in self.cpu],
                      [quiet] * len(keep))

    def medians(self) -> list[float]:
        import statistics

        return [statistics.median(col) for col in zip(*self.cpu, strict=True)]


def record(segs: Any, model: str, policies: tuple[str, ...], repeats: int,
           mode: str = "prefill") -> dict[str, Rounds]:
    """Replay `segs` `repeats` times per policy, interleaved (a load drift hits every arm
    alike), recording each launched prefill round's (visited, rows, probed) and scan CPU
    time; `mode` "decode": each decode step's (visited, running rows, 0) instead."""
    from eval import twin

    out: dict[str, Rounds] = {}
    for r in range(repeats):
        for pol in policies[r % len(policies):] + policies[:r % len(policies)]:
            rec: list[tuple[int, int, int, bool, float]] = []

            def host(rnd: Any, scan: Any, rec: list = rec) -> float:
                if getattr(rnd, "mode", "prefill") == mode and rnd.rids:
                    rec.append((scan_visited(scan), len(rnd.rids), scan.probed or 0,
                                bool(getattr(scan, "quiet", False)), scan.cpu_s))
                return 0.0

            twin.replay(segs, model, pol, host=host)
            x = [(v, n, p) for v, n, p, _, _ in rec]
            if pol not in out:
                out[pol] = Rounds(x, [], [q for *_, q, _ in rec])
            elif out[pol].x != x:
                raise RuntimeError(f"{pol}: repeat {r} ran other rounds than repeat 0 (the "
                                   "replay should be deterministic)")
            out[pol].cpu.append([c for *_, c in rec])
    return out


def robust_fit(x: list[tuple[int, ...]], y: list[float], probes: bool = False) -> HostCoef:
    """s0, s1, s2 (, s3 with `probes`) >= 0 minimising a Huber loss of
    y - (s0 + s1 * visited + s2 * rows (+ s3 * probed))."""
    import numpy as np
    from scipy.optimize import least_squares

    cols = 3 if probes else 2
    a = np.column_stack([np.ones(len(x)),
                         np.array([(*r, 0)[:cols] for r in x], dtype=float).reshape(-1, cols)])
    ms = np.array(y) * 1e3  # NOTE: in ms: a well-scaled problem
    scale = max(float(np.median(np.abs(ms - np.median(ms)))), 1e-3)  # Huber's knee: the MAD
    x0 = np.clip(np.linalg.lstsq(a, ms, rcond=None)[0], 0.0, None)
    res = least_squares(lambda c: a @ c - ms, x0, bounds=(0.0, np.inf), loss="huber",
                        f_scale=scale)
    return HostCoef(*(float(v) * 1e-3 for v in res.x))


def fit_rounds(rounds: dict[str, Rounds], native: str = "stock", traversal: str = "radixflow"
               ) -> tuple[HostCoef, HostCoef, HostCoef | None]:
    """Stock's coefficients, the traversal's = stock's + an excess >= 0 (module doc), and its
    quiet scans' the same way on their own rounds (None without any)."""
    base = robust_fit(rounds[native].x, rounds[native].medians())

    def excess(tr: Rounds) -> HostCoef:
        resid = [c - base(*r[:2]) for r, c in zip(tr.x, tr.medians(), strict=True)]
        d = robust_fit(tr.x, resid, probes=True)
        return HostCoef(base.s0 + d.s0, base.s1 + d.s1, base.s2 + d.s2, d.s3)

    tr = rounds[traversal]
    quiet = tr.part(True)
    return base, excess(tr.part(False)), (excess(quiet) if len(quiet.x) >= 8 else None)


# NOTE: the paper workload (probes: the rule waits) and the 0.8B's RACE (the rule recomputes
# every Blocked branch, unprobed): rounds with and without probes, so s3 and s1 separate.
FIT_SETS = (("mix", "qwen3.5-4b"), ("race", "qwen3.5-0.8b"))
# NOTE: decode steps (the paper's branches generate one token: none there): gsp's 16 tokens out
DECODE_SET = ("gsp", "qwen3.5-0.8b", {"groups": 16, "prompts_per_group": 4, "system_len": 2048,
                                      "question_len": 64, "output_len": 16, "rate": 8.0})


def fit_decode(repeats: int, data_dir: str | None = None) -> HostCoef:
    """A decode step's scan: stock's decode steps (its code runs in both arms: the step visits
    no request) on (1, running rows)."""
    from eval.workload import workload

    name, model, shape = DECODE_SET
    segs = workload(name, model, seed=0, data_dir=data_dir, **shape)
    r = record(segs, model, ("stock",), repeats, mode="decode")["stock"]
    c = robust_fit([x[:2] for x in r.x], r.medians())
    return HostCoef(c.s0, 0.0, c.s2)


def fit(sets: tuple[tuple[str, str], ...] = FIT_SETS, questions: int = 10,
        data_dir: str | None = None, repeats: int = 5, verbose: bool = False) -> HostCost:
    """Fit both scans' coefficients from the kit's measured scan CPU time on the workloads
    (name, model), their rounds pooled."""
    import statistics

    from eval.workload import workload

    rounds: dict[str, Rounds] = {}
    for name, model in sets:
        segs = workload(name, model, regime="all", order="forward", questions=questions,
                        rate=5.0, seed=0, data_dir=data_dir)
        for pol, r in record(segs, model, ("stock", "radixflow"), repeats).items():
            old = rounds.get(pol, Rounds([], [[] for _ in range(repeats)]))
            rounds[pol] = Rounds(old.x + r.x, [a + b for a, b in zip(old.cpu, r.cpu,
                                                                     strict=True)],
                                 old.quiet + r.quiet)
    native, trav, quiet = fit_rounds(rounds)
    decode = fit_decode(repeats, data_dir)
    if verbose:
        for pol, r in rounds.items():
            med = r.medians()
            print(f"{pol}: {len(r.x)} rounds x {repeats} repeats; median of round medians "
                  f"{statistics.median(med) * 1e3:.2f} ms, mean {statistics.fmean(med) * 1e3:.2f}"
                  f" ms; visited median {statistics.median(x[0] for x in r.x):g} "
                  f"(max {max(x[0] for x in r.x)}), rows median "
                  f"{statistics.median(x[1] for x in r.x):g}, probed "
                  f"{sum((*x, 0)[2] for x in r.x)} in all", file=sys.stderr)
        r = rounds["radixflow"]
        print(f"radixflow: {sum(r.quiet)} of {len(r.x)} rounds quiet", file=sys.stderr)
        for pol, coef in (("stock", native), ("radixflow", trav)):
            r = rounds[pol]
            model_ms = statistics.fmean(coef(*x) for x in r.x) * 1e3
            print(f"{pol}: modelled mean {model_ms:.2f} ms per round", file=sys.stderr)
        print(f"decode: {decode.s0 * 1e3:.3f} ms + {decode.s2 * 1e3:.4f} ms per running row",
              file=sys.stderr)
    names = "+".join(f"{n}/{m}" for n, m in sets)
    return HostCost(native, trav, source=f"fit:kit-scan-cpu {names} q{questions} "
                    f"x{repeats} median huber stock+excess>=0 probe-term quiet-apart "
                    f"decode:{DECODE_SET[0]}/{DECODE_SET[1]}", quiet=quiet, decode=decode)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.hostfit", description=__doc__.split("\n")[0])
    p.add_argument("--fit", action="store_true", help="measure and print fitted coefficients")
    p.add_argument("--questions", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5,
                   help="replays per scan (each round's CPU time is the median over them)")
    p.add_argument("--data-dir", default=None)
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error(f"--repeats: {a.repeats} (>= 1)")
    h = (fit(questions=a.questions, data_dir=a.data_dir, repeats=a.repeats, verbose=True)
         if a.fit else DEFAULT_HOST)
    print(json.dumps(h.as_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
