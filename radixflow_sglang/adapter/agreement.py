"""Rank agreement for the admission gate: every attention-TP rank takes rank 0's decision.

Wall clocks differ per rank; the gate's clock-dependent outcome is broadcast from the group's
first rank over SGLang's CPU (gloo) group, as SGLang's PrefillDelayer shares its state
(managers/prefill_delayer.py `_gather_info`). Rank-identical outcomes are not broadcast.
A prefill round's measured forward duration, scheduler host time and the previous round's
wall period (the round-cost fit's inputs) are broadcast the same way, in one collective per
round.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from radixflow_sglang.core.admission import Agreement, Decision, local_agreement
from radixflow_sglang.core.reasons import Reason

# NOTE: the broadcast's codes; the order is the wire format, fixed within a build (every rank
# runs the same one; `none` went with the rule, issue 35's ablation)
REASONS = (Reason.HOLD, Reason.DEADLINE, Reason.BUSY, Reason.ROWS, Reason.TOKENS, Reason.COST)


def group_agreement(group) -> Agreement:
    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return local_agreement
    src = dist.get_global_rank(group, 0)

    def share(decision: Decision) -> Decision:
        t = torch.tensor([int(decision.hold), REASONS.index(decision.reason), decision.count],
                         dtype=torch.int64)
        dist.broadcast(t, src=src, group=group)
        return Decision(bool(t[0]), REASONS[int(t[1])], int(t[2]))

    return share


def scheduler_agreement(sched) -> Agreement:
    return group_agreement(getattr(sched, "attn_tp_cpu_group", None))


def local_share(*values: float) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


def forward_share(group) -> Callable[..., tuple[float, ...]]:
    """Rank 0's measured values (a prefill round's forward duration and host time) for every
    rank of the group, in one broadcast (the round-cost fit must be identical everywhere, and
    each rank's clock measures a slightly different round). Every rank passes as many values."""
    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return local_share
    src = dist.get_global_rank(group, 0)

    def share(*values: float) -> tuple[float, ...]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.broadcast(t, src=src, group=group)
        return tuple(float(v) for v in t)

    return share


def scheduler_forward_share(sched) -> Callable[..., tuple[float, ...]]:
    return forward_share(getattr(sched, "attn_tp_cpu_group", None))
