#!/usr/bin/env bash
# Everything a 2-GPU device run checks and measures (about 8 minutes on 2xH200 without the
# sanitizer, which adds several more: run it as a call of its own where calls are limited):
# the Rust correctness checks (all-reduce with 10,000 race calls and 1,000 graph replays, the
# direct-access collectives, low precision), compute-sanitizer, the Python package against
# torch.distributed, then the bench tables (all-reduce graph mode, low precision). Results are
# packed into $OUT/session.tgz after every step, so a call cut off by its limit still returns
# what was finished, and $OUT/session-summary.txt lists each step's exit code and time.
#
# Prepared here with scripts/gpu_prepare.sh (no Rust on the device: binaries into .carry/bin, the
# kernel cache into .carry/kc, the wheel into dist/),
# and run with carry [".carry", "dist"]:
#   bash scripts/gpu_session.sh .carry/bin .carry/kc "checks python"   (one call, ~400 s)
#   bash scripts/gpu_session.sh .carry/bin .carry/kc bench             (~160 s)
#   bash scripts/gpu_session.sh .carry/bin .carry/kc sanitize          (up to ~590 s)
# PARTS (third argument) defaults to checks sanitize python bench; `coll` adds the direct-access
# collectives' tables (five benches, ~45 s each); `shared` runs the check programs at 3 and 4
# ranks on the 2 GPUs (`--share-gpus`, correctness of the n-rank kernels only). The bench steps'
# limits (BENCH_AR_LIMIT_S=40, BENCH_LP_LIMIT_S=30) end the sweeps after 64 MB; raise them to
# reach 256 MB in a call of their own.
# `p2p` times send/recv and the device-count all-to-all-v against NCCL and runs
# scripts/gpu_link_ceiling.py (~3 min); `pdl` times every collective from 1 KB to 256 KB with
# FERROCOMM_PDL off and on, interleaved (~5 min); `ce` the copy engines' probe and the copy-engine
# all-reduce checked and timed against the SM one (~6 min); `push` the push all-reduce against flat
# at 64-512 KB (~1.5 min); `ll128` the LL128 all-reduce checked in full (every flat size, 10,000
# back-to-back calls: a line torn on the way would show as a wrong sum) and timed against flat
# from 64 KB to 32 MB (~5 min). CHECKS lists the check programs of part `checks`
# (default "gpu_check gpu_check_coll gpu_check_lowp"; gpu_check alone takes ~125 s).
set -uo pipefail
bin="$(cd "${1:-.carry/bin}" && pwd)"
parts=" ${3:-checks sanitize python bench} "
listed() { [[ "$1" == *" $2 "* ]]; }  # a space-padded list, a name
want() { listed "$parts" "$1"; }
export FERROCOMM_KERNEL_CACHE="$(cd "${2:-.carry/kc}" && pwd)"
export NCCL_NVLS_ENABLE=0 FERROCOMM_TIMEOUT_S=30 PYTHONUNBUFFERED=1
out="${OUT:-/tmp}"
res="$out/session"
mkdir -p "$res"
summary="$res/summary.txt"
fc="$bin/ferrocomm"
step() { # name, limit in seconds, command...
  local name="$1" limit="$2"; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$res/$name.txt" 2>&1
  local rc=$?
  printf '%-26s rc=%-3s %4ss %s\n' "$name" "$rc" "$((SECONDS - t0))" \
    "$(grep -E 'Out of bounds|all results|passed|FAILED|summary:|ERROR SUMMARY|exit [0-9]' "$res/$name.txt" | tail -2 | tr '\n' ' ')" \
    | tee -a "$summary"
  tar czf "$out/session.tgz" -C "$out" session
  cp "$summary" "$out/session-summary.txt"
}
ab() { # step name, step limit, seconds per bench, bench flags, "COLL DTYPE;..." pairs, builds...
  # (scripts/gpu_ab.sh: the same build under settings, BIN@VAR=VALUE, interleaved; no check
  # program, the carried kernel cache as it is; tables and JSON under $OUT/<step name>)
  local name="$1" limit="$2" per="$3" args="$4" benches="$5"
  shift 5
  AB_CHECK=none AB_PRECOMPILE=none AB_STEP_S="$per" AB_ARGS="$args" AB_BENCHES="$benches" AB_DIR="$out/$name" \
    step "$name" "$limit" bash "$(dirname "$0")/gpu_ab.sh" "$FERROCOMM_KERNEL_CACHE" "$@"
}
{ date -u; nvidia-smi -L; nvidia-smi topo -m; } > "$res/machine.txt" 2>&1
"$fc" info > "$res/info.txt" 2>&1
checks=" ${CHECKS:-gpu_check gpu_check_coll gpu_check_lowp} "
if want checks; then
  listed "$checks" gpu_check &&
    step gpu_check 240 "$fc" launch -n 2 --timeout 238 -- "$bin/gpu_check" --no-timing
  listed "$checks" gpu_check_coll &&
    step gpu_check_coll 70 "$fc" launch -n 2 --timeout 68 -- "$bin/gpu_check_coll"
  listed "$checks" gpu_check_lowp &&
    step gpu_check_lowp 100 "$fc" launch -n 2 --timeout 98 -- "$bin/gpu_check_lowp"
fi
if want shared; then
  # More ranks than GPUs (`--share-gpus`: local rank r on GPU r mod 2, NCCL off, two processes
  # taking turns on one GPU): the 3- and 4-rank kernels' correctness, no timing. SHARED_WORLDS
  # (default "3 4") and SHARED_CHECKS (default: the three programs, --quick) choose the runs.
  for w in ${SHARED_WORLDS:-3 4}; do
    for p in ${SHARED_CHECKS:-gpu_check gpu_check_coll gpu_check_lowp}; do
      step "$p-w$w-shared" "${SHARED_LIMIT_S:-150}" "$fc" launch -n "$w" --timeout "$((${SHARED_LIMIT_S:-150} - 2))" -- \
        "$bin/$p" --share-gpus ${SHARED_FLAGS---quick}
    done
  done
fi
if want sanitize; then
  SANITIZE_RUN_TIMEOUT_S=95 OUT="$res" step sanitize 590 bash "$(dirname "$0")/gpu_sanitize.sh" "$bin"
fi
if want python; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/ferrocomm-site dist/ferrocomm-*.whl \
    > "$res/pip.txt" 2>&1
  CHECK_WATCHDOG_S=170 PYTHONPATH=/tmp/ferrocomm-site \
    step python_check 180 torchrun --nproc_per_node 2 python/tests/gpu/check_torch.py
  PYTHONPATH=/tmp/ferrocomm-site \
    step setup_fault 60 torchrun --nproc_per_node 2 python/tests/gpu/check_setup_fault.py
  PYTHONPATH=/tmp/ferrocomm-site \
    step python_dynamic 90 torchrun --nproc_per_node 2 python/tests/gpu/check_dynamic.py
  PYTHONPATH=/tmp/ferrocomm-site \
    step python_lists 90 torchrun --nproc_per_node 2 python/tests/gpu/check_lists.py
fi
if want coll; then
  # The direct-access collectives against NCCL, graph mode (docs/tuning.md's tables).
  for c in all_gather reduce_scatter all_to_all broadcast reduce; do
    step "$c-graph" "${BENCH_COLL_LIMIT_S:-45}" "$fc" bench "$c" -g 2 -d bfloat16 -b 1K -e 64M -f 4 -n 10 \
      --reps 3 -G 10 --vs nccl --json "$res/$c-graph.json"
  done
fi
if want p2p; then
  # Point-to-point and the device-count all-to-all-v against NCCL (graph and eager), then what
  # the link carries by the copy engines, one way and both ways (the ceiling of every large row).
  step sendrecv-graph "${BENCH_P2P_LIMIT_S:-60}" "$fc" bench sendrecv -g 2 -d bfloat16 -b 1K -e 256M -f 4 -n 10 \
    --reps 3 -G 10 --vs nccl --json "$res/sendrecv-graph.json"
  step sendrecv-eager "${BENCH_P2P_LIMIT_S:-60}" "$fc" bench sendrecv -g 2 -d bfloat16 -b 1K -e 1M -f 4 -n 20 \
    --reps 3 --vs nccl --json "$res/sendrecv-eager.json"
  step device_alltoallv-graph "${BENCH_P2P_LIMIT_S:-60}" "$fc" bench device_alltoallv -g 2 -d bfloat16 -b 1K -e 16M \
    -f 4 -n 10 --reps 3 -G 10 --vs nccl --json "$res/device_alltoallv-graph.json"
  step link_ceiling 60 python3 "$(dirname "$0")/gpu_link_ceiling.py" 16M 64M 256M
fi
if want pdl; then
  # Programmatic dependent launch on and off, the same build, every collective's small sizes in
  # graph mode, runs interleaved (scripts/gpu_ab.sh; its tables under $OUT/pdl-ab).
  ab pdl-ab 420 "${BENCH_PDL_LIMIT_S:-25}" "-b 1K -e 256K -f 4 -n 10 --reps 3 -G 10 --vs nccl" \
    "all_reduce bfloat16;all_gather bfloat16;reduce_scatter bfloat16;all_to_all bfloat16;all_to_all_v bfloat16;broadcast bfloat16;reduce bfloat16;sendrecv bfloat16" \
    "$bin" "$bin@FERROCOMM_PDL=1"
fi
if want ce; then
  # The copy engines: what they carry over NVLink one way and both ways against SM kernels, and
  # a stand-alone copy-engine all-reduce (bench/results/2026-12-01-h200x2-ce-probe); then the
  # library's (FERROCOMM_ALLREDUCE_CE_MIN_BYTES) checked at every flat size, and timed against
  # the SM flat and NCCL from 1 MB to 64 MB, runs interleaved.
  step ce_probe 200 bash "$(dirname "$0")/../bench/results/2026-12-01-h200x2-ce-probe/run.sh"
  FERROCOMM_ALLREDUCE_CE_MIN_BYTES=1 step gpu_check-ce 200 "$fc" launch -n 2 --timeout 198 -- \
    "$bin/gpu_check" --quick --no-timing
  ab ce-ab 200 "${BENCH_CE_LIMIT_S:-40}" "-b 1M -e 64M -f 4 -n 10 --reps 3 -G 10 --vs nccl" \
    "all_reduce bfloat16;all_reduce float" \
    "$bin@FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES=64M" \
    "$bin@FERROCOMM_ALLREDUCE_FLAT_MAX_BYTES=64M,FERROCOMM_ALLREDUCE_CE_MIN_BYTES=1M"
fi
if want push; then
  # The push (LL) all-reduce above its default limit (64 KiB at two ranks): the same build with
  # FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES at its buffer's 512 KiB, against flat, runs interleaved.
  # The data movers' LL won to 256 KiB parts (bench/results/2026-11-30-h200x2-push-own), and
  # push has gained ~1.7 us at 64 KiB since flat won at 256 KiB (docs/tuning.md's first table).
  ab push-ab 150 "${BENCH_PUSH_LIMIT_S:-30}" "-b 64K -e 512K -f 2 -n 20 --reps 3 -G 10 --vs nccl" \
    "all_reduce bfloat16;all_reduce float" \
    "$bin" "$bin@FERROCOMM_ALLREDUCE_PUSH_MAX_BYTES=512K"
fi
if want ll128; then
  # The LL128 all-reduce (FERROCOMM_ALLREDUCE_LL128_MAX_BYTES at the staging's 64 MiB: every
  # flat all-reduce by it), first checked (the whole gpu_check, whose race case runs 10,000
  # mixed calls back to back), then timed against the pull flat and NCCL, runs interleaved.
  FERROCOMM_ALLREDUCE_LL128_MAX_BYTES=64M step gpu_check-ll128 240 "$fc" launch -n 2 --timeout 238 -- \
    "$bin/gpu_check" --no-timing
  ab ll128-ab 200 "${BENCH_LL128_LIMIT_S:-40}" "-b 64K -e 32M -f 2 -n 20 --reps 3 -G 10 --vs nccl" \
    "all_reduce bfloat16;all_reduce float" \
    "$bin" "$bin@FERROCOMM_ALLREDUCE_LL128_MAX_BYTES=64M"
fi
if want bench; then
  step all_reduce-graph "${BENCH_AR_LIMIT_S:-40}" "$fc" bench all_reduce -g 2 -d bfloat16 -b 1K -e 256M -f 4 -n 10 --reps 3 \
    -G 10 --vs nccl --json "$res/all_reduce-graph.json" --plot "$res/all_reduce-graph.png"
  for c in "all_reduce bfloat16" "all_reduce float" "all_gather bfloat16" "all_to_all bfloat16"; do
    set -- $c
    step "lp-$1-$2" "${BENCH_LP_LIMIT_S:-30}" "$fc" bench "$1" -g 2 -d "$2" -b 4M -e 256M -f 4 -n 10 --reps 2 -G 10 \
      --low-precision e4m3 --vs nccl --json "$res/lp-$1-$2.json" --plot "$res/lp-$1-$2.png"
  done
fi
cat "$summary"
