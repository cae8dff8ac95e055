"""Quiet scans (issue 11): a scan in which no Blocked candidate can wait runs SGLang's own scan
with the traversal's hooks off, and the twin charges it SGLang's host time.

- `never_waits` is sound: wherever it says so, `group_wait_wins` recomputes every candidate a
  scan of that queue could visit (random coefficients, queues, views, cases; the test fails if
  the bound drops a term the rule reads, e.g. the requests present or the host time).
- It is not vacuous: a 0.8B-class model's short four-branch questions are quiet, a long
  shared document is not, nor a queue the budget cannot take at once.
- On SGLang's real scheduler (kit): the short question's scan is quiet and admits exactly what
  stock admits; a long shared document still parks its siblings (hooks on).
"""

from __future__ import annotations

import random

import pytest

from eval.hostcost import HostCoef, HostCost
from radixflow_sglang.core.cost import (
    CostCoeffs,
    RoundView,
    WaitCase,
    group_wait_wins,
    never_waits,
)
from radixflow_sglang.testing.fixtures import toks
from radixflow_sglang.testing.kit import Round, ScanTiming

SMALL = CostCoeffs(8e-3, 2.8e-6, 1e-4, 0.0)  # qwen3.5-0.8b-like: cheap tokens, 8 ms a round
T, S = 8192, 64


def _view(rng: random.Random, c: CostCoeffs, lengths: list[int], running: int, budget: int,
          host: float, page: int, idle: float | None = None,
          decoding: int | None = None) -> tuple[WaitCase, RoundView]:
    """A candidate visit a scan of this queue could reach: the i-th queued request, some of
    those before it selected (each charged up to a page more than its length); where a wait
    may launch nothing (`idle`), some visits' waits do (RoundView.idle_wait_s). `running`
    rows take rows; `decoding` of them (default all) are delayed (ScanView)."""
    decoding = running if decoding is None else decoding
    q = len(lengths)
    i = rng.randrange(q)
    selected = rng.randint(0, i)
    charged = sum(lengths[j] + rng.randint(0, page - 1) for j in range(selected))
    length = lengths[i]
    depth = rng.randint(1, length - 1)
    ready = rng.randint(0, depth)
    view = RoundView(
        rows=selected, behind=q - selected + decoding, budget_left=budget - charged,
        demand_after=sum(lengths[i + 1:]), mean_extend=sum(lengths) / q,
        rows_left=S - running - selected, token_budget=T, row_budget=S,
        siblings=rng.randint(0, q - 1 - i), host_s=host,
        arrival_rate=rng.choice([0.0, 5.0, 500.0]),
        idle_wait_s=idle if rng.random() < 0.5 else None)
    case = WaitCase(ready, depth, length, rng.choice([1, 2]), rng.choice([0, 0, length - depth]))
    return case, view


def test_never_waits_is_sound() -> None:
    rng = random.Random(7)
    quiet = idle_quiet = 0
    for _ in range(4000):
        c = CostCoeffs(rng.uniform(0, 0.05), rng.uniform(0, 2e-5), rng.uniform(0, 1e-3),
                       rng.choice([0.0, rng.uniform(-1e-10, 1e-10)]))
        lengths = [rng.randint(2, rng.choice([200, 2000])) for _ in range(rng.randint(1, 12))]
        running = rng.randint(0, 8)
        decoding = rng.choice([None, rng.randint(0, running)])
        host = rng.choice([0.0, rng.uniform(0, 5e-3)])
        page = rng.choice([1, 16, 64])
        budget = rng.randint(T // 4, T)
        idle = rng.choice([None, rng.uniform(0, 5e-3), rng.uniform(0, 0.05)])
        if not never_waits(c, lengths, running, budget, S, host, page, idle, decoding):
            continue
        quiet += 1
        idle_quiet += idle is not None
        for _ in range(5):
            case, view = _view(rng, c, lengths, running, budget, host, page, idle, decoding)
            assert not group_wait_wins(c, case, view).wait, (c, case, view)
    assert quiet > 300 and idle_quiet > 100  # the property was exercised, both floors


def test_short_questions_on_a_small_model_are_quiet() -> None:
    assert never_waits(SMALL, [380] * 4, 0, T, S, 0.0, 64)


def test_a_wait_that_may_launch_nothing_lowers_the_floor() -> None:
    """With a forward in flight and nothing decoding next a wait may cost only a host pass
    (tests/test_idle_wait.py): a 1,000-token question is no longer quiet there."""
    assert never_waits(SMALL, [1000] * 2, 0, T, S, 0.0, 64)
    assert not never_waits(SMALL, [1000] * 2, 0, T, S, 0.0, 64, idle_wait_s=0.002)


@pytest.mark.parametrize("lengths, running, budget", [
    ([6000] * 2, 0, T),  # a long shared document: waiting may win
    ([380] * 40, 0, T),  # more than the round takes: a recompute displaces queued work
    ([380] * 4, 62, T),  # no rows to spare
    ([380] * 4, 0, 1000),  # a budget left short by a chunk or decode rows
])
def test_not_quiet_where_a_wait_could_win(lengths, running, budget) -> None:
    assert not never_waits(SMALL, lengths, running, budget, S, 0.0, 64)


def test_the_bound_counts_every_request_present() -> None:
    """Each recompute delays every request present: more requests, not quiet."""
    assert never_waits(SMALL, [380] * 4, 0, T, S, 0.0, 1)
    assert not never_waits(SMALL, [380] * 4, 4, T, S, 0.0, 1)


def test_rows_a_result_in_flight_finishes_are_rows_not_delay() -> None:
    """Under overlap the last prefill's requests are in the scan's running batch until their
    results land: they take rows (SGLang's limit counts them) but a request whose result in
    flight is its last is not delayed by this round (adapter/reqs.py `decoding`)."""
    assert never_waits(SMALL, [380] * 4, 4, T, S, 0.0, 1, decoding=0)
    assert not never_waits(SMALL, [380] * 4, 62, T, S, 0.0, 1, decoding=0)


def _round4() -> Round:
    rids = ["a", "b", "c", "d"]
    return Round(0, rids, dict.fromkeys(rids, 10), dict.fromkeys(rids, 0), dict.fromkeys(rids),
                 None)


def test_a_quiet_scan_is_charged_its_own_coefficients() -> None:
    native, trav = HostCoef(1e-3, 0.0, 4e-4), HostCoef(1e-3, 0.0, 7e-4, 7e-4)
    quiet = HostCoef(1e-3, 0.0, 5e-4)
    fn = HostCost(native, trav, source="test", quiet=quiet).host_fn("radixflow")
    assert fn(_round4(), ScanTiming(4, 0.0, 4, quiet=True)) == pytest.approx(quiet(4, 4))
    assert fn(_round4(), ScanTiming(4, 0.0, 4)) == pytest.approx(trav(4, 4))
    # NOTE: without a fitted quiet term: SGLang's own scan; stock never has quiet scans
    bare = HostCost(native, trav, source="test")
    assert bare.host_fn("radixflow")(_round4(), ScanTiming(4, 0.0, 4, quiet=True)) == \
        pytest.approx(native(4, 4))


def test_the_fit_charges_quiet_scans_apart() -> None:
    """Quiet rounds fitted on their own: their excess over stock is not the traversal's."""
    from random import Random

    from eval.hostfit import Rounds, fit_rounds

    rng = Random(4)
    x = [(v, n, 0) for v in (1, 2, 3, 5, 8, 13) for n in (1, 2, 4) if n <= v]

    def rounds(coefs: list[HostCoef], xs: list) -> list[list[float]]:
        return [[c(*r) * (1 + rng.uniform(-0.03, 0.03)) for c, r in zip(coefs, xs, strict=True)]
                for _ in range(3)]

    native, trav, quiet = (HostCoef(1e-3, 1e-4, 3e-4), HostCoef(1e-3, 1e-4, 6e-4),
                           HostCoef(1e-3, 1e-4, 3.5e-4))
    stock = Rounds(x, rounds([native] * len(x), x))
    rf = Rounds(x + x, rounds([trav] * len(x) + [quiet] * len(x), x + x),
                [False] * len(x) + [True] * len(x))
    n, t, q = fit_rounds({"stock": stock, "radixflow": rf})
    assert t.s2 == pytest.approx(6e-4, rel=0.1)
    assert q.s2 == pytest.approx(3.5e-4, rel=0.1)


# --- on SGLang's real scheduler ----------------------------------------------------------------

DOC = list(range(10_000, 10_320))


def _question(k, tag: str, doc: list[int]) -> list:
    return [k.req(f"{tag}{j}", doc + [20 + j] * 24) for j in range(4)]


def test_a_short_question_scans_quietly_and_admits_what_stock_admits(make_kit) -> None:
    rounds = {}
    for policy in ("stock", "radixflow"):
        k = make_kit("qwen3.5-0.8b", "extra_buffer", policy)
        if k.runtime is not None:
            k.runtime.use_prior(SMALL)  # NOTE: the kit's runtime starts from the generic prior
        k.submit(*_question(k, "q", DOC))
        k.step()
        r = k.rounds[-1]
        rounds[policy] = (sorted(r.rids), r.extend, r.prefix, r.track)
        if policy == "radixflow":
            assert k.last_scan.quiet and k.runtime.stats.quiet
            assert k.runtime.summary()["quiet_scans"] == 1
            assert k.runtime.records.parked() == []
    assert rounds["radixflow"] == rounds["stock"]


def test_a_long_shared_document_keeps_the_hooks_on(make_kit) -> None:
    k = make_kit("qwen3.5-4b", "extra_buffer", "radixflow")
    k.runtime.use_prior(SMALL)
    doc = list(range(10_000, 16_000))
    k.submit(*_question(k, "q", doc))
    k.step()
    assert not k.last_scan.quiet and not k.runtime.stats.quiet
    assert k.runtime.summary()["quiet_scans"] == 0
    assert k.runtime.records.parked()  # its siblings wait for the first one's document state


def test_a_trace_numbers_quiet_and_traversal_rounds_by_one_count(make_kit, tmp_path) -> None:
    """A quiet scan skips the traversal, whose own round count then lags the scans: the trace's
    round events carry the scan's number, as its decide and forward events do (eval/calibrate.py
    orders rounds and matches selections by it)."""
    import json

    from radixflow_sglang.config import RadixFlowConfig

    trace = tmp_path / "t.jsonl"
    k = make_kit("qwen3.5-4b", "extra_buffer", "radixflow",
                 radixflow_config=RadixFlowConfig(policy="radixflow", trace=str(trace)))
    k.runtime.use_prior(SMALL)
    k.submit(*_question(k, "q", DOC))
    k.step()
    assert k.runtime.stats.quiet
    k.submit(*_question(k, "d", list(range(10_000, 16_000))))
    k.step()
    assert not k.runtime.stats.quiet and k.runtime.records.parked()
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    rounds = [(e["round"], e["quiet"]) for e in events if e["event"] == "round"]
    assert rounds == [(1, True), (2, False)]
    decided = {e["round"] for e in events if e["event"] == "decide"}
    assert decided == {2}


# --- unshared scans (adapter/quiet.py `sharing`, rule `unshared_scan`) -----------------------


def _stream(rng: random.Random, k, steps: int, system: list[int] = ()) -> list[list]:
    """Arrivals per step: unrelated prompts (each its own first block), documents' questions
    (siblings: a shared first block), and now and then a continuation of an earlier prompt;
    each after `system` (a system prompt: every first block shared)."""
    docs = [list(system) + list(range(100_000 * (d + 1), 100_000 * (d + 1) + rng.randint(300,
                                                                                        3000)))
            for d in range(4)]
    out, n, sent = [], 0, []
    for _ in range(steps):
        batch = []
        burst = rng.random() < 0.25  # NOTE: a document's questions together: siblings park
        for _ in range(3 if burst else rng.choice([0, 1, 1, 2])):
            n += 1
            kind = 0.6 if burst else rng.random()
            if kind < 0.5:
                ids = list(system) + [rng.randrange(1, 90_000)
                                      for _ in range(rng.randint(40, 9000))]
            elif kind < 0.85 or not sent:
                ids = rng.choice(docs) + [rng.randrange(1, 90_000) for _ in range(30)]
            else:
                ids = rng.choice(sent) + [rng.randrange(1, 90_000) for _ in range(50)]
            sent.append(ids)
            batch.append(k.req(f"r{n}", ids, max_new_tokens=rng.choice([1, 4])))
        out.append(batch)
    return out


def _schedule(seed: int, layout: str, overlap: bool, ablate=(),
              system: list[int] = ()) -> tuple[list, dict]:
    from radixflow_sglang.core.reasons import ablating
    from radixflow_sglang.testing.kit import Kit, KitConfig
    from radixflow_sglang.testing.loop import VirtualClock

    clock = VirtualClock()
    with ablating(ablate):
        k = Kit(KitConfig(model="qwen3.5-4b", layout=layout, overlap=overlap), policy="radixflow",
                clock=clock, sleep=clock.sleep)
        rounds = []
        for batch in _stream(random.Random(seed), k, 14, system):
            k.submit(*batch)
            clock.now += 0.01
            rnd = k.step()
            rounds.append(rnd)
        rounds += k.drain()
        reasons = k.runtime.summary()["reasons"]
    sched = [(r.rids, r.extend, r.prefix, r.chunked) for r in rounds
             if r is not None and r.mode == "prefill"]
    return sched, reasons


@pytest.mark.parametrize("layout,overlap", [("extra_buffer", True), ("extra_buffer", False),
                                            ("no_buffer", False)])
def test_an_unshared_scan_admits_what_the_hooks_would(layout, overlap) -> None:
    """Turned off where nothing can be Blocked, the hooks change no decision: the same prefill
    rounds (rows, extends, ready prefixes, chunks) with the rule as with it ablated, on
    streams that mix unrelated prompts, waiting siblings and continuations."""
    _hooks_off_changes_nothing("unshared_scan", layout, overlap)


def _hooks_off_changes_nothing(rule: str, layout: str, overlap: bool,
                               system: list[int] = ()) -> None:
    """Three seeds' streams: the same prefill rounds with `rule` as with it ablated, and both
    paths ran (scans quiet by the rule, and parked siblings)."""
    from radixflow_sglang.core.reasons import RULES, Reason

    quiet = parked = 0
    whole = RULES[Reason(rule)].reason  # NOTE: a case is ablated with its rule
    for seed in range(3):
        with_rule, reasons = _schedule(seed, layout, overlap, system=system)
        without, off = _schedule(seed, layout, overlap, [whole], system=system)
        assert with_rule == without
        assert rule not in off
        quiet += reasons.get(rule, 0)
        parked += sum(n for r, n in reasons.items() if r in ("wait_wins", "always_wait",
                                                               "committed_wait"))
    assert quiet > 0 and parked > 0


def test_a_shared_first_block_keeps_the_hooks_on(make_kit) -> None:
    """Unrelated long prompts behind a continuing chunk scan unshared; a queued prompt that
    shares the continuing chunk's first block, or another queued one's, does not."""
    def first_scans(queue_after: list[list[int]]) -> str | None:
        k = make_kit("qwen3.5-4b", "extra_buffer", "radixflow")
        k.submit(k.req("long", list(range(1, 20_001))))
        k.step()  # NOTE: its first chunk; it continues as SGLang's chunked request
        k.submit(*[k.req(f"q{i}", ids) for i, ids in enumerate(queue_after)])
        k.step()
        return k.runtime.scan.quiet

    other = [list(range(50_000 + 4000 * i, 50_000 + 4000 * i + 3000)) for i in range(2)]
    assert first_scans(other) == "unshared_scan"
    assert first_scans(other + [list(range(1, 3001))]) is None  # the chunk's first block
    assert first_scans(other + [other[0][:100] + [7] * 50]) is None  # a queued one's


def test_unshared_scans_keep_the_chain_cache_bounded(make_kit) -> None:
    """An unshared scan hashes the queue's first blocks into the traversal's chain cache; its
    scans count as rounds of that cache, so a server that only ever scans unshared keeps the
    last few scans' chains, not every request's."""
    k = make_kit("qwen3.5-4b", "extra_buffer", "radixflow")
    k._forget = lambda rid: None  # NOTE: as a server: no completion hook forgets a request
    for i in range(40):
        k.submit(k.req(f"u{i}", toks(10_000 * (i + 1), 3000)))
        k.step()
    k.drain()
    assert k.runtime.summary()["reasons"].get("unshared_scan", 0) >= 40
    assert len(k.runtime.traversal.chains) <= k.runtime.traversal.chains.keep + 1


# --- covered scans (adapter/quiet.py `covered`, rule `covered_scan`) --------------------------


@pytest.mark.parametrize("layout,overlap", [("extra_buffer", True), ("extra_buffer", False),
                                            ("no_buffer", False)])
def test_a_covered_scan_admits_what_the_hooks_would(layout, overlap) -> None:
    """Every request after one system prompt (no scan is unshared): where what the queue
    shares is ready already the hooks go off, and they change no decision: the same prefill
    rounds with the rule as with it ablated; documents' siblings still park."""
    _hooks_off_changes_nothing("covered_scan", layout, overlap, list(range(400_000, 401_024)))


def _queued_behind(make_kit, system: list[int], queue: list[list[int]], core: str = "python"):
    """An extra_buffer kit whose tree holds `system`'s state (two earlier prompts forked after
    it: SGLang publishes the fork's grid floor), with `queue` submitted, not yet scanned."""
    k = make_kit("qwen3.5-4b", "extra_buffer", "radixflow", tree_core=core)
    for i in range(2):
        k.submit(k.req(f"s{i}", system + toks(500_000 + 1000 * i, 300)))
        k.drain()
    reqs = [k.req(f"q{i}", ids) for i, ids in enumerate(queue)]
    k.submit(*reqs)
    return k, reqs


def _quiet_after(make_kit, system: list[int], queue: list[list[int]]) -> str | None:
    k, _ = _queued_behind(make_kit, system, queue)
    k.step()
    return k.runtime.scan.quiet


def test_sharing_past_the_ready_prefix_keeps_the_hooks_on(make_kit) -> None:
    """Two queued prompts behind a cached system prompt: covered while they share only it; not
    when they also share a document past it (its state is not ready: one could wait)."""
    system = list(range(400_000, 401_024))
    doc = toks(600_000, 2000)
    assert _quiet_after(make_kit, system, [system + toks(700_000, 3000),
                                           system + toks(710_000, 3000)]) == "covered_scan"
    assert _quiet_after(make_kit, system, [system + doc + toks(720_000, 50),
                                           system + doc + toks(730_000, 50)]) is None


TEMPLATE = [151_644, 872, 198, 151_645, 198]  # NOTE: chat-template text after a system prompt


@pytest.mark.parametrize("overlap", [True, False])
def test_a_chat_template_fork_is_covered_and_admits_what_the_hooks_would(overlap) -> None:
    """extra_buffer: every prompt shares a system prompt and a few template tokens past it, so
    the fork lies a few tokens past the grid, and SGLang's state sits at the grid floor: within
    theta of the fork, nothing can be Blocked there. Covered, and the same prefill rounds with
    the rule as with it ablated."""
    _hooks_off_changes_nothing("covered_scan", "extra_buffer", overlap,
                               list(range(400_000, 401_024)) + TEMPLATE)


@pytest.mark.parametrize("core", ["python", "rust"])
def test_a_state_within_theta_of_the_fork_covers_the_scan(make_kit, core) -> None:
    """Two queued prompts behind a cached system prompt and template tokens: the state nearest
    their fork is at the grid floor, not at the fork; covered while the gap is below theta,
    not when a document past it is shared too. Both of SGLang's tree cores."""
    from radixflow_sglang.adapter.boundary import state_near
    from radixflow_sglang.adapter.reqs import req_tokens

    system = list(range(400_000, 401_024)) + TEMPLATE
    k, reqs = _queued_behind(make_kit, system, [system + toks(700_000, 3000),
                                                system + toks(710_000, 3000)], core)
    tree, fork, ids = k.sched.tree_cache, len(system), req_tokens(reqs[0])
    assert not state_near(tree, reqs[0], ids, fork, 1, True)  # NOTE: no state at the fork
    assert state_near(tree, reqs[0], ids, fork, k.runtime.traversal.cfg.theta, True)
    k.step()
    assert k.runtime.scan.quiet == "covered_scan"
    doc = toks(600_000, 2000)
    k, _ = _queued_behind(make_kit, system, [system + doc + toks(720_000, 50),
                                             system + doc + toks(730_000, 50)], core)
    k.step()
    assert k.runtime.scan.quiet is None


@pytest.mark.parametrize("core", ["python", "rust"])
def test_a_state_the_queue_leaves_the_path_before_covers_nothing(make_kit, core) -> None:
    """A cached prompt's end state lies within theta of the queued requests' shared prefix,
    but they leave its path 20 tokens before it (inside the node that ends there): none of
    them can resume from it, their ready prefix is 0, so the scan is not covered (a covered
    check that read the node's end without its match let such a group's siblings recompute
    where the hooks parked them: mix 4B extra_buffer with overlap, question 9)."""
    from radixflow_sglang.adapter.boundary import state_near
    from radixflow_sglang.adapter.reqs import req_tokens

    doc = toks(800_000, 1000)
    k = make_kit("qwen3.5-4b", "no_buffer", "radixflow", tree_core=core)
    k.submit(k.req("cached", doc))
    k.drain()  # NOTE: no_buffer: its state at its end, 1000
    shared = doc[:980] + toks(900_000, 40)
    reqs = [k.req(f"q{i}", shared + toks(910_000 + 1000 * i, 300)) for i in range(2)]
    k.submit(*reqs)
    theta = k.runtime.traversal.cfg.theta
    assert not state_near(k.sched.tree_cache, reqs[0], req_tokens(reqs[0]), len(shared),
                          theta, True)
    probe = k.req("probe", doc + [1])  # NOTE: on the cached path, the state is found
    assert state_near(k.sched.tree_cache, probe, req_tokens(probe), 1000, theta, True)
    k.step()
    assert k.runtime.scan.quiet is None
