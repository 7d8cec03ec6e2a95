# Sourced by the GPU scripts (after `set -uo pipefail`): the two arguments every one of them
# starts with, and the environment every GPU run takes.

# gpu_dirs VAR USAGE ARGS...: ARGS start with BUILD_DIR (what scripts/gpu_prepare.sh made)
# and OUT_DIR; sets `build` to BUILD_DIR and VAR to OUT_DIR (created), both absolute. Fewer
# than two arguments, or a BUILD_DIR that is not there: USAGE on stderr, status 2.
gpu_dirs() {
  local var="$1" usage="$2"
  shift 2
  [ $# -ge 2 ] || { echo "$usage" >&2; return 2; }
  build="$(cd "$1" && pwd)" || return 2
  local dir
  mkdir -p "$2" && dir="$(cd "$2" && pwd)" || return 2
  printf -v "$var" %s "$dir"
}

# gpu_env: NVLink multicast off (never used here), and the kernel cache of BUILD_DIR unless
# FERROCOMM_KERNEL_CACHE names another.
gpu_env() {
  export NCCL_NVLS_ENABLE=0
  if [ -d "$build/kc" ]; then
    export FERROCOMM_KERNEL_CACHE="${FERROCOMM_KERNEL_CACHE:-$build/kc}"
  fi
}

# gpu_need_bins SCRIPT HINT NAME...: `bin` holds every NAME as an executable; otherwise SCRIPT's
# complaint (how to build them: HINT) on stderr, status 2.
gpu_need_bins() {
  local script="$1" hint="$2" n
  shift 2
  local names="$*"
  for n in "$@"; do
    [ -x "$bin/$n" ] || {
      echo "$script: $bin must hold ${names// / and } ($hint)" >&2
      return 2
    }
  done
}

# gpu_machine NAME: the machine's GPUs, shown and written to OUT_DIR/NAME-machine.txt (`out`);
# sets `ngpu` to their count.
gpu_machine() {
  nvidia-smi -L | tee "$out/$1-machine.txt" || true
  ngpu="$(nvidia-smi -L 2>/dev/null | wc -l)"
}
