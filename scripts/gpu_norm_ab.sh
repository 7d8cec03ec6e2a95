#!/usr/bin/env bash
# The fused RMSNorm of two builds on one GPU machine, side by side: the device check of the
# second, the local half's timings of both interleaved in one run (scripts/norm_bench.py
# --variant), and Nsight Compute on one row of bf16 4096 for each.
#
#   scripts/gpu_norm_ab.sh BUILD_DIR OUT_DIR [PARTS]
#
# BUILD_DIR holds the two builds scripts/gpu_prepare.sh made as variants (on a machine with
# Rust):
#   scripts/gpu_prepare.sh BUILD_DIR --variant A --from main     (the reference)
#   scripts/gpu_prepare.sh BUILD_DIR --variant B                 (this checkout)
# of which the parts use dist-A and dist-B (the wheels) and bin-B (ferrocomm and gpu_check_norm,
# for the check), and kc where it is there. AB_A and AB_B name other variants.
# PARTS (a quoted list) defaults to "check bench ncu":
#   check  scripts/gpu_check_norm.sh of B (every form at 1, 2 and 3 ranks, the ranks sharing the
#          GPUs where there are fewer; CHECK_FLAGS, default --quick), OUT_DIR/check/
#   bench  scripts/norm_bench.py with A, B and B again with FERROCOMM_RMSNORM_WIDE_MAX_ROWS=65535
#          (every row count in the few-rows kernels, to see where they stop winning; NB_WIDE=0
#          leaves it out), NB_ARGS (default: 12 row counts from 1 to 16384, hidden 4096 and
#          8192), OUT_DIR/bench/
#   ncu    when ncu is on PATH: one row of bf16 4096, each build's norm kernel and
#          torch.compile's, OUT_DIR/ncu-A.txt and ncu-B.txt
# Each step ends within 590 s (ncu 290 s a build), so a part fits a 10-minute command; run the
# parts one command each where that is the limit, into the same OUT_DIR. OUT_DIR/summary.txt
# gets each step's exit code and time (and the check's verdicts, the bench's table) appended;
# the script exits 1 when a step failed, 2 on bad arguments.
set -uo pipefail
. "$(dirname "$0")/gpu_args.sh"
gpu_dirs res "usage: scripts/gpu_norm_ab.sh BUILD_DIR OUT_DIR [PARTS]" "$@" || exit 2
parts=" ${3:-check bench ncu} "
for p in $parts; do
  case " check bench ncu " in *" $p "*) ;; *) echo "gpu_norm_ab.sh: unknown part '$p'" >&2; exit 2 ;; esac
done
a="${AB_A:-A}" b="${AB_B:-B}"
for v in "$a" "$b"; do
  ls "$build/dist-$v"/ferrocomm-*.whl > /dev/null 2>&1 ||
    { echo "gpu_norm_ab.sh: no wheel in $build/dist-$v (scripts/gpu_prepare.sh BUILD_DIR --variant $v)" >&2; exit 2; }
done
here="$(cd "$(dirname "$0")" && pwd)"
export NCCL_NVLS_ENABLE=0 FERROCOMM_TIMEOUT_S=30 PYTHONUNBUFFERED=1
[ -d "$build/kc" ] && export FERROCOMM_KERNEL_CACHE="$build/kc"
summary="$res/summary.txt"  # appended to: the parts may run one command each
echo "== $(date -u +%FT%TZ) parts:$parts(A: $a, B: $b)" >> "$summary"
{ date; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,clocks.max.sm --format=csv; } > "$res/machine.txt" 2>&1
failed=0
step() { # name, limit in seconds, command...
  local name="$1" limit="$2"; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$res/$name.log" 2>&1
  local rc=$?
  [ "$rc" -eq 0 ] || failed=1
  printf '%-10s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - t0))" | tee -a "$summary"
}
case "$parts" in *" check "*)
  step check 590 "$here/gpu_check_norm.sh" "$build" "$res/check" --variant "$b" ${CHECK_FLAGS:---quick}
  grep -hE "passed|FAIL" "$res"/check/*.log | tail -20 >> "$summary" ;;
esac
case "$parts" in *" bench "*)
  variants=(--variant "$a=$build/dist-$a" --variant "$b=$build/dist-$b")
  [ "${NB_WIDE:-1}" = 0 ] ||
    variants+=(--variant "$b-wide=$build/dist-$b@FERROCOMM_RMSNORM_WIDE_MAX_ROWS=65535")
  # shellcheck disable=SC2086  # NB_ARGS is a list of flags
  step bench 590 python3 "$here/norm_bench.py" "$res/bench" "${variants[@]}" \
    ${NB_ARGS:---rows 1,2,4,16,64,128,256,512,1024,2048,4096,16384 --hidden 4096,8192}
  sed -n '/^| hidden/,$p' "$res/bench/norm_bench.md" >> "$summary" 2>/dev/null ;;
esac
case "$parts" in *" ncu "*)
  if command -v ncu > /dev/null; then
    for v in "$a" "$b"; do
      site="$res/bench/site-$v"
      [ -d "$site" ] || python3 -m pip install -q --no-deps --no-index --target "$site" "$build/dist-$v"/ferrocomm-*.whl
      # The call checked once, then three eager calls of each kernel: the first of ours (the
      # check's) skipped, every later one and torch.compile's profiled, the caches as ncu
      # leaves them (flushed before each: the cold latency, with the code fetched anew).
      step "ncu-$v" 290 env PYTHONPATH="$site" ncu --launch-skip 1 --launch-count 6 \
        -k regex:"fc_rmsnorm|triton" --section SpeedOfLight --section LaunchStats \
        --section Occupancy --section WarpStateStats --section SchedulerStats \
        python3 "$here/norm_bench.py" "$res/ncu-$v" --profile --rows 1 --hidden 4096 --no-loopback
      mv "$res/ncu-$v.log" "$res/ncu-$v.txt"
    done
  else
    echo "ncu        left out: no ncu on PATH" | tee -a "$summary"
  fi ;;
esac
exit $failed
