"""Test harness: a `Kit` plus bookkeeping and invariant checks, one scheduling step at a time.

Used by the soak (eval/soak.py, through the virtual-time loop of testing/loop.py), the property
tests and the bad-input tests. In virtual time: `VirtualClock` is the runtime's clock and sleep.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from radixflow_sglang.testing.loop import CompletionLog, VirtualClock

__all__ = ["CompletionLog", "Harness", "Violations", "VirtualClock", "mamba_slots_for"]


@dataclass
class Violations:
    """Invariant breaks: a count per kind and the first few messages."""

    count: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    keep: int = 20

    def add(self, kind: str, message: str) -> None:
        self.count[kind] += 1
        if len(self.examples) < self.keep:
            self.examples.append(f"{kind}: {message}")

    def __bool__(self) -> bool:
        return bool(self.count)

    def total(self) -> int:
        return sum(self.count.values())


class Harness:
    """Drives one Kit step by step and checks its invariants after every step.

    A mixed round's decode rows (`Round.decoding`, `KitConfig.mixed_chunk`) are decode steps:
    of requests that were running and had computed their prompt; they take rows and tokens of
    the round's budgets but no part in chunk chains, coverage or cache hits.

    `retract` mirrors SGLang's `release_req` for a request whose batch is in flight (overlap):
    the KV is released without insert, the request reset, and it is re-queued once its batch's
    result has been processed (as the scheduler re-queues retracted requests before the next
    scan). `abort` is `Kit.abort_waiting` (a queued request, held or parked included).
    """

    def __init__(self, kit: Any, clock: VirtualClock | None = None,
                 record_shapes: bool = False) -> None:
        self.kit = kit
        self.clock = clock
        self.completions = CompletionLog().install(kit)
        self.lengths: dict[str, int] = {}
        self.aborted: Counter[str] = Counter()
        self.retracted: list[tuple[Any, Any]] = []  # (req, its in-flight batch)
        self.retractions = 0
        self.violations = Violations()
        self.rows = kit.cfg.rows or kit.geometry.rows
        self.tokens = kit.cfg.tokens or kit.geometry.tokens
        rt = kit.runtime
        self.park_bound = (rt.traversal.cfg.max_park_rounds
                           if rt is not None and rt.traversal is not None else 0)
        self.longest_wait_rounds = 0  # most rounds any request was parked (its whole life)
        self.most_parked_rounds = 0  # most rounds parked before a selection (RequestStats)
        self.stale_cow_sources = 0
        self.stalled_chunks = 0
        self.scan_cpu_s: list[float] = []
        self.queue_lens: list[int] = []
        self.steps = 0
        self.rounds = 0
        self.scheduled_tokens = 0
        self.hit_tokens = 0
        self.peak_kv_used = 0
        self.peak_mamba_used = 0
        self.shapes: list[tuple] | None = [] if record_shapes else None
        self._end: dict[str, int] = {}  # rid -> prefix + extend after its last round
        self._ended: set[str] = set()  # completed or aborted before the current step
        self._seen = 0  # completions already moved into _ended
        self._kv_total = kit.pools.allocator.available_size()
        self._mamba_total = kit.mamba_free()
        self.decode_steps = 0
        # NOTE: --enable-mixed-chunk: prefill rounds that carried decode rows, and those rows
        self.mixed_rounds = self.mixed_decode_rows = 0
        self._running: set[str] = set()  # rids in the running batch when the step began
        self.decode_retractions = 0  # retract_decode's (the kit's own, under KV pressure)
        kit.on_scan = self._scanned
        kit.on_retract = self._decode_retracted

    # --- requests ------------------------------------------------------------------------------
    def submit(self, rid: str, ids: Sequence[int], namespace: str | None = None,
               **sampling: Any) -> Any:
        """`sampling`: Kit.req's max_new_tokens, output, ignore_eos."""
        if rid in self.lengths:
            raise ValueError(f"duplicate request id {rid!r}")
        req = self.kit.req(rid, ids, namespace, **sampling)
        self.lengths[rid] = len(ids)
        self.kit.submit(req)
        return req

    def waiting_rids(self) -> list[str]:
        return [r.rid for r in self.kit.sched.waiting_queue]

    def abort(self, rid: str) -> bool:
        """Abort a queued request; False (nothing done) when it is not queued any more."""
        if rid not in self.waiting_rids():
            return False
        self.kit.abort_waiting(rid)
        self.aborted[rid] += 1
        self._ended.add(rid)
        return True

    def retractable(self) -> list[Any]:
        """Requests of in-flight batches that SGLang could retract: not a continuing chunk
        (chunked requests are never in the running batch), not finished, not retracted."""
        sched = self.kit.sched
        out = []
        for batch, _ in sched.result_queue:
            for r in batch.reqs:
                if r is sched.chunked_req or r.finished() or r.is_retracted:
                    continue
                if r.inflight_middle_chunks > 0:
                    continue
                out.append(r)
        return out

    def retract(self, req: Any) -> None:
        from sglang.srt.mem_cache.common import release_kv_cache

        batch = next(b for b, _ in self.kit.sched.result_queue if req in b.reqs)
        release_kv_cache(req, self.kit.pools.cache, checkpoint=False)  # as release_req
        req.reset_for_retract()
        self.kit.drop_running(req)  # NOTE: as retract_decode, it leaves the running batch
        self.retracted.append((req, batch))
        self._end.pop(req.rid, None)  # it restarts from whatever the cache then holds
        # NOTE: it re-prefills its input and the ids it generated (with outputs > 1)
        self.lengths[req.rid] = len(req.origin_input_ids) + len(req.output_ids)
        self.retractions += 1

    def _decode_retracted(self, req: Any) -> None:
        """retract_decode sent it back: it re-prefills its input and the ids it generated."""
        self.lengths[req.rid] = len(req.origin_input_ids) + len(req.output_ids)
        self._end.pop(req.rid, None)
        self.decode_retractions += 1

    def _requeue(self) -> None:
        inflight = [b for b, _ in self.kit.sched.result_queue]
        keep = []
        for req, batch in self.retracted:
            if any(b is batch for b in inflight):
                keep.append((req, batch))
            else:
                # NOTE: through the scheduler's own door, as retract-all re-queues
                # (req.is_retracted set): RadixFlow forgets its park history there
                self.kit.sched._add_request_to_queue(req)
        self.retracted = keep

    # --- rounds -------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return self.kit.busy or bool(self.retracted)

    def _scanned(self, timing: Any) -> None:
        self.queue_lens.append(timing.queued)
        self.scan_cpu_s.append(timing.cpu_s)

    def step(self) -> Any:
        self._requeue()
        sched = self.kit.sched
        chunked = sched.chunked_req
        # NOTE: the requests a mixed round's decode rows may come from: the running batch and
        # the last batch, which get_next_batch_to_run merges into it before the scan
        self._running = {r.rid for b in (sched.running_batch, sched.last_batch)
                         if b is not None for r in b.reqs}
        rnd = self.kit.step()
        self.steps += 1
        self._requeue()
        if chunked is not None and (rnd is None or chunked.rid not in rnd.rids):
            self.stalled_chunks += 1  # an admitted request's next chunk did not run this step
        self._check_round(rnd)
        order = self.completions.order
        self._ended.update(order[self._seen:])
        self._seen = len(order)
        self._check_waiting()
        self._check_pools()
        return rnd

    def drain(self, max_steps: int = 100_000, tick: float = 1e-3) -> None:
        for _ in range(max_steps):
            if not self.busy:
                return
            if self.clock is not None:
                self.clock.next_arrival = float("inf")
                self.clock.now += tick
            self.step()
        raise RuntimeError(f"not drained after {max_steps} steps: "
                           f"{len(self.kit.sched.waiting_queue)} waiting")

    # --- invariants ----------------------------------------------------------------------------
    def _check_round(self, rnd: Any) -> None:
        if rnd is None:
            return
        if rnd.mode == "decode":
            self._check_decode(rnd)
            return
        v = self.violations
        self.rounds += 1
        self.scheduled_tokens += rnd.scheduled_tokens
        if self.shapes is not None:
            self.shapes.append((rnd.rids, rnd.extend, rnd.prefix, rnd.track, rnd.chunked))
        self._check_budgets(rnd)
        for rid in rnd.rids:
            if rid not in self.lengths:
                v.add("unknown_request", f"round {rnd.index} selects {rid!r}")
                continue
            if rid in self._ended:
                v.add("selected_after_end", f"round {rnd.index} selects ended {rid!r}")
            prefix, extend = rnd.prefix[rid], rnd.extend[rid]
            if extend <= 0:
                v.add("empty_extend", f"round {rnd.index}: {rid} extends {extend}")
            # NOTE: a real cache hit only: a continued chunk's earlier chunks are its own work
            self.hit_tokens += max(prefix - self._end.get(rid, 0), 0)
            if rid in self._end and prefix != self._end[rid]:
                v.add("chunk_chain",
                      f"round {rnd.index}: {rid} resumes at {prefix}, not {self._end[rid]}")
            self._end[rid] = prefix + extend

    def _check_budgets(self, rnd: Any) -> None:
        """A prefill round's rows and tokens. NOTE: a mixed round's decode rows
        (Round.decoding) take a row and one token each (SGLang's PrefillAdder is given the
        running rows as `num_mixed_decode_tokens`); chunk chains, coverage and cache hits read
        the prefill rows only."""
        v = self.violations
        decoding = list(rnd.decoding)
        rows, tokens = len(rnd.rids) + len(decoding), rnd.scheduled_tokens + len(decoding)
        mixed = f" ({len(decoding)} of them decode rows)" if decoding else ""
        if rows > self.rows:
            v.add("row_budget", f"round {rnd.index}: {rows} rows > {self.rows}{mixed}")
        if tokens > self.tokens:
            v.add("token_budget", f"round {rnd.index}: {tokens} tokens > {self.tokens}{mixed}")
        if len(set(rnd.rids + decoding)) != rows:
            v.add("duplicate_row", f"round {rnd.index}: {rnd.rids}"
                                   + (f" + decoding {decoding}" if decoding else ""))
        if decoding:
            self._check_mixed(rnd, decoding)

    def _check_decode(self, rnd: Any) -> None:
        v = self.violations
        self.decode_steps += 1
        if len(rnd.rids) > self.rows:
            v.add("row_budget", f"decode {rnd.index}: {len(rnd.rids)} rows > {self.rows}")
        if len(set(rnd.rids)) != len(rnd.rids):
            v.add("duplicate_row", f"decode {rnd.index}: {rnd.rids}")
        self._check_decode_rows(f"decode {rnd.index}", rnd.rids)

    def _check_mixed(self, rnd: Any, decoding: list[str]) -> None:
        """A prefill round's decode rows (--enable-mixed-chunk): decode steps of requests
        that were running (prefill done, not ended) when the step began."""
        v = self.violations
        self.mixed_rounds += 1
        self.mixed_decode_rows += len(decoding)
        label = f"round {rnd.index} decode row"
        for rid in decoding:
            if rid not in self.lengths:
                v.add("unknown_request", f"{label} {rid!r}")
            elif rid not in self._running:
                v.add("mixed_not_running", f"{label} {rid!r}: not in the running batch")
        self._check_decode_rows(label, [r for r in decoding if r in self.lengths])

    def _check_decode_rows(self, label: str, rids: Sequence[str]) -> None:
        v = self.violations
        for rid in rids:
            if rid in self._ended:
                v.add("selected_after_end", f"{label} runs ended {rid!r}")
            elif self._end.get(rid) != self.lengths.get(rid):
                v.add("decode_before_prefill", f"{label}: {rid} computed to "
                                               f"{self._end.get(rid)} of {self.lengths.get(rid)}")

    def _check_waiting(self) -> None:
        v = self.violations
        kit = self.kit
        waiting = kit.sched.waiting_queue
        rids = {r.rid for r in waiting}
        for r in waiting:
            if r.kv.mamba_cow_src_index is not None:
                self.stale_cow_sources += 1
                v.add("stale_cow_source", f"step {self.steps}: waiting {r.rid} keeps a COW source")
            if r.kv.mamba_needs_clear:
                v.add("stale_mamba_clear", f"step {self.steps}: waiting {r.rid}")
            if r.kv.holds_mamba:
                v.add("waiting_holds_mamba", f"step {self.steps}: waiting {r.rid}")
            if r.kv.holds_kv:
                v.add("waiting_holds_kv", f"step {self.steps}: waiting {r.rid}")
            if r.lock is not None:
                v.add("waiting_holds_lock", f"step {self.steps}: waiting {r.rid}")
        rt = kit.runtime
        if rt is None:
            return
        for rid in rt.records.parked():
            if rid not in rids:
                v.add("parked_not_waiting", f"step {self.steps}: {rid} parked, not queued")
        for rid, n in rt.records.parked_rounds().items():  # every round it ever parked
            self.longest_wait_rounds = max(self.longest_wait_rounds, n)
            if n > self.park_bound:
                v.add("park_bound", f"step {self.steps}: {rid} parked {n} rounds "
                                    f"> {self.park_bound}")
        for rid in rids:
            rs = rt.requests.get(rid)
            if rs is not None:
                self.most_parked_rounds = max(self.most_parked_rounds, rs.rounds_parked)
                if rs.rounds_parked > self.park_bound:
                    v.add("park_bound", f"step {self.steps}: {rid} rounds_parked "
                                        f"{rs.rounds_parked} > {self.park_bound}")

    def _check_pools(self) -> None:
        kit = self.kit
        self.peak_kv_used = max(self.peak_kv_used,
                                self._kv_total - kit.pools.allocator.available_size())
        if self._mamba_total is not None:
            self.peak_mamba_used = max(self.peak_mamba_used,
                                       self._mamba_total - kit.mamba_free())

    def finish(self) -> dict[str, int]:
        """After the drain: end-of-run invariants; returns the kit's leak counts."""
        v = self.violations
        if self.busy:
            v.add("not_drained", f"{len(self.kit.sched.waiting_queue)} waiting")
        for rid, n in self.lengths.items():
            done, ab = self.completions.count[rid], self.aborted[rid]
            if done + ab != 1:
                v.add("ended_once", f"{rid}: completed {done}x, aborted {ab}x")
            elif done and self._end.get(rid) != n:
                v.add("coverage", f"{rid}: computed to {self._end.get(rid)} of {n} tokens")
        for rid in set(self.completions.count) - set(self.lengths):
            v.add("unknown_completion", rid)
        rt = self.kit.runtime
        if rt is not None:
            # NOTE: the kit tells the runtime nothing of completions (a server cannot): every
            # record must have ended with its request's selection or abort
            kept = {owner: n for owner, n in rt.records.counts().items() if n}
            if kept:
                v.add("stale_records", f"{kept}; requests {sorted(rt.requests)[:5]}, "
                                       f"parked {rt.records.parked()[:5]}, "
                                       f"history {sorted(rt.records.parked_rounds())[:5]}")
        leaks = self.kit.leaks()
        for kind, n in leaks.items():
            if n:
                v.add(f"leaked_{kind}", f"{n} slots")
        return leaks


def mamba_slots_for(layout: str, rows: int, overlap: bool = False) -> int:
    """The tightest mamba pool SGLang's slot accounting guarantees in the kit.

    The kit's pools (`HybridReqToTokenPool`, not the unified pool) have no mamba gate in
    admission: a batch takes per row its own state slot, with extra_buffer two ping-pong
    track slots, and it locks the cached state it copied from (copy-on-write source), which
    the tree then cannot evict for the batch's allocation. Rows per round are bounded by
    `rows`; under overlap the kit keeps the in-flight batch's rows outside the running batch,
    so two batches hold slots at once. Everything else (published states) is evictable.
    No_buffer adds one: the chunked request's checkpoint copies its state into a fresh slot
    (unified_cache/components/mamba.py `prepare_for_caching_req`) after its round, while every
    row may hold its own slot and its source (found in the soak with 16-token outputs: a full
    pool of hit rows, then a chunk's checkpoint; extra_buffer donates a ping-pong slot).
    """
    per_row = 4 if layout == "extra_buffer" else 2
    return per_row * rows * (2 if overlap else 1) + (layout == "no_buffer")
