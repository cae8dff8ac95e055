from __future__ import annotations

import warnings

import pytest

# NOTE: eval/ is imported from the repository root (pyproject's pytest `pythonpath`).
warnings.filterwarnings("ignore", category=UserWarning)


@pytest.fixture
def make_kit():
    """Kit factory on SGLang's real classes: make_kit(model, layout, policy, **KitConfig)."""
    from radixflow_sglang.testing.kit import Kit, KitConfig

    def build(model="qwen3.5-4b", layout="extra_buffer", policy="stock", radixflow_config=None,
              clock=None, **cfg):
        return Kit(KitConfig(model=model, layout=layout, **cfg), policy=policy,
                   radixflow_config=radixflow_config, clock=clock)

    return build
