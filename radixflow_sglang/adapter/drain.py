"""A bounded SIGTERM drain for SGLang 0.5.23's HTTP server (`--radixflow-drain-timeout`).

Upstream (managers/tokenizer_manager.py): `SignalHandler.sigterm_handler` sets
`gracefully_exit`; `TokenizerManager.sigterm_watchdog` notices it within 5 s, then waits, 5 s at a
time, until no request is in flight (no bound: 20 requests of 4,000 tokens took about a minute on
CPU), and only then asks the schedulers to exit and kills the process tree. SGLang 0.5.23 has no
switch for the bound (`SGL_FORCE_SHUTDOWN` skips the drain altogether). Meanwhile `/health`
answers 503 (entrypoints/http_server.py `health_generate`) but `/generate` and the OpenAI routes
still accept new work.

Two patches, installed in the process that runs the tokenizer manager (adapter/entry.py
`activate`, every policy):
- `sigterm_watchdog` is wrapped: it polls every IDLE_POLL_S, waits for in-flight requests at most
  `timeout` seconds, then aborts what is left (`abort_request(abort_all=True)`: the clients get
  SGLang's abort answer), gives the aborts ABORT_GRACE_S to come back, forgets any straggler,
  and hands over to upstream's watchdog, which finds the drain done and shuts down as usual
  (ShutdownReq to the schedulers, kill of the process tree, uvicorn stop).
- an HTTP middleware on SGLang's `app` answers 503 to every POST but `/abort_request` once the
  drain has begun.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from . import check_sglang_version

check_sglang_version()

from sglang.srt.managers.tokenizer_manager import TokenizerManager  # noqa: E402

logger = logging.getLogger(__name__)
POLL_S = 0.1
IDLE_POLL_S = 0.5  # before SIGTERM (upstream: 5 s); the middleware reads the flag directly
ABORT_GRACE_S = 5.0  # for the aborts' answers to come back from the scheduler
STILL_ALLOWED = ("/abort_request",)  # POSTs a drain still serves
_UPSTREAM_WATCHDOG = TokenizerManager.sigterm_watchdog
_timeout = 30.0
_middleware_added = False


async def _until(cond, deadline: float) -> bool:
    """Poll `cond` until it holds or `deadline` (monotonic) passes; whether it held."""
    while not cond():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


async def bounded_sigterm_watchdog(self: TokenizerManager) -> None:
    while not self.gracefully_exit:
        await asyncio.sleep(IDLE_POLL_S)
    start = time.monotonic()
    if not await _until(lambda: not self.rid_to_state, start + _timeout):
        left = list(self.rid_to_state)
        logger.warning("radixflow: drain timeout %gs (--radixflow-drain-timeout) reached; "
                       "aborting %d requests still in flight", _timeout, len(left))
        self.abort_request(abort_all=True)
        if not await _until(lambda: not self.rid_to_state, time.monotonic() + ABORT_GRACE_S):
            logger.warning("radixflow: no abort answer for %s; exiting without it",
                           list(self.rid_to_state))
            self.rid_to_state.clear()
    logger.info("radixflow: drained in %.1fs; shutting down", time.monotonic() - start)
    await _UPSTREAM_WATCHDOG(self)


def _draining() -> bool:
    from sglang.srt.entrypoints.http_server import _global_state

    tm = getattr(_global_state, "tokenizer_manager", None)
    return tm is not None and tm.gracefully_exit


class RefuseDuringDrain:
    """Pure ASGI middleware (SGLang patches `app.middleware("http")` so that a dispatch's
    returned response is never sent: utils/http_middleware_patch.py)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if (scope["type"] == "http" and scope["method"] == "POST"
                and scope["path"] not in STILL_ALLOWED and _draining()):
            from starlette.responses import JSONResponse

            await JSONResponse(status_code=503, content={"error": {
                "message": "the server is shutting down (SIGTERM drain, at most "
                           f"--radixflow-drain-timeout {_timeout:g} s): it takes no new "
                           "requests; send this one to another replica", "code": 503}},
            )(scope, receive, send)
            return
        await self.app(scope, receive, send)


def install(timeout: float) -> None:
    """Idempotent. The middleware must be added before uvicorn starts the app."""
    global _timeout, _middleware_added
    _timeout = timeout
    TokenizerManager.sigterm_watchdog = bounded_sigterm_watchdog
    if not _middleware_added:
        from sglang.srt.entrypoints.http_server import app

        app.add_middleware(RefuseDuringDrain)
        _middleware_added = True
