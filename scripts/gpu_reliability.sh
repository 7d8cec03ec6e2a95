#!/usr/bin/env bash
# docs/reliability.md's GPU checks, in one run (one GPU is enough; ranks share it, NCCL off):
#
#   scripts/gpu_reliability.sh BUILD_DIR OUT_DIR
#
# BUILD_DIR is what scripts/gpu_prepare.sh made (bin/, the kernel cache kc/, the wheel dist/).
#   1. scripts/gpu_peer_death.sh: SIGKILL to error per direct-access kernel family
#      (OUT_DIR/peer_death.txt, one line per family, PASS within a second);
#   2. python/tests/gpu/check_flight_graph.py at two ranks: the flight recorder under CUDA
#      graphs (OUT_DIR/flight_graph.log: a captured call recorded once, replays add nothing,
#      both analyzers read the dumps without a hang reported; its summary line);
#   3. scripts/torch_overhead.py on GPU 0 alone (world size 1, so NCCL underneath is fine): the
#      host time per call with the flight recorder on and off (OUT_DIR/overhead/overhead.md, its
#      line "flight recorder:" the recorder's cost per call, the next the control's).
# Writes OUT_DIR/reliability-summary.txt (each part's exit status and time); exits 1 when a
# part fails. About two minutes on an H200.
set -uo pipefail
. "$(dirname "$0")/gpu_args.sh"
[ $# -eq 2 ] || { echo "usage: scripts/gpu_reliability.sh BUILD_DIR OUT_DIR" >&2; exit 2; }
gpu_dirs out "usage: scripts/gpu_reliability.sh BUILD_DIR OUT_DIR" "$@" || exit 2
here="$(cd "$(dirname "$0")" && pwd)"
bin="$build/bin"
[ -x "$bin/ferrocomm" ] && ls "$build"/dist/ferrocomm-*.whl > /dev/null 2>&1 || {
  echo "gpu_reliability.sh: $build must hold bin/ferrocomm and dist/ferrocomm-*.whl (scripts/gpu_prepare.sh BUILD_DIR)" >&2
  exit 2
}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export FERROCOMM_KERNEL_CACHE="$build/kc"
ngpu="$(nvidia-smi -L 2>/dev/null | wc -l)"
share=()
[ "$ngpu" -ge 2 ] || share=(--share-gpus)
site="$(mktemp -d /tmp/ferrocomm-site-XXXXXX)"
trap 'rm -rf "$site"' EXIT
python3 -m pip install -q --no-deps --no-index --target "$site" "$build"/dist/ferrocomm-*.whl \
  > "$out/pip.txt" 2>&1
summary="$out/reliability-summary.txt"
: > "$summary"
status=0
part() { # name, limit in seconds, command...
  local name="$1" limit="$2" t0=$SECONDS
  shift 2
  timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || status=1
  printf '%-14s rc=%-3s %4ss\n' "$name" "$rc" "$((SECONDS - t0))" >> "$summary"
}
part peer_death 600 bash "$here/gpu_peer_death.sh" "$build" "$out"
FERROCOMM_TIMEOUT_S=30 PYTHONPATH="$site:$here/../python/tests/gpu" \
  part flight_graph 180 "$bin/ferrocomm" launch -n 2 --timeout 170 -- \
  python3 "$here/../python/tests/gpu/check_flight_graph.py" "$out/flight_graph" "${share[@]}"
PYTHONPATH="$site" part overhead 300 python3 "$here/torch_overhead.py" "$out/overhead" \
  --calls 20000 --rounds 20
cat "$summary"
exit $status
