#!/usr/bin/env bash
# The model bench on one GPU, two ranks sharing it (correctness and fidelity; timing numbers
# from a shared GPU mean nothing and are only a smoke test of the CUDA-graph paths):
#   1. the TP model at llama3-8b and qwen3-8b layer shapes (2 layers, fp32) equals the unsharded
#      model on gloo and ferrocomm (and the fused path when the installed ferrocomm has it);
#   2. the Hugging Face loader against transformers' own forward pass (small random models);
#   3. --fidelity end to end: training the byte-level LM, logits and perplexity per format;
#   4. a short decode/prefill run through every path (graph capture and replay).
# NCCL is off (it refuses two ranks on one GPU); gloo on CPU copies is the torch reference.
#
#   scripts/gpu_model_bench.sh BUILD_DIR OUT_DIR [--variant NAME] [PARTS]
# BUILD_DIR is what scripts/gpu_prepare.sh made (dist/: the wheel, installed into a temporary
# directory; kc/: the kernel cache; with --variant NAME, gpu_prepare.sh --variant NAME's wheel
# in dist-NAME/ instead). OUT_DIR receives one folder per step (result.json, result.png) and
# its log. PARTS (a quoted list) defaults to "check hf fidelity timing".
set -uo pipefail
usage="usage: scripts/gpu_model_bench.sh BUILD_DIR OUT_DIR [--variant NAME] [PARTS]"
. "$(dirname "$0")/gpu_args.sh"
gpu_dirs out "$usage" "$@" || exit 2
shift 2
dist="$build/dist"
if [ "${1:-}" = --variant ]; then
  [ -n "${2:-}" ] || { echo "$usage" >&2; exit 2; }
  dist="$build/dist-$2"
  shift 2
fi
parts=" ${1:-check hf fidelity timing} "
here="$(cd "$(dirname "$0")/.." && pwd)"
ls "$dist"/ferrocomm-*.whl > /dev/null 2>&1 ||
  { echo "gpu_model_bench.sh: no wheel in $dist (scripts/gpu_prepare.sh)" >&2; exit 2; }
site="$(mktemp -d /tmp/ferrocomm-site-XXXXXX)"
trap 'rm -rf "$site"' EXIT
python3 -m pip install -q --no-deps --no-index --target "$site" "$dist"/ferrocomm-*.whl \
  || exit 1
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export FERROCOMM_KERNEL_CACHE="$build/kc"
export FERROCOMM_NCCL_LIB=/nonexistent
export FERROCOMM_TIMEOUT_S="${FERROCOMM_TIMEOUT_S:-120}"
nvidia-smi -L || true
cd "$out" || exit 2
status=0
run() {  # NAME LIMIT_S COMMAND...
  local name="$1" limit="$2"
  shift 2
  case "$parts" in *" ${name%%-*} "*) ;; *) return ;; esac
  echo "=== $name: $*"
  local t0=$SECONDS
  if timeout -k 10 "$limit" "$@" > "$name.log" 2>&1; then
    echo "--- $name ok ($((SECONDS - t0)) s)"
  else
    echo "--- $name FAILED ($((SECONDS - t0)) s)"
    status=1
  fi
  tail -40 "$name.log"
}
bench=(torchrun --standalone --nproc_per_node 2 -m ferrocomm.bench_model)
fused="$(python3 -c 'import ferrocomm; print(int(callable(getattr(ferrocomm.Comm, "all_reduce_rmsnorm", None))))')"
paths="gloo,ferrocomm,ferrocomm-lp"
[ "$fused" = 1 ] && paths="$paths,ferrocomm-fused,ferrocomm-fused-lp"
run check-llama3-8b 240 "${bench[@]}" --check --model llama3-8b --layers 2 --dtype fp32 --paths "$paths" \
  --out check-llama3-8b
run check-qwen3-8b 240 "${bench[@]}" --check --model qwen3-8b --layers 2 --dtype fp32 --paths "$paths" \
  --out check-qwen3-8b
run check-llama3-8b-bf16 240 "${bench[@]}" --check --model llama3-8b --layers 2 --paths "$paths" \
  --out check-llama3-8b-bf16
run hf 120 python3 "$here/python/tests/gpu/check_hf_loader.py" hf
run fidelity 480 "${bench[@]}" --fidelity --model llama3-8b --layers 2 --out fidelity
run timing 300 "${bench[@]}" --model llama3-8b --layers 2 --paths "$paths" --decode-batches 1,8 \
  --context 1024 --steps 10 --warmup 3 --prefill 512,2048 --prefill-reps 2 --out timing
echo "gpu_model_bench: $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
