"""What the adapter reads off SGLang's Req, PrefillAdder and Scheduler: one leaf module.

Every adapter module (the runtime, the hold, the boundary publisher, the chunk-slot price, the
scan view) reads requests and budgets through these accessors, so none of them imports another
for a helper. Nothing here decides anything; each names the SGLang code it mirrors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.managers.scheduler import Scheduler


def namespace(req: Req) -> tuple:
    # NOTE: the radix key's fields (mem_cache/common.py::_req_radix_key) plus the LoRA adapter.
    return (req.extra_key, req.cache_salt, req.lora_id)


def req_tokens(req: Req):
    return req.origin_input_ids + req.output_ids if req.output_ids else req.origin_input_ids


def req_len(req: Req) -> int:
    """len(req_tokens(req)) without building the list."""
    return len(req.origin_input_ids) + len(req.output_ids)


def rows_running(batch: ScheduleBatch | None) -> int:
    """Rows the scan's running batch holds, as SGLang's row limit counts them. NOTE: the scan's
    batch (`adder.running_batch`), not `sched.running_batch`: `get_next_batch_to_run` merges
    the last prefill into its local running batch and assigns `sched.running_batch` only after
    the scan, so where no request was running the scheduler's batch still reads empty while
    the last prefill's requests run (under overlap, every one of them; without it, those that
    did not finish)."""
    return len(batch.reqs) if batch is not None else 0


def round_budget(sched: Scheduler) -> int:
    """A prefill round's token budget T: max_prefill_tokens, capped by the chunk size if set."""
    budget, chunk = sched.max_prefill_tokens, sched.chunked_prefill_size
    return min(budget, chunk) if chunk and chunk > 0 else budget


def budget_left(adder: PrefillAdder) -> int:
    """Prefill tokens this round can still take: the input budget, and the chunk's if set."""
    left = adder.rem_input_tokens
    return left if adder.rem_chunk_tokens is None else min(left, adder.rem_chunk_tokens)


def cache_hit(req: Req) -> int:
    """Tokens of this extend's ready prefix the request did not compute itself: SGLang's own
    cached-token increment (schedule_batch.py `prepare_for_extend`: prefix_len -
    already_computed), read before it runs. A continued chunk's earlier chunks are its own
    work, not a hit."""
    return max(req.prefix_len - req.already_computed, 0)


def last_token(req: Req) -> bool:
    """The request's next token is its last (max_new_tokens): it finishes with this round."""
    most = req.sampling_params.max_new_tokens
    return most is not None and most - len(req.output_ids) <= 1


def compute_charge(adder: PrefillAdder, extend: int) -> int:
    """What `PrefillAdder._update_prefill_budget` takes from the compute budgets for an extend."""
    return extend if adder.exact_chunk_fill else adder.ceil_paged_tokens(extend)


def chunk_cut(sched: Scheduler, adder: PrefillAdder, req: Req, left: int) -> int | None:
    """None when the request fits the residual chunk budget `left` whole, else the extend
    SGLang would cut it to (schedule_policy.py `PrefillAdder._select_prefill_admission`:
    fit on the page-ceiled extend, cut floored to the page and truncation_align_size)."""
    extend = len(req.full_untruncated_fill_ids) - req.prefix_len
    if compute_charge(adder, extend) <= left:
        return None
    page, align = adder.page_size, sched.truncation_align_size
    if adder.exact_chunk_fill:
        return left // align * align if align is not None else left
    cut = left // page * page
    if align is not None:
        cut = cut // align * align
    return (req.prefix_len + cut) // page * page - req.prefix_len


def release_parked(sched: Scheduler, req: Req) -> None:
    """Free what a parked request holds, exactly as the scan's own revert of a rejected request
    (scheduler.py `_get_new_batch_prefill_raw`, after `add_one_req`): the deferred copy-on-write
    source and clear flag, and a freshly allocated mamba slot (never a session's)."""
    req.kv.mamba_cow_src_index = None
    req.kv.mamba_needs_clear = False
    if req.kv.holds_mamba and not getattr(req, "session", None):
        sched.tree_cache.req_to_token_pool.mamba_allocator.free(req.kv.mamba_pool_idx.unsqueeze(-1))
        req.kv.mamba_pool_idx = None


def inflight_reqs(sched: Scheduler):
    """The requests of extend batches whose results are not processed yet (overlap loop),
    retracted ones left out."""
    for batch, _ in getattr(sched, "result_queue", ()):
        if batch.forward_mode.is_extend():
            yield from (r for r in batch.reqs if not r.is_retracted)


def decoding(sched: Scheduler, batch: ScheduleBatch | None) -> int:
    """Rows of the scan's running batch (`rows_running`) that decode in the next round if no
    prefill runs, the requests a longer round delays: every one but those whose result in
    flight ends them by length, which the overlap loop leaves out of its decode (upstream's
    own test, scheduler.py `_reqs_finishing_inflight`)."""
    if batch is None or not batch.reqs:
        return 0
    if len(getattr(sched, "result_queue", ())) > 1:
        # NOTE: upstream's test asserts the one result in flight `event_loop_overlap` leaves at
        # a scheduling pass; with more (another loop, a test's own launches) every row counts
        return len(batch.reqs)
    return len(batch.reqs) - len(sched._reqs_finishing_inflight(batch))
