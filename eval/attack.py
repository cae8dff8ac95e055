"""Attack a running server as careless and hostile clients do, then check that nothing is left.

    python -m eval.attack [--base http://127.0.0.1:30000] [--waves 3] [--requests 64]
        [--seed 7] [--json OUT]

Run it against `python -m radixflow_sglang.launch_server` with the SGLang flags you serve with
(docs/notes/2026-12-flags-attack.md: what it found). It sends:

* four concurrent requests with one rid, and bad input (empty ids, a prompt past the context,
  a negative max_new_tokens, a batch with an empty item);
* `--waves` waves of `--requests` concurrent requests on four shared 1,500-token prefixes,
  max_new_tokens 50 / 300 / 600: one in five asks n = 3, one in eleven streams, one in three
  carries a priority, one in seven disconnects after 0.5 or 2 s; every ninth is aborted by
  /abort_request, each wave is paused as an RL framework's weight sync does
  (/pause_generation in retract mode with a cache flush, in_place, abort; then
  /continue_generation), the last wave gets abort_all, and /flush_cache is sent mid-wave;
* five lone requests once the server is idle.

Checks (each failure is named): no answer is a server error (5xx other than a queue limit's
503); once idle after each wave, every rank's `radixflow.wait_set` and every count under
`radixflow.records` read 0; with a cost-aware wait rule the lone requests scan quiet (rank
`quiet_scans` sum moves by at least 5); the witness (simulated executor) reports 0 mismatched;
/health answers at the end. Exit status 0 when every check passed, 1 otherwise, 2 for bad
arguments. Idle is polled (SGLang's `/v1/loads`: no rank runs or queues a request), bounded by
`--idle-timeout`.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from eval import cli
from radixflow_sglang.testing.server import http_json

LONE = 5  # lone requests on the idle server: each must scan quiet (a cost-aware rule)
DOCS = 4  # shared prefixes a wave's requests use
DOC_LEN = 1_500
PAUSES = ("retract", "in_place", "abort")  # /pause_generation modes, one a wave in turn


def post(base: str, path: str, body: Any, timeout: float = 120.0) -> int | None:
    """The HTTP status, or None when the client gave up (a disconnect)."""
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (TimeoutError, urllib.error.URLError, ConnectionError):
        return None


def ranks(base: str) -> list[dict]:
    """Every rank's internal state (/server_info `internal_states`)."""
    return http_json(base + "/server_info", timeout=60)["internal_states"]


def tokens(seed: int, n: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(100, 200_000) for _ in range(n)]


def generate(base: str, ids: list[int], out: int, rid: str | None = None,
             timeout: float = 120.0, **extra: Any) -> int | None:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": out, "ignore_eos": True}}
    body.update({"rid": rid} if rid else {})
    body.update(extra)
    return post(base, "/generate", body, timeout)


def wave_request(rng: random.Random, k: int, i: int, docs: Sequence[list[int]]) -> dict:
    """Request i of wave k: its ids, output length, client timeout and extra fields."""
    extra: dict[str, Any] = {}
    if i % 5 == 0:
        extra["sampling_params"] = {"max_new_tokens": 4, "n": 3, "temperature": 0.7}
    if i % 11 == 0:
        extra["stream"] = True
    if i % 3 == 0:
        extra["priority"] = rng.choice([0, 1, 5, 10])
    return {"ids": docs[i % DOCS] + tokens(10_000 + 1_000 * k + i, 40),
            "out": rng.choice([50, 300, 600]),
            "timeout": rng.choice([0.5, 2.0]) if i % 7 == 0 else 300.0, "extra": extra}


def pause(base: str, mode: str) -> None:
    """An RL framework's weight sync mid-wave: /pause_generation in `mode` (retract: running
    requests go back to the queue, and the cache is flushed as after new weights; in_place;
    abort), then /continue_generation."""
    post(base, "/pause_generation", {"mode": mode})
    if mode == "retract":
        post(base, "/flush_cache", {})
    post(base, "/continue_generation", {})


def run_wave(base: str, rng: random.Random, k: int, n: int, last: bool) -> Counter:
    """One wave, its aborts, a pause (PAUSES, in turn) and a mid-wave flush; the answers'
    status counts."""
    docs = [tokens(100 * k + d, DOC_LEN) for d in range(DOCS)]
    codes: Counter = Counter()
    lock = threading.Lock()

    def send(i: int, spec: dict) -> None:
        c = generate(base, spec["ids"], spec["out"], f"atk{k}-{i}", spec["timeout"],
                     **spec["extra"])
        with lock:
            codes[c] += 1

    threads = [threading.Thread(target=send, args=(i, wave_request(rng, k, i, docs)))
               for i in range(n)]
    for t in threads:
        t.start()
    for i in range(0, n, 9):
        post(base, "/abort_request", {"rid": f"atk{k}-{i}"})
    pause(base, PAUSES[k % len(PAUSES)])
    if last:
        post(base, "/abort_request", {"rid": "", "abort_all": True})
    post(base, "/flush_cache", {})
    for t in threads:
        t.join()
    return codes


def busy(base: str) -> bool:
    """Some rank runs or queues a request (SGLang's /v1/loads; a parked request is queued)."""
    loads = http_json(base + "/v1/loads", timeout=60)["loads"]
    return any(x["num_running_reqs"] or x["num_waiting_reqs"] for x in loads)


def idle(base: str, timeout: float) -> list[dict]:
    """Every rank's state once none runs or queues a request (polled, at most `timeout`)."""
    deadline = time.monotonic() + timeout
    while busy(base) and time.monotonic() < deadline:
        time.sleep(0.2)
    return ranks(base)


def judge(states: Sequence[dict], when: str) -> list[str]:
    """The leaks an idle server's rank states show (module docstring)."""
    bad = []
    for i, s in enumerate(states):
        rf = s.get("radixflow")
        if rf is None:
            continue  # NOTE: stock: SGLang's own class keeps no RadixFlow record
        if rf.get("wait_set", 0):
            bad.append(f"{when}: rank {i} wait_set {rf['wait_set']} with nothing running")
        left = {k: v for k, v in rf.get("records", {}).items() if v}
        if left:
            bad.append(f"{when}: rank {i} records left {left}")
        w = s.get("witness")
        if w and w.get("mismatched"):
            bad.append(f"{when}: rank {i} witness mismatched {w['mismatched']}: "
                       f"{w.get('first_mismatches')}")
    return bad


def server_errors(codes: Counter, when: str) -> list[str]:
    """Answers that are server errors: any 5xx but a queue limit's 503."""
    bad = {c: n for c, n in codes.items() if c is not None and c >= 500 and c != 503}
    return [f"{when}: server errors {bad}"] if bad else []


def quiet_sum(states: Sequence[dict]) -> int | None:
    """Quiet scans summed over ranks, or None where no rank has a cost-aware wait rule."""
    rfs = [s["radixflow"] for s in states if "radixflow" in s]
    if not rfs or all(rf.get("wait_rule") != "cost-aware" for rf in rfs):
        return None
    return sum(rf.get("quiet_scans", 0) for rf in rfs)


def opening(base: str, log: Callable[[str], None]) -> list[str]:
    """Duplicate rids and bad input: each must be answered (a 4xx is fine), none a 5xx."""
    codes: Counter = Counter()
    doc = tokens(1, DOC_LEN)
    dup = [threading.Thread(target=lambda j=j: codes.update(
        [generate(base, doc + [j + 5], 20, "atk-dup")])) for j in range(4)]
    for t in dup:
        t.start()
    for t in dup:
        t.join()
    for body in ({"input_ids": [], "sampling_params": {}},
                 {"input_ids": tokens(3, 300_000), "sampling_params": {"max_new_tokens": 1}},
                 {"text": "x", "sampling_params": {"max_new_tokens": -3}},
                 {"input_ids": [[5, 6, 7], []], "sampling_params": {"max_new_tokens": 2}}):
        codes[post(base, "/generate", body)] += 1
    log(f"opening: {dict(codes)}")
    return server_errors(codes, "opening") + (
        ["opening: a duplicate rid or bad input went unanswered"] if None in codes else [])


def attack(base: str, waves: int, n: int, seed: int, idle_timeout: float,
           log: Callable[[str], None] = print) -> list[str]:
    """Every failed check, in order (empty: the server passed); a server that stops
    answering fails the check it was at."""
    step, bad = ["opening"], []
    try:
        _attack(base, waves, n, seed, idle_timeout, log, step, bad)
    except (urllib.error.URLError, OSError) as e:
        bad.append(f"{step[0]}: the server stopped answering ({e})")
    return bad


def _attack(base: str, waves: int, n: int, seed: int, idle_timeout: float,
            log: Callable[[str], None], step: list[str], bad: list[str]) -> None:
    rng = random.Random(seed)
    bad += opening(base, log)
    for k in range(waves):
        step[0] = f"wave {k}"
        codes = run_wave(base, rng, k, n, last=k == waves - 1)
        states = idle(base, idle_timeout)
        log(f"wave {k}: answers {dict(codes)}")
        bad += server_errors(codes, f"wave {k}") + judge(states, f"after wave {k}")
    step[0] = "idle"
    q0 = quiet_sum(ranks(base))
    for j in range(LONE):
        generate(base, tokens(500 + j, 200), 1)
    states = idle(base, idle_timeout)
    q1 = quiet_sum(states)
    if q0 is not None and q1 - q0 < LONE:
        bad.append(f"idle: {LONE} lone requests moved quiet_scans by {q1 - q0} (the quiet "
                   "path is lost)")
    bad += judge(states, "at the end")
    with urllib.request.urlopen(base + "/health", timeout=60) as r:
        if r.status != 200:
            bad.append(f"at the end: /health answered {r.status}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m eval.attack", description=__doc__.split("\n")[0])
    p.add_argument("--base", default="http://127.0.0.1:30000", help="the server's URL")
    p.add_argument("--waves", type=cli.positive(int), default=3)
    p.add_argument("--requests", type=cli.positive(int), default=64, help="per wave")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--idle-timeout", type=cli.positive(float), default=300.0,
                   help="seconds to wait for the server to go idle after a wave")
    p.add_argument("--json", default=None, help="write {'failures': [...]} here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        ranks(args.base)
    except (urllib.error.URLError, OSError) as e:
        build_parser().error(f"--base {args.base}: no server answers /server_info ({e})")
    bad = attack(args.base, args.waves, args.requests, args.seed, args.idle_timeout)
    for b in bad:
        print(f"FAIL {b}")
    print("attack: passed" if not bad else f"attack: {len(bad)} check(s) failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"failures": bad}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
