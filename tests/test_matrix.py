"""A tiny matrix (eval/matrix.py): files, cells, and ratios against the same cell's stock."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eval import matrix

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, int]:
    out = tmp_path_factory.mktemp("matrix")
    # NOTE: its own process, as a user runs it (the CLI, its pool and its exit status).
    argv = ["--out", str(out), "--models", "qwen3.5-4b", "--alphas-ms", "8,200", "--rates", "20",
            "--workloads", "synthetic", "--questions", "2", "--workers", "1",
            "--policies", "stock,traversal,radixflow"]
    r = subprocess.run([sys.executable, "-m", "eval.matrix", *argv], cwd=ROOT, timeout=1800,
                       capture_output=True, text=True)
    assert (out / "matrix.json").exists(), r.stderr[-3000:]
    return out, json.loads((out / "matrix.json").read_text()), r.returncode


def test_files_and_cells(run: tuple[Path, dict, int]) -> None:
    out, doc, rc = run
    assert rc == 0
    assert (out / "matrix.png").stat().st_size > 0
    text = (out / "matrix.md").read_text()
    assert "| radixflow mean |" in text and "| traversal mean |" in text
    cells = doc["cells"]
    # 2 alphas x (extra_buffer, extra_buffer + overlap, no_buffer) for a hybrid model
    keys = {(c["alpha_ms"], c["layout"], c["overlap"]) for c in cells}
    assert keys == {(a, lay, ov) for a in (8.0, 200.0)
                    for lay, ov in (("extra_buffer", False), ("extra_buffer", True),
                                    ("no_buffer", False))}
    assert len(cells) == doc["config"]["cells"] == 6
    assert text.count("| qwen3.5-4b |") == 6


def test_ratios_are_against_the_same_cells_stock(run: tuple[Path, dict, int]) -> None:
    _, doc, _ = run
    cells = doc["cells"]
    stock = [c["arms"]["stock"]["latency_mean_s"] for c in cells]
    assert len(set(stock)) > 1  # a ratio against another cell's stock would differ
    for c in cells:
        base = c["arms"]["stock"]
        for p in ("traversal", "radixflow"):
            arm, r = c["arms"][p], c["ratios"][p]
            assert r["mean"] == pytest.approx(arm["latency_mean_s"] / base["latency_mean_s"])
            assert r["p95"] == pytest.approx(arm["latency_p95_s"] / base["latency_p95_s"])
            assert r["tokens"] == pytest.approx(arm["scheduled_tokens"] /
                                                base["scheduled_tokens"])


def test_slower_cells_are_listed() -> None:
    cell = {"model": "m", "workload": "w", "rate": 5.0, "alpha_ms": 8.0, "layout": "l",
            "overlap": False, "ratios": {"radixflow": {"mean": 1.1, "p95": 0.9, "tokens": 0.5}}}
    assert matrix.slower([cell]) == [("m w r5 a8 l", "radixflow", "mean", 1.1)]


@pytest.mark.parametrize("argv,flag", [
    (["--policies", "radixflow,stock"], "--policies"),
    (["--models", "llama"], "--models"),
    (["--alphas-ms", "-3"], "--alphas-ms"),
])
def test_bad_arguments(tmp_path: Path, argv: list[str], flag: str,
                       capsys: pytest.CaptureFixture[str]) -> None:
    try:
        rc = matrix.main(["--out", str(tmp_path), *argv])
    except SystemExit as e:
        rc = e.code
    assert rc == 2
    assert flag in capsys.readouterr().err
