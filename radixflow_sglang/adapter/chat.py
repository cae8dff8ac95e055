"""The chat template's system message as a declared boundary (OpenAI chat endpoint; issue 15).

`install_chat` wraps serving_chat.py `OpenAIServingChat._convert_to_internal_request`: a chat
request with token-id input and no boundary of its own declares where its leading system
message(s) end (`system_boundary`) in `sampling_params.custom_params` (adapter/boundary.py
FIELD), which the scheduler then reads as any declared boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .boundary import FIELD


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def system_boundary(tokenizer, messages: list, prompt_ids: list[int],
                    template_kwargs: dict | None = None) -> int | None:
    """Token position where the leading system message(s) end in `prompt_ids`: the system
    messages rendered alone by the same chat template, matched against the prompt (the common
    prefix: a template may close the system block differently when more follows)."""
    k = 0
    while k < len(messages) and _role(messages[k]) in ("system", "developer"):
        k += 1
    if k == 0 or k == len(messages):
        return None
    try:
        ids = tokenizer.apply_chat_template([_plain(m) for m in messages[:k]], tokenize=True,
                                            add_generation_prompt=False,
                                            **(template_kwargs or {}))
    except Exception:  # noqa: BLE001  NOTE: a template that needs a user turn: no boundary
        return None
    n = lcp(token_ids(ids), prompt_ids)
    return n or None


def token_ids(rendered: Any) -> list[int]:
    """apply_chat_template(tokenize=True)'s ids: a list, or a BatchEncoding in newer
    transformers (a mapping whose list() would be its keys)."""
    if hasattr(rendered, "keys"):
        rendered = rendered["input_ids"]
    return list(rendered)


def _role(m: Any) -> str | None:
    return m.get("role") if isinstance(m, dict) else getattr(m, "role", None)


def _plain(m: Any) -> dict:
    if isinstance(m, dict):
        return m
    content = getattr(m, "content", None)
    if isinstance(content, list):  # NOTE: text parts joined, as templates see plain strings
        content = "".join(getattr(p, "text", "") or "" for p in content)
    return {"role": m.role, "content": content or ""}


def _with_system_boundary(self: Any, request: Any, adapted: Any) -> None:
    ids = adapted.input_ids
    sp = adapted.sampling_params
    if not isinstance(ids, list) or not ids or not isinstance(ids[0], int):
        return  # NOTE: a text prompt (tokenized later) or a batch: no boundary
    if not isinstance(sp, dict):
        return
    params = dict(sp.get("custom_params") or {})
    if FIELD in params:
        return  # the request declared its own
    b = system_boundary(self.tokenizer_manager.tokenizer, list(request.messages), ids,
                        request.chat_template_kwargs)
    if b is not None and b < len(ids):
        params[FIELD] = b
        sp["custom_params"] = params


_UPSTREAM_CONVERT = None


def install_chat() -> None:
    """Idempotent: chat requests declare the end of their system message as their boundary."""
    global _UPSTREAM_CONVERT
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

    if _UPSTREAM_CONVERT is not None:
        return
    _UPSTREAM_CONVERT = OpenAIServingChat._convert_to_internal_request

    def convert(self, request, raw_request=None):
        adapted, req = _UPSTREAM_CONVERT(self, request, raw_request)
        _with_system_boundary(self, request, adapted)
        return adapted, req

    OpenAIServingChat._convert_to_internal_request = convert
