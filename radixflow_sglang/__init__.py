"""RadixFlow for SGLang: state-ready traversal and flexible admission for hybrid-model prefill.

Layout: `core/` is a pure-Python policy core (tokens and integers, no SGLang import);
`adapter/` is the one place that touches SGLang 0.5.23 internals; `launch_server` and
`plugin` install the adapter into SGLang's scheduler processes; `models` is the model catalog
(`model_dirs/` its geometries, `tokenizer` its offline tokenizers); `testing/` the CPU kit and
test helpers on SGLang's real classes.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    """`radixflow_sglang.Engine`: sglang.Engine with RadixFlow (adapter/engine.py), imported on
    first use so that importing the package does not import SGLang."""
    if name == "Engine":
        from radixflow_sglang.adapter.engine import Engine

        return Engine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
