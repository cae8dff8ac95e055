#!/usr/bin/env bash
# Check that a NON-editable install serves the embedded default from outside the checkout:
#
#   bash scripts/check_install.sh [PYTHON]     # PYTHON: an interpreter that has sglang==0.5.23
#
# Builds the wheel with PYTHON, installs it (--no-deps) into a fresh venv under $TMPDIR that sees
# PYTHON's site-packages minus any radixflow_sglang install (a .pth to a directory of symlinks),
# makes the installed model dir read-only (chattr +i when run as root, else mode bits), starts
# `python -m radixflow_sglang.launch_server` from $TMPDIR (simulated executor on CPU), sends one
# /generate and reads /server_info: the tokenizer must land in $XDG_CACHE_HOME/radixflow-sglang.
# Takes 2-4 min on a busy 2-core machine (tokenizer build + SGLang start-up). Exit 0 = served.
set -euo pipefail
cd "$(dirname "$0")/.."
cleanup() {
  set +e  # NOTE: undo everything even when one step fails (the server's exit status, say)
  if [ -n "${PID:-}" ]; then kill -TERM -- "-$PID" 2>/dev/null; wait "$PID" 2>/dev/null; fi
  if [ -n "${MD:-}" ]; then
    if [ "$(id -u)" = 0 ]; then chattr -i "$MD"; else chmod u+w "$MD"; fi
  fi
  rm -rf "$WORK"
}
PY=${1:-.venv/bin/python}
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"  # absolute, symlinks kept (a venv's)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rf-install.XXXXXX")
trap cleanup EXIT
PORT=${PORT:-31777}
SITE=$("$PY" -c 'import sglang, pathlib; print(pathlib.Path(sglang.__file__).parent.parent)')

had=$(ls -d build radixflow_sglang.egg-info 2>/dev/null || true)
"$PY" -m pip wheel -q --no-deps --no-build-isolation . -w "$WORK/wheel"
[ -n "$had" ] || rm -rf build radixflow_sglang.egg-info  # NOTE: only what this build left
CHECKOUT=$PWD
cd "$WORK"  # NOTE: outside the checkout from here on, so nothing imports it from the cwd
BASE=$("$PY" -c 'import sys; print(sys.base_prefix)')/bin/python3
"$BASE" -m venv --without-pip "$WORK/venv"
VSITE=$("$WORK/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir "$WORK/deps"
for e in "$SITE"/* "$SITE"/.[!.]*; do
  case "$(basename "$e")" in radixflow_sglang*|__editable__*|*.pth|__pycache__) continue ;; esac
  ln -s "$e" "$WORK/deps/"
done
echo "$WORK/deps" > "$VSITE/zz-sglang-deps.pth"
"$WORK/venv/bin/python" -m pip install -q --no-deps --no-index "$WORK"/wheel/*.whl
MD=$("$WORK/venv/bin/python" -c \
  'from radixflow_sglang import models; print(models.model_dir(models.DEFAULT))')
case "$MD" in "$CHECKOUT"/*) echo "FAIL: model dir $MD is inside the checkout" >&2; exit 1 ;; esac
if [ "$(id -u)" = 0 ]; then chattr +i "$MD"; else chmod a-w "$MD"; fi

XDG_CACHE_HOME="$WORK/cache" PYTHONPATH='' HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  setsid "$WORK/venv/bin/python" -m radixflow_sglang.launch_server --host 127.0.0.1 \
  --port "$PORT" > "$WORK/server.log" 2>&1 &
PID=$!  # NOTE: setsid execs in place here (no job control), so PID leads the server's group
t0=$SECONDS
until curl -sf "localhost:$PORT/health" > /dev/null 2>&1; do
  kill -0 "$PID" 2>/dev/null || { tail -30 "$WORK/server.log" >&2; exit 1; }
  [ $((SECONDS - t0)) -lt 600 ] || { echo "FAIL: not ready in 600 s" >&2; exit 1; }
  sleep 1
done
echo "installed package: $MD (read-only); ready after $((SECONDS - t0)) s"
curl -sf "localhost:$PORT/generate" -H 'Content-Type: application/json' \
  -d '{"text": "Hello", "sampling_params": {"max_new_tokens": 1}}'
echo
served=$(curl -sf "localhost:$PORT/server_info" | "$WORK/venv/bin/python" -c \
  'import json, sys; d = json.load(sys.stdin)
print(d["model_path"], any("radixflow" in s for s in d.get("internal_states", [])))')
echo "served model_path, radixflow section: $served"
case "$served" in "$WORK/cache/radixflow-sglang/"*" True") echo OK ;; *) echo FAIL; exit 1 ;; esac
