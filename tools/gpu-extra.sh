#!/usr/bin/env bash
# The device executor's figures on a GPU, packed by the GPU check
# (listed in .gpu-extra) and run as its third call: bash .gpu/run.sh extra.
# All side by side in one run: the hand-written kernel against the executor
# running each algorithm, then device send/recv. Logs in $OUT (one per line).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out=${OUT:-/tmp/gpu-out}; mkdir -p "$out"
perf=.gpu/oxccl-perf
sweep=(-H gpu -t 2 -P 2 -b 8 -e 256M -f 8 -n 20 -w 5)
run() {  # run NAME LIMIT ENV... -- ARGS...
  local name=$1 lim=$2; shift 2
  local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  echo "=== $name: ${envs[*]} $*"
  timeout "$lim" env "${envs[@]}" "$@" > "$out/extra-$name.log" 2>&1
  echo "rc=$? $(grep -E 'Avg bus bandwidth|wrong' "$out/extra-$name.log" | tail -2 | tr '\n' ' ')"
}
run kernel 60 OXCCL_DEVICE_EXEC=kernel -- "$perf" all_reduce "${sweep[@]}"
run kernel-g2 60 OXCCL_DEVICE_EXEC=kernel -- "$perf" all_reduce -H gpu -t 1 -g 2 -P 2 -b 8 -e 256M -f 8 -n 20 -w 5
for a in oneshot twoshot ring tree rhd doubling; do
  run "exec-$a" 60 OXCCL_DEVICE_EXEC=program OXCCL_ALGO="$a" -- "$perf" all_reduce "${sweep[@]}"
done
run exec-4-ring 60 OXCCL_DEVICE_EXEC=program OXCCL_ALGO=ring -- "$perf" all_reduce -H gpu -t 4 -P 4 -b 8 -e 256M -f 8 -n 20 -w 5
run exec-hand 60 OXCCL_DEVICE_EXEC=program -- "$perf" -A .gpu/hand.json "${sweep[@]}"
run exec-gather 60 OXCCL_DEVICE_EXEC=auto -- "$perf" gather "${sweep[@]}"
run sendrecv-direct 60 OXCCL_DEVICE_PATH=direct -- "$perf" sendrecv "${sweep[@]}"
run sendrecv-staged 60 OXCCL_DEVICE_PATH=staged -- "$perf" sendrecv "${sweep[@]}"
