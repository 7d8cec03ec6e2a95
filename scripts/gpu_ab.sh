#!/usr/bin/env bash
# Side-by-side measurement of several builds in one run (same machine, same minute): the
# check program of every build but the first, then each bench run with every build in turn. All
# builds' kernels must be in the one kernel cache (scripts/gpu_prepare.sh --variant puts each build's
# there: the key is the source hash). Results and a summary in OUT_DIR.
#
#   scripts/gpu_ab.sh OUT_DIR KC BIN_A BIN_B [BIN_C ...]
#   (e.g. scripts/gpu_ab.sh results/ab BUILD_DIR/kc BUILD_DIR/bin-A BUILD_DIR/bin-B)
#
# A BIN may take settings for its runs, BIN@VAR=VALUE[,VAR=VALUE...] (e.g. the same build under
# two values of a tuning variable: BUILD_DIR/bin-B BUILD_DIR/bin-B@FERROCOMM_CUDA_STAGING_BYTES=128M).
# Its files are named after the BIN and the settings with every character but letters, digits,
# '.', '_' and '-' turned into '_' (bin-B-FERROCOMM_CUDA_STAGING_BYTES_128M), so that the names
# are safe in any shell and file system.
#
# Environment (defaults in brackets):
#   AB_BENCHES  "COLL DTYPE" pairs, ';'-separated
#               [all_reduce bfloat16;all_reduce float;all_gather bfloat16;all_to_all bfloat16]
#   AB_ARGS     bench flags [-b 4M -e 64M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl]
#   AB_CHECK    check program of the later builds, or none [gpu_check_lowp]
#   AB_STEP_S   seconds per bench [40]
#   AB_ARCH     architecture of the kernels each build makes sure are cached [sm_90]
#   AB_PRECOMPILE  none: skip that step (the carried cache holds what the benches load; a build
#               carried with only some dtypes' modules would otherwise compile the rest, ~70 s each)
# Each BIN holds ferrocomm (and the check program for all but the first).
set -uo pipefail
[ $# -ge 4 ] || { echo "usage: scripts/gpu_ab.sh OUT_DIR KC BIN_A BIN_B [BIN...]" >&2; exit 2; }
mkdir -p "$1" && res="$(cd "$1" && pwd)" || exit 2
export FERROCOMM_KERNEL_CACHE="$(cd "$2" && pwd)"
shift 2
bins=() envs=() names=()
for spec in "$@"; do
  b="${spec%%@*}"
  e=""
  [ "$spec" = "$b" ] || e="${spec#*@}"
  bins+=("$(cd "$b" && pwd)")
  envs+=("${e//,/ }")
  names+=("$(basename "$b")${e:+-${e//[^A-Za-z0-9._-]/_}}")
done
IFS=';' read -r -a benches <<< "${AB_BENCHES:-all_reduce bfloat16;all_reduce float;all_gather bfloat16;all_to_all bfloat16}"
args="${AB_ARGS:--b 4M -e 64M -f 4 -n 10 --reps 2 -G 10 --low-precision e4m3 --vs nccl}"
check="${AB_CHECK:-gpu_check_lowp}"
export NCCL_NVLS_ENABLE=0 FERROCOMM_TIMEOUT_S=30
: > "$res/summary.txt"
# Every build's kernels into the cache first: a module missing there would otherwise be compiled
# inside that build's first bench and eat its time limit (a cached module costs nothing here).
for i in "${!bins[@]}"; do
  [ "${AB_PRECOMPILE:-}" != none ] || break
  "${bins[$i]}/ferrocomm" precompile --arch "${AB_ARCH:-sm_90}" --cache "$FERROCOMM_KERNEL_CACHE" \
    > "$res/precompile-${names[$i]}.txt" 2>&1 ||
    echo "precompile (${names[$i]}): failed, see precompile-${names[$i]}.txt" | tee -a "$res/summary.txt"
done
if [ "$check" != none ]; then
  for i in "${!bins[@]}"; do
    [ "$i" -gt 0 ] || continue
    b="${bins[$i]}"
    f="$res/$check-${names[$i]}.txt"
    # shellcheck disable=SC2086  # the settings are VAR=VALUE words
    env ${envs[$i]} timeout 100 "$b/ferrocomm" launch -n 2 --timeout 98 -- "$b/$check" > "$f" 2>&1
    echo "$check (${names[$i]}): exit $? $(grep -E 'passed|all results|quantize alone' "$f" | tail -2 | tr '\n' ' ')" \
      | tee -a "$res/summary.txt"
  done
fi
for c in "${benches[@]}"; do
  set -- $c
  for i in "${!bins[@]}"; do
    f="$res/$1-$2-${names[$i]}"
    # shellcheck disable=SC2086  # AB_ARGS is a list of flags, the settings VAR=VALUE words
    env ${envs[$i]} timeout "${AB_STEP_S:-40}" "${bins[$i]}/ferrocomm" bench "$1" -g 2 -d "$2" $args \
      --json "$f.json" > "$f.txt" 2>&1
    echo "== $1 $2 ${names[$i]} (exit $?)" >> "$res/summary.txt"
    grep -E '^ +[0-9]' "$f.txt" >> "$res/summary.txt"
  done
done
cat "$res/summary.txt"
