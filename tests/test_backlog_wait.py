"""The wait rule under a backlog (issue 12, capacity): recomputing's extra work delays the
requests that arrive before the backlog drains, not only those queued now.

Traced on the capacity sweep (mix, qwen3.5-4b, seed 3, 12.33 q/s): three RACE siblings with a
320-token gain recomputed beside their producer with 27k tokens queued (3 rounds of backlog),
because the rule counted only the 11 requests behind them. At that rate ~49 requests/s arrive
and every one arriving in the next ~0.5 s queues behind the extra work too.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from radixflow_sglang.core.cost import CostCoeffs, RoundView, WaitCase, wait_wins

QWEN_4B = CostCoeffs(8e-3, 1.7e-5, 1.24e-4)  # eval/costmodel.py's derivation, no delta
CASE = WaitCase(ready=0, depth=320, length=371, lag=1)
TRACED = RoundView(rows=4, behind=11, budget_left=7680, demand_after=27_458, mean_extend=3144.0,
                   rows_left=60, token_budget=8192, row_budget=64, host_s=0.0033)


def test_arrivals_before_a_backlog_drains_make_recomputing_dearer() -> None:
    alone = wait_wins(QWEN_4B, CASE, TRACED)
    loaded = wait_wins(QWEN_4B, CASE, replace(TRACED, arrival_rate=49.0))
    assert not alone.wait and loaded.wait  # the traced recompute now waits
    assert loaded.wait_s == alone.wait_s  # waiting adds no work: arrivals do not see it
    # NOTE: the drain time of the 19,778 overflow tokens: 3 rounds' fixed cost and host time
    overflow = TRACED.demand_after - TRACED.budget_left
    drain = (QWEN_4B.beta * overflow + QWEN_4B.gamma * 7 + 3 * (QWEN_4B.alpha + 0.0033))
    extra = QWEN_4B.beta * (CASE.depth - CASE.ready)
    assert loaded.recompute_s - alone.recompute_s == pytest.approx(extra * 49.0 * drain)


def test_without_a_backlog_the_arrival_rate_changes_nothing() -> None:
    """Nothing queued beyond this round: an arrival finds the server free of the extra work's
    consequences only through this round, already in `behind`; the rule is unchanged."""
    light = replace(TRACED, demand_after=3000)
    for lam in (0.0, 5.0, 500.0):
        v = wait_wins(QWEN_4B, CASE, replace(light, arrival_rate=lam))
        assert v == wait_wins(QWEN_4B, CASE, light)


def _lone(k, rid: str, start: int):
    return k.req(rid, list(range(start, start + 300)))


def test_kit_runtime_measures_queue_arrivals_and_decides_on_rank_zeros_rate(make_kit, tmp_path):
    import json

    from radixflow_sglang.adapter.runtime import RadixFlowConfig

    now = [0.0]
    trace = tmp_path / "trace.jsonl"
    k = make_kit("qwen3.5-4b", "extra_buffer", "traversal", clock=lambda: now[0],
                 radixflow_config=RadixFlowConfig(policy="traversal", trace=str(trace)))
    rt = k.runtime
    shared: list[float] = []
    # NOTE: the rate rides the forward's broadcast (its last value); rank 0's value wins
    rt.roundcost.share_forward = lambda *v: (shared.append(v[-1]), (*v[:-1], 7.5))[1]
    now[0] = 2.0
    k.submit(*[_lone(k, f"a{i}", 1000 * (i + 1)) for i in range(20)])
    k.step()  # the scan counts the 20 requests that entered the queue
    rt.observe_forward(1, 300, 0.01)
    assert shared == [pytest.approx(20 / 0.5)]  # NOTE: ArrivalRate's 0.5 s minimum span
    k.drain()
    now[0] = 4.0
    doc = list(range(50_000, 54_000))
    k.submit(*[k.req(f"b{i}", doc + list(range(90_000 + 40 * i, 90_030 + 40 * i)))
               for i in range(4)])
    k.step()  # b0 produces the document; b1-b3 are Blocked and decided
    rt.observe_forward(1, 4030, 0.08)
    assert shared[-1] == pytest.approx(24 / 2.0)  # 24 arrivals over 2 s of the 5 s window
    k.drain()
    views = [json.loads(x)["view"] for x in trace.read_text().splitlines()
             if json.loads(x)["event"] == "decide"]
    assert views and all(v["arrival_rate"] == 7.5 for v in views)


def test_kit_a_policy_without_the_cost_rule_shares_no_rate(make_kit):
    k = make_kit("qwen3.5-4b", "extra_buffer", "traversal-always")
    shared: list[float] = []
    k.runtime.roundcost.share_forward = lambda *v: (shared.append(v), v)[1]
    k.submit(_lone(k, "a0", 1000))
    k.step()
    k.runtime.observe_forward(1, 300, 0.01)
    assert shared == [(0.01,)] and k.runtime.roundcost.arrival_rate == 0.0


def test_twin_under_a_backlog_the_cost_rule_schedules_what_always_waiting_does() -> None:
    """Synthetic mix on qwen3.5-4b at 24 q/s (a backlog of several rounds): the rule recomputed
    18 siblings beside their producers (1.032x always-wait's tokens, mean latency 1.04x), each
    delaying the arrivals queued behind the backlog. It now waits as always-wait does, except
    the groups whose producer arrived with them (tied, core/cost.py `RoundView.tied`: 10
    recomputed, 1.013x the tokens, mean 0.98x always-wait's: their questions end sooner)."""
    from eval.sweep import Setup, run_point

    setup = Setup(workload="synthetic", questions=40, seed=3)
    rule, always = (run_point(setup, p, 24.0) for p in ("radixflow", "radixflow-always"))
    assert always["recomputed"] == 0
    assert rule["recomputed"] <= 12
    assert rule["scheduled_tokens"] <= 1.02 * always["scheduled_tokens"]
    assert rule["latency_mean_s"] <= always["latency_mean_s"]


def test_the_kits_runtime_reads_a_virtual_clock(make_kit):
    """What the kit's runtime times (admission holds, the arrival rate the wait rule reads)
    must not depend on how long SGLang's scan took on the machine: the kit's default clock is
    virtual (`VirtualClock`: a hold sleeps to its deadline). Four requests registered within
    the rate's 0.5 s floor: 8 per second, exactly."""
    from radixflow_sglang.testing.loop import VirtualClock

    k = make_kit("qwen3.5-4b", "extra_buffer", "radixflow")
    assert isinstance(k.clock, VirtualClock) and k.runtime.clock is k.clock
    assert k.sleep == k.clock.sleep
    k.submit(*[_lone(k, f"r{i}", 1000 * (i + 1)) for i in range(4)])
    k.step()
    k.runtime.observe_forward(1, 4000, 0.05)  # NOTE: a server's forward hook shares the rate
    assert k.runtime.roundcost.arrival_rate == 8.0


def test_kit_a_pinned_arrival_rate_is_what_every_rank_prices(make_kit):
    """--radixflow-arrival-rate: the wait rule reads the pinned rate whatever the clients'
    timing (the same four arrivals read 8 per second measured, above); it still rides rank 0's
    broadcast, so every rank prices rank 0's value."""
    from radixflow_sglang.adapter.runtime import RadixFlowConfig

    k = make_kit("qwen3.5-4b", "extra_buffer", "radixflow",
                 radixflow_config=RadixFlowConfig(arrival_rate=0.0))
    shared: list[tuple] = []
    k.runtime.roundcost.share_forward = lambda *v: (shared.append(v), v)[1]
    k.submit(*[_lone(k, f"r{i}", 1000 * (i + 1)) for i in range(4)])
    k.step()
    k.runtime.observe_forward(1, 4000, 0.05)
    assert shared[-1][-1] == 0.0 and k.runtime.roundcost.arrival_rate == 0.0
    assert k.runtime.roundcost.arrivals.rate(k.clock()) == 8.0  # NOTE: still measured


def test_the_arrival_rate_flag_names_itself_and_its_range():
    from radixflow_sglang.config import ConfigError, config_from_env

    assert config_from_env({"RADIXFLOW_ARRIVAL_RATE": "2.5"}).arrival_rate == 2.5
    with pytest.raises(ConfigError, match="RADIXFLOW_ARRIVAL_RATE.*outside the allowed range"):
        config_from_env({"RADIXFLOW_ARRIVAL_RATE": "-1"})
