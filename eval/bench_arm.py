"""bench_serving arms: SGLang's own benchmark client against a fresh server per policy.

    python -m eval.run_arms --no-replay --bench gsp,random-ids --bench-policies stock,radixflow \\
        --out out/bench

For each policy of `--bench-policies` eval/run_arms.py starts one server (the same command and
arguments as its replay arm) and runs, in the order given by `--bench`, upstream's

    python -m sglang.bench_serving --backend sglang --dataset-name generated-shared-prefix|
        random-ids --warmup-requests 0 --cache-report --output-file ... --tokenize-prompt

(sglang/benchmark/serving.py cli_main; the datasets are sglang/benchmark/datasets/
generated_shared_prefix.py and random.py). It folds the JSON line bench_serving writes
(throughput, e2e latency, TTFT, completed) together with what the server itself scheduled in
the benchmark's time window: SGLang's own "Prefill batch" log lines for every policy, plus the
--radixflow-trace rounds where the server writes one.

* `gsp`: the issue's shape by default, 16 groups x 4 prompts, a 2,048-token system prompt, a
  64-token question, 4 output tokens, burst (`--bench-rate inf`). Computing each group's
  prefix once costs groups x (system + question) + groups x (prompts - 1) x question tokens
  (36,864 here): `prefix_once_tokens`, the reference the report divides by.
* `random-ids`: the same number of requests and prompt length with no shared prefix (random
  ids): RadixFlow must cost nothing there.
* `mooncake`: a Mooncake-format trace (`BenchShape.trace_file`, the first `trace_count` records,
  `--mooncake-slowdown-factor` 1 / `trace_speed`; the trace's timestamps pace it, the rate is
  ignored). bench_serving builds text prompts of its own from the hash ids ("{id}hi hi ..."
  per block in a chat template; sglang/benchmark/datasets/mooncake.py), outputs uncapped;
  eval/mooncake.py `bench_segments` builds the same prompts for the twin.

`--tokenize-prompt` (default; `--bench-text` turns it off) sends input ids, so the prompts
have exactly the requested lengths; text prompts are re-tokenized by the server and their
lengths drift. Benchmarks of one policy share its server in sequence: a later benchmark sees
the cache the earlier one left (random-ids prompts share no prefix with gsp ones). Each
benchmark gets its own HOME, because bench_serving caches the generated gsp data under
~/.cache/sglang/benchmark keyed by the tokenizer's class name, not its vocabulary.

On CPU the server decodes too: the simulated executor answers every decode step with one
deterministic token per running request after its cost-model sleep (adapter/simulated.py), so
output lengths > 1 run, and TPOT / ITL are that cost model, not a GPU's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from eval.traffic import GspShape

BENCHES = ("gsp", "random-ids", "mooncake")
DATASET = {"gsp": "generated-shared-prefix", "random-ids": "random-ids", "mooncake": "mooncake"}
# What summary.json keeps of bench_serving's result line (serving.py benchmark()).
BENCH_FIELDS = (
    "completed", "duration", "request_throughput", "input_throughput", "output_throughput",
    "total_input_tokens", "total_output_tokens", "mean_e2e_latency_ms",
    "median_e2e_latency_ms", "p99_e2e_latency_ms", "mean_ttft_ms", "median_ttft_ms",
    "p99_ttft_ms", "mean_tpot_ms", "max_concurrent_requests",
)
BENCH_TIMEOUT_S = 1800.0


def benches(text: str) -> list[str]:
    """`--bench`: comma-separated from BENCHES, or "none"."""
    names = [b.strip() for b in text.split(",") if b.strip()]
    if names == ["none"]:
        return []
    bad = [b for b in names if b not in BENCHES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r} (choose from {', '.join(BENCHES)}, comma-separated, "
            "or none)")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"a benchmark is listed twice: {text!r}")
    return names


@dataclass(frozen=True)
class BenchShape(GspShape):
    """The gsp shape, eval/traffic.py's (random-ids: the same request count, prompt length and
    output length), plus how bench_serving sends it."""

    rate: float = math.inf  # requests/s; inf = burst (bench_serving's --request-rate)
    seed: int = 0
    ids: bool = True  # --tokenize-prompt: exact prompt lengths
    trace_file: str | None = None  # mooncake: the trace (Mooncake-format JSONL)
    trace_count: int | None = None  # mooncake: its first N records (None: all)
    trace_speed: float = 1.0  # mooncake: time compression (slowdown factor 1 / speed)

    @property
    def requests(self) -> int:
        return self.groups * self.prompts_per_group

    def requests_of(self, name: str) -> int:
        """Requests the benchmark `name` sends (mooncake: the trace's first trace_count)."""
        if name != "mooncake":
            return self.requests
        return len(self.trace_records())

    def trace_records(self) -> list:
        """mooncake: the records bench_serving reads (the file's first trace_count)."""
        from eval.mooncake import load_trace

        if self.trace_file is None:
            raise ValueError("the mooncake benchmark needs a trace file")
        return load_trace(self.trace_file)[: self.trace_count]

    @property
    def prompt_len(self) -> int:
        return self.system_len + self.question_len

    @property
    def prefix_once_tokens(self) -> int:
        """gsp: every group's system prompt computed once, every question once."""
        return self.groups * self.system_len + self.requests * self.question_len

    def dataset_args(self, name: str) -> list[str]:
        if name == "gsp":
            return ["--gsp-num-groups", str(self.groups),
                    "--gsp-prompts-per-group", str(self.prompts_per_group),
                    "--gsp-system-prompt-len", str(self.system_len),
                    "--gsp-question-len", str(self.question_len),
                    "--gsp-output-len", str(self.output_len)]
        if name == "mooncake":
            return ["--dataset-path", str(self.trace_file),
                    "--num-prompts", str(self.requests_of(name)),
                    "--mooncake-slowdown-factor", repr(1.0 / self.trace_speed)]
        return ["--num-prompts", str(self.requests), "--random-input-len", str(self.prompt_len),
                "--random-output-len", str(self.output_len), "--random-range-ratio", "1.0"]


def bench_cmd(name: str, shape: BenchShape, base_url: str, model_dir: Path,
              out_file: Path) -> list[str]:
    rate = "inf" if math.isinf(shape.rate) else repr(shape.rate)
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang",
           "--base-url", base_url, "--model", str(model_dir), "--tokenizer", str(model_dir),
           "--dataset-name", DATASET[name], *shape.dataset_args(name),
           "--request-rate", rate, "--seed", str(shape.seed), "--warmup-requests", "0",
           "--cache-report", "--output-file", str(out_file), "--disable-tqdm"]
    # NOTE: mooncake prompts are text whatever the flag (the dataset builds them)
    return cmd + (["--tokenize-prompt"] if shape.ids and name != "mooncake" else [])


def bench_env(home: Path) -> dict[str, str]:
    env = dict(os.environ, HOME=str(home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    env.pop("SGLANG_IS_IN_CI", None)  # NOTE: it would flush the server's cache first
    return env


def read_result(out_file: Path) -> dict[str, Any]:
    """The last JSON line bench_serving appended to its --output-file."""
    if not out_file.exists():
        raise ValueError(f"{out_file}: bench_serving wrote no result")
    lines = [ln for ln in out_file.read_text().splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"{out_file}: empty result file")
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise ValueError(f"{out_file} line {len(lines)}: malformed JSON ({e})") from None


def fold(result: Mapping[str, Any], requests: int) -> dict[str, Any]:
    """bench_serving's fields kept in summary.json; fewer completed than sent is an error."""
    missing = [k for k in ("completed", "mean_e2e_latency_ms") if k not in result]
    if missing:
        raise ValueError(f"bench_serving result lacks {', '.join(missing)}")
    if result["completed"] != requests:
        raise ValueError(f"bench_serving completed {result['completed']} of {requests} "
                         "requests")
    out = {k: result.get(k) for k in BENCH_FIELDS}
    cache = result.get("cache_report") or {}
    out["client_cached_tokens"] = cache.get("total_cached_tokens")
    out["client_prompt_tokens"] = cache.get("total_prompt_tokens")
    return out


def server_counts(batches: Sequence[tuple[int, int, int]],
                  trace: Sequence[Mapping[str, Any]] | None,
                  span: tuple[float, float]) -> dict[str, Any]:
    """What the server scheduled inside the benchmark's window: SGLang's log lines (every
    policy) and, with a trace, its rounds (prefill rounds that launched a batch)."""
    from eval.client import rounds_in

    n = len(batches)
    out: dict[str, Any] = {
        "rounds_sglang_log": n,
        "scheduled_tokens_sglang_log": sum(b[1] for b in batches),
        "cached_tokens_sglang_log": sum(b[2] for b in batches),
        "rows_per_round_sglang_log": sum(b[0] for b in batches) / n if n else 0.0,
        "rounds_trace": None, "scheduled_tokens_trace": None, "blocked_trace": None,
    }
    if trace is not None:
        every = rounds_in(trace, [span])
        launched = [e for e in every if e["rows"] > 0]
        out["rounds_trace"] = len(launched)
        out["scheduled_tokens_trace"] = sum(e["scheduled_tokens"] for e in launched)
        out["blocked_trace"] = sum(e.get("blocked", 0) for e in every)
    return out


@dataclass
class BenchRun:
    """One benchmark against one policy's server (a failed one keeps its error, no numbers)."""

    bench: str
    policy: str
    command: str = ""
    server_command: str = ""
    result: dict[str, Any] | None = None  # fold()
    server: dict[str, Any] | None = None  # server_counts()
    error: str | None = None
    wall_s: float = 0.0
    repeat: int = 0  # --bench-repeat: which alternation (ABBA order, eval/run_arms.py)

    @property
    def ok(self) -> bool:
        return self.error is None and self.result is not None


def run_one(name: str, shape: BenchShape, base_url: str, model_dir: Path, out_dir: Path,
            batches_since_mark: Callable[[], list[tuple[int, int, int]]],
            trace_path: Path | None, timeout: float = BENCH_TIMEOUT_S,
            ) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """Run bench_serving once; return (command, fold(), server_counts()).

    `batches_since_mark()` gives the server log's prefill batches written since just before
    this call (eval/run_arms.py prefill_log_lines)."""
    from eval.client import load_trace

    out_file, bench_log = out_dir / f"bench-{name}.jsonl", out_dir / f"bench-{name}.log"
    out_file.unlink(missing_ok=True)  # NOTE: bench_serving appends
    home = out_dir / f"bench-{name}-home"
    home.mkdir(parents=True, exist_ok=True)
    cmd = bench_cmd(name, shape, base_url, model_dir, out_file)
    t0 = time.monotonic()
    with open(bench_log, "w") as f:
        f.write("$ " + shlex.join(cmd) + "\n")
        f.flush()
        try:
            proc = subprocess.run(cmd, env=bench_env(home), stdout=f, stderr=subprocess.STDOUT,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"bench_serving {name} ran past {timeout:.0f} s; see "
                               f"{bench_log}") from None
    t1 = time.monotonic()
    if proc.returncode != 0:
        tail = bench_log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"bench_serving {name} exited rc={proc.returncode}; log tail:\n"
                           + tail)
    result = fold(read_result(out_file), shape.requests_of(name))
    trace = load_trace(trace_path) if trace_path is not None else None
    if trace_path is not None and trace is None:
        raise RuntimeError(f"no trace written at {trace_path}")
    return cmd, result, server_counts(batches_since_mark(), trace, (t0, t1))


def scheduler_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the server's scheduler processes (SGLang's process title
    "sglang::scheduler...", children of the launcher `pid`) have used so far: the host time
    its rounds cost, read from the OS, the same way for stock (untouched SGLang) and radixflow."""
    import psutil

    total = 0.0
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return math.nan
    for k in kids:
        try:
            if "scheduler" in k.name():
                t = k.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            continue
    return total


def ratios(run: BenchRun, base: BenchRun) -> dict[str, float | None]:
    """run / stock for the headline numbers (None where stock has no value)."""
    pairs = {"scheduled_tokens": ("server", "scheduled_tokens_sglang_log"),
             "rounds": ("server", "rounds_sglang_log"),
             "scheduler_cpu_s": ("server", "scheduler_cpu_s"),
             "request_throughput": ("result", "request_throughput"),
             "mean_e2e_latency_ms": ("result", "mean_e2e_latency_ms"),
             "median_e2e_latency_ms": ("result", "median_e2e_latency_ms"),
             "p99_e2e_latency_ms": ("result", "p99_e2e_latency_ms"),
             "mean_ttft_ms": ("result", "mean_ttft_ms")}
    out: dict[str, float | None] = {}
    for key, (part, k) in pairs.items():
        a, b = (getattr(run, part) or {}).get(k), (getattr(base, part) or {}).get(k)
        out[key] = a / b if a is not None and b else None
    return out


REPEAT_FIELDS = (("result", "mean_e2e_latency_ms"), ("result", "mean_ttft_ms"),
                 ("result", "p99_e2e_latency_ms"), ("server", "scheduled_tokens_sglang_log"),
                 ("server", "rounds_sglang_log"), ("server", "scheduler_cpu_s"))


def repeat_entry(r: BenchRun) -> dict[str, Any]:
    """One alternation's headline figures (--bench-repeat), or its error."""
    if not r.ok:
        return {"repeat": r.repeat, "failed": True, "error": r.error}
    return {"repeat": r.repeat, **{k: (getattr(r, part) or {}).get(k)
                                   for part, k in REPEAT_FIELDS}}


def summary(runs: Sequence[BenchRun], shape: BenchShape) -> dict[str, Any]:
    """summary.json's "bench": {bench: {policy: {...}}} with ratios vs the stock policy (the
    first alternation's). With --bench-repeat > 1 every policy also lists its "repeats" and a
    non-stock one "vs_stock_repeats" (alternation k against stock's alternation k) and
    "vs_stock_median" (their median per figure: what a claim may quote, never one run)."""
    out: dict[str, Any] = {}
    first = [r for r in runs if r.repeat == 0]
    for r in first:
        entry: dict[str, Any] = {"command": r.command, "server_command": r.server_command,
                                 "wall_s": r.wall_s}
        if r.ok:
            entry |= {"bench_serving": r.result, "server": r.server}
            if r.bench == "gsp":
                sched = r.server["scheduled_tokens_sglang_log"]
                entry["prefix_once_tokens"] = shape.prefix_once_tokens
                entry["scheduled_over_prefix_once"] = sched / shape.prefix_once_tokens
        else:
            entry |= {"failed": True, "error": r.error}
        out.setdefault(r.bench, {})[r.policy] = entry
    for bench, per in out.items():
        base = next((r for r in first if r.bench == bench and r.policy == "stock" and r.ok),
                    None)
        for r in first:
            if r.bench == bench and r.ok and base is not None and r is not base:
                per[r.policy]["vs_stock"] = ratios(r, base)
    if any(r.repeat > 0 for r in runs):
        _add_repeats(out, runs)
    return out


def _add_repeats(out: dict[str, Any], runs: Sequence[BenchRun]) -> None:
    for bench, per in out.items():
        stock = {r.repeat: r for r in runs
                 if r.bench == bench and r.policy == "stock" and r.ok}
        for policy, entry in per.items():
            mine = sorted((r for r in runs if r.bench == bench and r.policy == policy),
                          key=lambda r: r.repeat)
            entry["repeats"] = [repeat_entry(r) for r in mine]
            if policy == "stock":
                continue
            pairs = [ratios(r, stock[r.repeat]) for r in mine if r.ok and r.repeat in stock]
            entry["vs_stock_repeats"] = pairs
            keys = pairs[0].keys() if pairs else ()
            entry["vs_stock_median"] = {
                k: median(vs) if (vs := [p[k] for p in pairs if p[k] is not None]) else None
                for k in keys}


__all__ = ["BENCHES", "BenchRun", "BenchShape", "bench_cmd", "benches", "fold", "read_result",
           "repeat_entry", "run_one", "scheduler_cpu_s", "server_counts",
           "summary"]
