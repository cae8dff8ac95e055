#!/usr/bin/env bash
# Decisions identical? `bash scripts/decisions.sh BASE_REV [CELL...]` replays a matrix of
# workloads (twin, virtual time, --host-cost none, witness executor) at BASE_REV and at the
# working tree, then compares every decision event (python -m eval.decisions). Exit 1 on any
# difference. What a refactor commit shows as its proof. ~4 min a tree on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:?usage: bash scripts/decisions.sh BASE_REV [CELL...]}"; shift
out="${DECISIONS_OUT:-out/decisions}"
# NOTE: the base tree lives in a temporary folder: point it at this checkout's data
[ -n "${RADIXFLOW_DATA_DIR:-}" ] || [ ! -d ../shared/data ] || export RADIXFLOW_DATA_DIR="$(cd ../shared/data && pwd)"
declare -A CELLS=(
  [mix-nb]="--workload mix --model qwen3.5-4b --policies radixflow,radixflow-frag,radixflow-always,timer5 --questions 20 --layout no_buffer"
  [mix-xb]="--workload mix --model qwen3.5-4b --policies radixflow --questions 20 --layout extra_buffer --overlap"
  [gsp-nb]="--workload gsp --model qwen3.5-0.8b --policies radixflow --layout no_buffer"
  [gsp-xb]="--workload gsp-paced --model qwen3.5-0.8b --policies radixflow --layout extra_buffer --overlap --undeclared"
  [nsample]="--workload nsample --model qwen3.5-4b --policies radixflow,radixflow-frag --layout no_buffer --undeclared"
  [multiturn]="--workload multiturn --model qwen3.5-4b --policies radixflow --layout extra_buffer --overlap"
  [synth]="--workload synthetic --model qwen3.5-4b --policies radixflow --layout no_buffer"
)
cells=("$@"); [ ${#cells[@]} -gt 0 ] || cells=("${!CELLS[@]}")
tree="$(mktemp -d)/base"
git worktree add -q --detach "$tree" "$base"
trap 'git worktree remove --force "$tree"' EXIT
ln -s "$PWD/.venv" "$tree/.venv"
replay() {  # replay DIR TAG CELL
  (cd "$1" && PYTHONPATH="$PWD" .venv/bin/python -m eval.replay ${CELLS[$3]} --host-cost none \
     --no-progress --trace "$OLDPWD/$out/$2/$3" --out "$OLDPWD/$out/$2/$3-report" \
     > "$OLDPWD/$out/$2/$3.log" 2>&1) || { echo "replay failed: $2 $3 ($out/$2/$3.log)"; exit 1; }
}
mkdir -p "$out/base" "$out/tree"; rm -rf "${out:?}"/{base,tree}/*
bad=0
for c in "${cells[@]}"; do
  [ -n "${CELLS[$c]:-}" ] || { echo "unknown cell $c; cells: ${!CELLS[*]}"; exit 2; }
  replay "$tree" base "$c"; replay "$PWD" tree "$c"
  echo "== $c (${CELLS[$c]})"
  .venv/bin/python -m eval.decisions "$out/base/$c" "$out/tree/$c" || bad=1
done
exit $bad
