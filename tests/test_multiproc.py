"""A real `--dp-size 2` server (simulated executor, two scheduler processes behind SGLang's DP
controller) under a bounded four-branch load: no hang, no leak, siblings pinned to one rank
reach it, and each rank's RadixFlow counters account for exactly the requests it served.

The router case (two replicas behind `sglang-router`) is an eval command, eval/multiproc.py."""

from __future__ import annotations

import pytest

from eval import multiproc
from radixflow_sglang.testing.server import Server, free_port

pytestmark = pytest.mark.slow

QUESTIONS = 4


def _delta(after: dict, before: dict, key: str) -> int:
    return after[key] - before[key]


def test_dp2_siblings_stay_on_their_rank_and_counters_add_up(tmp_path):
    port = free_port()
    cmd = multiproc.server_cmd(port, tmp_path / "trace.jsonl", ["--dp-size", "2"])
    with Server(cmd, multiproc.server_env(2), tmp_path / "server.log", port,
                cwd=multiproc.ROOT) as srv:
        srv.wait_ready(600)
        before = multiproc.radixflow_states(srv.base)
        assert len(before) == 2, before  # one internal state per DP rank
        load = multiproc.send_load(srv.base, QUESTIONS, inflight=2, doc_words=300,
                                   timeout=300, pin=2)
        srv.idle_leak_check()  # both ranks' strict idle memory checks ran and passed
        after = multiproc.radixflow_states(srv.base)
    recs = load.records
    assert len(recs) == 4 * QUESTIONS
    assert all(r.status == 200 and r.error is None for r in recs), [vars(r) for r in recs]
    # routed_dp_rank: question q on rank q % 2, read back from the response's meta_info
    assert all(r.dp_rank == r.question % 2 for r in recs), [(r.rid, r.dp_rank) for r in recs]
    for rank in (0, 1):
        mine = [r for r in recs if r.dp_rank == rank]
        assert mine, rank
        hit = sum(r.cached_tokens for r in mine)
        # every prompt token of this rank's requests was scheduled on it unless reused there
        assert _delta(after[rank], before[rank], "scheduled_tokens") == sum(
            r.prompt_tokens for r in mine) - hit
        # NOTE: >=, not ==: the counter also counts a continued chunk's own earlier chunks
        # (a no_buffer producer cut at a fork continues with prefix_len = the fork)
        assert _delta(after[rank], before[rank], "hit_tokens") >= hit
        assert _delta(after[rank], before[rank], "rounds") >= 1
