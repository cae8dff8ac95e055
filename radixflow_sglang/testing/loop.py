"""One virtual-time loop: the scheduler twin (eval/twin.py) and the soak (eval/soak.py) drive a
`Kit` through it. One clock, one completion log, one idle guard.

Timeline (SGLang's `event_loop_normal` / `event_loop_overlap`, scheduler.py)
----------------------------------------------------------------------------
* `now` is the time of the scheduler's next scan. Before each scan every arrival due by `now`
  is submitted; when nothing is waiting, chunked or in flight, `now` jumps to the next arrival.
* One step = `Kit.step()` (scan, launch, process a result). A launched round takes `host`
  seconds of scheduler CPU time (scan + batch preparation; 0 when `host` is None) and then
  `cost` seconds on the GPU: start = max(now + host, gpu_free), end = start + cost. Without
  overlap the step processes the round just launched, so `now` moves to its end and the host
  time adds to the round; with overlap it processes the previous round, so `now` moves to that
  one's end and the host time hides behind the forward still running (as the overlap loop
  does), unless it is longer; either way the next scan comes after this one's host time.
* A request completes at the end of the round whose result completed it.
* The loop's pass (`pass_s`, 0 by default): a step that launched a round or processed a
  result scans again `pass_s` after its launch or that result, whichever came later: the live
  loop's work after a launch (the launch call itself, the result's processing and streaming,
  taking in requests) before its next scan (eval/calibrate.py `loop_pass` reads it off a
  server's trace). Under overlap a request that registers in it is seen by the next scan while
  the round just launched runs, as live.
* Closed-loop arrivals: `arrive(item)` (e.g. from `on_complete`) adds an arrival during the
  run at `at(item)`, in time order after those due at the same time; one due already (a
  completion inside the step just taken) is submitted before the next scan.
* The runtime's clock reads `now`; its sleep (an admission hold) advances `now` to the hold's
  deadline or the next arrival, whichever is first (a real scheduler polls its socket).
* Idle guard: a step that launches nothing, processes nothing and sleeps no time costs
  IDLE_TICK_S (or less, up to the next arrival); MAX_IDLE_SCANS such steps in a row raise.

A launched round is a prefill batch or a decode step of the running batch (the kit's `Round` /
`DecodeRound`, `mode` "prefill" / "decode"); both occupy the GPU for `cost(round)` seconds.

Hooks: `on_launch(Launch)` after each launched round, `on_complete(rid, t)` per completion,
`on_forward(rows, tokens, seconds)` per prefill forward (a runtime's cost estimator can observe
the simulated GPU time there; as in a server, decode forwards do not feed it), `before_step()`
(aborts, retractions).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

IDLE_TICK_S = 5e-4  # virtual time a scan that launches, processes and sleeps nothing takes
MAX_IDLE_SCANS = 200_000  # 100 s of virtual time without progress: raise

T = TypeVar("T")


class VirtualClock:
    """The runtime's clock and sleep. A hold sleeps until its deadline or the next arrival."""

    def __init__(self) -> None:
        self.now = 0.0
        self.next_arrival = math.inf

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now = min(self.now + max(0.0, seconds), max(self.now, self.next_arrival))


class CompletionLog:
    """Completions per request, in order; fed by `Kit.on_complete` (keeps no Req)."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self.order: list[str] = []
        self.outputs: dict[str, tuple[int, ...]] = {}  # rid -> the ids SGLang emits for it

    def install(self, kit: Any) -> CompletionLog:
        kit.on_complete = self.record
        kit.keep_finished = False
        return self

    def record(self, req: Any) -> None:
        self.count[req.rid] += 1
        self.order.append(req.rid)
        # NOTE: what the client gets (schedule_batch.py `Req.output_ids_through_stop`): a
        # max_new_tokens=0 request emits nothing, though its row holds a token that depends on
        # the batch (tp_worker.py: zeros for a prefill-only batch, else a sampled id)
        self.outputs[req.rid] = tuple(req.output_ids_through_stop)


@dataclass(frozen=True)
class Launch:
    """A launched round in virtual time."""

    round: Any  # the kit's Round
    scan_s: float  # when the scan that formed it ran
    host_s: float  # scheduler CPU time charged to it (scan + batch preparation)
    start_s: float  # on the GPU
    end_s: float


HostCost = Callable[[Any, Any], float]  # (Round, ScanTiming) -> seconds


@dataclass
class VirtualLoop:
    """Drives `kit` (or a Harness around it: `stepper`) in virtual time; see the module doc."""

    kit: Any
    cost: Callable[[Any], float]  # Round -> GPU seconds
    host: HostCost | None = None  # None: the scan is free (the old twin)
    stepper: Any = None  # has .step() -> Round | None and .busy (default: the kit)
    clock: VirtualClock = field(default_factory=VirtualClock)
    log: CompletionLog | None = None  # default: a new one installed on the kit
    on_launch: Callable[[Launch], None] | None = None
    on_complete: Callable[[str, float], None] | None = None
    on_forward: Callable[[int, int, float], None] | None = None
    before_step: Callable[[], None] | None = None
    idle_tick_s: float = IDLE_TICK_S
    max_idle_scans: int = MAX_IDLE_SCANS
    label: str = ""
    pass_s: float = 0.0  # the loop's pass after a launch or a processed result (module doc)

    def __post_init__(self) -> None:
        self.stepper = self.stepper or self.kit
        self.log = self.log or CompletionLog().install(self.kit)
        rt = self.kit.runtime
        if rt is not None and rt.clock is not self.clock and rt.clock() != self.clock():
            raise RuntimeError("the kit's runtime does not read the loop's virtual clock")
        self.now = 0.0
        self.gpu_free = 0.0
        self.steps = 0
        self.host_s = 0.0  # total scheduler CPU time charged
        self.completed: list[tuple[str, float]] = []  # (rid, completion time), in order
        self._inflight: deque[Launch] = deque()
        self._seen = 0
        self._pending: deque = deque()
        self._at: Callable[[Any], float] = lambda _a: 0.0

    def run(self, arrivals: Iterable[T], at: Callable[[T], float],
            submit: Callable[[T], None]) -> float:
        """Submit `arrivals` (in time order) at `at(a)` and step until everything has drained;
        return `now`, which is then also the end of the last forward."""
        self._pending = deque(arrivals)
        self._at = at
        idle = 0
        while self._advance(submit):
            progressed, slept = self._step_once()
            idle = 0 if progressed else self._idle(idle + 1, slept)
        if self._inflight:
            raise RuntimeError(f"{self.label}: {len(self._inflight)} batches never processed")
        self.now = max(self.now, self.gpu_free)
        return self.now

    def _advance(self, submit: Callable[[Any], None]) -> bool:
        """Submit the arrivals due by `now`; while the stepper has nothing to do, jump to the
        next arrival. False: nothing runs and nothing is left to arrive."""
        pending, at = self._pending, self._at
        while True:
            while pending and at(pending[0]) <= self.now:
                submit(pending.popleft())
            if self.stepper.busy:
                return True
            if not pending:
                return False
            self.now = max(self.now, at(pending[0]))

    def _step_once(self) -> tuple[bool, bool]:
        """One stepper iteration at `now`: launch what it returns, process what it completed.
        Returns (it launched or processed a batch, an admission hold slept in virtual time)."""
        if self.before_step is not None:
            self.before_step()
        clock, sched, pending = self.clock, self.kit.sched, self._pending
        now = self.now
        clock.now = now
        clock.next_arrival = self._at(pending[0]) if pending else math.inf
        before = len(sched.result_queue)
        rnd = self.stepper.step()
        self.steps += 1
        # NOTE: the loop's next pass comes after this one's host work (under overlap too:
        # what registers during a scan is seen by the pass after it, while the forward runs)
        host_end = self._launch(rnd, now) if rnd is not None else now
        slept = clock.now > now  # an admission hold slept in virtual time
        self.now = max(host_end, clock.now)
        popped = before + (rnd is not None) - len(sched.result_queue)
        end = self.now
        for _ in range(popped):
            end = self._inflight.popleft().end_s
            self.now = max(self.now, end)
        if rnd is not None or popped:
            self.now += self.pass_s
        self._completions(end)
        return rnd is not None or popped != 0, slept

    def _idle(self, idle: int, slept: bool) -> int:
        """A step that launched and processed nothing (the `idle`-th in a row): past
        `max_idle_scans` the run has stalled; else virtual time moves on by an idle tick (not
        past the next arrival) unless a hold already slept."""
        if idle > self.max_idle_scans:
            raise RuntimeError(
                f"{self.label}: no progress for {idle} scans at t={self.now:.3f}s with "
                f"{len(self.kit.sched.waiting_queue)} waiting")
        if not slept:
            self.now = min(self.clock.next_arrival, self.now + self.idle_tick_s)
        return idle

    def arrive(self, item: Any) -> None:
        """Add an arrival while `run` runs (a closed loop: after a completion)."""
        at, pending = self._at, self._pending
        i = len(pending)
        while i > 0 and at(pending[i - 1]) > at(item):
            i -= 1
        pending.insert(i, item)

    def _launch(self, rnd: Any, now: float) -> float:
        """Launch `rnd` scanned at `now`; returns when its host work ends."""
        c = self.cost(rnd)
        h = self.host(rnd, self.kit.last_scan) if self.host is not None else 0.0
        ready = now + h if self.host is not None else now
        start = max(ready, self.gpu_free)
        end = start + c
        self.gpu_free = end
        self.host_s += h
        launch = Launch(rnd, now, h, start, end)
        self._inflight.append(launch)
        if self.on_forward is not None and rnd.mode == "prefill":
            self.on_forward(len(rnd.rids), rnd.scheduled_tokens, c)
        if self.on_launch is not None:
            self.on_launch(launch)
        return ready

    def _completions(self, t: float) -> None:
        """Requests completed this step: at the end of the round whose result was processed."""
        order = self.log.order
        while self._seen < len(order):
            rid = order[self._seen]
            self._seen += 1
            self.completed.append((rid, t))
            if self.on_complete is not None:
                self.on_complete(rid, t)
