"""Request checks SGLang 0.5.23 lacks, made where it validates requests: before the scheduler.

PATCH one: managers/tokenizer_manager.py `TokenizerManager._validate_one_request(obj,
input_ids)` runs in the HTTP / tokenizer-manager process for every (sub-)request once its token
input is known (single, batch and parallel-sampling paths, text or input_ids), and a ValueError
there becomes HTTP 400 (entrypoints/http_server.py `serve_generate_request`; the OpenAI routes
map it the same way). Before upstream's own checks we reject

- an empty token input (text "" that tokenizes to nothing, or input_ids []): SGLang admits it
  as a 0-token row and its scheduler dies at mem_cache/common.py `release_kv_cache`'s
  assertion, taking every client down (upstream's own `input_ids cannot be empty` check in
  io_struct.py `_determine_batch_size` sees neither text "" nor an empty item of a batch);
- a token id outside [0, vocab): a real model indexes its embedding with it;
- a `top_logprobs_num` above the vocabulary size: SGLang builds k entries per position (10^6
  gave a 32.5 MB answer after seconds for 4 tokens, under every executor);
- a bad publication boundary `sampling_params.custom_params.radixflow_boundary` (not an
  integer in [0, input length]), or a `custom_params` that is not an object (adapter/boundary.py);
- under the simulated executor, a feature it cannot produce (hidden states, LoRA, ...:
  `SIMULATED_LACKS`), naming the field and the executor.

A failing item of a batch is named by its index (`batch item I: ...`; PATCH two:
managers/io_struct.py `GenerateReqInput.__getitem__` tags each sub-request with its index).
A session request (session_params with an id) may be empty here: the scheduler rebuilds its
prompt from the session and rejects it itself if still empty (io_struct.py, same function).
Installed in the launching process for every policy, stock included (launch_server.py), and by
the plugin in every process it runs in. NOTE: SGLang's multi-tokenizer mode
(--tokenizer-worker-num > 1) tokenizes in uvicorn worker processes that neither path reaches.
"""

from __future__ import annotations

from array import array
from typing import Any

from . import check_sglang_version

check_sglang_version()

from sglang.srt.managers.io_struct import GenerateReqInput  # noqa: E402
from sglang.srt.managers.tokenizer_manager import TokenizerManager  # noqa: E402

from .boundary import boundary_problem  # noqa: E402

_UPSTREAM_VALIDATE = TokenizerManager._validate_one_request


def _is_session(obj: Any) -> bool:
    params = getattr(obj, "session_params", None)
    return isinstance(params, dict) and bool(params.get("id"))


def token_input_problem(obj: Any, input_ids: list[int] | None, vocab_size: int) -> str | None:
    """Why this request's token input must not reach the scheduler, or None."""
    if getattr(obj, "input_embeds", None) is not None or input_ids is None:
        return None  # embeddings carry the input; nothing tokenized to check
    if len(input_ids) == 0:
        if _is_session(obj):
            return None
        source = "input_ids" if getattr(obj, "input_ids", None) is not None else "text"
        return (f"the token input is empty ({source} gives no tokens); "
                "send at least one token")
    if obj.contains_mm_input() or not vocab_size:
        return None  # NOTE: the multimodal processor built these ids; its own pads are legal
    try:
        ids = array("q", input_ids)  # NOTE: C-speed min/max (HTTP already made them int64)
    except (TypeError, OverflowError):
        return "token ids must be integers in [0, vocabulary size)"
    low, high = min(ids), max(ids)
    if low >= 0 and high < vocab_size:
        return None
    pos, tok = next((i, t) for i, t in enumerate(ids) if not 0 <= t < vocab_size)
    return (f"token id {tok} at position {pos} is outside the vocabulary "
            f"[0, {vocab_size}) (vocabulary size {vocab_size})")


def check_token_input(obj: Any, input_ids: list[int] | None, vocab_size: int) -> None:
    problem = token_input_problem(obj, input_ids, vocab_size)
    if problem is not None:
        rid = getattr(obj, "rid", None)
        raise ValueError(f"request {rid!r}: {problem}" if isinstance(rid, str) else problem)


# NOTE: what a simulated forward cannot produce (it has tokens, no logits, hidden states or
# adapters): field -> why. Logprobs and grammars it does produce (adapter/sim_outputs.py).
SIMULATED_LACKS = {
    "return_hidden_states": "it computes no hidden states",
    "return_sampling_mask": "it samples from no logits",
    "return_entropy": "it samples from no logits",
    "return_routed_experts": "it routes no experts",
    "return_indexer_topk": "it runs no attention indexer",
    "lora_path": "it runs no LoRA adapters",
    "lora_id": "it runs no LoRA adapters",
    "custom_logit_processor": "it produces no logits to process",
    "input_embeds": "it reads token ids only",
    "image_data": "it runs no multimodal encoder",
    "video_data": "it runs no multimodal encoder",
    "audio_data": "it runs no multimodal encoder",
}
_executor: str | None = None  # the launcher's executor; None: SGLang's model worker


def executor_problem(obj: Any, executor: str | None) -> str | None:
    """Why `executor` cannot serve this (sub-)request, or None."""
    if executor != "simulated":
        return None
    lacks = ("not supported by the simulated executor (--radixflow-executor simulated: {}); "
             "serve on a GPU (--radixflow-executor model) for it")
    for field, why in SIMULATED_LACKS.items():
        if getattr(obj, field, None):
            return f"{field}: {lacks.format(why)}"
    sp = getattr(obj, "sampling_params", None)
    width = sp.get("beam_width") if isinstance(sp, dict) else None
    if isinstance(width, int) and width > 1:
        return f"sampling_params.beam_width: {lacks.format('it scores no beams')}"
    return None


def top_logprobs_problem(obj: Any, vocab_size: int) -> str | None:
    """A top-k above the vocabulary: there are only `vocab_size` tokens to rank, and SGLang
    would build k entries per position anyway (10^6 took 32.5 MB and seconds for 4 tokens)."""
    k = getattr(obj, "top_logprobs_num", None)
    if not isinstance(k, int) or isinstance(k, bool) or not vocab_size or k <= vocab_size:
        return None
    return (f"top_logprobs_num: {k} is above the vocabulary size {vocab_size}; allowed: an "
            f"integer in [0, {vocab_size}]")


def _validate_one_request(self: TokenizerManager, obj: Any, input_ids: list[int]) -> None:
    try:
        check_token_input(obj, input_ids, self.model_config.vocab_size)
        problem = boundary_problem(obj, input_ids)  # NOTE: the field (adapter/boundary.py)
        if problem is None:
            problem = top_logprobs_problem(obj, self.model_config.vocab_size)
        if problem is None:
            problem = executor_problem(obj, _executor)
        if problem is not None:
            raise ValueError(problem)
        _UPSTREAM_VALIDATE(self, obj, input_ids)
    except ValueError as e:
        index = getattr(obj, BATCH_INDEX, None)
        if index is None:
            raise
        # NOTE: one bad item fails the whole batch; the client must learn which one
        raise ValueError(f"batch item {index}: {e}") from None


BATCH_INDEX = "_radixflow_batch_index"
_UPSTREAM_GETITEM = GenerateReqInput.__getitem__


def _getitem(self: GenerateReqInput, i: int) -> GenerateReqInput:
    """PATCH: managers/io_struct.py `GenerateReqInput.__getitem__` builds the i-th sub-request
    of a batch, which forgets its index; tagged here (batches of two or more) so that a check
    failure can name the item."""
    sub = _UPSTREAM_GETITEM(self, i)
    if getattr(self, "batch_size", 1) > 1:
        setattr(sub, BATCH_INDEX, i)
    return sub


def install(executor: str | None = None) -> None:
    """Idempotent; patches the class, so a TokenizerManager built later is covered too.
    `executor`: "simulated" refuses what the simulated executor cannot produce."""
    global _executor
    if executor is not None:  # NOTE: the plugin's later install keeps the launcher's executor
        _executor = executor
    TokenizerManager._validate_one_request = _validate_one_request
    GenerateReqInput.__getitem__ = _getitem


def installed() -> bool:
    return (TokenizerManager._validate_one_request is _validate_one_request
            and GenerateReqInput.__getitem__ is _getitem)
