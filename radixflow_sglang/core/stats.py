"""Per-round and per-request counters, as plain data for traces and metrics."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class RoundStats:
    round: int
    visited: int = 0
    ready: int = 0
    blocked: int = 0
    other: int = 0
    wait_set: int = 0
    rows: int = 0
    scheduled_tokens: int = 0
    hit_tokens: int = 0
    forks: int = 0  # producers moved to publish at a fork point
    released_by_bound: int = 0  # parked too long: handed to native handling
    chunked: bool = False
    held: int = 0  # iterations held before this round, plus fresh requests skipped in it
    released_by_admission: str = ""  # why held requests were released ("" = none held)
    frag_deferred: int = 0
    newcomer_deferred: int = 0  # kept out of a released consumer's round (core/cost.py)
    # NOTE: Blocked, but the cost-aware rule found recomputing cheaper (unprobed: at every
    # ready prefix it could have, core/traversal.py `recomputes_unprobed`)
    recomputed: int = 0
    probed: int = 0  # visits that ran the probe match (the rest skipped it: eval/hostcost.py)
    quiet: bool = False  # no candidate could wait: the scan ran without traversal hooks
    t_start: float = 0.0
    t_end: float = 0.0
    # NOTE: the loop's pass to this scan from its last launch or processed result, whichever
    # came later, where the result's ready time is known (the simulated executor's): the
    # twin's loop pass (eval/calibrate.py `loop_pass`); None: unknown, or not the first pass
    pass_s: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class RequestStats:
    rid: str
    registered: float
    seq: int = 0  # registration order (identical on every TP rank)
    registered_round: int = 0  # the scan count when first seen (identical on every TP rank)
    # NOTE: the scheduler pass that first saw it (identical on every TP rank: a pass's arrivals
    # are broadcast together); requests of one burst share it
    arrival: int = 0
    stamp: float = 0.0  # the agreed clock when first seen (rank 0's, identical on every rank)
    first_selected: float | None = None
    first_selected_round: int | None = None
    rounds_parked: int = 0
    deferred: int = 0  # rounds kept out of a released consumer's round
    eligible: bool = False  # released by admission (or never held)


@dataclass
class Totals:
    rounds: int = 0
    blocked: int = 0
    forks: int = 0
    released_by_bound: int = 0
    parked_max_rounds: int = 0
    frag_deferred: int = 0
    newcomer_deferred: int = 0
    scheduled_tokens: int = 0
    hit_tokens: int = 0
    recomputed: int = 0
    quiet_scans: int = 0

    def add(self, r: RoundStats) -> None:
        self.rounds += 1
        self.blocked += r.blocked
        self.forks += r.forks
        self.released_by_bound += r.released_by_bound
        self.frag_deferred += r.frag_deferred
        self.newcomer_deferred += r.newcomer_deferred
        self.scheduled_tokens += r.scheduled_tokens
        self.hit_tokens += r.hit_tokens
        self.recomputed += r.recomputed
        self.quiet_scans += r.quiet
