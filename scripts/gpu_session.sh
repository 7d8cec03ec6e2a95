#!/usr/bin/env bash
# Everything a GPU machine checks and measures, in parts:
#
#   scripts/gpu_session.sh BUILD_DIR OUT_DIR [PARTS]
#
# BUILD_DIR is what scripts/gpu_prepare.sh made on a machine with Rust (bin/: ferrocomm and the
# check programs; kc/: the kernel cache; dist/: the wheel); the GPU machine needs neither Rust
# nor network. Every step writes OUT_DIR/<step>.txt (and its JSON/PNG), OUT_DIR/machine.txt and
# info.txt describe the machine, and OUT_DIR/summary.txt lists each step's exit code, time and
# verdict, every step or part left out and why, and ends with the steps that failed. The script
# exits 1 when a step failed (a non-zero exit, a time limit), 2 on bad arguments, else 0.
# PARTS (a quoted list) defaults to "checks sanitize python windows bench":
#   checks    the Rust correctness checks: gpu_check (10,000 race calls, 1,000 graph replays),
#             gpu_check_coll (the direct-access collectives), gpu_check_lowp (low precision),
#             gpu_check_nccl (one rank on one GPU: every collective NCCL carries against the
#             reference, and the NCCL watchdog's timeout path); CHECKS picks some of them,
#             CHECK_FLAGS adds flags to the first three (default --quick on one GPU; gpu_check
#             alone takes ~125 s on two)
#   shared    the check programs at more ranks than GPUs (`--share-gpus`: correctness of the
#             n-rank kernels only); SHARED_WORLDS, SHARED_CHECKS, SHARED_FLAGS (--quick)
#   sanitize  compute-sanitizer memcheck and racecheck over the three programs (scripts/gpu_sanitize.sh)
#   python    the Python package's GPU checks (python/tests/gpu), the wheel from BUILD_DIR/dist
#   windows   windows and the persistent all-gather (python/tests/gpu/check_windows.py: two
#             ranks, then three sharing the GPUs; about a minute each on one GPU), the wheel
#   torch     the "ferrocomm" torch.distributed backend against gloo (collectives, CUDA graphs,
#             torch.compile, DTensor, transformers tp_plan="auto"; needs transformers, and
#             accelerate installed or carried in BUILD_DIR/dist/extra), and
#             scripts/torch_overhead.py's host time per call (~5 min)
#   bench     the bench tables: all-reduce graph mode, low precision (two GPUs or more)
#   coll      the direct-access collectives' tables (five benches, ~45 s each)
#   p2p       send/recv and the device-count all-to-all-v against NCCL, scripts/gpu_link_ceiling.py
#   pdl       every collective 1 KB-256 KB with FERROCOMM_PDL off and on, interleaved (~5 min)
#   ce        the copy-engine all-reduce checked at every flat size, timed against the SM flat
#   push      the push all-reduce against flat at 64-512 KB (~1.5 min)
#   ll128     the LL128 all-reduce checked in full (10,000 back-to-back calls: a line torn on the
#             way would show as a wrong sum), timed against flat from 64 KB to 32 MB (~5 min)
# On a machine with one GPU, the checks run two ranks sharing it (`--share-gpus`: NCCL left out,
# as it refuses two ranks on one GPU, but gpu_check_nccl runs it on one rank; correctness only),
# `shared` runs three, the Python checks that compare with torch's NCCL are left out, and the
# timing parts are left out; the summary names each. Times above
# are for 2xH200. The bench steps' limits (BENCH_AR_LIMIT_S=40, BENCH_LP_LIMIT_S=30) end the
# sweeps after 64 MB; raise them to reach 256 MB.
set -uo pipefail
. "$(dirname "$0")/gpu_args.sh"
gpu_dirs res "usage: scripts/gpu_session.sh BUILD_DIR OUT_DIR [PARTS]" "$@" || exit 2
bin="$build/bin"
[ -x "$bin/ferrocomm" ] || { echo "gpu_session.sh: no ferrocomm in $bin (scripts/gpu_prepare.sh BUILD_DIR)" >&2; exit 2; }
parts=" ${3:-checks sanitize python windows bench} "
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/.."  # python/tests/gpu
listed() { [[ "$1" == *" $2 "* ]]; }  # a space-padded list, a name
want() { listed "$parts" "$1"; }
all_parts=" checks shared sanitize python windows torch bench coll p2p pdl ce push ll128 "
for p in $parts; do
  listed "$all_parts" "$p" || { echo "gpu_session.sh: unknown part '$p' (parts:$all_parts)" >&2; exit 2; }
done
all_checks="gpu_check gpu_check_coll gpu_check_lowp gpu_check_nccl"
checks=" ${CHECKS:-$all_checks} "
for p in $checks; do
  listed " $all_checks " "$p" || { echo "gpu_session.sh: unknown check '$p' in CHECKS ($all_checks)" >&2; exit 2; }
done
export FERROCOMM_KERNEL_CACHE="$build/kc"
export NCCL_NVLS_ENABLE=0 FERROCOMM_TIMEOUT_S=30 PYTHONUNBUFFERED=1
summary="$res/summary.txt"
: > "$summary"
fc="$bin/ferrocomm"
ngpu="$(nvidia-smi -L 2>/dev/null | wc -l)"
share=""  # one GPU: two ranks share it
[ "$ngpu" -ge 2 ] || share="--share-gpus"
failed=()  # steps that failed
left=()    # steps and parts left out
step() { # name, limit in seconds, command...
  local name="$1" limit="$2"; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$res/$name.txt" 2>&1
  local rc=$?
  [ "$rc" -eq 0 ] || failed+=("$name")
  printf '%-26s rc=%-3s %4ss %s\n' "$name" "$rc" "$((SECONDS - t0))" \
    "$(grep -E 'Out of bounds|all results|passed|FAILED|summary:|ERROR SUMMARY|exit [0-9]' "$res/$name.txt" | tail -2 | tr '\n' ' ')" \
    | tee -a "$summary"
  return "$rc"
}
leave_out() { # name, why
  left+=("$1")
  printf '%-26s left out: %s\n' "$1" "$2" | tee -a "$summary"
}
timing() { # part name: left out on one GPU, where ranks take turns and nothing is timed
  [ -z "$share" ] && return 0
  leave_out "part $1" "needs two GPUs to time anything (this machine has $ngpu)"
  return 1
}
ab() { # step name, step limit, seconds per bench, bench flags, "COLL DTYPE;..." pairs, builds...
  # (scripts/gpu_ab.sh: the same build under settings, BIN@VAR=VALUE, interleaved; no check
  # program, BUILD_DIR's kernel cache as it is; tables and JSON under OUT_DIR/<step name>)
  local name="$1" limit="$2" per="$3" args="$4" benches="$5"
  shift 5
  AB_CHECK=none AB_PRECOMPILE=none AB_STEP_S="$per" AB_ARGS="$args" AB_BENCHES="$benches" \
    step "$name" "$limit" bash "$here/gpu_ab.sh" "$res/$name" "$FERROCOMM_KERNEL_CACHE" "$@"
}
{ date -u; nvidia-smi -L; nvidia-smi topo -m; } > "$res/machine.txt" 2>&1
step info 60 "$fc" info
not_asked=""
for p in $all_parts; do want "$p" || not_asked+=" $p"; done
[ -z "$not_asked" ] || leave_out "parts$not_asked" "not asked for (PARTS)"
# shellcheck disable=SC2206  # flags, split on spaces
cflags=(${CHECK_FLAGS-${share:+--quick}} $share)  # ranks sharing a GPU: the quick matrix
if want checks; then
  for p in $all_checks; do
    listed "$checks" "$p" || leave_out "$p" "not in CHECKS"
  done
  if [ -n "$share" ]; then
    listed "$checks" gpu_check &&
      leave_out "gpu_check NCCL cases" "two ranks share one GPU, which NCCL refuses: its NCCL cases, two-host simulation, NCCL timeout check and timing (gpu_check_nccl runs NCCL on one rank)"
  fi
  listed "$checks" gpu_check &&
    step gpu_check 240 "$fc" launch -n 2 --timeout 238 -- "$bin/gpu_check" --no-timing "${cflags[@]}"
  listed "$checks" gpu_check_coll &&
    step gpu_check_coll 150 "$fc" launch -n 2 --timeout 148 -- "$bin/gpu_check_coll" "${cflags[@]}"
  listed "$checks" gpu_check_lowp &&
    step gpu_check_lowp 150 "$fc" launch -n 2 --timeout 148 -- "$bin/gpu_check_lowp" "${cflags[@]}"
  # One rank on one GPU, whatever the machine has: NCCL never refuses that.
  listed "$checks" gpu_check_nccl &&
    step gpu_check_nccl 180 "$fc" launch -n 1 --timeout 178 -- "$bin/gpu_check_nccl"
fi
if want shared; then
  # More ranks than GPUs (`--share-gpus`: local rank r on GPU r mod GPUs, NCCL off, processes
  # taking turns on a GPU): the n-rank kernels' correctness, no timing. SHARED_WORLDS (default
  # "3 4", "3" on one GPU) and SHARED_CHECKS (default: the three programs, --quick) choose the runs.
  worlds="3 4"
  if [ -n "$share" ]; then
    worlds="3"
    [ -n "${SHARED_WORLDS:-}" ] || leave_out "shared at 4 ranks" "one GPU (SHARED_WORLDS=\"3 4\" runs it)"
  fi
  for w in ${SHARED_WORLDS:-$worlds}; do
    for p in ${SHARED_CHECKS:-gpu_check gpu_check_coll gpu_check_lowp}; do
      step "$p-w$w-shared" "${SHARED_LIMIT_S:-150}" "$fc" launch -n "$w" --timeout "$((${SHARED_LIMIT_S:-150} - 2))" -- \
        "$bin/$p" --share-gpus ${SHARED_FLAGS---quick}
    done
  done
fi
if want sanitize; then
  SANITIZE_RUN_TIMEOUT_S=95 SANITIZE_FLAGS="$share" \
    step sanitize 590 bash "$here/gpu_sanitize.sh" "$build" "$res"
fi
site=""
install_site() { # the wheel from BUILD_DIR/dist into a directory of its own, once per session
  [ -z "$site" ] || return 0
  site="$(mktemp -d /tmp/ferrocomm-site-XXXXXX)"
  trap 'rm -rf "$site"' EXIT
  step pip 300 python3 -m pip install -q --no-deps --no-index --target "$site" "$build"/dist/ferrocomm-*.whl
}
if want python; then
  install_site
  if [ -n "$share" ]; then
    leave_out python_check "one GPU: it compares with torch.distributed's NCCL, which refuses two ranks on one GPU"
    leave_out setup_fault "one GPU: two ranks of NCCL on one GPU are refused"
  else
    # Against torch.distributed's NCCL on the same inputs, and a set-up fault on one rank.
    CHECK_WATCHDOG_S=170 PYTHONPATH="$site" \
      step python_check 180 torchrun --nproc_per_node 2 python/tests/gpu/check_torch.py
    PYTHONPATH="$site" \
      step setup_fault 60 torchrun --nproc_per_node 2 python/tests/gpu/check_setup_fault.py
  fi
  # shellcheck disable=SC2086  # empty or one flag
  PYTHONPATH="$site" \
    step python_dynamic 90 torchrun --nproc_per_node 2 python/tests/gpu/check_dynamic.py $share
  # shellcheck disable=SC2086
  PYTHONPATH="$site" \
    step python_lists 90 torchrun --nproc_per_node 2 python/tests/gpu/check_lists.py $share
fi
if want windows; then
  # Windows and the persistent all-gather: two ranks, then three sharing the GPUs (each prints
  # `[rank R] ok NAME` per check and a summary per rank).
  install_site
  # shellcheck disable=SC2086  # empty or one flag
  PYTHONPATH="$site" \
    step python_windows 180 torchrun --nproc_per_node 2 python/tests/gpu/check_windows.py $share
  PYTHONPATH="$site" step python_windows_w3 180 \
    torchrun --nproc_per_node 3 python/tests/gpu/check_windows.py --share-gpus
fi
if want torch; then
  install_site
  # transformers' tp_plan needs accelerate: wheels carried in BUILD_DIR/dist/extra (pip download
  # accelerate psutil --no-deps --python-version 3.12 --only-binary=:all: -d BUILD_DIR/dist/extra)
  # are installed beside the package when the machine lacks them.
  if ! python3 -c "import accelerate" 2> /dev/null && ls "$build"/dist/extra/*.whl > /dev/null 2>&1; then
    step pip-extra 300 python3 -m pip install -q --no-deps --no-index --target "$site" "$build"/dist/extra/*.whl
  fi
  # gloo on CPU copies is the reference, so NCCL stays off and the ranks may share one GPU.
  FERROCOMM_NCCL_LIB=/nonexistent CHECK_WATCHDOG_S=530 PYTHONPATH="$site" \
    step torch_backend 540 torchrun --nproc_per_node 2 python/tests/gpu/check_torch_backend.py \
    "$res/torch_backend"
  PYTHONPATH="$site" step torch_overhead 240 python3 "$here/torch_overhead.py" "$res/torch_overhead"
fi
if want coll && timing coll; then
  # The direct-access collectives against NCCL, graph mode (docs/tuning.md's tables).
  for c in all_gather reduce_scatter all_to_all broadcast reduce; do
    step "$c-graph" "${BENCH_COLL_LIMIT_S:-45}" "$fc" bench "$c" -g 2 -d bfloat16 -b 1K -e 64M -f 4 -n 10 \
      --reps 3 -G 10 --vs nccl --json "$res/$c-graph.json"
  done
fi
if want p2p && timing p2p; then
  # Point-to-point and the device-count all-to-all-v against NCCL (graph and eager), then what
  # the link carries by the copy engines, one way and both ways (the ceiling of every large row).
  step sendrecv-graph "${BENCH_P2P_LIMIT_S:-60}" "$fc" bench sendrecv -g 2 -d bfloat16 -b 1K -e 256M -f 4 -n 10 \
    --reps 3 -G 10 --vs nccl --json "$res/sendrecv-graph.json"
  step sendrecv-eager "${BENCH_P2P_LIMIT_S:-60}" "$fc" bench sendrecv -g 2 -d bfloat16 -b 1K -e 1M -f 4 -n 20 \
    --reps 3 --vs nccl --json "$res/sendrecv-eager.json"
  step device_alltoallv-graph "${BENCH_P2P_LIMIT_S:-60}" "$fc" bench device_alltoallv -g 2 -d bfloat16 -b 1K -e 16M \
    -f 4 -n 10 --reps 3 -G 10 --vs nccl --json "$res/device_alltoallv-graph.json"
  step link_ceiling 60 python3 "$here/gpu_link_ceiling.py" 16M 64M 256M
fi
if want pdl && timing pdl; then
  # Programmatic dependent launch on and off, the same build, every collective's small sizes in
  # graph mode, runs interleaved (scripts/gpu_ab.sh; its tables under OUT_DIR/pdl-ab).
  ab pdl-ab 420 "${BENCH_PDL_LIMIT_S:-25}" "-b 1K -e 256K -f 4 -n 10 --reps 3 -G 10 --vs nccl" \
    "all_reduce bfloat16;all_gather bfloat16;reduce_scatter bfloat16;all_to_all bfloat16;all_to_all_v bfloat16;broadcast bfloat16;reduce bfloat16;sendrecv bfloat16" \
    "$bin" "$bin@FERROCOMM_PDL=1"
fi
if want ce && timing ce; then
  # The copy-engine all-reduce (FERROCOMM_ALLREDUCE_CE_MIN_BYTES) checked at every flat size,
  # and timed against the SM flat and NCCL from 1 MB to 64 MB, runs interleaved.
  FERROCOMM_ALLREDUCE_CE_MIN_BYTES=1 step gpu_check-ce 200 "$fc" launch -n 2 --timeout 198 -- \
    "$bin/gpu_check" --quick --no-timing
  ab ce-ab 200 "${BENCH_CE_LIMIT_S:-40}" "-b 1M -e 64M -f 4 -n 10 --reps 3 -G 10 --vs nccl" \
    "all_reduce bfloat16;all_reduce float" \
    "$bin@FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES=64M" \
    "$bin@FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES=64M,FERROCOMM_ALLREDUCE_CE_MIN_BYTES=1M"
fi
if want push && timing push; then
  # The push (LL) all-reduce above its default limit (64 KiB at two ranks): the same build with
  # FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES at its buffer's 512 KiB, against flat, runs interleaved.
  # The data movers' LL won to 256 KiB parts (docs/cuda-collectives.md), and push has gained
  # ~1.7 us at 64 KiB since flat won at 256 KiB.
  ab push-ab 150 "${BENCH_PUSH_LIMIT_S:-30}" "-b 64K -e 512K -f 2 -n 20 --reps 3 -G 10 --vs nccl" \
    "all_reduce bfloat16;all_reduce float" \
    "$bin" "$bin@FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES=512K"
fi
if want ll128 && timing ll128; then
  # The LL128 all-reduce (FERROCOMM_ALLREDUCE_LL128_MAX_BYTES at the staging's 64 MiB: every
  # flat all-reduce by it), first checked (the whole gpu_check, whose race case runs 10,000
  # mixed calls back to back), then timed against the pull flat and NCCL, runs interleaved.
  FERROCOMM_ALLREDUCE_LL128_MAX_BYTES=64M step gpu_check-ll128 240 "$fc" launch -n 2 --timeout 238 -- \
    "$bin/gpu_check" --no-timing
  ab ll128-ab 200 "${BENCH_LL128_LIMIT_S:-40}" "-b 64K -e 32M -f 2 -n 20 --reps 3 -G 10 --vs nccl" \
    "all_reduce bfloat16;all_reduce float" \
    "$bin" "$bin@FERROCOMM_ALLREDUCE_LL128_MAX_BYTES=64M"
fi
if want bench && timing bench; then
  step all_reduce-graph "${BENCH_AR_LIMIT_S:-40}" "$fc" bench all_reduce -g 2 -d bfloat16 -b 1K -e 256M -f 4 -n 10 --reps 3 \
    -G 10 --vs nccl --json "$res/all_reduce-graph.json" --plot "$res/all_reduce-graph.png"
  for c in "all_reduce bfloat16" "all_reduce float" "all_gather bfloat16" "all_to_all bfloat16"; do
    set -- $c
    step "lp-$1-$2" "${BENCH_LP_LIMIT_S:-30}" "$fc" bench "$1" -g 2 -d "$2" -b 4M -e 256M -f 4 -n 10 --reps 2 -G 10 \
      --low-precision e4m3 --vs nccl --json "$res/lp-$1-$2.json" --plot "$res/lp-$1-$2.png"
  done
fi
{
  echo
  if [ "${#left[@]}" -gt 0 ]; then
    printf 'left out (%s, each with its reason above):' "${#left[@]}"
    printf ' %s;' "${left[@]}"
    echo
  fi
  if [ "${#failed[@]}" -eq 0 ]; then
    echo "every step run passed"
  else
    echo "FAILED (${#failed[@]} steps): ${failed[*]}"
  fi
} >> "$summary"
echo
cat "$summary"
[ "${#failed[@]}" -eq 0 ] || exit 1
