"""Multi-process serving on CPU: a `--dp-size N` server, or replicas behind SGLang's router.

Every process is real: `python -m radixflow_sglang.launch_server` (simulated executor) and, for
`router`, `python -m sglang_router.launch_router` (PyPI `sglang-router`, the project's `router`
extra) with the cache-aware policy, all on 127.0.0.1. A bounded four-branch load (at most
`--inflight` questions at once, each a shared document plus four sibling suffixes, sent as text
with a `rid`) runs through the front door; then the run checks

* no hang: every request answers within `--request-timeout` seconds;
* no leak: SGLang's strict idle memory check passes on every server (Server.idle_leak_check);
* siblings reach the same replica (router) or DP rank (dp, with `--pin`): who served a request
  is read back from the server side (the replica's RadixFlow trace / `meta_info.dp_rank`);
* counters per rank: each server's `/server_info` `internal_states[i]["radixflow"]`.

    .venv/bin/python -m eval.multiproc dp --out runs/multiproc-dp
    .venv/bin/python -m eval.multiproc router --out runs/multiproc-router

DP ranks on CPU need SGLANG_CPU_OMP_THREADS_BIND (one entry per rank: SGLang's numa check);
the launcher sets it from the cores it may use when unset. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
import urllib.error
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radixflow_sglang.testing.server import Server, free_port, request_json

ROOT = Path(__file__).resolve().parents[1]

WORDS = ("fox dog river stone light cloud paper music garden window storm bridge market "
         "silver forest engine letter winter harbor candle").split()
BRANCHES = "ABCD"


def question_texts(q: int, doc_words: int) -> list[str]:
    rng = random.Random(q)
    doc = f"Document {q}. " + " ".join(rng.choice(WORDS) for _ in range(doc_words))
    return [f"{doc}\nQuestion {q}: is the answer {x}? Option {x}: "
            + " ".join(rng.choice(WORDS) for _ in range(12)) for x in BRANCHES]


@dataclass
class Record:
    rid: str
    question: int
    status: int | None = None
    error: str | None = None
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    dp_rank: int | None = None
    replica: str | None = None
    latency_s: float = 0.0


@dataclass
class Load:
    records: list[Record] = field(default_factory=list)
    wall_s: float = 0.0


def send_load(base: str, questions: int, inflight: int, doc_words: int, timeout: float,
              pin: int | None = None, tag: str = "mp") -> Load:
    """Questions through a pool of `inflight` slots; a question's four branches go together."""
    load, lock = Load(), threading.Lock()

    def one(q: int, k: int, text: str) -> Record:
        rec = Record(rid=f"{tag}-q{q}-{BRANCHES[k]}", question=q)
        body: dict[str, Any] = {"text": text, "rid": rec.rid, "sampling_params":
                                {"max_new_tokens": 2, "temperature": 0, "ignore_eos": True}}
        if pin is not None:
            body["routed_dp_rank"] = q % pin
        t0 = time.monotonic()
        try:
            rec.status, out = request_json(base + "/generate", body, timeout=timeout)
            meta = out["meta_info"]
            rec.cached_tokens, rec.prompt_tokens = meta["cached_tokens"], meta["prompt_tokens"]
            rec.dp_rank = meta.get("dp_rank")
        except urllib.error.HTTPError as e:
            rec.status, rec.error = e.code, e.read().decode(errors="replace")[:300]
        except Exception as e:  # NOTE: a timeout is a hang: recorded, and the check fails
            rec.error = repr(e)
        rec.latency_s = time.monotonic() - t0
        with lock:
            load.records.append(rec)
        return rec

    def question(q: int) -> None:
        with ThreadPoolExecutor(len(BRANCHES)) as ex:
            list(ex.map(lambda kt: one(q, *kt), enumerate(question_texts(q, doc_words))))

    t0 = time.monotonic()
    with ThreadPoolExecutor(inflight) as ex:
        list(ex.map(question, range(questions)))
    load.wall_s = time.monotonic() - t0
    load.records.sort(key=lambda r: r.rid)
    return load


def wait_routable(base: str, timeout: float) -> int:
    """The router answers /health before its workers pass its own health checks, and until
    then /generate fails with 503 no_available_workers: probe until one generate answers 200.
    Returns the probes it took (each also reaches a replica, under rid mp-probe-N)."""
    deadline = time.monotonic() + timeout
    for n in range(1, 1 << 30):
        body = {"text": "probe", "rid": f"mp-probe-{n}", "sampling_params": {"max_new_tokens": 1}}
        try:
            if request_json(base + "/generate", body, timeout=timeout)[0] == 200:
                return n
        except urllib.error.HTTPError as e:
            if e.code != 503 or time.monotonic() > deadline:
                raise
        time.sleep(1.0)  # NOTE: a poll interval while the router's health checks run
    raise AssertionError("unreachable")


def trace_rids(trace: Path) -> set[str]:
    if not trace.exists():
        return set()
    rids = set()
    for line in trace.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue  # NOTE: a torn last line
        if e.get("event") == "selected":
            rids.add(e["rid"])
    return rids


def radixflow_states(base: str) -> list[dict]:
    info = request_json(base + "/server_info", timeout=120)[1]
    return [s.get("radixflow", {}) for s in info["internal_states"]]


def server_cmd(port: int, trace: Path, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "radixflow_sglang.launch_server", "--host", "127.0.0.1",
            "--port", str(port), "--disable-overlap-schedule",
            "--radixflow-trace", str(trace), *extra]


def server_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("RADIXFLOW_POLICY", None)
    return env


def group_checks(load: Load, where: dict[str, str | int | None]) -> dict[str, Any]:
    """Per question: the set of replicas / ranks its four branches reached."""
    by_q: dict[int, set] = {}
    for r in load.records:
        by_q.setdefault(r.question, set()).add(where.get(r.rid))
    split = {q: sorted(map(str, s)) for q, s in by_q.items() if len(s) != 1 or None in s}
    return {"questions": len(by_q), "split_or_unknown": split}


def run_dp(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    port, trace = free_port(), out / "trace.jsonl"
    extra = ["--dp-size", str(args.dp_size), *args.server_arg]
    if args.dp_attention:
        extra.append("--enable-dp-attention")
    result: dict[str, Any] = {"mode": "dp", "dp_size": args.dp_size,
                              "dp_attention": args.dp_attention, "pin": args.pin}
    with Server(server_cmd(port, trace, extra), server_env(), out / "server.log",
                port, cwd=ROOT) as srv:
        t0 = time.monotonic()
        srv.wait_ready(args.start_timeout)
        result["start_s"] = round(time.monotonic() - t0, 1)
        load = send_load(srv.base, args.questions, args.inflight, args.doc_words,
                         args.request_timeout, pin=args.dp_size if args.pin else None)
        srv.idle_leak_check()
        result["per_rank"] = radixflow_states(srv.base)
        result["alive_after"] = srv.proc.poll() is None
    where = {r.rid: r.dp_rank for r in load.records}
    return result | summarize(load, where)


def run_router(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    servers, names = [], []
    result: dict[str, Any] = {"mode": "router", "replicas": args.replicas,
                              "policy": args.router_policy}
    try:
        t0 = time.monotonic()
        for i in range(args.replicas):
            port = free_port()
            srv = Server(server_cmd(port, out / f"trace-{i}.jsonl", args.server_arg),
                         server_env(), out / f"replica-{i}.log", port, cwd=ROOT)
            servers.append(srv)  # NOTE: before it starts: a SIGTERM in between stops it too
            srv.__enter__()
            names.append(srv.base)
        for srv in servers:  # NOTE: started together, waited in turn
            srv.wait_ready(args.start_timeout)
        rport = free_port()
        router = Server([sys.executable, "-m", "sglang_router.launch_router", "--host",
                         "127.0.0.1", "--port", str(rport), "--policy", args.router_policy,
                         "--worker-urls", *names], dict(os.environ), out / "router.log",
                        rport, cwd=ROOT)
        with router:
            router.wait_healthy(args.start_timeout)
            result["router_probes"] = wait_routable(router.base, args.start_timeout)
            result["start_s"] = round(time.monotonic() - t0, 1)
            load = send_load(router.base, args.questions, args.inflight, args.doc_words,
                             args.request_timeout)
        for srv in servers:
            srv.idle_leak_check()
        result["per_replica"] = {s.base: radixflow_states(s.base) for s in servers}
        result["alive_after"] = all(s.proc.poll() is None for s in servers)
    finally:
        for srv in servers:
            srv.stop()
    where: dict[str, str | int | None] = {}
    for i in range(len(servers)):
        for rid in trace_rids(out / f"trace-{i}.jsonl"):
            where[rid] = f"replica-{i}"
    return result | summarize(load, where)


def summarize(load: Load, where: dict[str, Any]) -> dict[str, Any]:
    for r in load.records:
        r.replica = None if where.get(r.rid) is None else str(where[r.rid])
    failed = [r.rid for r in load.records if r.error or r.status != 200]
    return {"requests": len(load.records), "failed": failed, "load_wall_s": round(load.wall_s, 1),
            "max_latency_s": round(max((r.latency_s for r in load.records), default=0.0), 2),
            "siblings": group_checks(load, where),
            "records": [vars(r) for r in load.records]}


def verdict(res: dict[str, Any], require_same: bool) -> list[str]:
    bad = []
    if res["failed"]:
        bad.append(f"{len(res['failed'])} requests failed or hung: {res['failed'][:8]}")
    if not res.get("alive_after"):
        bad.append("a server died")
    if require_same and res["siblings"]["split_or_unknown"]:
        bad.append(f"siblings split across replicas/ranks: {res['siblings']['split_or_unknown']}")
    return bad


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("mode", choices=("dp", "router"))
    p.add_argument("--out", type=Path, required=True, help="output folder (logs, summary.json)")
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--inflight", type=int, default=2, help="questions in flight at once")
    p.add_argument("--doc-words", type=int, default=600, help="shared document length (words)")
    p.add_argument("--dp-size", type=int, default=2)
    p.add_argument("--dp-attention", action="store_true", help="add --enable-dp-attention")
    p.add_argument("--pin", action="store_true",
                   help="dp: route question q to rank q %% dp-size (routed_dp_rank)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--router-policy", default="cache_aware")
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra server argument (repeatable), e.g. --server-arg=--page-size=16")
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--request-timeout", type=float, default=300.0)
    return p


def main(argv: list[str] | None = None) -> int:
    from eval.run_arms import sigterm_exits

    sigterm_exits()  # NOTE: a killed run (`timeout`) stops its servers and router, no orphans
    args = build_parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    res = run_dp(args, args.out) if args.mode == "dp" else run_router(args, args.out)
    require_same = args.mode == "router" or args.pin
    res["problems"] = verdict(res, require_same)
    (args.out / "summary.json").write_text(json.dumps(res, indent=1))
    brief = {k: v for k, v in res.items() if k != "records"}
    print(json.dumps(brief, indent=1))
    return 1 if res["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
