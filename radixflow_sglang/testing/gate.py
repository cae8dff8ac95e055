"""Forward gate: a test holds the simulated executor's forwards on events it controls.

Off unless RADIXFLOW_SIM_GATE names a directory (read by radixflow_sglang/adapter/simulated.py in
the scheduler process). Two files in that directory carry the protocol:

* `limit` (the test writes it): forwards numbered above its integer wait; no file, none wait.
  Forwards are numbered per scheduler from 1 (the start-up warm-up counts).
* `state-<dp rank>.json` (the worker writes it while a forward waits): the forward's number,
  its batch's rids, whether it extends, and the rids in the scheduler's waiting queue.

While a forward waits, the worker runs the event loop's receive step (`Scheduler.ingest_requests`,
managers/scheduler.py, the first thing `event_loop_normal` does each iteration) every few ms, so
requests and aborts the test sends reach the waiting queue and the test sees them there before it
lets the forward go: what shares a round is decided by events, not by timing. Receiving while a
forward runs is what SGLang's overlap loop does anyway. For a tp_size 1 scheduler only (the
receive step broadcasts across TP ranks).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENV = "RADIXFLOW_SIM_GATE"
POLL_S = 0.005


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class ForwardGate:
    """The worker's side: `hold(batch)` before each forward."""

    def __init__(self, directory: Path, scheduler: Any) -> None:
        self.dir, self.scheduler, self.forwards = directory, scheduler, 0
        from radixflow_sglang.adapter.metrics import dp_rank_of

        rank = dp_rank_of(scheduler) or 0
        self.state_path = directory / f"state-{rank}.json"

    @classmethod
    def from_env(cls, scheduler: Any) -> ForwardGate | None:
        d = os.environ.get(ENV)
        return cls(Path(d), scheduler) if d else None

    def _limit(self) -> int | None:
        try:
            return int((self.dir / "limit").read_text())
        except (FileNotFoundError, ValueError):  # NOTE: ValueError: caught mid-write
            return None

    def hold(self, batch: Any) -> None:
        self.forwards += 1
        last = None
        while (limit := self._limit()) is not None and limit < self.forwards:
            state = {"forward": self.forwards, "batch": [r.rid for r in batch.reqs],
                     "extend": bool(batch.forward_mode.is_extend()),
                     "waiting": [r.rid for r in self.scheduler.waiting_queue]}
            if state != last:
                _write_atomic(self.state_path, json.dumps(state))
                last = state
            self.scheduler.ingest_requests()
            time.sleep(POLL_S)
        if last is not None:
            self.state_path.unlink(missing_ok=True)  # NOTE: a state file means a forward waits


class GateControl:
    """The test's side, over the same directory."""

    def __init__(self, directory: Path, alive: Callable[[], None] = lambda: None) -> None:
        self.dir, self.alive = directory, alive
        self.dir.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        """Every later forward waits."""
        _write_atomic(self.dir / "limit", "0")

    def release(self, forward: int) -> None:
        """Forwards up to `forward` run; the next one waits."""
        _write_atomic(self.dir / "limit", str(forward))

    def open(self) -> None:
        (self.dir / "limit").unlink(missing_ok=True)

    def state(self, rank: int = 0) -> dict | None:
        try:
            return json.loads((self.dir / f"state-{rank}.json").read_text())
        except FileNotFoundError:
            return None

    def wait(self, pred: Callable[[dict], bool], what: str, timeout: float = 300.0,
             rank: int = 0) -> dict:
        """The state of a waiting forward once `pred` holds for it (polled; the timeout only
        bounds a hang)."""
        deadline = time.monotonic() + timeout
        while True:
            s = self.state(rank)
            if s is not None and pred(s):
                return s
            self.alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"forward gate: {what} not seen in {timeout:.0f} s; last {s}")
            time.sleep(POLL_S)
