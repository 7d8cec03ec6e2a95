#!/usr/bin/env bash
# The whole test suite: Rust (format, lint, unit, multi-process, doc tests, API docs) and Python.
# CI runs exactly this.
#
# What the tests need goes into a virtual environment of the project's own, .venv (created on
# the first run, brought up to date when the list below changes): NVRTC 13.0 (so that every
# CUDA kernel is compile-checked on a machine without a GPU; newer NVRTC emits code that driver
# 580 refuses), numpy, pytest, maturin, torch with expecttest and hypothesis for the
# torch.distributed tests (torch's own backend test suite imports those two), and mypy for the
# package's types.
# Nothing is installed outside .venv. uv installs them (fast, and from its cache on later runs).
#
# Compiled kernels are kept where the library keeps them (FERROCOMM_KERNEL_CACHE, by default
# ~/.cache/ferrocomm), keyed by source hash, options, arch and NVRTC version: the NVRTC check
# compiles only kernels whose source changed since any checkout on this machine compiled them.
#
# Every stage runs even when an earlier one fails; a summary of the stages (pass/fail, seconds)
# ends the run, and the exit status is non-zero when any failed.
set -uo pipefail
cd "$(dirname "$0")/.."

VENV="${FERROCOMM_TEST_VENV:-.venv}"
PY="$VENV/bin/python"
# The list the environment is built from; a change here rebuilds it.
REQUIREMENTS="nvidia-cuda-nvrtc==13.0.88
numpy
pytest
expecttest
hypothesis
maturin>=1.5,<2
torch==2.11.0
mypy==2.4.1"

names=()
codes=()
secs=()

# stage NAME COMMAND...: runs the command, records its status and time, never stops the run.
stage() {
  local name=$1
  shift
  echo
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@"
  local rc=$?
  names+=("$name")
  codes+=("$rc")
  secs+=($((SECONDS - t0)))
  if [ "$rc" -ne 0 ]; then
    echo "=== $name FAILED (exit $rc)"
  fi
  return 0
}

passed() {
  local i
  for i in "${!names[@]}"; do
    if [ "${names[$i]}" = "$1" ]; then
      [ "${codes[$i]}" -eq 0 ]
      return
    fi
  done
  return 1
}

python_env() {
  if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV" || return
  fi
  if [ ! -x "$VENV/bin/uv" ]; then
    "$PY" -m pip install -q --disable-pip-version-check uv || return
  fi
  local want="$REQUIREMENTS"
  if [ "$(cat "$VENV/.ferrocomm-requirements" 2>/dev/null)" = "$want" ]; then
    echo "up to date ($VENV)"
    return 0
  fi
  # shellcheck disable=SC2086
  "$VENV/bin/uv" pip install -q --python "$PY" $REQUIREMENTS || return
  printf '%s' "$want" >"$VENV/.ferrocomm-requirements"
}

nvrtc_dir() {
  "$PY" - <<'PY'
import os, nvidia
hits = [os.path.join(p, "cu13", "lib") for p in nvidia.__path__
        if os.path.exists(os.path.join(p, "cu13", "lib", "libnvrtc.so.13"))]
print(hits[0] if hits else "")
PY
}

rust_tests() {
  if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --locked --no-fail-fast
  else
    cargo test --workspace --locked --no-fail-fast
  fi
}

# The Python package built as users build it (maturin through pip, without build isolation so
# that the environment's maturin is used), in the dev profile (not a release build of
# everything) and in a target directory of its own: maturin configures pyo3 for the
# environment's Python, which would otherwise rebuild pyo3 and its dependents in target/debug
# back and forth between this stage and the cargo stages of the next run.
python_package() {
  CARGO_TARGET_DIR="$PWD/target/python" MATURIN_PEP517_ARGS="--profile dev" \
    "$PY" -m pip install -q --disable-pip-version-check --no-build-isolation --force-reinstall \
    --no-deps ./
}

stage python-env python_env
if [ -z "${FERROCOMM_NVRTC_LIB:-}" ] && passed python-env; then
  FERROCOMM_NVRTC_LIB="$(nvrtc_dir)"
  export FERROCOMM_NVRTC_LIB
fi
echo "NVRTC for kernel compile checks: ${FERROCOMM_NVRTC_LIB:-(none found)}"

stage fmt cargo fmt --all -- --check
stage clippy cargo clippy --workspace --all-targets --locked -- -D warnings
stage rust-tests rust_tests
stage doc-tests cargo test --workspace --doc --locked
# The library's API docs build without warnings (broken or private links).
stage api-docs env RUSTDOCFLAGS="-D warnings" cargo doc -p ferrocomm --no-deps --locked
if passed python-env; then
  stage python-package python_package
  stage python-tests "$PY" -m pytest -q --durations=5 python/tests
  # The package's types, strictly (pyproject.toml's [tool.mypy]).
  stage python-types "$PY" -m mypy
else
  names+=("python-package" "python-tests" "python-types")
  codes+=(1 1 1)
  secs+=(0 0 0)
  echo "=== python stages not run: the environment could not be built"
fi

echo
echo "=== summary (${SECONDS} s in all)"
failed=0
for i in "${!names[@]}"; do
  if [ "${codes[$i]}" -eq 0 ]; then
    verdict=pass
  else
    verdict="FAIL (exit ${codes[$i]})"
    failed=$((failed + 1))
  fi
  printf '%-16s %-16s %5d s\n' "${names[$i]}" "$verdict" "${secs[$i]}"
done
if [ "$failed" -ne 0 ]; then
  echo "$failed stage(s) failed"
  exit 1
fi
echo "every stage passed"
