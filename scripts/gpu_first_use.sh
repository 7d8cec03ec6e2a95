#!/usr/bin/env bash
# The first use of the package on a GPU machine, as a new user meets it: a fresh HOME (empty
# kernel cache, empty driver JIT cache), FERROCOMM_KERNEL_CACHE unset, the wheel of
# scripts/gpu_prepare.sh installed into a temporary directory. Times from the start of the
# program (import torch, import ferrocomm) to the first all-reduce's result on the GPU
# (scripts/first_use.py prints the parts as JSON):
#   1. one rank, the built-in kernels;
#   2. two ranks sharing the GPU (NCCL off: it refuses two ranks on one GPU), built-in kernels;
#   3. one rank with FERROCOMM_BUILTIN_KERNELS=0 (the library ignores its built-in kernels, as
#      on a GPU they were not built for): the compile at first use, its stderr line, NVRTC from
#      /usr/local/cuda (FERROCOMM_NVRTC_LIB overrides);
#   4. the same again in the same HOME: the kernel cache's entries loaded, nothing compiled;
#   5. two ranks sharing the GPU, compile forced, in another fresh HOME: one compiles each unit,
#      the other waits for it (lock file), both print their line.
#
#   scripts/gpu_first_use.sh BUILD_DIR OUT_DIR
# OUT_DIR/first_use.txt holds every run's output (the JSON lines, the compile lines) and
# OUT_DIR/summary.txt one line per run.
set -uo pipefail
. "$(dirname "$0")/gpu_args.sh"
gpu_dirs res "usage: scripts/gpu_first_use.sh BUILD_DIR OUT_DIR" "$@" || exit 2
here="$(cd "$(dirname "$0")" && pwd)"
fc="$build/bin/ferrocomm"
[ -x "$fc" ] || { echo "no ferrocomm in $build/bin (scripts/gpu_prepare.sh BUILD_DIR)" >&2; exit 2; }
site="$(mktemp -d /tmp/ferrocomm-site-XXXXXX)"
homes="$(mktemp -d /tmp/ferrocomm-homes-XXXXXX)"
trap 'rm -rf "$site" "$homes"' EXIT
python3 -m pip install -q --no-deps --no-index --target "$site" "$build"/dist/ferrocomm-*.whl \
  > "$res/pip.txt" 2>&1 || { cat "$res/pip.txt"; exit 1; }
unset FERROCOMM_KERNEL_CACHE XDG_CACHE_HOME
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 FERROCOMM_TIMEOUT_S=600
log="$res/first_use.txt"
summary="$res/summary.txt"
: > "$log"
: > "$summary"
{ date -u; nvidia-smi -L; } >> "$log" 2>&1
# run NAME HOME RANKS [VAR=VALUE...]: the program under ferrocomm launch, with HOME and the
# settings given; its output to the log, its wall time and JSON to the summary.
run() {
  local name="$1" home="$2" ranks="$3"
  shift 3
  mkdir -p "$home"
  echo "=== $name (HOME=$home, $ranks rank(s), $*)" >> "$log"
  local t0 t1 rc
  t0=$(date +%s%N)
  env HOME="$home" PYTHONPATH="$site" "$@" timeout 900 "$fc" launch -n "$ranks" -- \
    python3 "$here/first_use.py" > "$res/$name.txt" 2>&1
  rc=$?
  t1=$(date +%s%N)
  cat "$res/$name.txt" >> "$log"
  printf '%-24s rc=%s wall %d ms | %s | %s\n' "$name" "$rc" "$(((t1 - t0) / 1000000))" \
    "$(grep -o '"import_to_result_s": [0-9.]*' "$res/$name.txt" | tr '\n' ' ')" \
    "$(grep -c 'ferrocomm: compiling' "$res/$name.txt") compile line(s), $(grep -c 'ferrocomm: waiting' "$res/$name.txt") wait line(s)" \
    | tee -a "$summary"
}
run builtin_1rank "$homes/a" 1
run builtin_2ranks "$homes/b" 2 FERROCOMM_NCCL_LIB=/nonexistent
run compile_1rank "$homes/c" 1 FERROCOMM_BUILTIN_KERNELS=0
run cached_1rank "$homes/c" 1 FERROCOMM_BUILTIN_KERNELS=0
run compile_2ranks "$homes/d" 2 FERROCOMM_BUILTIN_KERNELS=0 FERROCOMM_NCCL_LIB=/nonexistent
HOME="$homes/a" "$fc" info > "$res/info.txt" 2>&1
cat "$summary"
