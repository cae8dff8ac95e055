"""Two gloo ranks on CPU (issue 13 item 6): whatever each rank's hold decides, every rank runs
the same collectives in the same order (SGLang's real PrefillDelayer all-gather and the hold's
own agreement broadcast); a mismatch blocks a rank until the group's timeout fails the run."""

from __future__ import annotations

import pytest
import torch.multiprocessing as mp

from radixflow_sglang.testing.ranks import Scenario, gloo_pair, run_ranks
from radixflow_sglang.testing.server import free_port

# DP attention: rank 0's queue holds a lone arrival while rank 1's is empty (then gets one).
DP = {0: {0: ("a",)}, 1: {6: ("b",)}}
# One attention-TP group of two ranks (skewed clocks) sharing one queue.
TP = {0: {0: ("q0",), 2: ("q1",), 4: ("q2",), 7: ("q3",)}}
SCENARIOS = (
    Scenario("dp", policy="flex-always", passes=10, arrivals=DP),  # the hold always holds
    Scenario("dp", policy="timer5", passes=10, arrivals=DP),
    Scenario("tp", policy="radixflow", passes=24, arrivals=TP),
    Scenario("tp", policy="timer10", passes=24, arrivals=TP),
)


@pytest.fixture(scope="module")
def results():
    """Both ranks run every scenario in one spawn (each rank imports SGLang once)."""
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(run_ranks, args=(SCENARIOS, free_port(), out), nprocs=2, join=True)
        return {n: (out[(n, 0)], out[(n, 1)]) for n in range(len(SCENARIOS))}


def _selected(rounds) -> list[str]:
    return [rid for r in rounds if r for rid in r]


@pytest.mark.parametrize("n", [0, 1], ids=["flex-always", "timer5"])
def test_dp_ranks_gather_every_pass_while_one_holds(results, n):
    sc = SCENARIOS[n]
    r0, r1 = results[n]
    assert r0.gathers == r1.gathers == sc.passes  # one all-gather per pass on every rank
    assert r0.rounds[0] is None and _selected(r0.rounds) == ["a"]  # rank 0 held, then ran a
    assert _selected(r1.rounds) == ["b"]


@pytest.mark.parametrize("n", [2, 3], ids=["radixflow", "timer10"])
def test_tp_ranks_share_the_hold_and_gather_every_pass(results, n):
    sc = SCENARIOS[n]
    r0, r1 = results[n]
    assert r0.rounds == r1.rounds and sorted(_selected(r0.rounds)) == ["q0", "q1", "q2", "q3"]
    assert r0.gathers == r1.gathers == sc.passes
    assert r0.broadcasts == r1.broadcasts > 0  # both ranks called the hold's broadcast alike


def _share_ranks(rank: int, port: int, out) -> None:
    import torch.distributed as dist

    from radixflow_sglang.adapter.agreement import forward_share

    with gloo_pair(rank, port) as calls:
        share = forward_share(dist.group.WORLD)
        # NOTE: each rank's clock measured a slightly different round
        out[rank] = (share(0.1 + rank, 0.004 + rank), share(0.2 + rank), calls[0])


def test_tp_ranks_agree_on_a_rounds_forward_and_host_time_in_one_broadcast():
    """A prefill round's forward duration and host time: rank 0's pair on every rank, one
    collective per round (issue 11: they were two)."""
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_share_ranks, args=(free_port(), out), nprocs=2, join=True)
        r0, r1 = out[0], out[1]
    assert r0[0] == r1[0] == (0.1, 0.004) and r0[1] == r1[1] == (0.2,)
    assert r0[2] == r1[2] == 2  # one broadcast per call, whatever the number of values
