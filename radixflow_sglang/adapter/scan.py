"""The prefill scan, ported from SGLang 0.5.23 with RadixFlow's hooks.

Source: sglang/srt/managers/scheduler.py, `Scheduler._get_new_batch_prefill_raw` (0.5.23),
copied verbatim; every change is a line marked `# RADIXFLOW:`. `rf` is the scheduler's
`RadixFlowRuntime`; with the `radix` policy its hooks change nothing, so the scan selects
exactly what stock selects (tested round by round against the unmodified method).

The copy runs over the upstream module's globals (see `_with_upstream_globals` below): every
free name (TEST_RETRACT, get_schedule, set_time_batch, AddReqResult, ...) resolves in
sglang.srt.managers.scheduler at call time, exactly as upstream's method does, so patching
one there (as SGLang's own tests do) reaches this scan too.
"""
# ruff: noqa
# fmt: off

from __future__ import annotations

import builtins
import dis
import types

import sglang.srt.managers.scheduler as _upstream


def get_new_batch_prefill_raw(
    self,
    prefill_delayer_single_pass: Optional[PrefillDelayerSinglePassExecutor],
    running_batch: ScheduleBatch,
) -> Tuple[Optional[ScheduleBatch], ScheduleBatch]:
    # Check if the grammar is ready in the grammar queue
    if self.grammar_manager.has_waiting_grammars():
        ready_grammar_requests = self.grammar_manager.get_ready_grammar_requests()
        for req in ready_grammar_requests:
            self._add_request_to_queue(req)

    if self.enable_priority_preemption or self.is_hybrid_swa:
        # Reset batch_is_full to try preemption with a prefill adder.
        running_batch.batch_is_full = False
    if running_batch.is_empty():
        # An empty batch has no request left to leave, and only a leaving
        # request clears the flag elsewhere, so admission would stay shut.
        running_batch.batch_is_full = False

    if (
        running_batch.batch_is_full or len(self.waiting_queue) == 0
    ) and self.chunked_req is None:
        return None, running_batch

    running_bs = len(running_batch.reqs)
    # Skipped during a chunked prefill: that pass must proceed regardless.
    if (
        self.min_free_slots_delayer is not None
        and self.chunked_req is None
        and self.min_free_slots_delayer.should_delay(
            running_bs=running_bs,
            num_allocatable_reqs=self.get_num_allocatable_reqs(
                running_bs, running_batch=running_batch
            ),
        )
    ):
        return None, running_batch

    # A chunked request skips this check: it keeps its req_to_token row across
    # chunks, and under PP it (or a dllm request) may finish in another
    # microbatch, so holding it back here would leak its memory.
    if (
        self.get_num_allocatable_reqs(running_bs, running_batch=running_batch) <= 0
        and self.chunked_req is None
        and not self.enable_priority_preemption
    ):
        running_batch.batch_is_full = True
        return None, running_batch

    # Get priority queue
    self.policy.calc_priority(
        self.waiting_queue,
        running_batch,
        processed_tokens=self.processed_tokens_counter,
    )

    if TEST_RETRACT and running_bs > TEST_RETRACT_NO_PREFILL_BS:
        # If we are testing retraction and the running batch size exceeds
        # TEST_RETRACT_NO_PREFILL_BS, we skip the prefill to keep the requests
        # in the waiting queue.
        return None, running_batch

    # Determine chunked_prefill_size for this batch
    chunked_prefill_size = self.chunked_prefill_size
    if self.chunked_req is not None and self.dynamic_chunk_sizer is not None:
        history_len = self.chunked_req.prefix_len
        dynamic_size = self.dynamic_chunk_sizer.predict(history_len)
        if dynamic_size is not None:
            chunked_prefill_size = dynamic_size

    # Prefill policy
    # Get BLOCK_M from the backend for tile-budget admission logic
    attn_backend = self.tp_worker.model_runner.attn_backend
    if hasattr(attn_backend, "extend_attention_block_m"):
        prefill_tile_block_m = attn_backend.extend_attention_block_m
    else:
        prefill_tile_block_m = 64  # Fallback for non-Triton backends

    adder = self.get_prefill_adder_class()(
        self.page_size,
        self.tree_cache,
        self.token_to_kv_pool_allocator,
        running_batch,
        self.new_token_ratio_tracker.current,
        self.max_prefill_tokens,
        chunked_prefill_size,
        running_bs if self.is_mixed_chunk else 0,
        self.priority_scheduling_preemption_threshold,
        max_prefill_bs=int(self.max_prefill_bs),
        max_running_requests=self.max_running_requests,
        prefill_max_requests=get_schedule().prefill_max_requests,
        prefill_delayer_single_pass=prefill_delayer_single_pass,
        dllm_config=self.dllm_config,
        waiting_queue_len=len(self.waiting_queue),
        prefill_tile_block_m=prefill_tile_block_m,
    )
    rf = self.radixflow  # RADIXFLOW: producers in flight (results not yet processed)
    rf.begin_scan(self, adder)  # RADIXFLOW

    if self.chunked_req is not None:
        self.chunked_req.init_next_round_input()
        adder.chunked_req_limit = self.policy.shortest_prefill_chunk_limit(
            self.chunked_req,
            self.waiting_queue,
            adder.rem_chunk_tokens or 0,
            self.page_size,
        )
        self.chunked_req = adder.add_chunked_req(self.chunked_req)
        rf.chunk_continued(self, self.chunked_req)  # RADIXFLOW: its chunk publishes too

    if self.enable_lora:
        running_loras = {
            req.lora_id for req in running_batch.reqs if not req.finished()
        }
        # Account for LoRAs that are already loaded in the adder, such as chunked requests
        running_loras.update(req.lora_id for req in adder.can_run_list)

        if self.lora_drainer:
            self.lora_drainer.update_draining_state(
                self.waiting_queue,
                running_batch.reqs,
            )

    mamba_allocator = getattr(self.req_to_token_pool, "mamba_allocator", None)
    if mamba_allocator is not None:
        mamba_allocator.alloc_group_begin(len(self.waiting_queue))
    buffer_pipeline = self.tree_cache.buffer_pipeline
    # Get requests from the waiting queue to a new prefill batch
    for req in self.waiting_queue:
        # A spent pass budget admits no one, even before the first
        # candidate: the resumed chunk or mixed decode rows can spend it.
        if adder.budget_state() == AddReqResult.OTHER:
            break
        # RADIXFLOW: Blocked requests park here, before LoRA, preemption or budget see them.
        if rf.park(self, req, adder):  # RADIXFLOW
            continue  # RADIXFLOW: it keeps its queue position
        if rf.defer_unmatched(self, req, adder):  # RADIXFLOW: DEFER's fast path, no match
            continue  # RADIXFLOW
        if self.enable_lora and not self.can_schedule_lora_req(req, running_loras):
            continue

        # A forward batch runs one pooling mode, so setwise readout requests
        # (token_indices_to_pool) cannot share a batch with last-token ones.
        # Admit only the first request's mode; the other stays queued.
        if adder.can_run_list and (
            (req.token_indices_to_pool is not None)
            != (adder.can_run_list[0].token_indices_to_pool is not None)
        ):
            continue

        running_bs = len(running_batch.reqs)
        candidate_beam_width = (
            req.beam_group.beam_width if req.beam_group is not None else None
        )
        num_held_rows = sum(r.kv.holds_kv for r in adder.can_run_list)
        if rf.rows_kept(self, req, adder, candidate_beam_width, num_held_rows):  # RADIXFLOW
            break  # RADIXFLOW: the row limit counts the rows this scan's parks keep
        if len(adder.can_run_list) >= self.get_num_allocatable_reqs(
            running_bs,
            candidate_beam_width,
            running_batch=running_batch,
            num_held_rows=num_held_rows,
        ):
            running_batch.batch_is_full = True

        if running_batch.batch_is_full:
            if not self.enable_priority_preemption or not adder.preempt_to_schedule(
                req
            ):
                break

        if self.enable_hicache_storage or self.enable_lmcache:
            prefetch_done = self.tree_cache.check_prefetch_progress(
                req.cache_request_handle
            )
            req.time_stats.observe_storage_prefetch_ready(prefetch_done)
            if not prefetch_done:
                # skip staging requests that are ongoing prefetch
                continue
            # Pop the L3-loaded span. Unified cache exposes its absolute
            # start so cache-mode L2/L3 attribution survives L3-tail eviction.
            loaded_tokens, loaded_start = self.tree_cache.pop_prefetch_loaded_span(
                req.cache_request_handle
            )
            if loaded_tokens > 0:
                req.storage_hit_length = loaded_tokens
                req.storage_hit_start = loaded_start
                # Cache-mode host memory is a resident L2 tier. Buffer mode
                # marks the staged span below once it is surfaced.
                req.host_hit_is_storage = False

        req.init_next_round_input(self.tree_cache)
        if rf.defer(self, req, adder):  # RADIXFLOW: would be cut into a chunk it must not be
            continue  # RADIXFLOW
        if self.enable_hicache_storage and (
            self._prefetch_after_device_hit_loss(req)
        ):
            continue
        if self.enable_hicache_storage and buffer_pipeline is not None:
            staging_ready = buffer_pipeline.prepare_staged_prefetch(req)
            req.time_stats.observe_storage_staging_ready(staging_ready)
            if not staging_ready:
                continue
        res = adder.add_one_req(
            req,
            has_chunked_req=(self.chunked_req is not None),
            truncation_align_size=self.truncation_align_size,
        )
        rf.after_add(self, req, adder, res)  # RADIXFLOW: a selected request is a producer

        if self.enable_lora:
            running_loras.add(req.lora_id)

        if res != AddReqResult.CONTINUE:
            if res == AddReqResult.NO_TOKEN:
                # Set batch_is_full after making sure there are requests that can be served
                running_batch.batch_is_full = len(adder.can_run_list) > 0 or (
                    not running_batch.is_empty()
                )
            # revert matched mamba idx to avoid memory leak, if req is not added.
            # Only free if the slot was freshly allocated in this batch (not
            # pre-existing from a session). Session-held slots have their own
            # lifecycle and freeing them here causes double-free.
            added = len(adder.can_run_list) > 0 and req is adder.can_run_list[-1]
            if not added:
                # init_next_round_input() may stage deferred Mamba COW/clear
                # metadata before add_one_req() rejects the request.
                req.kv.mamba_cow_src_index = None
                req.kv.mamba_needs_clear = False
                if req.kv.holds_mamba and not getattr(req, "session", None):
                    self.tree_cache.req_to_token_pool.mamba_allocator.free(
                        req.kv.mamba_pool_idx.unsqueeze(-1)
                    )
                    req.kv.mamba_pool_idx = None
            break

    if mamba_allocator is not None:
        mamba_allocator.alloc_group_end()
    rf.end_scan(self, adder)  # RADIXFLOW: round counters

    # Update waiting queue
    can_run_list: List[Req] = adder.can_run_list
    if len(can_run_list) == 0:
        # Preemption already released these requests; requeue them even
        # though the request they made room for was not admitted.
        for req in adder.preempt_list:
            self._add_request_to_queue(req)
        return None, running_batch

    can_run_set = set(can_run_list)
    retries = self.tree_cache.storage_prefetch_retries
    if self.enable_hicache_storage and retries is not None:
        for req in can_run_list:
            retries.cancel(req.rid)
    self.waiting_queue = [x for x in self.waiting_queue if x not in can_run_set]
    if adder.preempt_list:
        for req in adder.preempt_list:
            self._add_request_to_queue(req)

    if adder.new_chunked_req is not None:
        # Update chunked prefill
        assert self.chunked_req is None
        self.chunked_req = adder.new_chunked_req

    if self.chunked_req is not None:
        self.chunked_req.inflight_middle_chunks += 1

    set_time_batch(can_run_list, "set_forward_entry_time")

    # Create a new batch
    new_batch = ScheduleBatch.init_new(
        can_run_list,
        self.req_to_token_pool,
        self.token_to_kv_pool_allocator,
        self.tree_cache,
        self.model_config,
        self.enable_overlap,
        self.spec_algorithm,
        chunked_req=self.chunked_req,
    )

    new_batch.contains_last_prefill_chunk = (
        self.chunked_req is None or len(can_run_list) != 1
    )
    new_batch.hisparse_coordinator = self.hisparse_coordinator

    if self.enable_hierarchical_cache or self.enable_unified_cache_external_linker:
        # todo (zhiqiang): disable cuda graph execution if hicache loading triggered
        new_batch.hicache_consumer_index = (
            self.tree_cache.ready_to_load_host_cache()
        )

    new_batch.prepare_for_extend()

    if self.tp_worker.model_runner.prefill_aware_swa:
        for req in can_run_list:
            req.kv.swa_evict_floor = req.extend_end

    # Record prefill stats for logging after forward.
    new_batch.prefill_stats = PrefillStats.from_adder(
        adder,
        running_batch.reqs,
        self.enable_priority_scheduling,
        num_pending_tokens=self.load_inquirer._get_num_pending_tokens(
            chunk_deduct=(
                self.chunked_req.extend_len if self.chunked_req is not None else 0
            ),
        ),
    )

    # Mixed-style chunked prefill
    if (
        self.is_mixed_chunk
        and not running_batch.is_empty()
        and not (new_batch.return_logprob or running_batch.return_logprob)
        # mix_with_running cats input_ids but not input_embeds — shapes would mismatch
        and new_batch.input_embeds is None
        # Beam member rows are not supported inside a mixed extend batch.
        and all(r.beam_group is None for r in running_batch.reqs)
    ):
        # TODO (lianmin): support return_logprob + mixed chunked prefill
        finishing_reqs = self._reqs_finishing_inflight(running_batch)
        running_batch.filter_batch(reqs_to_exclude=finishing_reqs)
        if finishing_reqs:
            running_batch.batch_is_full = False
        # The prefill admitted above may leave no KV room for the decode
        # rows. They then sit out this step and decode on the next decode
        # step, which fits them; a mixed step does not retract them.
        if not running_batch.is_empty() and running_batch.check_decode_mem():
            running_batch.prepare_for_decode()
            new_batch.mix_with_running(running_batch)
            new_batch.decoding_reqs = running_batch.reqs
            if not self.enable_overlap and not self.spec_algorithm.is_none():
                # Non-overlap spec never writes the relay; stash the
                # tails' pending tokens for the mixed input resolve.
                last_tokens = torch.tensor(
                    [r.output_ids[-1] for r in running_batch.reqs],
                    dtype=torch.int64,
                    device=self.device,
                )
                self.future_map.stash_bonus_tokens(
                    running_batch.req_pool_indices, last_tokens
                )
            running_batch = ScheduleBatch(
                reqs=[], batch_is_full=running_batch.batch_is_full
            )
    else:
        new_batch.decoding_reqs = None

    return new_batch, running_batch


def _with_upstream_globals(fn: types.FunctionType) -> types.FunctionType:
    """`fn` rebuilt over sglang.srt.managers.scheduler's namespace (not a snapshot of it).

    NOTE: a `from ... import NAME` copy binds NAME by value when this module loads, so a later
    patch of the upstream module would reach stock but not us. Every global the copy reads
    must exist upstream (checked here, at import): a missing one fails loudly, not mid-scan.
    """
    names = {i.argval for i in dis.get_instructions(fn) if i.opname == "LOAD_GLOBAL"}
    missing = sorted(n for n in names if n not in _upstream.__dict__ and not hasattr(builtins, n))
    if missing:
        raise ImportError(f"radixflow_sglang scan: {missing} not defined in {_upstream.__name__}")
    out = types.FunctionType(fn.__code__, _upstream.__dict__, fn.__name__, fn.__defaults__,
                             fn.__closure__)
    out.__kwdefaults__ = fn.__kwdefaults__
    out.__annotations__ = fn.__annotations__
    out.__doc__ = fn.__doc__
    out.__module__ = fn.__module__
    out.__qualname__ = fn.__qualname__
    return out


get_new_batch_prefill_raw = _with_upstream_globals(get_new_batch_prefill_raw)
