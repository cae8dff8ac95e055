"""Are two traces' decisions identical? The proof a refactor commit shows.

`python -m eval.decisions BEFORE AFTER` compares two `--radixflow-trace` / `eval.replay --trace`
files (or two directories of them, file by file): every decision event (ORDER's `order`,
VISIT's `park`, DEFER's `defer`, `parked`, `decide`, `admitted`, PLACE/PUBLISH's `cut`,
`selected`, and each round's counts) must match in order, field by field, clock readings and
measured times left out (they differ run to run live; in the twin with `--host-cost none` they
match too). Exit 0 and one line per file when identical; else exit 1 naming the file, the
event's position and the first differing field.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

DECISIONS = frozenset({"order", "park", "defer", "parked", "decide", "admitted", "cut",
                       "selected", "round"})
# NOTE: clock readings and what is priced from measured time: not decisions
CLOCK = frozenset({"t_start", "t_end", "registered", "stamp", "first_selected", "wait_s",
                   "recompute_s", "view", "host_s", "arrival_rate", "older_by", "pass_s"})
_MISSING = object()  # NOTE: a field one event has and the other lacks differs, even if None


def decisions(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, the event less its clock fields) for each decision event in `path`."""
    with path.open() as f:
        for n, line in enumerate(f, 1):
            try:
                e = json.loads(line)
            except json.JSONDecodeError as err:
                raise SystemExit(f"{path}:{n}: not a JSON trace event ({err})") from None
            if e.get("event") in DECISIONS:
                yield n, {k: v for k, v in e.items() if k not in CLOCK}


def first_difference(a: Path, b: Path) -> str | None:
    """None when `a` and `b` decide alike; else where and how they first differ."""
    ea, eb = list(decisions(a)), list(decisions(b))
    for i, ((na, x), (nb, y)) in enumerate(zip(ea, eb, strict=False)):
        if x != y:
            keys = sorted(set(x) | set(y), key=str)
            k = next(k for k in keys if x.get(k, _MISSING) != y.get(k, _MISSING))
            return (f"decision {i + 1} ({a}:{na} vs {b}:{nb}, {x.get('event')} of "
                    f"{x.get('rid', '-')} in round {x.get('round', '-')}): {k} "
                    f"{x.get(k, 'absent')!r} vs {y.get(k, 'absent')!r}")
    if len(ea) != len(eb):
        return f"{a} has {len(ea)} decisions, {b} {len(eb)}"
    return None


def pairs(a: Path, b: Path) -> list[tuple[Path, Path]]:
    if a.is_dir() != b.is_dir():
        raise SystemExit(f"compare a file with a file, a directory with a directory: {a}, {b}")
    if not a.is_dir():
        return [(a, b)]
    names = sorted(p.name for p in a.glob("*.jsonl"))
    if names != sorted(p.name for p in b.glob("*.jsonl")) or not names:
        raise SystemExit(f"{a} and {b} hold different trace files (or none): {names}")
    return [(a / n, b / n) for n in names]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.decisions", description=__doc__.split(
        "\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    bad = 0
    for a, b in pairs(args.before, args.after):
        diff = first_difference(a, b)
        n = sum(1 for _ in decisions(a))
        print(f"{b.name}: " + (f"identical ({n} decisions)" if diff is None else diff))
        bad += diff is not None
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
