"""Prefill forward durations for the round-cost fit, measured around the worker call.

On a GPU: CUDA timing events recorded on the scheduler's forward stream right before and after
`Scheduler.run_batch` (managers/scheduler.py) enqueues the batch; read when the result is
processed (`process_batch_result`, after SGLang's own copy_done wait), so the figure is the
forward from launch to result ready, honest under overlap scheduling (the start event fires
only when the previous batch's work on that stream is done). The simulated executor
(adapter/simulated.py) reports its simulated time on the result, and when it is ready; on any
other CPU worker the wall time of the (synchronous) call is used.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

SIM_ATTR = "radixflow_forward_s"  # set by SimulatedWorker on its results
READY_ATTR = "radixflow_ready_at"  # and the perf_counter time its forward is done
SPAN_ATTR = "radixflow_forward_span_s"  # and its launch to that time (a queued wait included)
_EVENTS = "_radixflow_events"
_WALL = "_radixflow_wall_s"


def start(sched, clock: Callable[[], float] = time.perf_counter):
    if torch.cuda.is_available():
        stream = getattr(sched, "forward_stream", None) or torch.cuda.current_stream()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        return ("cuda", stream, ev, clock)
    return ("wall", None, clock(), clock)


def stop(token, result) -> None:
    kind, stream, t0, clock = token
    if result is None:
        return
    if kind == "cuda":
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        setattr(result, _EVENTS, (t0, ev))
    else:
        setattr(result, _WALL, clock() - t0)


def seconds(result) -> float:
    """The forward's duration; NaN when nothing was measured (the fit ignores it)."""
    sim = getattr(result, SIM_ATTR, None)
    if sim is not None:
        return float(sim)
    events = getattr(result, _EVENTS, None)
    if events is not None:
        events[1].synchronize()
        return events[0].elapsed_time(events[1]) / 1e3
    return float(getattr(result, _WALL, float("nan")))


def loop_seconds(result) -> float:
    """The forward's share of the loop's wall period (core/cost.py LaunchPeriods): a simulated
    forward's launch to ready (a test gate's hold and a wait behind the forward before it are
    the forward's, not the host's), on another CPU worker the synchronous call's wall time, on
    a GPU the CUDA events' time."""
    span = getattr(result, SPAN_ATTR, None)
    if span is not None:
        return float(span)
    wall = getattr(result, _WALL, None)
    return float(wall) if wall is not None else seconds(result)


def ready_at(result) -> float | None:
    """When a simulated forward's result was ready (perf_counter); None for any other."""
    ready = getattr(result, READY_ATTR, None)
    return None if ready is None else float(ready)


def simulated(result) -> bool:
    """The simulated executor ran this forward (its time is the cost model's, not a clock's)."""
    return getattr(result, SIM_ATTR, None) is not None


def batch_shape(batch) -> tuple[int, int, float]:
    """(rows, extended tokens, full-attention query-key pairs) of a prefill batch."""
    ext = list(getattr(batch, "extend_lens", None) or [])
    pre = list(getattr(batch, "prefix_lens", None) or [])
    tokens = int(getattr(batch, "extend_num_tokens", None) or sum(ext))
    pairs = float(sum(e * (p + e / 2) for e, p in zip(ext, pre, strict=False)))
    return len(batch.reqs), tokens, pairs
