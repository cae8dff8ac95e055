"""Forward gate, the worker's half: a test holds the simulated executor's forwards on events
it controls.

Off unless RADIXFLOW_SIM_GATE names a directory (read by adapter/simulated.py in the scheduler
process; the test's half, GateControl, is radixflow_sglang/testing/gate.py). Two files in that
directory carry the protocol:

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
from pathlib import Path
from typing import Any

from .metrics import dp_rank_of

ENV = "RADIXFLOW_SIM_GATE"
POLL_S = 0.005


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class ForwardGate:
    """The worker's side: `hold(batch)` before each forward."""

    def __init__(self, directory: Path, scheduler: Any) -> None:
        self.dir, self.scheduler, self.forwards = directory, scheduler, 0
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
                write_atomic(self.state_path, json.dumps(state))
                last = state
            self.scheduler.ingest_requests()
            time.sleep(POLL_S)
        if last is not None:
            self.state_path.unlink(missing_ok=True)  # NOTE: a state file means a forward waits
