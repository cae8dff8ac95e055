"""Explain a RadixFlow trace, request by request.

    python -m radixflow_sglang.explain TRACE [--rid RID]
    python -m radixflow_sglang.explain --rulebook

TRACE is a JSONL file written by a server's `--radixflow-trace PATH` or by
`python -m eval.replay --trace DIR` (DIR/POLICY.jsonl). For every request (or only RID) it prints
a timeline in round order: when it arrived, each decision the scan made about it with the rule
that made it (core/reasons.py: `park` events for the VISIT decision point, `defer` for DEFER),
the costs the wait rule compared (`decide`), the producer and depth it waited for (`parked`),
the boundary rules that placed its own state (`cut`: PLACE, PUBLISH and any no_buffer fork
mark), the depth it resumed from and where it publishes (`admitted`), and when it was selected.
A DP server's ranks share one file: each event carries its `dp_rank`, and requests are told
apart by rank. `--rulebook` prints the rules in order (docs/design.md's first table).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

PER_REQUEST = ("park", "rows_kept", "defer", "decide", "parked", "admitted", "cut", "selected")


def read(path: str | Path) -> Iterator[dict[str, Any]]:
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:  # NOTE: a server killed mid-write
                print(f"{path}:{n}: skipped ({e.msg})", file=sys.stderr)


def timelines(events: Iterable[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per-request events in trace order, keyed by rid (prefixed by the DP rank in a DP trace)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("event") in PER_REQUEST and "rid" in e:
            key = e["rid"] if "dp_rank" not in e else f"dp{e['dp_rank']}/{e['rid']}"
            out.setdefault(key, []).append(e)
    return out


def _ms(s: float | None) -> str:
    return "?" if s is None else f"{s * 1e3:.2f} ms"


def describe(e: dict[str, Any]) -> str:
    """One event as one line of a request's timeline."""
    kind, why = e["event"], e.get("reason")
    if kind == "park":
        return f"visit: {e['action']} ({why})"
    if kind == "defer":
        return f"defer: {e['action']} ({why})"
    if kind == "rows_kept":
        return (f"row limit: {e['kept']} parked ahead of it keep their rows beside "
                f"{e['rows']} selected (the scan stops)")
    if kind == "cut":
        at = "SGLang's own depth" if e.get("depth") is None else f"depth {e['depth']}"
        mark = "" if e.get("mark") is None else f"; fork mark {e['mark']}"
        return f"publish: {e['action']} ({e['placed']}, {why}) at {at}{mark}"
    if kind == "decide":
        ready = "unprobed" if e.get("ready") is None else f"ready {e['ready']}"
        cost = ("" if not e.get("probed") else
                f"; wait {_ms(e.get('wait_s'))} vs recompute {_ms(e.get('recompute_s'))}")
        return (f"wait rule: producer {e['producer']} publishes at {e['depth']} ({ready}, "
                f"length {e['length']}){cost} -> {'wait' if e['wait'] else 'recompute'} ({why})")
    if kind == "parked":
        at = "fork" if e.get("fork") else "publish depth"
        return (f"parked: waits for {e['producer']} at depth {e['depth']} ({at}), ready "
                f"{e['ready']} ({why})")
    if kind == "admitted":
        publish = e.get("publish")
        where = "publishes no state" if publish is None else f"publishes at {publish}"
        return (f"admitted: resumes from depth {e['prefix']} (cache hit {e['hit']}), extends "
                f"{e['extend']}, {where}")
    if kind == "selected":
        return (f"selected in round {e.get('first_selected_round')} after "
                f"{e.get('rounds_parked', 0)} parked round(s), {e.get('deferred', 0)} deferral(s)")
    return kind


def render(rid: str, events: list[dict[str, Any]], out: TextIO | None = None) -> None:
    out = out or sys.stdout
    arrived = next((e for e in events if e["event"] == "selected"), None)
    first = events[0].get("round", "?")
    head = (f"arrived in round {arrived.get('registered_round')} (t={arrived['registered']:.3f})"
            if arrived is not None else f"first seen in round {first}")
    print(f"{rid}: {head}", file=out)
    for e in events:
        rnd = e.get("round", e.get("first_selected_round", "?"))
        print(f"  r{rnd}  {describe(e)}", file=out)


def explain(path: str | Path, rid: str | None = None, out: TextIO | None = None) -> int:
    """Print the timelines (to stdout by default); the number of requests printed."""
    out = out or sys.stdout
    lines = timelines(read(path))
    if rid is not None:
        lines = {k: v for k, v in lines.items() if k == rid or k.endswith(f"/{rid}")}
    for key, events in lines.items():
        render(key, events, out)
    return len(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m radixflow_sglang.explain",
                                description=__doc__.split("\n")[0])
    p.add_argument("trace", nargs="?", help="a --radixflow-trace / eval.replay --trace JSONL file")
    p.add_argument("--rid", default=None, help="only this request")
    p.add_argument("--rulebook", action="store_true", help="print the rulebook and exit")
    a = p.parse_args(argv)
    if a.rulebook:
        from radixflow_sglang.core.reasons import rulebook_table

        sys.stdout.write(rulebook_table())
        return 0
    if a.trace is None:
        p.error("a TRACE is needed (or --rulebook)")
    if not Path(a.trace).is_file():
        p.error(f"{a.trace}: no such file")
    try:
        n = explain(a.trace, a.rid)
        sys.stdout.flush()
    except BrokenPipeError:
        # NOTE: the reader stopped (`| head`): no traceback; stdout to devnull so the
        # interpreter's own flush at exit does not raise again (Python's signal docs)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if n == 0:
        print(f"no request events{' for ' + a.rid if a.rid else ''} in {a.trace} (a trace "
              "written before reasons were traced has none)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
