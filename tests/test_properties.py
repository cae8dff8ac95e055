"""Property tests: random prefix-sharing workloads through SGLang's real scan, every policy.

For each policy and each of (qwen3.5-4b extra_buffer), (qwen3.5-4b no_buffer),
(nemotron-9b extra_buffer) and (qwen3-8b full attention), Hypothesis draws documents with
1-4 branches (shared prefixes of random length, suffixes of random length, duplicates
included), unrelated requests, an arrival order over steps, aborts of waiting and of parked
requests, retractions of in-flight requests (overlap) and pools just large enough not to
deadlock, so published states are evicted. `testing.harness.Harness` checks after every step:

* no waiting request holds a KV row, a mamba slot, a copy-on-write source or a tree lock;
* parked requests are queued, and no request parks more rounds over its whole life than the
  bound (publish lag + margin: the wait set's total_rounds and RequestStats.rounds_parked);
* each round fits its row and token budget; no request is selected after it ended; each
  request's chunks chain (prefix of one = prefix + extend of the last); a request cut into
  chunks continues every step (no admission hold stalls it);

and after the drain: every request completed or was aborted exactly once and was computed
to its input length, the runtime keeps no per-request records, and with the tree evicted no
KV, row or mamba slot is left (Kit.leaks()). `radix` must select exactly what `stock`
selects, round by round, under the same arrivals, aborts and retractions.

The pools: KV = the longest request + KV_SLACK tokens (the minimum that never deadlocks;
some examples add more), the mamba pool = `eval.soak.mamba_slots_for` (per row: its own
slot, two ping-pong buffers with extra_buffer, and the locked copy-on-write source; doubled
under overlap; no_buffer one more for the chunked request's checkpoint). Profiles: "ci"
(default, derandomized, 40 examples per case); `HYPOTHESIS_PROFILE=explore
RADIXFLOW_EXAMPLES=1000` for random, longer searches.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixflow_sglang.core.policy import POLICIES
from radixflow_sglang.geometry import load_geometry
from radixflow_sglang.testing.harness import Harness, VirtualClock, mamba_slots_for

settings.register_profile(
    "ci", max_examples=40, deadline=None, database=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "explore", max_examples=int(os.environ.get("RADIXFLOW_EXAMPLES", "200")), deadline=None,
    database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")

CONFIGS = [
    pytest.param("qwen3.5-4b", "extra_buffer", 1, id="qwen3.5-4b-extra_buffer"),
    pytest.param("qwen3.5-4b", "no_buffer", 1, id="qwen3.5-4b-no_buffer"),
    pytest.param("nemotron-9b", "extra_buffer", 1, id="nemotron-9b-extra_buffer"),
    pytest.param("qwen3-8b", "full", 1, id="qwen3-8b-full"),
    # KV pages of 16 under Nemotron's 128 grid: chunk cuts on pages, fragments possible
    pytest.param("nemotron-9b", "extra_buffer", 16, id="nemotron-9b-extra_buffer-page16"),
]
NO_LEAK = {"kv": 0, "rows": 0, "mamba": 0}
TICK_S = 1e-3  # virtual time per step: admission holds (5 / 10 ms) release after a few steps
KV_SLACK = 6  # SGLang caps a prompt at pool - 6 tokens (max_req_input_len)


@dataclass
class Plan:
    requests: list[tuple[str, list[int], str | None]]  # rid, ids, namespace, in arrival order
    arrivals: list[int]  # requests submitted before each step
    actions: list[tuple[str, int] | None]  # before each step: ("abort" | "abort_parked" |
    #                                        "retract", pick) or nothing
    rows: int
    tokens: int
    overlap: bool
    kv_extra: int  # KV tokens beyond the minimum (0: every new document evicts old states)
    mamba_extra: int  # mamba slots beyond the minimum
    theta: int | None = None  # RadixFlowConfig knobs (None: defaults)
    park_margin: int = 1
    admission_ms: float | None = None


def lengths(grid: int) -> st.SearchStrategy[int]:
    """Any length, or one just around a multiple of the grid (where publish depths move)."""
    near = st.builds(lambda k, d: max(1, k * grid + d), st.integers(1, 8), st.integers(-2, 2))
    return st.one_of(st.integers(1, 900), near)


@st.composite
def plans(draw: st.DrawFn, layout: str, grid: int) -> Plan:
    base = 100_000
    docs: list[list[tuple[str, list[int], str | None]]] = []
    for d in range(draw(st.integers(1, 3))):
        doc = list(range(base, base + draw(lengths(grid))))
        base += 1000
        ns = draw(st.sampled_from([None, "x"]))
        group = []
        for b in range(draw(st.integers(1, 4))):
            suffix = draw(st.integers(0, 200))  # 0: a duplicate of the bare document
            group.append((f"d{d}b{b}", doc + list(range(base, base + suffix)), ns))
            base += 300
        docs.append(group)
    for u in range(draw(st.integers(0, 3))):
        docs.append([(f"u{u}", list(range(base, base + draw(st.integers(1, 600)))), None)])
        base += 1000
    if draw(st.booleans()):  # siblings back to back, or any order
        reqs = [r for g in draw(st.permutations(docs)) for r in g]
    else:
        reqs = draw(st.permutations([r for g in docs for r in g]))
    arrivals = draw(st.lists(st.integers(0, 6), min_size=1, max_size=12))
    if sum(arrivals) < len(reqs):
        arrivals.append(len(reqs) - sum(arrivals))
    steps = len(arrivals) + 6
    action = st.one_of(st.none(), st.none(), st.tuples(
        st.sampled_from(["abort", "abort_parked", "retract", "retract"]), st.integers(0, 63)))
    actions = draw(st.lists(action, min_size=steps, max_size=steps))
    overlap = layout != "no_buffer" and draw(st.booleans())
    return Plan(
        requests=reqs, arrivals=arrivals, actions=actions,
        rows=draw(st.sampled_from([2, 3, 4, 16])),
        tokens=draw(st.sampled_from([128, 256, 512, 1024])),
        overlap=overlap,
        kv_extra=draw(st.sampled_from([0, 0, 512, 4096])),
        mamba_extra=draw(st.sampled_from([0, 0, 1, 2, 8, 64])),  # just above the minimum too
        theta=draw(st.sampled_from([None, None, 16, 200])),
        park_margin=draw(st.sampled_from([1, 1, 0, 2])),
        admission_ms=draw(st.sampled_from([None, None, 0.0, 1.0, 20.0])),
    )


def build(model: str, layout: str, policy: str, plan: Plan,
          record_shapes: bool = False, page: int = 1) -> Harness:
    from radixflow_sglang.adapter.runtime import RadixFlowConfig
    from radixflow_sglang.testing.kit import Kit, KitConfig

    longest = max(len(ids) for _, ids, _ in plan.requests)
    kv = longest + KV_SLACK + plan.kv_extra
    if page > 1:  # NOTE: the paged allocator hands out whole pages (one more for the decode)
        kv = -(-kv // page) * page + page
    kit_layout = "extra_buffer" if layout == "full" else layout
    slots = mamba_slots_for(kit_layout, plan.rows, plan.overlap) + plan.mamba_extra
    clock = VirtualClock()
    cfg = None
    if policy != "stock":
        # NOTE: radix must equal stock: no learned boundary (a RadixFlow publication) there
        cfg = RadixFlowConfig(policy=policy, theta=plan.theta, park_margin=plan.park_margin,
                              admission_ms=plan.admission_ms,
                              boundaries="declared" if policy == "radix" else "both")
    kit = Kit(KitConfig(model=model, layout=kit_layout, rows=plan.rows, tokens=plan.tokens,
                        kv_tokens=kv, mamba_slots=slots, overlap=plan.overlap,
                        page_size=page),
              policy=policy, radixflow_config=cfg, clock=clock, sleep=clock.sleep)
    return Harness(kit, clock, record_shapes=record_shapes)


def act(h: Harness, kind: str, pick: int) -> None:
    if kind == "retract":
        reqs = h.retractable()
        if reqs:
            h.retract(reqs[pick % len(reqs)])
        return
    waiting = h.waiting_rids()
    if kind == "abort_parked":
        rt = h.kit.runtime
        parked = rt.traversal.waits.rids() if rt is not None and rt.traversal else []
        waiting = [r for r in waiting if r in parked] or waiting
    if waiting:
        assert h.abort(waiting[pick % len(waiting)])


class ReuseWatch:
    """A parked consumer must get the state it waited for (issue 13 item 12: SGLang users see
    branch reuse silently drop to 0 when mamba slots run short). Before each step it notes
    the wait set's (producer, depth) per consumer; a consumer selected in that step must start
    from a ready prefix >= that depth, unless its producer was retracted meanwhile."""

    def __init__(self, h: Harness) -> None:
        self.kept = 0
        self.missed: list[tuple] = []
        self._retracted: set[str] = set()
        waits = h.kit.runtime.traversal.waits
        step, retract = h.step, h.retract

        def watched_retract(req) -> None:
            self._retracted.add(req.rid)
            retract(req)

        def watched_step():
            parked = {rid: (waits.get(rid).producer, waits.get(rid).depth)
                      for rid in waits.rids()}
            rnd = step()
            for rid in rnd.rids if rnd is not None else ():
                if rid not in parked or parked[rid][0] in self._retracted:
                    continue
                if rnd.prefix[rid] >= parked[rid][1]:
                    self.kept += 1
                else:
                    self.missed.append((rnd.index, rid, *parked[rid], rnd.prefix[rid]))
            return rnd

        h.step, h.retract = watched_step, watched_retract


def run(model: str, layout: str, policy: str, plan: Plan, record_shapes: bool = False,
        page: int = 1) -> tuple[Harness, dict[str, int]]:
    h = build(model, layout, policy, plan, record_shapes, page)
    rt = h.kit.runtime
    h.reuse = ReuseWatch(h) if rt is not None and rt.traversal is not None else None
    pending = list(plan.requests)
    for i, action in enumerate(plan.actions):
        n = plan.arrivals[i] if i < len(plan.arrivals) else len(pending)
        for rid, ids, ns in pending[:n]:
            h.submit(rid, ids, ns)
        pending = pending[n:]
        if action is not None:
            act(h, *action)
        h.clock.now += TICK_S
        h.step()
    assert not pending
    h.drain(max_steps=5_000, tick=TICK_S)
    leaks = h.finish()
    return h, leaks


def check(h: Harness, leaks: dict[str, int], layout: str) -> None:
    assert not h.violations, h.violations.examples
    assert leaks == NO_LEAK
    assert h.stale_cow_sources == 0
    assert h.stalled_chunks == 0  # an admitted request's next chunk runs every step
    rt = h.kit.runtime
    if rt is not None and rt.traversal is not None:
        # NOTE: the cost-aware rule re-decides every round: a consumer parked once may later be
        # admitted by a recompute decision (by design); the always-wait rule never does that.
        if not rt.spec.cost_aware:
            assert h.reuse.missed == []  # (round, consumer, producer, depth waited for, got)
        assert h.longest_wait_rounds <= rt.traversal.cfg.max_park_rounds
        assert rt.totals.parked_max_rounds <= rt.traversal.cfg.max_park_rounds
    if h.kit.runtime is not None:
        assert h.kit.runtime.grid.layout.value == layout


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("model, layout, page", CONFIGS)
def test_random_workloads_keep_every_invariant(model: str, layout: str, page: int,
                                               policy: str) -> None:
    @settings(settings.get_profile(PROFILE))
    @given(plan=plans(layout, load_geometry(model).grid))
    def prop(plan: Plan) -> None:
        h, leaks = run(model, layout, policy, plan, record_shapes=policy == "radix", page=page)
        check(h, leaks, layout)
        if policy == "radix":
            s, s_leaks = run(model, layout, "stock", plan, record_shapes=True, page=page)
            check(s, s_leaks, layout)
            assert h.shapes == s.shapes
            assert dict(h.aborted) == dict(s.aborted)

    prop()


# --- an admission hold must not stall work that was already admitted --------------------------


def chunk_then_arrival(policy: str) -> list[tuple[float, str | None, list[str] | None]]:
    """A (2,000 tokens) is admitted and cut into 512-token chunks; B arrives while A is cut.
    Returns (virtual ms, chunked request before the step, the step's rows) per step."""
    from radixflow_sglang.testing.kit import Kit, KitConfig

    clock = VirtualClock()
    k = Kit(KitConfig(model="qwen3.5-4b", tokens=512), policy=policy, clock=clock,
            sleep=clock.sleep)
    k.submit(k.req("A", list(range(10_000, 12_000))))
    log = []
    for i in range(8):
        if i == 2:
            k.submit(k.req("B", list(range(30_000, 30_100))))
        before = k.sched.chunked_req.rid if k.sched.chunked_req is not None else None
        rnd = k.step()
        log.append((round(clock.now * 1e3, 1), before, rnd.rids if rnd is not None else None))
        clock.now += TICK_S
    assert set(k.finished) == {"A", "B"} and k.leaks() == NO_LEAK
    return log


@pytest.mark.parametrize("policy", POLICIES)
def test_a_hold_never_stalls_an_admitted_chunked_request(policy: str) -> None:
    """Once, a timer hold returned no batch at all while a request was mid-chunk, so its next
    chunk waited out the deadline of a later arrival."""
    log = chunk_then_arrival(policy)
    stalled = [(ms, chunked) for ms, chunked, rows in log
               if chunked is not None and (rows is None or chunked not in rows)]
    assert stalled == [], log


# --- mamba slot pressure (issue 13 item 12) ---------------------------------------------------

TIGHT = [
    pytest.param("qwen3.5-4b", "extra_buffer", False, id="qwen3.5-4b-extra_buffer"),
    pytest.param("qwen3.5-4b", "extra_buffer", True, id="qwen3.5-4b-extra_buffer-overlap"),
    pytest.param("qwen3.5-4b", "no_buffer", False, id="qwen3.5-4b-no_buffer"),
    pytest.param("nemotron-9b", "extra_buffer", True, id="nemotron-9b-extra_buffer-overlap"),
]


def branchy_plan(overlap: bool, mamba_extra: int, tokens: int) -> Plan:
    """8 documents (700+ tokens) of 4 branches each plus an unrelated request, one question
    per step, 4 rows: every round forks or parks, and published states compete for slots."""
    reqs, base = [], 100_000
    for d in range(8):
        doc = list(range(base, base + 700 + 37 * d))
        base += 5000
        for b in range(4):
            reqs.append((f"d{d}b{b}", doc + list(range(base, base + 40 + 7 * b)), None))
            base += 100
        reqs.append((f"u{d}", list(range(base, base + 200 + 50 * d)), None))
        base += 1000
    return Plan(requests=reqs, arrivals=[5] * 8, actions=[None] * 14, rows=4, tokens=tokens,
                overlap=overlap, kv_extra=8192, mamba_extra=mamba_extra)


@pytest.mark.parametrize("model, layout, overlap", TIGHT)
def test_a_mamba_pool_just_above_the_minimum_keeps_forks_parking_and_reuse(model, layout,
                                                                           overlap):
    """SGLang users report "Can not alloc mamba cache" crashes and branch reuse dropping to 0
    when mamba slots run short. At the minimum pool + 1 slot (harness.mamba_slots_for), forks
    and parking trigger neither: no allocation fails (SGLang asserts), every invariant and
    the reuse watch hold (no parked consumer starts below the depth it waited for), and
    every policy schedules exactly what it does with 64 slots more."""
    runs = {}
    for extra in (1, 64):
        # NOTE: chunked documents, and whole ones (no_buffer forks); at 512 radixflow's
        # siblings of a chunked producer park for its last chunk, so 256 is what fills the pool
        for tokens in (256, 512, 2048):
            plan = branchy_plan(overlap, extra, tokens)
            for policy in ("stock", "radixflow"):
                h, leaks = run(model, layout, policy, plan)
                check(h, leaks, layout)
                runs[extra, tokens, policy] = h
    for policy in ("stock", "radixflow"):
        tight = [runs[1, t, policy] for t in (256, 512, 2048)]
        assert max(h.peak_mamba_used - h.kit.cfg.mamba_slots for h in tight) >= -1  # ran full
    for tokens in (256, 512, 2048):
        for policy in ("stock", "radixflow"):
            tight, roomy = runs[1, tokens, policy], runs[64, tokens, policy]
            assert (tight.scheduled_tokens, tight.hit_tokens) == (roomy.scheduled_tokens,
                                                                  roomy.hit_tokens)
        assert (runs[1, tokens, "radixflow"].scheduled_tokens
                <= runs[1, tokens, "stock"].scheduled_tokens)
    parked = [runs[1, t, "radixflow"] for t in (256, 512, 2048)]
    assert sum(h.kit.runtime.totals.blocked for h in parked) > 0
    assert sum(h.kit.runtime.totals.forks for h in parked) > 0
    assert sum(h.reuse.kept for h in parked) > 0
