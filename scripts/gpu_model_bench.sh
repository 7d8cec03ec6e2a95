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
#   bash scripts/gpu_model_bench.sh OUT_DIR [WHEEL]
# OUT_DIR receives one folder per part (result.json, result.png) and the logs. WHEEL, when
# given, is installed first (pip --no-deps); otherwise ferrocomm must be importable already.
# PARTS (default "check hf fidelity timing") picks parts; FERROCOMM_KERNEL_CACHE may point at
# kernels compiled beforehand (scripts/gpu_prepare.sh's .carry/kc).
set -uo pipefail
out="${1:?usage: gpu_model_bench.sh OUT_DIR [WHEEL]}"
here="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$out"
if [ -n "${2:-}" ]; then
  python3 -m pip install -q --no-deps --force-reinstall "$2" || exit 1
fi
export FERROCOMM_NCCL_LIB=/nonexistent
export FERROCOMM_TIMEOUT_S="${FERROCOMM_TIMEOUT_S:-120}"
FERROCOMM_KERNEL_CACHE="$(realpath -m "${FERROCOMM_KERNEL_CACHE:-/tmp/ferrocomm-kernels}")"
export FERROCOMM_KERNEL_CACHE
parts=" ${PARTS:-check hf fidelity timing} "
nvidia-smi -L || true
cd "$out" || exit 1
status=0
run() {
  local name="$1"
  shift
  case "$parts" in *" ${name%%-*} "*) ;; *) return ;; esac
  echo "=== $name: $*"
  local t0=$SECONDS
  if "$@" > "$name.log" 2>&1; then
    echo "--- $name ok ($((SECONDS - t0)) s)"
  else
    echo "--- $name FAILED ($((SECONDS - t0)) s)"
    status=1
  fi
  tail -40 "$name.log"
}
bench() {
  torchrun --standalone --nproc_per_node 2 -m ferrocomm.bench_model "$@"
}
fused="$(python3 -c 'import ferrocomm; print(int(callable(getattr(ferrocomm.Comm, "all_reduce_rmsnorm", None))))')"
paths="gloo,ferrocomm,ferrocomm-lp"
[ "$fused" = 1 ] && paths="$paths,ferrocomm-fused,ferrocomm-fused-lp"
run check-llama3-8b bench --check --model llama3-8b --layers 2 --dtype fp32 --paths "$paths" \
  --out check-llama3-8b
run check-qwen3-8b bench --check --model qwen3-8b --layers 2 --dtype fp32 --paths "$paths" \
  --out check-qwen3-8b
run check-llama3-8b-bf16 bench --check --model llama3-8b --layers 2 --paths "$paths" \
  --out check-llama3-8b-bf16
run hf python3 "$here/python/tests/gpu/check_hf_loader.py" hf
run fidelity bench --fidelity --model llama3-8b --layers 2 --out fidelity
run timing bench --model llama3-8b --layers 2 --paths "$paths" --decode-batches 1,8 \
  --context 1024 --steps 10 --warmup 3 --prefill 512,2048 --prefill-reps 2 --out timing
echo "gpu_model_bench: $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
