"""A real `--dp-size 2` server (simulated executor, two scheduler processes behind SGLang's DP
controller) under a bounded four-branch load: no hang, no leak, siblings pinned to one rank
reach it, and each rank's RadixFlow counters (/server_info) match its own trace records.

The router case (two replicas behind `sglang-router`) is an eval command, eval/multiproc.py."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from eval import multiproc
from radixflow_sglang import launch_server
from radixflow_sglang.testing.server import Server, free_port

QUESTIONS = 4


@pytest.mark.parametrize("cores, ranks, want", [({0, 1}, 2, "0|1"), ({0, 1, 2, 3}, 2, "0,1|2,3"),
                                                ({5}, 2, "5|5")])
def test_cpu_rank_binding_gives_each_rank_its_cores(monkeypatch, cores, ranks, want):
    monkeypatch.setattr(launch_server.os, "sched_getaffinity", lambda _pid: cores)
    assert launch_server.cpu_rank_binding(ranks) == want


def test_sibling_check_names_split_and_unknown_questions():
    recs = [multiproc.Record(f"q{q}-{x}", q) for q in range(3) for x in "AB"]
    where = {"q0-A": 0, "q0-B": 0, "q1-A": 0, "q1-B": 1, "q2-A": 1}
    got = multiproc.group_checks(multiproc.Load(recs), where)
    assert got == {"questions": 3, "split_or_unknown": {1: ["0", "1"], 2: ["1", "None"]}}


def _by_rank(states: list[dict]) -> dict[int, dict]:
    # NOTE: /server_info lists DP ranks in the order they answered, not by rank
    return {s["dp_rank"]: s for s in states}


@pytest.mark.slow
def test_dp2_siblings_stay_on_their_rank_and_counters_add_up(tmp_path):
    port, trace = free_port(), tmp_path / "trace.jsonl"
    cmd = multiproc.server_cmd(port, trace, ["--dp-size", "2", "--enable-metrics"])
    env = multiproc.server_env()
    env.pop("SGLANG_CPU_OMP_THREADS_BIND", None)  # NOTE: the launcher binds the ranks itself
    with Server(cmd, env, tmp_path / "server.log", port,
                cwd=multiproc.ROOT) as srv:
        srv.wait_ready(600)
        before = _by_rank(multiproc.radixflow_states(srv.base))
        load = multiproc.send_load(srv.base, QUESTIONS, inflight=2, doc_words=300,
                                   timeout=300, pin=2)
        srv.idle_leak_check()  # both ranks' strict idle memory checks ran and passed
        after = _by_rank(multiproc.radixflow_states(srv.base))
        with urllib.request.urlopen(srv.base + "/metrics", timeout=60) as r:
            metrics = r.read().decode()
    assert set(before) == set(after) == {0, 1}
    recs = load.records
    assert len(recs) == 4 * QUESTIONS
    assert all(r.status == 200 and r.error is None for r in recs), [vars(r) for r in recs]
    # routed_dp_rank: question q on rank q % 2, read back from the response's meta_info
    assert all(r.dp_rank == r.question % 2 for r in recs), [(r.rid, r.dp_rank) for r in recs]
    events = [json.loads(x) for x in trace.read_text().splitlines()]
    selected = {e["rid"]: e["dp_rank"] for e in events if e["event"] == "selected"}
    assert all(selected[r.rid] == r.dp_rank for r in recs)  # each rank's trace: its requests
    for rank in (0, 1):
        rounds = [e for e in events if e["event"] == "round" and e["dp_rank"] == rank]
        for key in ("scheduled_tokens", "blocked"):  # the rank's counters = its trace
            assert after[rank][key] == sum(e[key] for e in rounds), (rank, key)
        # Prometheus: one series per rank (not every rank's samples under dp_rank="0")
        assert re.search(rf'radixflow_rounds_total{{[^}}]*dp_rank="{rank}"[^}}]*}} '
                         rf'{float(sum(1 for e in rounds if e["rows"]))}', metrics), rank
        mine = [r for r in recs if r.dp_rank == rank]
        # every prompt token of this rank's requests was scheduled on it unless reused there
        # (>=: SGLang's /health may add a 1-token request of its own)
        assert after[rank]["scheduled_tokens"] - before[rank]["scheduled_tokens"] >= sum(
            r.prompt_tokens - r.cached_tokens for r in mine)
