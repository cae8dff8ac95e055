#!/usr/bin/env bash
# One entry point for a fresh machine: `bash scripts/run.sh serve|test|live|replay|lint [args...]`.
# Creates .venv on first use (sglang==0.5.23 and its full dependency set: ~9 min, ~11 GB),
# then reinstalls only when pyproject.toml changes.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
PY="$VENV/bin/python"
STAMP="$VENV/.radixflow-stamp"
want="$(sha256sum pyproject.toml | cut -c1-16)"

if [ ! -x "$PY" ]; then
  python3 -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing radixflow-sglang and sglang==0.5.23 into $VENV (first time: ~9 min)" >&2
  "$PY" -m pip install -q -e '.[test,eval]'
  echo "$want" > "$STAMP"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

cmd="${1:-test}"; shift || true
case "$cmd" in
  serve)  exec "$PY" -m radixflow_sglang.launch_server "$@" ;;
  test)   "$PY" -m ruff check radixflow_sglang eval tests examples
          exec "$PY" -m pytest -q -m "not live" "$@" ;;
  live)   exec "$PY" -m pytest -q -m live "$@" ;;  # whole eval runs on live servers (~20 min)
  replay) exec "$PY" -m eval.replay "$@" ;;
  lint)   exec "$PY" -m ruff check radixflow_sglang eval tests examples ;;
  *)      echo "usage: bash scripts/run.sh {serve|test|live|replay|lint} [args...]" >&2; exit 2 ;;
esac
