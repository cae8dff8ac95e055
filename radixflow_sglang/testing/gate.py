"""Forward gate, the test's half: hold the simulated executor's forwards on events the test
controls. The protocol and the worker's half (ForwardGate) are radixflow_sglang/adapter/
forward_gate.py."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from radixflow_sglang.adapter.forward_gate import (  # noqa: F401  (ENV: the test sets it)
    ENV,
    POLL_S,
    ForwardGate,
    write_atomic,
)


class GateControl:
    """The test's side, over the same directory."""

    def __init__(self, directory: Path, alive: Callable[[], None] = lambda: None) -> None:
        self.dir, self.alive = directory, alive
        self.dir.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        """Every later forward waits."""
        write_atomic(self.dir / "limit", "0")

    def release(self, forward: int) -> None:
        """Forwards up to `forward` run; the next one waits."""
        write_atomic(self.dir / "limit", str(forward))

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
