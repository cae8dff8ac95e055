"""Argument types shared by the eval scripts: argparse turns their errors into messages that
name the flag and the allowed values."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from radixflow_sglang.core.policy import POLICIES

# NOTE: an arm that is no RadixFlow policy: SGLang's unmodified scheduler (policy stock) with
# `--schedule-policy lpm` (schedule_policy.py `_compute_prefix_matches`: a request whose prefix
# another queued request shares waits), SGLang's own answer to in-batch prefix sharing.
STOCK_LPM = "stock-lpm"
ARM_SCHEDULE = {STOCK_LPM: ("stock", "lpm")}  # arm -> (policy, SGLang --schedule-policy)
ARMS = (*POLICIES, STOCK_LPM)


def arm_policy(arm: str) -> tuple[str, str | None]:
    """(RadixFlow policy, SGLang --schedule-policy or None: the server's default fcfs)."""
    return ARM_SCHEDULE.get(arm, (arm, None))


def _names(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"give at least one {what}")
    bad = [p for p in names if p not in allowed]
    if bad:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {', '.join(map(repr, bad))} (choose from {', '.join(allowed)})")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a {what} is listed twice: {text!r}")
    return names


def policies(text: str) -> list[str]:
    return _names(text, POLICIES, "policy")


def arms(text: str) -> list[str]:
    """Policies plus the stock-lpm arm (eval.replay, eval.run_arms)."""
    return _names(text, ARMS, "policy")


def comma_choices(allowed: tuple[str, ...] | list[str]) -> Callable[[str], list[str]]:
    """An argparse type: comma-separated names from `allowed`, each once."""
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        bad = [n for n in names if n not in allowed]
        if bad or not names or len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(
                f"invalid value {text!r} (choose from {', '.join(allowed)}, comma-separated, "
                "each once)")
        return names

    return parse


def _checked(kind: type, what: str | None, ok: Callable[[Any], bool],
             rule: str) -> Callable[[str], Any]:
    what = what or f"a {kind.__name__}"

    def parse(text: str) -> Any:
        try:
            x = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not ok(x):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
        return x

    return parse


def positive(kind: type, what: str | None = None) -> Callable[[str], Any]:
    return _checked(kind, what, lambda x: x > 0, "> 0")


def non_negative(kind: type, what: str | None = None) -> Callable[[str], Any]:
    """A finite number >= 0 (argparse names the flag in the error)."""
    return _checked(kind, what, lambda x: 0 <= x < float("inf"), "a finite number >= 0")


def server_words(p: argparse.ArgumentParser, server_args: str) -> list[str]:
    """--server-args split as a shell would, or an argument error naming the flag."""
    import shlex

    try:
        return shlex.split(server_args)
    except ValueError as e:  # NOTE: an unclosed quote: shlex says "No closing quotation"
        p.error(f"--server-args: {e} in {server_args!r}; quote each SGLang flag's value "
                "as a shell would")


def check_overlap(p: argparse.ArgumentParser, overlap: bool, server_args: str) -> None:
    """--overlap with no_buffer in --server-args: SGLang refuses to start such a server
    (arg_groups/mamba_hook.py `validate_mamba_no_buffer`: no_buffer runs without overlap), so
    every run of the series would fail at start-up. An argument error instead, naming both."""
    words = server_words(p, server_args)
    layout = next((w.split("=", 1)[1] for w in words
                   if w.startswith("--mamba-radix-cache-strategy=")), None)
    if "--mamba-radix-cache-strategy" in words[:-1]:
        layout = words[words.index("--mamba-radix-cache-strategy") + 1]
    if overlap and layout == "no_buffer":
        p.error("--overlap: the no_buffer layout (--server-args \"--mamba-radix-cache-strategy "
                "no_buffer\") runs without overlap scheduling (SGLang refuses the pair); drop "
                "--overlap, or choose --mamba-radix-cache-strategy extra_buffer")
