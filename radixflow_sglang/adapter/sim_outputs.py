"""What a token-only executor must add to its result for SGLang 0.5.23's result processing.

An executor that picks token ids without logits (adapter/simulated.py) hands SGLang a
`GenerationBatchResult` whose `logits_output` SGLang reads whenever a batch asks for logprobs
(managers/utils.py `GenerationBatchResult.copy_to_cpu`, managers/scheduler_components/
batch_result_processor.py `move_logprobs_to_cpu` / `_normalize_decode_outputs`,
logprob_result_processor.py `add_logprob_return_values`), and whose token must pass the
request's grammar (`_apply_prefill_grammar` / `_accept_grammar_tokens`: a refused token aborts
the request with "Grammar accept_token failed"). `attach` supplies both:

- grammar: the batch's vocabulary mask, built and applied as the real sampler does
  (model_executor/model_runner.py `ModelRunner._preprocess_logits`:
  `SamplingBatchInfo.update_regex_vocab_mask`, then the backend's `GrammarMask.apply` on the
  logits, then `grammar_mask = None`), over logits that favour the executor's token: the
  executor's token when the grammar allows it, else the first token the grammar allows.
  Under overlap scheduling the mask waits for the previous batch's tokens, as upstream's
  (managers/tp_worker.py `TpModelWorker.forward_batch_generation`: `delay_sample_func` when
  `sampling_info.grammars` is set; the scheduler runs it after processing the last batch).
- logprobs: a fixed distribution centred on the chosen token m (the executor's own, after the
  grammar): the token at distance d = (t - m) mod V has probability 2^-(d+1) for d < HEAD and
  the rest (2^-HEAD) is shared evenly by the other V - HEAD tokens. Output logprobs, top-k and
  the requested token ids' logprobs are read off it in the layout the real sampler writes
  (layers/logprob_processor.py `OutputLogprobProcessor.compute_logprobs`: one tensor per row,
  empty rows for requests that did not ask); prompt-token logprobs (`logprob_start_len`)
  likewise, each position's distribution centred on the prompt's next token.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from . import check_sglang_version

check_sglang_version()

from sglang.srt.layers.logits_processor import LogitsProcessorOutput  # noqa: E402

HEAD = 16  # tokens with a geometric share of the distribution
LOG_HALF = math.log(0.5)


def logprob_at(distance: torch.Tensor, vocab: int) -> torch.Tensor:
    """Log-probability of the token `distance` places after the chosen one (mod `vocab`)."""
    tail = HEAD * LOG_HALF - math.log(vocab - HEAD)
    head = (distance + 1).to(torch.float32) * LOG_HALF
    return torch.where(distance < HEAD, head, torch.full_like(head, tail))


def has_grammars(batch: Any) -> bool:
    """Put the batch's grammars on its sampling info as model_executor/forward_batch_info.py
    `ForwardBatch.init_new` does (a forward that builds no ForwardBatch must do it itself)."""
    info = getattr(batch, "sampling_info", None)
    if info is None:
        return False
    info.grammars = [r.grammar for r in batch.reqs] if batch.has_grammar else None
    return info.grammars is not None


def allowed_tokens(batch: Any, ids: torch.Tensor) -> torch.Tensor:
    """`ids` with every token its row's grammar refuses replaced by the first it allows."""
    if not has_grammars(batch):
        return ids
    info = batch.sampling_info
    info.update_regex_vocab_mask()
    mask, info.grammar_mask = info.grammar_mask, None  # NOTE: as _preprocess_logits releases it
    if mask is None:
        return ids
    rows = torch.arange(len(ids))
    logits = torch.zeros(len(ids), info.vocab_size, dtype=torch.float32)
    logits[rows, ids] = 1.0
    mask.apply(logits)  # NOTE: the backend's own apply: -inf where the grammar refuses
    ok = torch.isfinite(logits)
    first = ok.to(torch.int8).argmax(dim=1)  # NOTE: argmax returns the first maximum
    return torch.where(ok[rows, ids], ids, first)


def logits_output(batch: Any, ids: torch.Tensor, vocab: int) -> LogitsProcessorOutput:
    """What the scheduler reads off a forward without logits; logprobs when the batch asks."""
    out = LogitsProcessorOutput(next_token_logits=None)
    if not getattr(batch, "return_logprob", False):
        return out
    out.next_token_logprobs = torch.full((len(ids),), LOG_HALF, dtype=torch.float32)
    tops = batch.top_logprobs_nums or [0] * len(ids)
    if any(k > 0 for k in tops):
        spans = [torch.arange(k) for k in tops]
        out.next_token_top_logprobs_val = [logprob_at(d, vocab) for d in spans]
        out.next_token_top_logprobs_idx = [(m + d) % vocab for m, d in zip(ids, spans,
                                                                           strict=True)]
    wanted = batch.token_ids_logprobs or [None] * len(ids)
    if any(t is not None for t in wanted):
        out.next_token_token_ids_logprobs_val = [
            torch.empty(0) if t is None else logprob_at((torch.tensor(t) - m) % vocab, vocab)
            for m, t in zip(ids, wanted, strict=True)]
        out.next_token_token_ids_logprobs_idx = [[] if t is None else list(t) for t in wanted]
    if batch.forward_mode.is_extend() and batch.extend_input_logprob_token_ids is not None:
        input_logprobs(out, batch, tops, wanted, vocab)
    return out


def input_logprobs(out: LogitsProcessorOutput, batch: Any, tops: list[int], wanted: list,
                   vocab: int) -> None:
    """Prompt-token logprobs in the layout layers/logits_processor.py `LogitsProcessor.forward`
    writes them (a flat tensor over every row's positions from its extend logprob start; per
    row, one list per position for top-k and requested ids). The distribution at a position
    is centred on the prompt's next token (ScheduleBatch.extend_input_logprob_token_ids)."""
    nxt = batch.extend_input_logprob_token_ids
    counts = [n - s for n, s in zip(batch.extend_lens, batch.extend_logprob_start_lens,
                                    strict=True)]
    out.input_token_logprobs = torch.full((len(nxt),), LOG_HALF, dtype=torch.float32)
    spans = torch.split(nxt, counts)
    if any(k > 0 for k in tops):
        out.input_top_logprobs_val = [[logprob_at(torch.arange(k), vocab).tolist()] * len(sp)
                                      for k, sp in zip(tops, spans, strict=True)]
        out.input_top_logprobs_idx = [[((m + torch.arange(k)) % vocab).tolist() for m in sp]
                                      for k, sp in zip(tops, spans, strict=True)]
    if any(t is not None for t in wanted):
        out.input_token_ids_logprobs_val = [
            [] if t is None else
            [logprob_at((torch.tensor(t) - m) % vocab, vocab).tolist() for m in sp]
            for t, sp in zip(wanted, spans, strict=True)]
        out.input_token_ids_logprobs_idx = [[] if t is None else [list(t)] * len(sp)
                                            for t, sp in zip(wanted, spans, strict=True)]


def finish_result(batch: Any, next_token_ids: torch.Tensor,
                  vocab: int) -> tuple[torch.Tensor, LogitsProcessorOutput]:
    """The executor's tokens after the grammar, and the logits output SGLang reads."""
    ids = allowed_tokens(batch, next_token_ids)
    return ids, logits_output(batch, ids, vocab)


def attach(result: Any, batch: Any, vocab: int, overlap: bool,
           on_final: Callable[[torch.Tensor], None] | None = None) -> None:
    """Complete a token-only `GenerationBatchResult` in place (now, or, under overlap with a
    grammar in the batch, when the scheduler runs its `delay_sample_func`). `on_final` sees
    the final ids (the executor's, where the grammar allows them)."""

    def finish() -> Any:
        result.next_token_ids, result.logits_output = finish_result(
            batch, result.next_token_ids, vocab)
        if on_final is not None:
            on_final(result.next_token_ids)
        return result

    if overlap and has_grammars(batch):
        result.delay_sample_func = finish
    else:
        finish()
