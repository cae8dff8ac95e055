"""The simulated executor's logprobs (adapter/sim_outputs.py): a proper distribution centred on
the chosen token, in the layout SGLang's result processing reads."""

from __future__ import annotations

import math

import torch

from radixflow_sglang.adapter.sim_outputs import HEAD, LOG_HALF, logprob_at

VOCAB = 248_320


def test_the_distribution_sums_to_one_and_peaks_at_the_chosen_token() -> None:
    lp = logprob_at(torch.arange(VOCAB), VOCAB).double()
    assert math.isclose(torch.logsumexp(lp, 0).item(), 0.0, abs_tol=1e-6)
    assert math.isclose(lp[0].item(), LOG_HALF, rel_tol=1e-6) and int(lp.argmax()) == 0
    # strictly decreasing over the head, then flat below it
    assert bool((lp[1:HEAD + 1] < lp[:HEAD]).all()) and bool((lp[HEAD:] == lp[HEAD]).all())


def test_a_tiny_vocabulary_is_still_a_distribution() -> None:
    v = HEAD + 2
    assert math.isclose(torch.logsumexp(logprob_at(torch.arange(v), v).double(), 0).item(), 0.0,
                        abs_tol=1e-6)
