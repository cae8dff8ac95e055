"""The config contract (radixflow_sglang/config.py): each setting defined once, flag <->
variable <-> RadixFlowConfig field, validated once, errors naming what the user set."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from radixflow_sglang.config import (
    FIELD_NAMES,
    FLAG_NAMES,
    SETTINGS,
    VAR_NAMES,
    ConfigError,
    RadixFlowConfig,
    build,
    config_from_env,
)
from radixflow_sglang.core import policy as core_policy


def test_every_setting_is_one_field_one_flag_one_variable_with_one_default() -> None:
    cfg_fields = {f.name: f.default for f in dataclasses.fields(RadixFlowConfig)}
    assert {s.field: s.default for s in SETTINGS} == cfg_fields
    for s in SETTINGS:
        assert s.flag == "--radixflow-" + s.field.replace("_", "-")
        assert s.var == "RADIXFLOW_" + s.field.upper()
    assert len({s.flag for s in SETTINGS}) == len({s.var for s in SETTINGS}) == len(SETTINGS)


def test_policy_choices_are_the_cores_list_and_the_admission_range_its_range() -> None:
    by = {s.field: s for s in SETTINGS}
    assert by["policy"].choices is core_policy.POLICIES
    assert (by["admission_ms"].low, by["admission_ms"].high) == core_policy.ADMISSION_MS_RANGE


def test_the_adapter_keeps_the_old_import_paths() -> None:
    from radixflow_sglang.adapter.runtime import RadixFlowConfig as FromRuntime
    from radixflow_sglang.adapter.scheduler import config_from_env as from_scheduler

    assert FromRuntime is RadixFlowConfig and from_scheduler is config_from_env


def test_the_config_is_frozen_and_checked_when_built() -> None:
    cfg = RadixFlowConfig(policy="traversal", theta=128)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.theta = 1  # type: ignore[misc]
    with pytest.raises(ConfigError, match=r"^RadixFlowConfig.theta: 0 is outside the allowed "
                                          r"range \[1, 1048576\]$"):
        RadixFlowConfig(theta=0)
    with pytest.raises(ConfigError, match=r"^RadixFlowConfig.park_margin: '2' is not an integer"):
        RadixFlowConfig(park_margin="2")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^RadixFlowConfig.trace is set but "
                                          r"RadixFlowConfig.policy is stock"):
        RadixFlowConfig(policy="stock", trace="t.jsonl")


def test_environment_round_trip_for_every_setting(tmp_path) -> None:
    cfg = RadixFlowConfig(policy="radixflow-frag", admission_ms=2.5, theta=300, park_margin=0,
                          frag_cap=7, trace=str(tmp_path / "t.jsonl"), round_overhead_ms=12.5,
                          arrival_rate=3.0)
    env = {k: v for k, v in cfg.to_env().items() if v is not None}
    assert set(env) == {s.var for s in SETTINGS}
    assert config_from_env(env) == cfg
    assert config_from_env({}) == RadixFlowConfig()
    assert config_from_env({"RADIXFLOW_THETA": ""}) == RadixFlowConfig()  # empty: unset


@pytest.mark.parametrize("var, text, problem", [
    ("RADIXFLOW_POLICY", "fast", "invalid choice 'fast' (choose from stock, radix,"),
    ("RADIXFLOW_ADMISSION_MS", "inf", "inf is outside the allowed range [0, 1000] ms"),
    ("RADIXFLOW_ADMISSION_MS", "soon", "'soon' is not a number"),
    ("RADIXFLOW_THETA", "1.5", "'1.5' is not an integer"),
    ("RADIXFLOW_FRAG_CAP", "1001", "1001 is outside the allowed range [0, 1000]"),
    ("RADIXFLOW_ROUND_OVERHEAD_MS", "-1", "-1 is outside the allowed range [0, 60000] ms"),
    ("RADIXFLOW_TRACE", "/no/such/dir/t.jsonl", "directory /no/such/dir does not exist"),
])
def test_variable_errors_name_the_variable(var: str, text: str, problem: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_env({var: text})
    assert str(e.value).startswith(f"{var}: {problem}")


def test_one_error_renders_with_the_name_of_each_source() -> None:
    """The launcher mixes sources: each field is named by where its value came from."""
    with pytest.raises(ConfigError) as e:
        build({"trace": "t.jsonl"}, {"trace": VAR_NAMES["trace"], "policy": FLAG_NAMES["policy"]},
              parsed={"policy": "stock"})
    assert str(e.value).startswith("RADIXFLOW_TRACE is set but --radixflow-policy is stock")
    assert e.value.render(FIELD_NAMES).startswith("RadixFlowConfig.trace is set but")
    assert str(pickle.loads(pickle.dumps(e.value))) == str(e.value)  # crosses processes
