"""Two scheduler ranks on CPU over gloo: SGLang's real PrefillDelayer and our hold's agreement.

Each rank is a process with its own kit (SGLang's real scheduler class over real pools) and the
real `PrefillDelayer` (managers/prefill_delayer.py), whose per-pass all-gather spans the TP
group, as `Scheduler.__init__` builds it under `--enable-prefill-delayer`. Two layouts:
- `dp`: DP attention, two attention-TP groups of one rank, each with its own queue (a DP
  group's queue differs from the other's); the delayer gathers over both.
- `tp`: one attention-TP group of two ranks with one queue and skewed clocks; the hold's
  decision is shared over the group (adapter/agreement.py) and the delayer gathers over it.
Every pass must run the same collectives on every rank; a rank that skips one leaves the
other blocked in it until the group's timeout fails the run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from types import SimpleNamespace

ARRIVAL_STEP_S = 0.001  # virtual time between scheduler passes


@dataclass(frozen=True)
class Scenario:
    layout: str  # "dp" | "tp"
    policy: str = "flex"
    passes: int = 12
    # rank -> {pass: request ids arriving before it}; `tp` ranks share rank 0's arrivals
    arrivals: dict[int, dict[int, tuple[str, ...]]] = field(default_factory=dict)
    skew_s: float = 0.003  # rank 1's clock runs ahead by this much on odd passes
    timeout_s: float = 60.0  # a missing collective fails the run after this long


@dataclass
class RankResult:
    rank: int
    rounds: list[list[str] | None]  # per pass: the prefill batch's rids, None if none
    gathers: int  # PrefillDelayer all-gathers this rank ran
    broadcasts: int  # hold decisions shared over the attention-TP group


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _counting_delayer(layout: str, group, counter: list[int]):
    """SGLang's PrefillDelayer, built under this layout's topology; counts its all-gathers."""
    from sglang.srt.managers.prefill_delayer import PrefillDelayer
    from sglang.srt.runtime_context import get_parallel

    class CountingDelayer(PrefillDelayer):
        def _gather_info(self, **kw):
            counter[0] += 1
            return super()._gather_info(**kw)

    # NOTE: what SGLang's group initialisation records; one gloo group stands for the TP group
    # (and, in `tp`, the attention-TP group). The delayer reads the topology only here.
    dp = 2 if layout == "dp" else 1
    coordinator = SimpleNamespace(cpu_group=group, device_group=group, device="cpu")
    with get_parallel().override(tp_group=coordinator, tp_size=2, attn_dp_size=dp,
                                 attn_tp_size=2 // dp, attn_cp_size=1, moe_tp_size=2,
                                 num_dp_ranks=dp, attn_dp_enabled=dp > 1):
        return CountingDelayer(max_delay_passes=30, token_usage_low_watermark=None)


def _kit(scenario: Scenario, rank: int, group, clock: _Clock):
    from sglang.srt.managers.prefill_delayer import RecentPrefillBatchSizeTracker
    from sglang.srt.managers.scheduler_components.pool_stats_observer import (
        SchedulerPoolStatsObserver,
    )

    from radixflow_sglang.adapter.agreement import scheduler_agreement
    from radixflow_sglang.testing.kit import Kit, KitConfig

    shared: list[int] = [0]
    agreement = None
    if scenario.layout == "tp":
        holder = SimpleNamespace(attn_tp_cpu_group=group)
        share = scheduler_agreement(holder)

        def agreement(decision):
            shared[0] += 1
            return share(decision)

    # NOTE: the delayer asserts overlap scheduling (prefill_delayer.py, PrefillDelayer.__init__).
    k = Kit(KitConfig(model="qwen3-8b", overlap=True), policy=scenario.policy, clock=clock,
            agreement=agreement)
    s = k.sched
    s.attn_tp_cpu_group = group if scenario.layout == "tp" else None
    gathers = [0]
    s.prefill_delayer = _counting_delayer(scenario.layout, group, gathers)
    s.prefill_bs_tracker = RecentPrefillBatchSizeTracker(window_size=16)
    s.max_prefill_bs = 0
    s.pool_stats_observer = SchedulerPoolStatsObserver(
        tree_cache=s.tree_cache, token_to_kv_pool_allocator=s.token_to_kv_pool_allocator,
        req_to_token_pool=s.req_to_token_pool, session_controller=None,
        hisparse_coordinator=None, is_hybrid_swa=False, is_hybrid_ssm=False,
        enable_hisparse=False, full_tokens_per_layer=None, swa_tokens_per_layer=None,
        max_total_num_tokens=k.cfg.kv_tokens,
    )
    return k, gathers, shared


def run_ranks(rank: int, scenarios: tuple[Scenario, ...], port: int, out: dict) -> None:
    """One rank (a `torch.multiprocessing.spawn` target): join the gloo group, run each
    scenario on a fresh kit, put its RankResult in `out[(scenario index, rank)]`."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    longest = max(s.timeout_s for s in scenarios)
    dist.init_process_group("gloo", rank=rank, world_size=2,
                            timeout=timedelta(seconds=max(600.0, longest)))
    for n, scenario in enumerate(scenarios):
        group = dist.new_group([0, 1], backend="gloo",
                               timeout=timedelta(seconds=scenario.timeout_s))
        out[(n, rank)] = _run(rank, scenario, group)
    dist.barrier()
    dist.destroy_process_group()


def _run(rank: int, scenario: Scenario, group) -> RankResult:
    import torch.distributed as dist

    clock = _Clock()
    k, gathers, broadcasts = _kit(scenario, rank, group, clock)
    source = rank if scenario.layout == "dp" else 0
    arrivals = scenario.arrivals.get(source, {})
    dist.barrier()  # NOTE: both ranks built (imports take long on a busy machine)
    rounds: list[list[str] | None] = []
    for i in range(scenario.passes):
        clock.now = i * ARRIVAL_STEP_S + (scenario.skew_s * rank * (i % 2))
        for n, rid in enumerate(arrivals.get(i, ())):
            k.submit(k.req(rid, list(range(1000 * (n + 1), 1000 * (n + 1) + 300)) + [i]))
        rnd = k.step()
        rounds.append(rnd.rids if rnd is not None else None)
    return RankResult(rank, rounds, gathers[0], broadcasts[0])


@contextmanager
def gloo_pair(rank: int, port: int) -> Iterator[list[int]]:
    """A two-rank gloo group on 127.0.0.1 for this spawned rank; yields the number of
    `dist.broadcast` calls made inside (a list of one int), then restores and tears down."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    calls = [0]
    real = dist.broadcast

    def counted(*a, **kw):
        calls[0] += 1
        return real(*a, **kw)

    dist.broadcast = counted
    try:
        yield calls
    finally:
        dist.broadcast = real
        dist.destroy_process_group()
