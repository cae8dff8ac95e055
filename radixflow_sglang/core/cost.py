"""Round cost: a prior from the model's numbers, an online robust fit, and the wait decision.

    c(rows, tokens, pairs) = alpha + beta * tokens + gamma * rows + delta * pairs

`tokens` are the tokens a prefill forward extends, `rows` its requests, `pairs` the (query,
key) pairs its full-attention layers score (sum of extend * (prefix + extend / 2)). The prior
(`prior_from_geometry`) is the first-principles derivation documented in eval/costmodel.py;
`RoundCostEstimator` refits it from measured forward durations; `wait_wins` is the
cost-aware Blocked decision derived in docs/design.md ("The wait decision").
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field

from .reasons import Reason, enabled

PEAK_FLOPS = 790e12  # H200 dense bf16, FLOP/s (assumption, eval/costmodel.py docstring)
MFU = 0.5  # prefill model FLOP utilisation (assumption)
HBM_BYTES_PER_S = 4.8e12  # H200 HBM3e bandwidth
ALPHA_S = 8e-3  # fixed per-forward overhead (assumption)
ROW_OVERHEAD_S = 1e-4  # per-row bookkeeping (assumption)


@dataclass(frozen=True)
class CostCoeffs:
    alpha: float  # s per forward
    beta: float  # s per scheduled token
    gamma: float  # s per row
    delta: float = 0.0  # s per full-attention (query, key) pair
    source: str = "custom"

    def __call__(self, rows: float, tokens: float, pairs: float = 0.0) -> float:
        return self.alpha + self.beta * tokens + self.gamma * rows + self.delta * pairs

    def as_dict(self) -> dict:
        return asdict(self)


def prior_from_geometry(params: float, vocab: int, hidden: int, tied: bool, *,
                        state_bytes: int = 0, full_layers: int = 0, heads: int = 0,
                        head_dim: int = 0, alpha: float = ALPHA_S,
                        source: str = "geometry") -> CostCoeffs:
    """eval/costmodel.py's derivation as a pure function of the model's numbers: beta from the
    per-token matmul FLOPs (parameters less the embedding tables), gamma from row bookkeeping,
    the LM head on the last position and one recurrent-state copy, delta from the full-attention
    layers' per-pair FLOPs."""
    flops_per_s = PEAK_FLOPS * MFU
    p_tok = params - (1 if tied else 2) * vocab * hidden
    beta = 2 * p_tok / flops_per_s
    gamma = ROW_OVERHEAD_S + 2 * vocab * hidden / flops_per_s + 2 * state_bytes / HBM_BYTES_PER_S
    delta = 4 * full_layers * heads * head_dim / flops_per_s
    return CostCoeffs(alpha, beta, gamma, delta, source)


# NOTE: a server whose model numbers are unknown starts from a 4B-class model on one H200
# (qwen3.5-4b's derived values); the fit replaces it within tens of rounds.
GENERIC_PRIOR = CostCoeffs(ALPHA_S, 1.7e-5, 1.24e-4, 0.0, "generic")

# Feature scales: the prior weighs each coefficient like PRIOR_ROUNDS rounds of this shape.
_SCALE = (1.0, 1024.0, 8.0, 1e6)
# NOTE: the prior's alpha is an assumption (ALPHA_S), its beta, gamma and delta are derived from
# the model's FLOPs: a measured level goes to alpha, the derived terms move only as far as the
# measured shapes span them (docs/design.md, "Cold fits"). Alpha is free from the first forward.
_PRIOR_WEIGHT = (0.0, 1.0, 1.0, 1.0)


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (4x4; keeps the core free of numpy)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        piv = m[c][c]
        for r in range(c + 1, n):
            f = m[r][c] / piv
            for k in range(c, n + 1):
                m[r][k] -= f * m[c][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x


def _solve_nonneg(a: list[list[float]], b: list[float]) -> list[float]:
    """`_solve` with every coefficient >= 0: the most negative one is held at 0 and the rest
    solved again until none is negative (an active set, never released: 4 terms, one or two
    solves). A cost term is never negative, and clamping one after an unconstrained solve
    leaves the terms it traded against inflated: the box's exact forwards of one shape family
    fitted delta < 0 and, clamped, priced a 1,088-token extend at 2.4x its cost."""
    free = list(range(len(b)))
    while True:
        sub = _solve([[a[i][j] for j in free] for i in free], [b[i] for i in free])
        x = [0.0] * len(b)
        for i, v in zip(free, sub, strict=True):
            x[i] = v
        neg = [i for i in free if x[i] < 0]
        if not neg:
            return x
        free.remove(min(neg, key=lambda i: x[i]))


# The fit's numbers (docs/design.md, "The wait decision": "Round cost", "Cold fits")
# NOTE: a tenth of a round per FLOP-derived coefficient: shapes the server never ran stay at
# the prior, while a handful of measured rounds outweigh it
PRIOR_ROUNDS = 0.1
FORGET = 0.998  # NOTE: ~500 rounds of memory: recent hardware state wins; not measured
# NOTE: a lone outlier (the first CUDA graph capture, a stall) never moves the fit
REJECT_SIGMAS = 6.0
HUBER_SIGMAS = 2.0  # NOTE: the usual Huber knee in robust sigmas; not measured
# NOTE: forwards (and prefill rounds' host and wall times) in a median: not measured; chosen as
# enough for a stable median that still follows a level change within tens of rounds
FIT_WINDOW = 32
# NOTE: a level shift is accepted from its 3rd forward: sigma needs 3 residuals, 3 alike in a
# row are a shift, one is an outlier (notes/2026-11-wait-rule.md: the cold segment it fixed)
SETTLE = 3
TRUST = 0.5  # NOTE: trusted while the median miss is within a factor 1.5; not measured
# NOTE: sigma's floor, relative to the prediction plus 1 us: the noiseless twin must not reject
# float rounding; before SETTLE residuals a quarter of the prediction (a lone first outlier is
# rejected, SETTLE alike forwards are a level shift); not measured
SIGMA_FLOOR = 1e-3
SIGMA_FLOOR_S = 1e-6
COLD_SIGMA = 0.25
MAD_SIGMA = 1.4826  # the median absolute deviation's scale to a normal sigma (a constant)


class RoundCostEstimator:
    """Weighted least squares over measured forwards, regularised towards a prior.

    Solves min sum_i w_i (y_i - x_i.t)^2 + n0 * |t - t0|^2 in scaled features x = (1,
    tokens/1024, rows/8, pairs/1e6), t >= 0 (`_solve_nonneg`; t0's alpha left out of the
    penalty): the prior counts like `prior_rounds` rounds that pin each FLOP-derived coefficient
    (beta, gamma, delta), so directions the observed rounds do not span (e.g. every round had
    the same row count) stay at the prior; alpha, the prior's assumption, has no prior weight: a
    measured level is alpha's. Observations decay by `forget` per round (recent hardware state
    wins; ~500 rounds). Robustness: a residual beyond `reject` robust sigmas is ignored, and one
    beyond `huber` sigmas is down-weighted (Huber). Sigma is 1.4826 x the median absolute
    residual of the last `window` observations, rejected ones included, so a genuine level shift
    (a wrong prior) is accepted from its `settle`-th forward while a lone outlier (first CUDA
    graph capture, a stall) never moves the fit. Deterministic: the same observations in the
    same order give the same fit.

    `trusted`: the fit predicted the recent forwards (median over the last `settle`) within a
    factor `1 + trust`. `decision_coeffs` is what a decision reads: the fit while trusted,
    else the fit with alpha moved by the median residual of those forwards (a wrong prior's
    level is known from the first measured forward, before the fit has learnt it). Before any
    measured forward: the prior.
    """

    def __init__(self, prior: CostCoeffs, *, prior_rounds: float = PRIOR_ROUNDS,
                 forget: float = FORGET, reject: float = REJECT_SIGMAS,
                 huber: float = HUBER_SIGMAS, window: int = FIT_WINDOW, settle: int = SETTLE,
                 trust: float = TRUST, wall: float | None = None) -> None:
        self.prior = prior
        self.wall_fixed = wall  # NOTE: --radixflow-round-overhead-ms: the wall overhead, pinned
        self.n0 = prior_rounds
        self.forget = forget
        self.reject_k, self.huber_k = reject, huber
        self.settle, self.trust = settle, trust
        self._miss: deque[float] = deque(maxlen=settle)  # |log(measured / predicted)|
        self._recent: deque[tuple[list[float], float]] = deque(maxlen=settle)  # (x, measured)
        # NOTE: the rejected forwards since the last accepted one (a level shift's first ones)
        self._held: deque[tuple[list[float], float]] = deque(maxlen=max(settle, 1))
        self._t0 = [prior.alpha * _SCALE[0], prior.beta * _SCALE[1], prior.gamma * _SCALE[2],
                    prior.delta * _SCALE[3]]
        self._s = [[0.0] * 4 for _ in range(4)]
        self._sy = [0.0] * 4
        self._t = self._t0[:]
        self._resid: deque[float] = deque(maxlen=window)
        self.observed = 0
        self.rejected = 0
        self.last_s = math.nan
        # NOTE: coefficients by view ("fit", "decision", "round"), computed once per fit
        # update: a quiet scan reads decision_coeffs twice (the hold, the quiet rule) and a
        # read cost ~5 us; `observe` and `observe_period` (all that moves them) clear it
        self._coeffs: dict[str, CostCoeffs] = {}
        self._host: deque[float] = deque(maxlen=window)  # scheduler host s per prefill round
        # NOTE: a prefill round's wall period less its forward (LaunchPeriods), per round
        self._wall: deque[float] = deque(maxlen=window)
        # NOTE: the same across a pass that waited for its result (LaunchPeriods.idle)
        self._resume: deque[float] = deque(maxlen=window)

    @property
    def coeffs(self) -> CostCoeffs:
        """The current fit, clamped to >= 0 (a decision never uses a negative cost)."""
        c = self._coeffs.get("fit")
        if c is None:
            c = self._coeffs["fit"] = self._fit_coeffs()
        return c

    def _fit_coeffs(self) -> CostCoeffs:
        a, b, g, d = (max(0.0, t / s) for t, s in zip(self._t, _SCALE, strict=True))
        src = f"fit:{self.observed - self.rejected}/{self.observed}+{self.prior.source}"
        return CostCoeffs(a, b, g, d, src if self.observed else self.prior.source)

    def predict(self, rows: float, tokens: float, pairs: float = 0.0) -> float:
        return self.coeffs(rows, tokens, pairs)

    @property
    def trusted(self) -> bool:
        """The fit predicts the measured forwards (class docstring); True before any."""
        if not self._miss:
            return True
        return sorted(self._miss)[(len(self._miss) - 1) // 2] <= math.log1p(self.trust)

    @property
    def decision_coeffs(self) -> CostCoeffs:
        """The fit, level-corrected while it mispredicts the recent forwards (class docstring),
        a round priced at its wall time (`walled`)."""
        c = self._coeffs.get("decision")
        if c is None:
            c = self._coeffs["decision"] = self.walled(self._level_coeffs())
        return c

    @property
    def round_coeffs(self) -> CostCoeffs:
        """The fit (no level correction) with a round priced at its wall time (`walled`)."""
        c = self._coeffs.get("round")
        if c is None:
            c = self._coeffs["round"] = self.walled(self.coeffs)
        return c

    def walled(self, c: CostCoeffs) -> CostCoeffs:
        """`c` with the measured wall overhead of a round (`wall_s`) in its fixed cost: the loop's
        host parts a round costs besides its forward. Unchanged before any period is measured."""
        if not self.measures_wall:
            return c
        return CostCoeffs(c.alpha + self.wall_s, c.beta, c.gamma, c.delta, c.source + "+wall")

    def _level_coeffs(self) -> CostCoeffs:
        c = self.coeffs
        if self.trusted:
            return c
        # NOTE: residuals under the CURRENT fit: the fit may have absorbed part of the level
        # since it predicted them (the prediction errors would count that part twice).
        err = sorted(y - self._pred(x) for x, y in self._recent)
        n = len(err)
        shift = (err[(n - 1) // 2] + err[n // 2]) / 2  # NOTE: the median (two forwards: mean)
        return CostCoeffs(max(0.0, c.alpha + shift), c.beta, c.gamma, c.delta,
                          c.source + "+level")

    def sigma(self, predicted: float) -> float:
        # NOTE: floor relative to the prediction: a noiseless source (the twin) must not reject
        # float rounding; before `settle` residuals, a quarter of the prediction (a lone first
        # outlier is rejected; `settle` alike forwards in a row are a level shift).
        floor = SIGMA_FLOOR * predicted + SIGMA_FLOOR_S
        if len(self._resid) < self.settle:
            return max(COLD_SIGMA * predicted, floor)
        med = sorted(self._resid)[len(self._resid) // 2]
        return max(MAD_SIGMA * med, floor)

    def observe(self, rows: int, tokens: int, seconds: float, pairs: float = 0.0) -> bool:
        """Feed one measured prefill forward; False when it was rejected as an outlier."""
        if not (seconds >= 0 and math.isfinite(seconds)) or rows <= 0:
            return False
        self._coeffs.clear()  # NOTE: from here on the fit, its level and its source move
        self.observed += 1
        self.last_s = seconds
        x = [1.0, tokens / _SCALE[1], rows / _SCALE[2], pairs / _SCALE[3]]
        pred = self._pred(x)
        r = seconds - pred
        sig = self.sigma(max(pred, 0.0))
        self._resid.append(abs(r))
        self._miss.append(abs(math.log(max(seconds, 1e-9) / max(pred, 1e-9))))
        self._recent.append((x, seconds))
        if abs(r) > self.reject_k * sig:
            self.rejected += 1
            self._held.append((x, seconds))
            return False
        self._feed(x, seconds, r, sig)
        # NOTE: a level shift's first forwards were rejected before the window saw it; they
        # are fed now if the fit that accepts the shift accepts them (a lone outlier stays out).
        held, self._held = list(self._held), deque(maxlen=self._held.maxlen)
        for hx, hy in held:
            hp = self._pred(hx)
            hs = self.sigma(max(hp, 0.0))
            if abs(hy - hp) <= self.reject_k * hs:
                self.rejected -= 1
                self._feed(hx, hy, hy - hp, hs)
        return True

    def observe_host(self, seconds: float) -> None:
        """The scheduler's own CPU time (scan and batch preparation) of one prefill round."""
        if seconds >= 0 and math.isfinite(seconds):
            self._host.append(seconds)

    @property
    def host_s(self) -> float:
        """Median host seconds per prefill round over the last `window` (0 before any): what
        a round adds to its requests' latency besides its forward when nothing hides it."""
        if not self._host:
            return 0.0
        return sorted(self._host)[len(self._host) // 2]

    def observe_period(self, period: float, forward: float) -> None:
        """One prefill round's wall period (LaunchPeriods) and its forward: the rest is the wall
        time the loop's host parts add to a round (under overlap only what its forward did not
        hide; never below 0)."""
        if 0 <= period < math.inf and 0 <= forward < math.inf:
            self._coeffs.clear()  # NOTE: the wall overhead moves `walled`
            self._wall.append(max(0.0, period - forward))

    def observe_resume(self, period: float, forward: float) -> None:
        """A prefill round's wall period across a pass that launched nothing while work was
        queued, and its forward: the rest is the loop's pass from the result to the next launch
        (a wait that launches nothing costs it: RoundView.idle_wait_s)."""
        if 0 <= period < math.inf and 0 <= forward < math.inf:
            self._resume.append(max(0.0, period - forward))

    @property
    def resume_s(self) -> float | None:
        """Median of the last `window` passes from a result to the next launch; None before."""
        if not self._resume:
            return None
        return sorted(self._resume)[len(self._resume) // 2]

    @property
    def host_fed(self) -> bool:
        """Scan host times are fed (a GPU server, the twin; not a simulated server)."""
        return bool(self._host)

    @property
    def measures_wall(self) -> bool:
        """A round's wall overhead is known, measured or pinned (it is then in `walled`'s
        fixed cost)."""
        return bool(self._wall) or self.wall_fixed is not None

    @property
    def wall_s(self) -> float:
        """Median wall overhead per prefill round over the last `window` (0 before any), or
        the pinned one (`wall`): decisions then never read a clock-derived figure."""
        if self.wall_fixed is not None:
            return self.wall_fixed
        if not self._wall:
            return 0.0
        return sorted(self._wall)[len(self._wall) // 2]

    def _pred(self, x: list[float]) -> float:
        return sum(xi * ti for xi, ti in zip(x, self._t, strict=True))

    def _feed(self, x: list[float], y: float, r: float, sig: float) -> None:
        w = 1.0 if abs(r) <= self.huber_k * sig else self.huber_k * sig / abs(r)
        lam = self.forget
        for i in range(4):
            self._sy[i] = lam * self._sy[i] + w * x[i] * y
            for j in range(4):
                self._s[i][j] = lam * self._s[i][j] + w * x[i] * x[j]
        n = [self.n0 * pw for pw in _PRIOR_WEIGHT]
        a = [[self._s[i][j] + (n[i] if i == j else 0.0) for j in range(4)] for i in range(4)]
        b = [self._sy[i] + n[i] * self._t0[i] for i in range(4)]
        self._t = _solve_nonneg(a, b)

    def as_dict(self) -> dict:
        c = self.coeffs
        return {"alpha_s": c.alpha, "beta_s": c.beta, "gamma_s": c.gamma, "delta_s": c.delta,
                "source": c.source, "observed": self.observed, "rejected": self.rejected,
                "trusted": self.trusted, "host_s": self.host_s, "wall_s": self.wall_s,
                "resume_s": self.resume_s,
                "periods": len(self._wall), "wall_pinned": self.wall_fixed is not None,
                "last_forward_s": None if math.isnan(self.last_s) else self.last_s}


class LaunchPeriods:
    """The scheduler loop's wall period of each prefill round: from its launch to the loop's
    next launch (of any batch), when no pass between them went idle. For two prefills in a
    row that is the period between their launches: the forward plus every host part (result
    processing, streaming, the next scan and batch preparation); under overlap what the
    forward did not hide. Prefill rounds are numbered in launch order from 0; `take(k)` hands
    round k's period out once (NaN: unknown, the loop went idle or round k is still open).
    Pure: the caller passes the clock's readings."""

    def __init__(self) -> None:
        # NOTE: (round, launch time, a pass since launched nothing while work was queued)
        self._open: tuple[int, float, bool] | None = None
        self._done: dict[int, tuple[float, float]] = {}
        self.launched = 0  # prefill rounds launched

    def launch(self, now: float, prefill: bool) -> None:
        if self._open is not None:
            k, t, idled = self._open
            self._done[k] = (math.nan, now - t) if idled else (now - t, math.nan)
        self._open = None
        if prefill:
            self._open = (self.launched, now, False)
            self.launched += 1

    def idle(self, waiting: bool = False) -> None:
        """A loop pass launched nothing: the open round's period would include the wait. With
        work queued (`waiting`: parked or held requests) the loop only waited for a result, so
        the period less the forward is the pass from that result to the next launch (`take`'s
        second value, RoundView.idle_wait_s); with nothing queued it may be any idle time."""
        if self._open is not None and waiting:
            self._open = (*self._open[:2], True)
        else:
            self._open = None

    def take(self, k: int) -> tuple[float, float]:
        """Round k's (period, period across a waiting pass): at most one known, NaN otherwise."""
        for old in [j for j in self._done if j < k]:
            del self._done[old]  # NOTE: never taken (bounded: rounds are taken in order)
        return self._done.pop(k, (math.nan, math.nan))


# --------------------------------------------------------------------------------------------
# The wait decision (docs/design.md, "The wait decision")
# --------------------------------------------------------------------------------------------


# NOTE: the paper's token budget T and its rows S (models.py's `TOKENS` and `DEFAULT_ROWS` are
# these): a view built without its scan's budgets (the tests) prices a paper-sized round
PAPER_TOKENS = 8192
PAPER_ROWS = 64


@dataclass(frozen=True)
class RoundView:
    """Rank-identical facts about the round being scanned, when a candidate is visited."""

    rows: int  # requests already selected this round
    behind: int  # requests finishing after this round whatever happens (candidate included)
    budget_left: int  # prefill tokens the round may still take, before the candidate
    demand_after: int  # tokens of unselected waiting work after the candidate (upper bound)
    mean_extend: float  # mean tokens per unselected waiting request
    rows_left: int  # rows the round may still take, before the candidate
    parked_tokens: int = 0  # extend of consumers already parked this round (they run next)
    parked_rows: int = 0
    token_budget: int = PAPER_TOKENS  # T
    row_budget: int = PAPER_ROWS  # S
    siblings: int = 0  # queued after the candidate, sharing its prefix to the depth (its group)
    host_s: float = 0.0  # scheduler host time a round adds (scan + batch prep; 0 under overlap)
    arrival_rate: float = 0.0  # requests/s arriving (rank 0's clock, shared): they queue too
    # NOTE: no_buffer: what a later sibling group of this scan saves by waiting, which a wait
    # whose fork cut takes SGLang's one chunk slot denies it (adapter/slot.py)
    slot_value: float = 0.0
    # NOTE: requests selected this round whose latency ends with the candidate's group's: its
    # producer, when the group arrived with it (a fork, n samples: one question). Waiting then
    # delays them too, once per group (docs/design.md, "Tied producers")
    tied: int = 0
    # NOTE: seconds the oldest request finishing with this round arrived before the candidate
    # (agreed-clock stamps, rank-identical): the tail guard (docs/design.md, "The tail guard")
    older_by: float = math.inf  # NOTE: unknown ages: no guard
    # NOTE: under overlap, a wait for a producer in flight that launches nothing: this round
    # runs none but the candidate's group, so if it waits the loop processes the producer's
    # result and scans again (this many host seconds), and the wait's round takes this one's
    # place (docs/design.md, "Overlap: a wait that launches nothing"). None: the round runs anyway
    idle_wait_s: float | None = None


@dataclass(frozen=True)
class WaitCase:
    ready: int  # the candidate's ready prefix now
    depth: int  # depth the producer publishes at
    length: int  # the candidate's input length (extend = length - prefix)
    lag: int  # rounds until the state is published (1; 2 for this scan's producer under overlap)
    cut_rest: int = 0  # no_buffer: tokens the producer defers a round when cut at the fork


@dataclass(frozen=True)
class Verdict:
    wait: bool
    wait_s: float  # summed added latency if the candidate waits
    recompute_s: float  # summed added latency if it recomputes now
    tail: bool = False  # the wait won but would make its question the slowest (`raises_tail`)
    # NOTE: the rule that decided (core/reasons.py); by default the cost comparison's. Not
    # compared: a verdict is its outcome and costs, whichever rule named it
    reason: Reason = field(default=None, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.reason is None:
            why = (Reason.TAIL_GUARD if self.tail else Reason.WAIT_WINS if self.wait
                   else Reason.RECOMPUTE_WINS)
            object.__setattr__(self, "reason", why)


def _pairs(prefix: int, extend: int) -> float:
    return extend * (prefix + extend / 2)


def _extend_cost(c: CostCoeffs, prefix: int, extend: int) -> float:
    """What one request's `extend` tokens after `prefix` add to a round's forward."""
    return c.beta * extend + c.delta * _pairs(prefix, extend) + c.gamma


def wait_wins(c: CostCoeffs, case: WaitCase, v: RoundView) -> Verdict:
    """Wait iff the summed latency it adds (the candidate, lag rounds later) is below the summed
    latency recomputing adds (its whole extend delays what finishes with this round, its extra
    work what finishes later, and a binding budget pushes displaced work a round back). Pure,
    rank-identical inputs."""
    overflow = max(v.demand_after - v.budget_left, 0)
    over_rows = math.ceil(overflow / max(v.mean_extend, 1.0))
    nxt, wait_s = _wait_rounds(c, case, v, overflow, over_rows)
    wait_s = _wait_extra(c, case, v, overflow, nxt, wait_s)
    recompute_s = _recompute_cost(c, case, v, overflow, over_rows, nxt)
    return Verdict(wait_s < recompute_s, wait_s, recompute_s)


def _wait_extra(c: CostCoeffs, case: WaitCase, v: RoundView, overflow: int, nxt: float,
                wait_s: float) -> float:
    """`wait_s` (the candidate's own wait) plus what the wait adds to its tied producer and,
    with a no_buffer fork cut, to the producer and the chunk slot."""
    cut = 1 if case.cut_rest > 0 else 0
    if v.tied and not cut:
        # NOTE: a producer that finishes this round without a cut is credited its early finish
        # by the request sum; its question ends with the consumers, so the wait delays it too
        # (with a cut it finishes a round later anyway: counted below)
        wait_s += v.tied * wait_s
    if cut:
        # NOTE: a no_buffer fork ends the producer's extend at the fork: the producer finishes
        # its rest a round later too (the consumer whose wait makes the cut pays for it), less
        # the queued work that fills the tokens it leaves when the budget binds.
        backfill = min(case.cut_rest, overflow) / max(v.mean_extend, 1.0)
        wait_s += max(nxt * (1.0 - backfill), 0.0)
        # NOTE: the cut holds SGLang's one chunk slot this round: a later group whose first
        # needed it for its own fork recomputes instead (docs/design.md, "The chunk slot")
        wait_s += v.slot_value
    return wait_s


def _recompute_cost(c: CostCoeffs, case: WaitCase, v: RoundView, overflow: int,
                    over_rows: int, nxt: float) -> float:
    """The summed latency recomputing now adds (`nxt`: the round after this one)."""
    e = case.length - case.ready  # extend if it runs now
    e2 = case.length - case.depth  # extend after the wait
    gain = case.depth - case.ready
    extra = c.beta * gain + c.delta * (_pairs(case.ready, e) - _pairs(case.depth, e2))
    # NOTE: under a backlog the extra work also delays every request arriving before the
    # backlog drains (a work-conserving server stays busy until then): a lower bound on the
    # busy period's arrivals, zero without overflow (docs/design.md, "Waiting under a backlog")
    drain = (c.beta * overflow + c.gamma * over_rows
             + math.ceil(overflow / max(v.token_budget, 1)) * (c.alpha + v.host_s))
    arriving = v.arrival_rate * drain
    # NOTE: what finishes with this round (its rows, the candidate, the siblings recomputing
    # with it) is delayed by the candidate's whole extend: waiting moves all of it out of the
    # round. What finishes later anyway runs the rest in a later round either way: the gain.
    here = v.rows + group_size(v)  # NOTE: the candidate and the siblings its rows can take
    full = _extend_cost(c, case.ready, e)
    recompute_s = (full * here + extra * (max(v.rows + v.behind - here, 0) + arriving)
                   + _displaced(case, v) * nxt)
    rest = e - v.budget_left
    if rest > 0:
        # NOTE: it does not fit what is left of the budget: recomputing chunks it, and it
        # finishes only with its rest, one round later per budget's worth (its own rounds),
        # which are longer than the round it would join after the wait.
        spill = math.ceil(rest / max(v.token_budget, 1)) * nxt
        recompute_s += spill + c.beta * max(rest - e2, 0)
        # NOTE: a tied producer's question then ends with the rest too (it waits either way)
        recompute_s += v.tied * spill
    return recompute_s


def _displaced(case: WaitCase, v: RoundView) -> float:
    """Queued requests (in mean extends) the candidate's extend pushes out of this round."""
    e = case.length - case.ready
    fits_now = min(v.demand_after, v.budget_left)
    fits_native = min(v.demand_after, max(v.budget_left - e, 0))
    displaced = (fits_now - fits_native) / max(v.mean_extend, 1.0)
    if v.rows_left <= 1 and v.demand_after > 0:
        displaced = max(displaced, 1.0)  # NOTE: its row would go to the next request
    return displaced


def _wait_rounds(c: CostCoeffs, case: WaitCase, v: RoundView, overflow: int,
                 over_rows: int) -> tuple[float, float]:
    """(the round the candidate runs in after a wait, the candidate's added latency: that
    round, plus the round in between under overlap)."""
    cut = 1 if case.cut_rest > 0 else 0
    # NOTE: a round's latency is its scan and batch preparation (host) plus its forward; the
    # fit measures forwards only. Under overlap the host time hides behind the previous forward.
    nxt = v.host_s + c(min(v.row_budget, 1 + cut + v.parked_rows + over_rows),
                       min(v.token_budget, case.length - case.depth + case.cut_rest
                           + v.parked_tokens + overflow))
    # NOTE: a wait of 2 rounds (overlap) passes a round that runs only the overflow; with none
    # the overlap loop processes the producer's result without a forward in between.
    between = (v.host_s + c(min(v.row_budget, over_rows), min(v.token_budget, overflow))
               if overflow else 0.0)
    if v.idle_wait_s is not None:
        # NOTE: recomputing, the round exists only for the group: its fixed cost is theirs
        # either way, and the wait adds the pass between the producer's end and its round
        return nxt, nxt - c.alpha + v.idle_wait_s
    return nxt, nxt + (case.lag - 1) * between


def group_wait_wins(c: CostCoeffs, case: WaitCase, v: RoundView) -> Verdict:
    """`_group_verdict`, unless its wait would make the group's question the slowest of the
    requests the choice affects (`raises_tail`): then it recomputes, as SGLang does."""
    g = _group_verdict(c, case, v)
    if g.wait and enabled(Reason.TAIL_GUARD) and raises_tail(c, case, v):
        return Verdict(False, g.wait_s, g.recompute_s, tail=True)
    # NOTE: an ablated comparison side (core/reasons.py) hands its verdict to the other side
    if not enabled(g.reason):
        return Verdict(not g.wait, g.wait_s, g.recompute_s)
    return g


def raises_tail(c: CostCoeffs, case: WaitCase, v: RoundView) -> bool:
    """The group's wait delays its question past the latency recomputing would give the oldest
    request finishing with this round (docs/design.md, "The tail guard"). Only where the choice
    affects nothing else: the round takes the whole group and all queued work either way (with
    overflow the queued requests are the later tail, and waiting shortens the work before them).

    Recomputing, every request finishing with the round (the group's question, the oldest)
    finishes at its end; waiting, the round is shorter by the group's work (`saved`) and the
    question finishes with the next one (`late`). The question arrived `older_by` after the
    oldest, so its latency exceeds the oldest's recompute latency iff late - saved > older_by."""
    k = group_size(v)
    e, e2 = case.length - case.ready, case.length - case.depth
    if k * e > v.budget_left or v.demand_after - (k - 1) * case.length > v.budget_left - k * e:
        return False
    last = _copy(v, demand_after=0, parked_rows=v.parked_rows + k - 1,
                 parked_tokens=v.parked_tokens + (k - 1) * e2)
    late = _wait_rounds(c, case, last, 0, 0)[1]
    saved = k * _extend_cost(c, case.ready, e) + c.beta * case.cut_rest
    return late - saved > v.older_by


def _group_verdict(c: CostCoeffs, case: WaitCase, v: RoundView) -> Verdict:
    """One verdict for a sibling group: the candidate and the `v.siblings` queued requests
    behind it that share its prefix to the depth (same producer, same depth, same gain).

    Compares the summed latency of the two consistent choices, each sibling costed as
    `wait_wins` would see it after the siblings before it: all wait (sibling j finds j more
    parked rows and tokens in the next round) or all recompute (sibling j finds j more rows in
    this round and j extends less budget). A split is never better for their question: it
    waits for both the recompute round and the parked ones' round (docs/design.md, "Sibling
    groups"), unless the budget forces it: the siblings the round cannot take after a chunked
    one are visited again next round, still Blocked, and wait behind the chunk's rest
    (`_late_cost`, docs/design.md, "A group the round cannot take"). Only the first sibling
    makes a no_buffer cut."""
    k = group_size(v)
    if k == 1:
        return wait_wins(c, case, v)
    e = case.length - case.ready
    run = _runs_now(k, e, v.budget_left)
    late = _late_cost(c, case, v, run, k) if run < k else 0.0
    wait_s = recompute_s = 0.0
    rest = _copy(case, cut_rest=0)
    for j in range(k):
        w, r = _sibling_costs(c, case if j == 0 else rest, v, j, k, run, late, case.cut_rest)
        wait_s += w
        recompute_s += r
    return Verdict(wait_s < recompute_s, wait_s, recompute_s)


def _sibling_costs(c: CostCoeffs, cj: WaitCase, v: RoundView, j: int, k: int, run: int,
                   late: float, cut_rest: int) -> tuple[float, float]:
    """(wait, recompute) latency of sibling `j` of a group of `k` (`cj`: its case; only the
    first cuts), after the siblings before it made the same choice; `run`: the siblings a
    recompute runs this round, `late`: what one it cannot take pays on top of its wait."""
    e, e2 = cj.length - cj.ready, cj.length - cj.depth
    dem = max(v.demand_after - j * cj.length, 0)
    # NOTE: the tied wait for the round that runs the whole group: the last sibling's
    tied = v.tied if j == k - 1 and not cut_rest else 0
    vw = _copy(v, demand_after=dem, parked_rows=v.parked_rows + j,
               parked_tokens=v.parked_tokens + j * e2, siblings=0, tied=tied)
    w = wait_wins(c, cj, vw).wait_s
    if j >= run:
        return w, w + late * (1 + tied)
    # NOTE: the siblings after j that the round takes recompute in it too (`siblings`: they
    # finish with it), the ones before j are its rows
    vr = _copy(v, demand_after=dem, rows=v.rows + j, behind=max(v.behind - j, 1),
               budget_left=max(v.budget_left - j * e, 0),
               rows_left=max(v.rows_left - j, 0), siblings=run - 1 - j,
               tied=tied if run == k else 0)
    return w, wait_wins(c, cj, vr).recompute_s


def _runs_now(k: int, e: int, budget_left: int) -> int:
    """Siblings a recompute runs this round: those the budget takes whole, then one chunked
    (SGLang chunks one request a round and takes nothing after it)."""
    whole = budget_left // max(e, 1)
    return min(k, whole + (1 if budget_left > whole * e else 0))


def _late_cost(c: CostCoeffs, case: WaitCase, v: RoundView, run: int, k: int) -> float:
    """What a sibling the round cannot take pays on top of its wait when the ones before it
    recompute: the chunked sibling's rest runs before (or with) its round. Under overlap
    (lag 2) the rest takes the round in between, which the wait leaves empty when no queued
    work overflows (a whole round: qwen3.5-0.8b quality, alpha 200 ms, a question 0.64 s
    recomputing vs 0.43 s waiting); otherwise it adds its work to a round that runs anyway.
    A no_buffer wait that cuts its producer at the fork is what publishes the state there:
    recomputing makes no cut, so the late siblings wait for the chunked sibling's own
    publication, a round after its rest's."""
    e = case.length - case.ready
    queued = max(v.demand_after - (k - 1) * case.length, 0)  # NOTE: besides the group
    chunk = v.budget_left - (run - 1) * e if run else 0
    rest = e - chunk if 0 < chunk < e else 0
    if rest <= 0:
        return 0.0
    t = max(v.token_budget, 1)
    grow = c.beta * rest + c.gamma + c.delta * _pairs(case.ready + chunk, rest)
    rounds = math.ceil(rest / t)  # NOTE: a rest longer than a budget takes rounds of its own
    if case.cut_rest > 0 or (case.lag >= 2 and queued <= v.budget_left):
        return grow + rounds * (v.host_s + c.alpha)
    return grow + (rounds - 1) * (v.host_s + c.alpha)


def group_saving(c: CostCoeffs, case: WaitCase, v: RoundView) -> float:
    """Summed latency a sibling group's wait saves over recomputing (0 when it recomputes)."""
    g = group_wait_wins(c, case, v)
    return g.recompute_s - g.wait_s if g.wait else 0.0


def _copy(obj, **changes):
    """`dataclasses.replace` for the plain frozen records of this loop (RoundView, WaitCase: no
    __post_init__, no init=False fields): the same fields and values without re-running
    __init__ (replace validates and sets every field again: most of this loop's time)."""
    new = object.__new__(type(obj))
    new.__dict__.update(obj.__dict__, **changes)
    return new


def group_size(v: RoundView) -> int:
    """Requests `group_wait_wins` decides for: the candidate and its siblings, within the rows
    the round has left."""
    return max(1, min(1 + v.siblings, max(v.rows_left, 1)))


def recomputes_at_every_ready(c: CostCoeffs, case: WaitCase, v: RoundView) -> bool:
    """True when `group_wait_wins` recomputes for `case` at every ready prefix >= `case.ready`
    (the same producer, depth, length and view): its verdict at `case.ready`, the largest gain,
    where that verdict bounds the rest (docs/design.md, "Skipping the probe").

    NOTE: the wait side does not read the ready prefix; the recompute side grows with the gain
    (extra work, displaced and chunked tokens), except where earlier siblings' recomputes
    exhaust the budget (the j-th sibling's displaced work then shrinks as they take more):
    False unless the group is one request or every sibling fits the budget at this gain. The
    tail guard only turns waits into recomputes, and more so at a smaller gain (less saved)."""
    k = group_size(v)
    if k > 1 and v.budget_left < k * (case.length - case.ready):
        return False
    return not group_wait_wins(c, case, v).wait


def never_waits(c: CostCoeffs, lengths: list[int], running: int, budget: int,
                row_budget: int, host_s: float, page: int = 1,
                idle_wait_s: float | None = None, decoding: int | None = None) -> bool:
    """True when `group_wait_wins` recomputes every Blocked candidate this scan can visit,
    whatever its producer, ready prefix and siblings (docs/design.md, "Quiet scans"). `lengths`:
    the waiting queue's input lengths; `running`: rows running (SGLang's row limit counts
    them); `decoding`: those of them a longer round delays (default: all); `budget`: the
    prefill tokens the scan starts with; `page`: the charge's rounding. Sufficient, not
    necessary:

    - every queued request fits the round at its full length (`len(lengths) * (max + page)`
      within `budget`, and two rows to spare), so no recompute displaces work, overflows,
      chunks or meets a backlog: recomputing costs at most its whole extend and row times
      the requests present, `<= (beta * L + |delta| * L**2 / 2 + gamma) * present`;
    - waiting costs at least the next round's host time and fixed cost, `host_s + c(1, 0)`;
      where a wait may launch nothing (`idle_wait_s`: a forward in flight, nothing decoding
      next; RoundView.idle_wait_s), at least that pass and the round's variable part.
    """
    if not lengths or min(c.alpha, c.beta, c.gamma) < 0:
        return False
    longest = max(lengths)
    if len(lengths) * (longest + page) > budget or len(lengths) + running + 1 > row_budget:
        return False
    present = len(lengths) + (running if decoding is None else decoding)
    extra = c.beta * longest + abs(c.delta) * longest * longest / 2 + c.gamma
    floor = host_s + c(1, 0)
    if idle_wait_s is not None:
        floor = min(floor, idle_wait_s + c(1, 0) - c.alpha)
    return extra * present < floor


# NOTE: a learned cut must save a quarter more than its round (docs/design.md, "A learned cut
# must pay"): its round lands whole on one question, its saving is spread and expected
CUT_MARGIN = 1.25


def newcomer_waits(c: CostCoeffs, prefix: int, extend: int, finishing: int, others: int,
                   parked: int, host_s: float, arrival_rate: float = 0.0,
                   round_rows: int = 0, round_tokens: int = 0,
                   margin: float = CUT_MARGIN) -> bool:
    """A released consumer's round stays short (docs/design.md, "A released consumer's round"):
    whether a request that joins a round holding released consumers (requests that waited
    for a producer's state and now run) waits one round instead. Joining grows the round by
    its work, `beta * extend + gamma + delta * pairs`, which every row that finishes with the
    round (`finishing`: prefill-only rows, the consumers' questions) pays. Waiting adds a
    round's fixed cost and host time to everyone who finishes later anyway (`others`: the
    newcomer, the queue, the running decode rows, the selected rows that go on decoding, and
    the requests arriving at `arrival_rate` while this round (`round_rows`, `round_tokens`
    so far) and the newcomer's run: a lower bound of those the extra round delays), except
    the `parked` rows: they run in the next round and would pay its work instead.
    The wait rule assumed the consumers' round costs what they bring to it; a newcomer
    arriving during the producer's round must not make the wait cost more than it saved.
    The saving must exceed the cost `margin` times, as a learned cut's (`cut_pays`): it moves
    a round onto the newcomer's question, whose round then takes whatever arrived meanwhile
    (nemotron-9b quality, rate 10, alpha 50 ms, no_buffer: a deferral at 1.18x its cost took
    the next question's producer into the newcomer's round and the chunk slot from its
    siblings, mean 0.281 -> 0.342 s)."""
    if finishing <= 0 or extend <= 0:
        return False
    pairs = _pairs(prefix, extend)
    grows = c.beta * extend + c.gamma + c.delta * pairs
    span = 2 * host_s + c(round_rows, round_tokens) + c(1, extend, pairs)
    later = max(others - parked, 1) + arrival_rate * span
    return finishing * grows > margin * (later * (c.alpha + host_s) + parked * grows)


def cut_pays(c: CostCoeffs, gain: int, rest: int, behind: int, users: float,
             backlog_budget: int = 0, margin: float = CUT_MARGIN) -> bool:
    """no_buffer: whether cutting a request's extend at a *learned* boundary pays
    (docs/design.md, "The wait decision", "A learned cut must pay"). The cut ends the extend at
    the boundary, `gain` tokens past its ready prefix, and runs its `rest` next round: the
    request (and the question it belongs to) finishes one round later, at least c(1, rest)
    (the rest's tokens only move, they are not added). Not cutting, the first of its `users`
    recomputes the gain (the others wait for that one), work that delays it and the `behind`
    requests: the benefit side of boundary.py `defer_wins`. A declared boundary is not asked
    (the client says the prefix is shared); a learned one is a guess, and on a model whose
    tokens are cheap under a large fixed cost per round its cut cost a question a round for a
    recompute of a millisecond (qwen3.5-0.8b race, alpha 200 ms, no_buffer: 1.16x stock).
    `backlog_budget`: the round's token budget T when queued work exceeds what the round has
    left (0: no backlog). Under a backlog a recomputed token displaces a token of queued work,
    and rounds run full: each token then also carries alpha / T of a round's fixed cost
    (qwen3.5-0.8b quality no_buffer, ~2,950-token documents at rate 10: without it the cut was
    declined and the later questions' recomputes cost 1.24x stock at alpha 100 ms).
    The saving must exceed the round `margin` times (`CUT_MARGIN`): a cut that only breaks
    even moves a whole round onto one question to spread it, in expectation, over later
    ones: the mean stays and that question becomes the tail (nemotron-9b race, alpha 50 ms:
    saving/round 1.00, mean 1.00x, p95 1.47x stock)."""
    if users <= 0 or gain <= 0:
        return False
    per_token = c.beta + (c.alpha / backlog_budget if backlog_budget > 0 else 0.0)
    return min(users, 1.0) * per_token * gain * (1 + behind) > margin * c(1, rest)


def cut_raises_tail(c: CostCoeffs, rest: int, older_by: float) -> bool:
    """A cut request's question finishes a round later (that round, less the rest's tokens
    this round no longer runs): past the latency of the oldest row finishing with this round,
    which arrived `older_by` s before it (docs/design.md, "The tail guard")."""
    return c(1, rest) - c.beta * rest > older_by


def measured(c: CostCoeffs) -> bool:
    """Coefficients fitted to at least one measured forward (`RoundCostEstimator.coeffs`), not
    the prior alone (whose alpha is an assumption, ALPHA_S)."""
    return c.source.startswith("fit:")
