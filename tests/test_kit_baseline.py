"""Foundation baseline: what SGLang 0.5.23 itself does, on its real classes in the CPU kit.

These pin the mechanics RadixFlow is built on (reference notes, sections 1.3, 1.5, 2.2 and 6):
same-round consumers recompute a shared document, a producer publishes near its own end, a
later sibling's ready prefix versus its token match, and the scan's early stop. Depths are
computed from the model's grid G, never typed in.
"""

from __future__ import annotations

import inspect
import textwrap
from array import array

import pytest

DOC = list(range(1000, 3000))  # 2,000 shared tokens (not a multiple of 64 or 128)
HYBRID = [("qwen3.5-4b", "extra_buffer"), ("qwen3.5-4b", "no_buffer"),
          ("nemotron-9b", "extra_buffer")]


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def match(kit, ids, namespace=None):
    """The cache's own view: (ready length, longest token match, mamba branching seqlen)."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    res = kit.pools.cache.match_prefix(
        MatchPrefixParams(key=RadixKey(array("q", ids), extra_key=namespace)))
    return res.device_prefix_len, res.full_kv_hit_length, res.mamba_branching_seqlen


def probe(kit, rid, ids):
    """A request's own match, as the scan would do it but without copy-on-write."""
    req = kit.req(rid, ids)
    req.init_next_round_input(kit.pools.cache, cow_mamba=False)
    assert not req.kv.holds_mamba and req.kv.mamba_cow_src_index is None  # nothing to release
    return req


def published_depth(kit, ids) -> int:
    """Depth of the deepest usable state on `ids`' path (probe one token past its end)."""
    return match(kit, list(ids) + [7])[0]


@pytest.fixture(scope="module")
def grid():
    from radixflow_sglang.geometry import load_geometry

    return lambda model: load_geometry(model).grid


# --- (1) same-round consumer --------------------------------------------------------------------


@pytest.mark.parametrize("model, layout", HYBRID + [("qwen3-8b", "extra_buffer")])
def test_same_round_consumer_recomputes_the_document(make_kit, model, layout):
    k = make_kit(model, layout, "stock")
    p, a = DOC + toks(5000, 100), DOC + toks(6000, 120)
    k.submit(k.req("P", p), k.req("A", a))
    rnd = k.step()
    assert rnd.rids == ["P", "A"]  # one round: nothing in SGLang makes A wait
    assert rnd.prefix == {"P": 0, "A": 0}  # A matches the old tree: ready prefix 0
    assert rnd.scheduled_tokens == len(p) + len(a)  # the document is computed twice
    assert rnd.chunked is None
    assert k.drain() == [] and k.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


# --- (2) where the producer publishes, and what a later sibling matches ---------------------


@pytest.mark.parametrize("model, layout", HYBRID)
def test_producer_publishes_near_its_own_end_not_at_the_fork(make_kit, grid, model, layout):
    g = grid(model)
    k = make_kit(model, layout, "stock")
    p, a = DOC + toks(5000, 100), DOC + toks(6000, 120)
    k.submit(k.req("P", p), k.req("A", a))
    rnd = k.step()
    assert not k.sched.result_queue  # completed through the result path
    if layout == "extra_buffer":
        assert rnd.track["P"] == len(p) // g * g
        assert rnd.track["A"] == len(a) // g * g
        assert published_depth(k, p) == len(p) // g * g
        assert published_depth(k, a) == len(a) // g * g
    else:
        assert published_depth(k, p) == len(p)  # no_buffer: the extend end
        assert published_depth(k, a) == len(a)
    # the shared document node holds no state: a later sibling's ready prefix is 0
    b_ids = DOC + toks(7000, 80)
    ready, token_match, branching = match(k, b_ids)
    assert (ready, token_match) == (0, len(DOC))
    assert branching == len(DOC) // g * g
    b = probe(k, "B", b_ids)
    assert b.prefix_len == 0 and b.mamba_branching_seqlen == len(DOC) // g * g
    # B recomputes everything; with extra_buffer it publishes the branch point, so only the
    # third sibling C hits (no_buffer: states only at sequence ends, C still gets 0)
    k.submit(k.req("B", b_ids))
    rb = k.step()
    assert rb.prefix == {"B": 0} and rb.extend == {"B": len(b_ids)}
    c_ids = DOC + toks(8000, 50)
    k.submit(k.req("C", c_ids))
    rc = k.step()
    if layout == "extra_buffer":
        assert rb.track["B"] == len(DOC) // g * g
        assert rc.prefix == {"C": len(DOC) // g * g}
    else:
        assert rc.prefix == {"C": 0}
    assert rc.extend["C"] == len(c_ids) - rc.prefix["C"]
    assert k.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_full_attention_sibling_hits_the_whole_document(make_kit):
    k = make_kit("qwen3-8b", "extra_buffer", "stock")
    k.submit(k.req("P", DOC + toks(5000, 100)))
    k.drain()
    b = probe(k, "B", DOC + toks(7000, 80))
    assert b.prefix_len == len(DOC)  # every page is reusable
    assert match(k, DOC + toks(7000, 80))[:2] == (len(DOC), len(DOC))


@pytest.mark.parametrize("model, layout", HYBRID)
def test_waiting_alone_does_not_help_a_fork(make_kit, model, layout):
    """A that waits until P alone has completed still gets ready 0 (no fork state)."""
    k = make_kit(model, layout, "stock")
    k.submit(k.req("P", DOC + toks(5000, 100)))
    k.drain()
    k.submit(k.req("A", DOC + toks(6000, 120)))
    assert k.step().prefix == {"A": 0}


@pytest.mark.parametrize("model, layout", HYBRID)
def test_prefix_commit_of_a_grid_length_document_hits(make_kit, grid, model, layout):
    g = grid(model)
    doc = toks(1000, 2048)  # a multiple of both 64 and 128
    assert len(doc) % g == 0
    k = make_kit(model, layout, "stock")
    k.submit(k.req("P", doc))
    k.drain()
    k.submit(k.req("A", doc + toks(6000, 120)))
    rnd = k.step()
    assert rnd.prefix == {"A": len(doc)} and rnd.extend == {"A": 120}
    # an exact repeat can match at most len - 1 tokens: ready 0
    k.submit(k.req("R", doc))
    assert k.step().prefix == {"R": 0}


def test_namespaces_do_not_share_cache(make_kit):
    k = make_kit("qwen3.5-4b", "extra_buffer", "stock")
    doc = toks(1000, 2048)
    k.submit(k.req("P", doc, namespace="tenant-1"))
    k.drain()
    assert match(k, doc + [5], namespace="tenant-1")[0] == len(doc)
    assert match(k, doc + [5], namespace="tenant-2")[:2] == (0, 0)
    assert match(k, doc + [5])[:2] == (0, 0)


# --- (3) the scan ends at its first non-CONTINUE outcome ------------------------------------


def visited(req) -> bool:
    return req.last_node is not None  # only init_next_round_input sets it


def test_scan_stops_at_no_token_although_a_later_request_fits(make_kit):
    k = make_kit("qwen3.5-4b", "extra_buffer", "stock", kv_tokens=1000)
    # R2 alone would fit the pool (it passes intake) but not beside R1: NO_TOKEN
    r1, r2, r3 = (k.req("R1", toks(10_000, 300)), k.req("R2", toks(20_000, 900)),
                  k.req("R3", toks(30_000, 100)))
    assert len(r1.origin_input_ids) + len(r3.origin_input_ids) < 1000  # R1 + R3 would fit
    k.submit(r1, r2, r3)
    batch = k.scan()
    assert [r.rid for r in batch.reqs] == ["R1"]
    assert visited(r2) and not visited(r3)  # R2: NO_TOKEN, the scan breaks before R3
    assert k.sched.running_batch.batch_is_full
    assert [r.rid for r in k.sched.waiting_queue] == ["R2", "R3"]
    assert not r2.kv.holds_mamba and r2.kv.mamba_cow_src_index is None  # reverted


def test_scan_stops_at_other_without_chunking(make_kit):
    k = make_kit("qwen3.5-4b", "extra_buffer", "stock", tokens=512)
    k.sched.chunked_prefill_size = None  # chunking off: an over-budget request is OTHER
    r1, r2, r3 = (k.req("R1", toks(10_000, 300)), k.req("R2", toks(20_000, 2000)),
                  k.req("R3", toks(30_000, 100)))
    assert 300 + 100 <= 512  # R3 fits the budget R1 leaves
    k.submit(r1, r2, r3)
    batch = k.scan()
    assert [r.rid for r in batch.reqs] == ["R1"]
    assert visited(r2) and not visited(r3)


def test_with_chunking_the_large_request_becomes_the_chunk_and_ends_the_scan(make_kit):
    k = make_kit("qwen3.5-4b", "extra_buffer", "stock", tokens=512)
    r1, r2, r3 = (k.req("R1", toks(10_000, 300)), k.req("R2", toks(20_000, 2000)),
                  k.req("R3", toks(30_000, 100)))
    k.submit(r1, r2, r3)
    rnd = k.step()
    assert rnd.rids == ["R1", "R2"] and rnd.chunked == "R2"
    assert rnd.extend == {"R1": 300, "R2": 512 - 300}
    assert not visited(r3)
    rounds = k.drain()
    assert sum(r.scheduled_tokens for r in rounds) + rnd.scheduled_tokens == 2400
    assert k.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_rows_limit_ends_the_scan(make_kit):
    k = make_kit("qwen3.5-4b", "extra_buffer", "stock", rows=2)
    reqs = [k.req(f"R{i}", toks(10_000 * (i + 1), 50)) for i in range(4)]
    k.submit(*reqs)
    rnd = k.step()
    assert rnd.rids == ["R0", "R1"]
    assert not visited(reqs[3])


# --- guards -------------------------------------------------------------------------------------


def test_version_guard_names_both_versions():
    from radixflow_sglang.adapter import REQUIRED_SGLANG, SGLangVersionError, check_sglang_version

    with pytest.raises(SGLangVersionError) as e:
        check_sglang_version("0.5.22")
    assert REQUIRED_SGLANG == "0.5.23"
    assert "0.5.22" in str(e.value) and "0.5.23" in str(e.value)
    assert isinstance(e.value, ImportError)
    assert check_sglang_version("0.5.23") == "0.5.23"
    assert check_sglang_version() == "0.5.23"  # the installed one


# The reviewed hooks of adapter/scan.py: (line index in the function's source, exact line).
# Every line naming RADIXFLOW must be here, in this order; a new or changed one fails the drift
# guard until it is reviewed (does it leave stock behaviour alone under `radix`?) and pinned.
SCAN_HOOKS = [
    (96, "    rf = self.radixflow  # RADIXFLOW: producers in flight (results not yet processed)"),
    (97, "    rf.begin_scan(self, adder)  # RADIXFLOW"),
    (108, "        rf.chunk_continued(self, self.chunked_req)  # RADIXFLOW: its chunk publishes "
          "too"),
    (133, "        # RADIXFLOW: Blocked requests park here, before LoRA, preemption or budget see "
          "them."),
    (134, "        if rf.park(self, req, adder):  # RADIXFLOW"),
    (135, "            continue  # RADIXFLOW: it keeps its queue position"),
    (136, "        if rf.defer_unmatched(self, req, adder):  # RADIXFLOW: DEFER's fast path, no "
          "match"),
    (137, "            continue  # RADIXFLOW"),
    (155, "        if rf.rows_kept(self, req, adder, candidate_beam_width, num_held_rows):  "
          "# RADIXFLOW"),
    (156, "            break  # RADIXFLOW: the row limit counts the rows this scan's parks keep"),
    (192, "        if rf.defer(self, req, adder):  # RADIXFLOW: would be cut into a chunk it must "
          "not be"),
    (193, "            continue  # RADIXFLOW"),
    (208, "        rf.after_add(self, req, adder, res)  # RADIXFLOW: a selected request is a "
          "producer"),
    (238, "    rf.end_scan(self, adder)  # RADIXFLOW: round counters"),
]
# RadixFlowScheduler's two entry points, as reviewed: the hold wraps upstream's
# get_new_batch_prefill (its PrefillDelayer collective runs on every pass) and a held pass skips
# the scan the way upstream's empty queue does.
OVERRIDE = '''\
    def get_new_batch_prefill(self, running_batch) -> NextBatchPlan:
        if self.chunked_req is None and health_checks_only(self.waiting_queue):
            # NOTE: a /health poll's 1-token prefill is not scheduling work: SGLang's own
            # scan runs it, and no RadixFlow counter, trace event or cost sample sees it
            self.radixflow.health_checks += 1
            self._radixflow_native = True
            try:
                return super().get_new_batch_prefill(running_batch)
            finally:
                self._radixflow_native = False
        # NOTE: a held pass still goes through upstream's get_new_batch_prefill, so the
        # PrefillDelayer runs its per-pass all-gather (finalize negotiates "not prefillable",
        # as for an empty queue): under DP attention every rank joins it whatever it holds.
        self._radixflow_held = self.radixflow.hold(self, running_batch)
        try:
            return super().get_new_batch_prefill(running_batch)
        finally:
            self._radixflow_held = False
'''
RAW_WRAPPER = '''\
    def _get_new_batch_prefill_raw(self, prefill_delayer_single_pass, running_batch):
        if self._radixflow_native:
            return super()._get_new_batch_prefill_raw(prefill_delayer_single_pass,
                                                      running_batch)
        if self._radixflow_held:
            return None, running_batch  # held: no scan this pass (as upstream's empty queue)
        t0 = time.perf_counter()
        ret, running_batch = get_new_batch_prefill_raw(self, prefill_delayer_single_pass,
                                                       running_batch)
        if ret is not None:
            # NOTE: the scan and batch preparation (prepare_for_extend runs in the scan): the
            # host time a round adds without overlap (core/cost.py RoundView.host_s)
            setattr(ret, _HOST, time.perf_counter() - t0)
        return ret, running_batch
'''
# The forward timer and the round-cost fit: both wrap upstream's method and call it unchanged.
RUN_BATCH = '''\
    def run_batch(self, batch, *args, **kwargs):
        """Upstream's run_batch, with a prefill forward's duration measured around it and every
        launch's time taken (a prefill round's wall period ends at the loop's next launch)."""
        self._radixflow_launched_at = self._radixflow_free_at = self._radixflow_wall()
        self.radixflow.roundcost.periods.launch(self._radixflow_launched_at,
                                                observed_prefill(batch))
        if not batch.forward_mode.is_extend():
            return super().run_batch(batch, *args, **kwargs)
        token = forward_timer.start(self, self._radixflow_wall)
        result = super().run_batch(batch, *args, **kwargs)
        forward_timer.stop(token, result)
        return result
'''
PROCESS_RESULT = '''\
    def process_batch_result(self, batch, result):
        ready = forward_timer.ready_at(result)
        out = super().process_batch_result(batch, result)
        # NOTE: the loop went on from here once the result was ready and the launch before it
        # was made (under overlap the next batch's); a GPU's ready time is not known here
        self._radixflow_free_at = None if ready is None else max(ready,
                                                                 self._radixflow_launched_at)
        if observed_prefill(batch):
            # NOTE: every rank processes the same batches in the same order, so the broadcast
            # inside observe_forward runs on every rank, in order (one per prefill round).
            rows, tokens, pairs = forward_timer.batch_shape(batch)
            host = getattr(batch, _HOST, None)
            # NOTE: set on every rank's copy of this batch, or on none. A simulated forward's
            # time is the cost model's, so the CPU box's scan time is not fed beside it; the
            # loop's wall period below is, on every executor (recorded in the trace)
            if forward_timer.simulated(result):
                host = None
            # NOTE: the previous prefill round's period: its next launch (this round's, at the
            # latest) came before this result, with or without overlap
            k, self._radixflow_processed = self._radixflow_processed, self._radixflow_processed + 1
            p, resumed = self.radixflow.roundcost.periods.take(k - 1)
            period = (p, self._radixflow_loop_forward, resumed)
            self._radixflow_loop_forward = forward_timer.loop_seconds(result)
            self.radixflow.observe_forward(rows, tokens, forward_timer.seconds(result), host,
                                           period, pairs=pairs, forward_iter=batch.forward_iter)
        return out
'''
# A pass that runs nothing ends the open prefill round's wall period (core/cost.py LaunchPeriods);
# every pass reads the loop's pass since its last launch or result (traced only).
NEXT_BATCH = '''\
    def get_next_batch_to_run(self, *args, **kwargs):
        if self._radixflow is not None:
            # NOTE: the loop's pass: from its last launch or processed result (whichever came
            # later) to this pass (traced, never decided on; the twin's loop pass)
            free, self._radixflow_free_at = self._radixflow_free_at, None
            self._radixflow.roundcost.pass_s = (None if free is None
                                                else self._radixflow_wall() - free)
        plan = super().get_next_batch_to_run(*args, **kwargs)
        if plan.batch_to_run is None and self._radixflow is not None:
            # NOTE: a wait is no round's cost; with work queued, the pass after a result
            self._radixflow.roundcost.periods.idle(waiting=bool(self.waiting_queue))
        return plan
'''
# A retracted request re-enters the queue: RadixFlow forgets it, then upstream's method runs.
REQUEUE = '''\
    def _add_request_to_queue(self, req, is_retracted: bool = False):
        """Upstream's, after forgetting what RadixFlow knew of a request that re-enters the
        queue after a retraction: it is a new candidate, re-matched, with a fresh wait bound.
        NOTE: retract_decode passes is_retracted; priority preemption and retract-all re-queue
        through a bare call, their requests marked by reset_for_retract (req.is_retracted)."""
        if (is_retracted or req.is_retracted) and self._radixflow is not None:
            self._radixflow.records.forget(req.rid)
        return super()._add_request_to_queue(req, is_retracted)
'''
# The Scheduler methods RadixFlowScheduler replaces (anything else is SGLang's own).
OVERRIDDEN = {"_get_new_batch_prefill_raw", "get_internal_state", "get_new_batch_prefill",
              "run_batch", "process_batch_result", "_add_request_to_queue",
              "get_next_batch_to_run", "_release_aborted_request"}


def _drop_hooks(body: list, marked: set[int], errors: list[str]) -> list:
    """`body` without the statements that start on a marked line (recursively); a hook that
    runs on into unmarked lines (opens a block or a string) is an error."""
    import ast

    out = []
    for node in body:
        if node.lineno - 1 in marked:
            lines = set(range(node.lineno - 1, node.end_lineno))
            if not lines <= marked:
                errors.append(f"hook at line {node.lineno - 1} spans unmarked lines "
                              f"{sorted(lines - marked)[:5]}")
            continue
        for name in ("body", "orelse", "finalbody", "handlers"):
            sub = getattr(node, name, None)
            if isinstance(sub, list) and sub and isinstance(sub[0], ast.AST):
                setattr(node, name, _drop_hooks(sub, marked, errors))
        out.append(node)
    return out


def drift_errors(ours: str, theirs: str, hooks: list[tuple[int, str]]) -> list[str]:
    """Why `ours` (scan.py's function source) is not upstream's `theirs` plus exactly `hooks`:
    (1) the marked lines with their positions must be the reviewed list; (2) the unmarked
    lines must be upstream's, verbatim; (3) upstream's syntax tree must be ours with the hook
    statements removed, and every hook must be whole statements on marked lines."""
    import ast

    errors = []
    lines = ours.splitlines()
    marked = [(i, line) for i, line in enumerate(lines) if "RADIXFLOW" in line]
    if marked != hooks:
        errors.append(f"marked lines are not the reviewed hooks: new/changed "
                      f"{[m for m in marked if m not in hooks][:3]}, missing "
                      f"{[h for h in hooks if h not in marked][:3]}")
    kept = [line for line in lines if "RADIXFLOW" not in line]
    kept[0] = kept[0].replace("def get_new_batch_prefill_raw(", "def _get_new_batch_prefill_raw(")
    want = theirs.rstrip().splitlines()
    if kept != want:
        pairs = zip(kept, want, strict=False)
        at = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(kept), len(want)))
        errors.append(f"unmarked lines differ from upstream at kept line {at}")
    try:
        fn = ast.parse(ours).body[0]
    except SyntaxError as e:
        return errors + [f"does not parse: {e}"]
    idx = {i for i, _ in marked}
    fn.body = _drop_hooks(fn.body, idx, errors)
    fn.name = "_get_new_batch_prefill_raw"
    comments = {i for i, line in marked if line.lstrip().startswith("#")}
    covered = set()
    for node in ast.walk(ast.parse(ours).body[0]):
        if isinstance(node, ast.stmt) and node.lineno - 1 in idx:
            covered |= set(range(node.lineno - 1, node.end_lineno))
    if idx - covered - comments:
        inside = sorted(idx - covered - comments)
        errors.append(f"marked lines inside an upstream statement: {inside}")
    if ast.dump(fn) != ast.dump(ast.parse(theirs).body[0]):
        errors.append("syntax tree minus the hooks differs from upstream's")
    return errors


def _sources() -> tuple[str, str]:
    import sglang.srt.managers.scheduler as sched_mod

    from radixflow_sglang.adapter import scan

    ours = inspect.getsource(scan.get_new_batch_prefill_raw)
    theirs = textwrap.dedent(inspect.getsource(sched_mod.Scheduler._get_new_batch_prefill_raw))
    return ours, theirs


def test_scan_is_sglangs_own_plus_exactly_the_reviewed_hooks():
    """Drift guard: scan.py is SGLang 0.5.23's method verbatim plus the pinned hook lines."""
    ours, theirs = _sources()
    assert ours.splitlines()[0] == "def get_new_batch_prefill_raw("
    assert drift_errors(ours, theirs, SCAN_HOOKS) == []


def _insert(src: str, after: str, *new: str) -> str:
    lines = src.splitlines()
    i = next(i for i, line in enumerate(lines) if after in line)
    return "\n".join(lines[: i + 1] + list(new) + lines[i + 1:]) + "\n"


def _mutants(ours: str) -> dict[str, str]:
    """Marked edits that change stock behaviour (issue 13 item 10) and that the old guard,
    which only dropped every marked line and compared the rest, let through."""
    lines = ours.splitlines()
    i = next(i for i, line in enumerate(lines) if "if res != AddReqResult.CONTINUE:" in line)
    j = next(j for j in range(i, len(lines)) if lines[j].strip() == "break")
    quoted = lines[:i] + ['        """  # RADIXFLOW'] + lines[i:j + 1] + [
        '        """  # RADIXFLOW'] + lines[j + 1:]
    return {
        # every rejected request looks admitted: the scan never breaks
        "continue": _insert(ours, "rf.after_add(",
                            "        res = AddReqResult.CONTINUE  # RADIXFLOW"),
        # upstream's rejection block becomes a string expression
        "quoted": "\n".join(quoted) + "\n",
        # marked brackets swallow an unmarked upstream call: the match never runs
        "bracket": ours.replace(
            "\n        req.init_next_round_input(self.tree_cache)\n",
            "\n        _ = (  # RADIXFLOW\n        req.init_next_round_input(self.tree_cache)\n"
            "        ) if False else None  # RADIXFLOW\n", 1),
        # a reviewed hook edited in place
        "edited": ours.replace("if rf.park(self, req, adder):  # RADIXFLOW",
                               "if rf.park(self, req, adder) or True:  # RADIXFLOW"),
    }


def _old_guard_passes(ours: str, theirs: str) -> bool:
    kept = [line for line in ours.splitlines() if "RADIXFLOW" not in line]
    kept[0] = "def _get_new_batch_prefill_raw("
    return "\n".join(kept).rstrip() == theirs.rstrip()


@pytest.mark.parametrize("kind", ["continue", "quoted", "bracket", "edited"])
def test_drift_guard_rejects_marked_lines_that_change_stock(kind):
    ours, theirs = _sources()
    bad = _mutants(ours)[kind]
    assert bad != ours
    assert _old_guard_passes(bad, theirs)  # the gap the pinned list closes
    errors = drift_errors(bad, theirs, SCAN_HOOKS)
    assert any("not the reviewed hooks" in e for e in errors), errors
    # re-pinning the new marked lines without review still fails where a hook is not a whole
    # statement of its own (a string or brackets around upstream lines)
    repinned = [(i, line) for i, line in enumerate(bad.splitlines()) if "RADIXFLOW" in line]
    errors = drift_errors(bad, theirs, repinned)
    if kind in ("quoted", "bracket"):
        assert any("syntax tree" in e for e in errors), errors
    else:
        assert errors == []  # only the reviewed list stands between these and a merge


def test_the_get_new_batch_prefill_override_is_the_reviewed_one():
    """The override is ours, not a copy: pin its text and which Scheduler methods we replace.
    NOTE: re-pin (after review) whenever the override changes."""
    import sglang.srt.managers.scheduler as sched_mod

    from radixflow_sglang.adapter.scheduler import RadixFlowScheduler

    assert inspect.getsource(RadixFlowScheduler.get_new_batch_prefill) == OVERRIDE
    assert inspect.getsource(RadixFlowScheduler._get_new_batch_prefill_raw) == RAW_WRAPPER
    assert inspect.getsource(RadixFlowScheduler.run_batch) == RUN_BATCH
    assert inspect.getsource(RadixFlowScheduler.process_batch_result) == PROCESS_RESULT
    assert inspect.getsource(RadixFlowScheduler._add_request_to_queue) == REQUEUE
    assert inspect.getsource(RadixFlowScheduler.get_next_batch_to_run) == NEXT_BATCH
    replaced = {n for n, v in vars(RadixFlowScheduler).items()
                if callable(v) and hasattr(sched_mod.Scheduler, n)}
    assert replaced == OVERRIDDEN
    # upstream's method still reaches the scan through the attribute we replace
    upstream = inspect.getsource(sched_mod.Scheduler.get_new_batch_prefill)
    assert "self._get_new_batch_prefill_raw(" in upstream


def test_stock_is_sglangs_unmodified_class(make_kit):
    from sglang.srt.managers.scheduler import Scheduler

    from radixflow_sglang.adapter.scheduler import RadixFlowScheduler

    assert type(make_kit(policy="stock").sched) is Scheduler
    radix = make_kit(policy="radix").sched
    assert isinstance(radix, RadixFlowScheduler)
    assert radix._get_new_batch_prefill_raw.__func__ is not Scheduler._get_new_batch_prefill_raw
    assert radix.radixflow.traversal is None
    assert make_kit(policy="traversal").sched.radixflow.traversal is not None
