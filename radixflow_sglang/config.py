"""The one config contract: `--radixflow-*` flag <-> RADIXFLOW_* variable <-> config field.

Every setting is defined once in SETTINGS (its field, type, default, range or choices, help).
The launcher builds its flags from it and hands the validated config to SGLang's spawned
processes through the variables (`to_env`); each scheduler process and the plugin read them back
(`config_from_env`); `radixflow_sglang.Engine` takes them as keywords `radixflow_<field>`
(`config_from_kwargs`). Checks raise `ConfigError` naming the field; the layer that knows where a
value came from renders it with the flag or the variable the user actually set.

Engine-free (no SGLang import), so `--help` and argument errors are fast.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from radixflow_sglang.core.admission import HOLD_MS
from radixflow_sglang.core.boundary import MODES as BOUNDARY_MODES
from radixflow_sglang.core.points import FRAG_CAP
from radixflow_sglang.core.policy import ADMISSION_MS_RANGE, POLICIES, PolicySpec, policy_spec
from radixflow_sglang.core.traversal import PARK_MARGIN, THETA_FLOOR
from radixflow_sglang.profiles import DEFAULT_PROFILE, PROFILES

FLAG_PREFIX = "--radixflow-"
ENV_PREFIX = "RADIXFLOW_"
KWARG_PREFIX = "radixflow_"  # radixflow_sglang.Engine's keywords
EXECUTORS = ("model", "simulated")
KIND_NAMES = {int: "an integer", float: "a number", str: "a string"}


class ConfigError(ValueError):
    """A bad setting. `problem` never names a flag or variable: `render` adds the name the user
    set (one field: "NAME: problem"; several: the problem is a template with {0}, {1}, ...)."""

    def __init__(self, fields: tuple[str, ...], problem: str,
                 names: Mapping[str, str] | None = None) -> None:
        self.fields, self.problem = fields, problem
        self.names = dict(FIELD_NAMES if names is None else names)
        super().__init__(self.render(self.names))

    def __reduce__(self) -> tuple:  # NOTE: picklable across processes (args is the message)
        return (ConfigError, (self.fields, self.problem, self.names))

    def render(self, names: Mapping[str, str]) -> str:
        labels = [names.get(f, f) for f in self.fields]
        if len(labels) == 1:
            return f"{labels[0]}: {self.problem}"
        return self.problem.format(*labels)

    def named(self, names: Mapping[str, str]) -> ConfigError:
        return ConfigError(self.fields, self.problem, names)


@dataclass(frozen=True)
class Setting:
    field: str
    kind: type  # int, float or str
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None
    unit: str = ""
    path: bool = False  # a file to write: its directory must exist
    env: bool = True  # False: a launcher-only flag (no variable, not a RadixFlowConfig field)

    @property
    def flag(self) -> str:
        return FLAG_PREFIX + self.field.replace("_", "-")

    @property
    def var(self) -> str | None:
        return ENV_PREFIX + self.field.upper() if self.env else None

    def num(self, x: float) -> str:
        return str(int(x)) if self.kind is int and math.isfinite(x) else f"{x:g}"

    def parse(self, text: str) -> Any:
        """Text (a flag's argument or a variable's value) -> checked value; neutral errors."""
        if self.kind is int:
            try:
                value = int(text)
            except ValueError:
                raise ConfigError((self.field,), f"{text!r} is not {KIND_NAMES[int]}") from None
        elif self.kind is float:
            try:
                value = float(text)
            except ValueError:
                raise ConfigError((self.field,), f"{text!r} is not {KIND_NAMES[float]}") from None
        else:
            value = text
        self.check(value)
        return value

    def check(self, value: Any) -> None:
        if value is None:
            return
        kinds = (int, float) if self.kind is float else (self.kind,)
        if not isinstance(value, kinds) or isinstance(value, bool):
            raise ConfigError((self.field,), f"{value!r} is not {KIND_NAMES[self.kind]}")
        if self.choices is not None and value not in self.choices:
            raise ConfigError((self.field,), f"invalid choice {value!r} "
                                             f"(choose from {', '.join(self.choices)})")
        if self.low is not None and not (math.isfinite(value) and self.low <= value <= self.high):
            raise ConfigError((self.field,), f"{self.num(value)} is outside the allowed range "
                                             f"[{self.num(self.low)}, {self.num(self.high)}]"
                                             f"{self.unit}")
        if self.path:
            parent = Path(value).resolve().parent
            if not parent.is_dir():
                raise ConfigError((self.field,), f"directory {parent} does not exist")


SETTINGS: tuple[Setting, ...] = (
    Setting("policy", str, "radixflow", "admission / selection policy", choices=POLICIES),
    Setting("admission_ms", float, None,
            f"flexible admission hold bound in ms (default {HOLD_MS:g}; timer5/timer10 fix "
            "theirs)",
            low=ADMISSION_MS_RANGE[0], high=ADMISSION_MS_RANGE[1], unit=" ms"),
    Setting("theta", int, None, "minimum ready-prefix gain (tokens) worth a wait; "
            f"default max(G, {THETA_FLOOR})", low=1, high=1 << 20),
    Setting("park_margin", int, PARK_MARGIN,
            "rounds beyond the publish lag a request may stay parked", low=0, high=1000),
    Setting("frag_cap", int, FRAG_CAP, "rounds radixflow-frag may defer one request", low=0,
            high=1000),
    Setting("trace", str, None, "per-round and per-request JSONL trace path (not with stock)",
            path=True),
    Setting("boundaries", str, "both", "publication boundaries: publish a request's state "
            "where its shared prefix ends: declared (request field, system message, fork "
            "prefix), learned (from the cache's reuse depths), both, or off",
            choices=BOUNDARY_MODES),
    Setting("chat_boundary", str, "off", "declare the end of a chat request's system message as "
            "its boundary (with declared/both); off by default: a conversation whose system "
            "prompt nobody shares loses its end state (8 percent more tokens on multi-turn)",
            choices=("off", "on")),
    Setting("drain_timeout", float, 30.0, "seconds SIGTERM waits for in-flight requests before "
            "it aborts them and the server exits (SGLang alone waits without bound); new "
            "requests get 503 meanwhile", low=0, high=86_400, unit=" s"),
    Setting("round_overhead_ms", float, None, "the host time a prefill round adds besides its "
            "forward, as every wait decision prices it; default: measured (the median wall "
            "period less the forward over the last 32 prefill rounds). Pin it to make "
            "decisions independent of host load", low=0, high=60_000, unit=" ms"),
    Setting("arrival_rate", float, None, "the request arrival rate (per second) the wait rule "
            "prices; default: measured (new queue entries over the last 5 s, rank 0's clock). "
            "Pin it, with --radixflow-round-overhead-ms, to make the wait rule's decisions "
            "independent of the clients' timing (the hold's deadline still reads the clock)",
            low=0, high=1e6, unit="/s"),
    Setting("sim_profile", str, DEFAULT_PROFILE, "the simulated executor's round cost "
            "(radixflow_sglang/profiles.py): box (5 ms + 2 us/token + 0.1 ms/row) or paper (the "
            "served model's A800 rounds, the paper's Table 9: 0.8B 42.6 ms + 7.1 us/token); "
            "RADIXFLOW_SIM_ALPHA/BETA/GAMMA override one coefficient each; the model executor "
            "ignores it", choices=PROFILES),
    Setting("sim_scan_tax_us", float, 0.0, "a what-if for the simulated executor: this many "
            "microseconds of the scheduler thread's CPU spent before each prefill scan that "
            "has requests queued, under every policy (stock too): what that much more host "
            "time per scan costs on this machine (eval/whatif_arm.py); 0 (default) spends "
            "none; the model executor ignores it", low=0, high=1e6, unit=" us"),
)
LAUNCHER_SETTINGS: tuple[Setting, ...] = (
    Setting("executor", str, None, "model (GPU) or simulated (CPU cost model); default: model "
            "if a GPU is visible", choices=EXECUTORS, env=False),
)
BY_FIELD = {s.field: s for s in SETTINGS + LAUNCHER_SETTINGS}
# NOTE: what an unset setting means, for the start-up line when the model is not known yet (the
# plugin starts before SGLang reads the model): never the bare word "default"
UNSET_MEANS = {"theta": f"max(G,{THETA_FLOOR})", "trace": "off", "round_overhead_ms": "measured",
               "arrival_rate": "measured"}
FIELD_NAMES = {s.field: f"RadixFlowConfig.{s.field}" for s in SETTINGS}
FLAG_NAMES = {s.field: s.flag for s in SETTINGS + LAUNCHER_SETTINGS}
VAR_NAMES = {s.field: s.var for s in SETTINGS}
KWARG_NAMES = {s.field: KWARG_PREFIX + s.field for s in SETTINGS + LAUNCHER_SETTINGS}


@dataclass(frozen=True)
class RadixFlowConfig:
    """The validated settings of one scheduler process (defaults: SETTINGS)."""

    policy: str = "radixflow"
    admission_ms: float | None = None
    theta: int | None = None  # min ready-prefix gain worth a wait; default max(G, 64)
    park_margin: int = PARK_MARGIN  # rounds beyond the publish lag a request may stay parked
    frag_cap: int = FRAG_CAP  # rounds a request may be deferred by the fragmentation guard
    trace: str | None = None  # JSONL path for per-round and per-request events
    boundaries: str = "both"  # publication boundaries (core/boundary.py MODES)
    chat_boundary: str = "off"  # the chat system message as a declared boundary
    drain_timeout: float = 30.0  # seconds a SIGTERM drain waits before aborting (adapter/drain.py)
    round_overhead_ms: float | None = None  # a round's host overhead, pinned (None: measured)
    arrival_rate: float | None = None  # the wait rule's arrival rate, pinned (None: measured)
    sim_profile: str = DEFAULT_PROFILE  # the simulated executor's cost profile (profiles.py)
    sim_scan_tax_us: float = 0.0  # what-if: scheduler CPU spent before each scan (simulated.py)

    def __post_init__(self) -> None:
        for f in fields(self):
            BY_FIELD[f.name].check(getattr(self, f.name))
        if self.trace and self.policy == "stock":
            # NOTE: stock runs SGLang's unmodified scheduler class, which writes no trace
            raise ConfigError(("trace", "policy"), "{0} is set but {1} is stock, which runs "
                                                   "SGLang's unmodified scheduler and writes no "
                                                   "trace: drop {0} or choose another policy")

    @property
    def spec(self) -> PolicySpec:
        return policy_spec(self.policy, self.admission_ms)

    def settings(self) -> dict[str, Any]:
        """Every setting in force (None: resolved per model, e.g. theta = max(G, 64)); the
        policy's hold bound for admission_ms ("off": the policy does not hold)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["admission_ms"] = self.spec.admission_ms if self.spec.admission else "off"
        return out

    def describe_settings(self, resolved: Mapping[str, Any] | None = None) -> str:
        """`k=v` for every setting in force: an unset one as what it resolves to (`resolved`,
        e.g. theta once the model is known), else the rule that resolves it (UNSET_MEANS)."""
        values = self.settings() | {k: v for k, v in (resolved or {}).items() if v is not None}
        return " ".join(f"{k}={UNSET_MEANS.get(k, 'default') if v is None else v}"
                        for k, v in values.items())

    def to_env(self) -> dict[str, str | None]:
        """The variables that carry this config to spawned processes (None: unset it)."""
        return {s.var: None if getattr(self, s.field) is None else str(getattr(self, s.field))
                for s in SETTINGS}


def build(texts: Mapping[str, str], names: Mapping[str, str],
          parsed: Mapping[str, Any] | None = None) -> RadixFlowConfig:
    """A config from per-field texts (and already-parsed values); errors name `names[field]`."""
    values = dict(parsed or {})
    try:
        for field, text in texts.items():
            values[field] = BY_FIELD[field].parse(text)
        return RadixFlowConfig(**values)
    except ConfigError as e:
        raise e.named(names) from None


def env_texts(env: Mapping[str, str]) -> dict[str, str]:
    """The settings a RADIXFLOW_* variable sets (empty values count as unset)."""
    return {s.field: env[s.var] for s in SETTINGS if env.get(s.var)}


def config_from_env(env: Mapping[str, str] | None = None) -> RadixFlowConfig:
    """The scheduler processes' and the plugin's config; errors name the variable."""
    return build(env_texts(os.environ if env is None else env), VAR_NAMES)


def config_from_kwargs(kwargs: Mapping[str, Any],
                       env: Mapping[str, str]) -> tuple[RadixFlowConfig, str | None]:
    """radixflow_sglang.Engine's settings: keywords `radixflow_<field>` (typed values), else the
    RADIXFLOW_* variables, else defaults; (config, executor or None). Errors name the keyword
    or the variable the caller set; an unknown `radixflow_*` keyword lists the known ones."""
    by_kwarg = {name: field for field, name in KWARG_NAMES.items()}
    unknown = sorted(k for k in kwargs if k.startswith(KWARG_PREFIX) and k not in by_kwarg)
    if unknown:
        raise TypeError(f"unknown RadixFlow keyword {unknown[0]!r} (choose from "
                        f"{', '.join(by_kwarg)})")
    given = {by_kwarg[k]: v for k, v in kwargs.items() if k in by_kwarg}
    executor = given.pop("executor", None)
    names = {f: KWARG_NAMES[f] for f in given} | {
        f: VAR_NAMES[f] for f in env_texts(env) if f not in given}
    try:
        BY_FIELD["executor"].check(executor)
    except ConfigError as e:
        raise e.named(KWARG_NAMES) from None
    texts = {f: t for f, t in env_texts(env).items() if f not in given}
    return build(texts, names, parsed=given), executor


def argparse_type(setting: Setting) -> Callable[[str], Any]:
    """An argparse `type=`: argparse reports its error as "argument FLAG: problem"."""
    import argparse

    def parse(text: str) -> Any:
        try:
            return setting.parse(text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(e.problem) from None

    parse.__name__ = setting.field  # NOTE: argparse names the type in some messages
    return parse
