"""The wait set: parked consumers, rechecked every round, parked for a bounded number of rounds."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Parked:
    rid: str
    first_round: int
    rounds: int  # consecutive rounds parked so far
    producer: str
    depth: int


class WaitSet:
    def __init__(self, max_rounds: int) -> None:
        # NOTE: the bound is the producer's publish lag plus a margin; past it, native handling.
        self.max_rounds = max_rounds
        self._parked: dict[str, Parked] = {}
        self.total_rounds: dict[str, int] = {}  # per request, kept after release for metrics

    def __len__(self) -> int:
        return len(self._parked)

    def __contains__(self, rid: str) -> bool:
        return rid in self._parked

    def get(self, rid: str) -> Parked | None:
        return self._parked.get(rid)

    def producer_of(self, rid: str) -> str | None:
        """The producer `rid` is parked on (None: not parked)."""
        p = self._parked.get(rid)
        return None if p is None else p.producer

    def may_park(self, rid: str) -> bool:
        # NOTE: the bound counts every round the request ever parked, so leaving and
        # re-entering the wait set cannot extend its wait.
        return self.rounds_left(rid) > 0

    def rounds_left(self, rid: str) -> int:
        """Rounds `rid` may still park before the bound releases it to native handling."""
        return max(self.max_rounds - self.total_rounds.get(rid, 0), 0)

    def park(self, rid: str, round_idx: int, producer: str, depth: int) -> Parked:
        p = self._parked.get(rid)
        if p is None:
            p = self._parked[rid] = Parked(rid, round_idx, 0, producer, depth)
        p.rounds += 1
        p.producer, p.depth = producer, depth
        self.total_rounds[rid] = self.total_rounds.get(rid, 0) + 1
        return p

    def release(self, rid: str) -> Parked | None:
        return self._parked.pop(rid, None)

    def rids(self) -> list[str]:
        return list(self._parked)

    def forget(self, rid: str) -> None:
        """The request left the scheduler (finished or aborted): drop every record of it."""
        self._parked.pop(rid, None)
        self.total_rounds.pop(rid, None)
