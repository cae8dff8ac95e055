"""The kit's vocabulary is the model's (issue: harden item 3): each geometry's config.json
`vocab_size` (Qwen3.5 248,320, Qwen3 151,936, Nemotron-H 131,072), never one model's."""

from __future__ import annotations

import pytest

from radixflow_sglang import models


def config_vocab(name: str) -> int:
    return models.text_config(name)["vocab_size"]


@pytest.mark.parametrize("model", ["qwen3.5-4b", "qwen3-8b", "nemotron-9b"])
def test_the_kit_takes_its_vocabulary_from_the_model_config(make_kit, model):
    k = make_kit(model, "extra_buffer", "stock")
    vocab = config_vocab(model)
    assert k.geometry.vocab_size == vocab
    assert k.sched.model_config.vocab_size == vocab  # what the scan and Req read
    assert k.req("a", [1, 2, 3]).vocab_size == vocab


def test_the_catalog_geometries_differ_in_vocabulary():
    # NOTE: guards the test above: one hard-coded size cannot match them all
    assert len({config_vocab(m) for m in ("qwen3.5-4b", "qwen3-8b", "nemotron-9b")}) == 3
