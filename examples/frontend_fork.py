"""An SGLang frontend program that forks, against a RadixFlow server.

Each program reads one document, then `s.fork(k)` asks k questions about it, the tree-search /
agent fan-out shape: every branch shares the document. The frontend sends the document first
(max_new_tokens=0: its fork prefix, which RadixFlow treats as a declared boundary), then the k
branches at once.

    python -m radixflow_sglang.launch_server --port 30000 &      # the server (CPU: simulated)
    python examples/frontend_fork.py --url http://127.0.0.1:30000
    python examples/frontend_fork.py --launch --small            # start a server, then run

Prints one JSON line: the programs' answers count, wall time, and the server's counters
(RadixFlow's rounds and parked requests; with the simulated executor the prefill tokens and
the witness's verdict).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

SMALL = {"documents": 2, "branches": 3, "document_words": 200, "output_len": 2}
WORDS = ("river stone lantern orchard harbor meadow signal copper violet thunder ember glacier "
         "canyon willow beacon falcon prairie summit").split()


def documents(n: int, words: int) -> list[str]:
    return [f"Document {d}. " + " ".join(WORDS[(d * 5 + i * 3) % len(WORDS)] for i in range(words))
            for d in range(n)]


def program(branches: int, output_len: int):
    import sglang as sgl

    @sgl.function
    def ask(s, document):
        s += document + "\n"
        forks = s.fork(branches)
        for i, f in enumerate(forks):
            f += f"Question {i}: what is word {i * 7} of the document? Answer:"
            f += sgl.gen("answer", max_tokens=output_len, temperature=0, ignore_eos=True)
        s["answers"] = [f["answer"] for f in forks]

    return ask


def server_counters(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/server_info", timeout=120) as r:
        state = json.loads(r.read())["internal_states"][0]
    out = {}
    if "radixflow" in state:
        out["radixflow"] = {k: state["radixflow"][k] for k in ("policy", "rounds", "blocked")}
    if "simulated" in state:
        out["prefill_tokens"] = state["simulated"]["prefill_tokens"]
        out["witness_mismatched"] = state["witness"]["mismatched"]
    return out


def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    import sglang as sgl

    backend = sgl.RuntimeEndpoint(url)
    t0 = time.perf_counter()
    states = program(args.branches, args.output_len).run_batch(
        [{"document": d} for d in documents(args.documents, args.document_words)],
        backend=backend, num_threads=args.documents)
    wall = time.perf_counter() - t0
    answers = [a for s in states for a in s["answers"]]
    return {"programs": len(states), "answers": len(answers), "wall_s": round(wall, 3),
            **server_counters(url)}


def launched(args: argparse.Namespace, log: Path):
    """Our launcher as a subprocess (radixflow_sglang/testing/server.py waits for it)."""
    from radixflow_sglang.testing.server import Server, free_port

    port = free_port()
    cmd = [sys.executable, "-m", "radixflow_sglang.launch_server", "--host", "127.0.0.1",
           "--port", str(port), "--radixflow-policy", args.policy]
    return Server(cmd, dict(os.environ, PYTHONUNBUFFERED="1"), log, port)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:30000")
    p.add_argument("--launch", action="store_true", help="start a server on a free port first")
    p.add_argument("--policy", default="radixflow", help="with --launch")
    p.add_argument("--log", type=Path,
                   default=Path(tempfile.gettempdir()) / "frontend_fork_server.log",
                   help="with --launch: the server's log (default: in the temp dir)")
    p.add_argument("--documents", type=int, default=8)
    p.add_argument("--branches", type=int, default=4)
    p.add_argument("--document-words", type=int, default=1500)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--small", action="store_true", help=f"a smoke-test size: {SMALL}")
    args = p.parse_args(argv)
    if args.small:
        vars(args).update(SMALL)
    if not args.launch:
        print(json.dumps(run(args.url, args)), flush=True)
        return
    with launched(args, args.log) as server:
        server.wait_ready(600)
        print(json.dumps({"policy": args.policy, **run(server.base, args)}), flush=True)


if __name__ == "__main__":
    main()
