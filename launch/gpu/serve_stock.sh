#!/usr/bin/env bash
# GPU ONLY: the stock arm, `python -m sglang.launch_server` with the same model, budgets and
# environment as serve.sh but no --radixflow-* arguments.
#
#   bash launch/gpu/serve_stock.sh MODEL [extra sglang args...]
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: bash launch/gpu/serve_stock.sh MODEL [extra sglang args...]" >&2
  exit 2
fi
MODEL=$1
shift
exec bash "$(dirname "$0")/serve.sh" "$MODEL" sglang "$@"
