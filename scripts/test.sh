#!/usr/bin/env bash
# The whole test suite: Rust (format, lint, unit, multi-process, a machine without the NVIDIA
# driver, doc tests, API docs) and Python.
# CI runs exactly this.
#
# What the tests need goes into a virtual environment of the project's own, .venv (created on
# the first run, brought up to date when the list below changes): NVRTC 13.0 (the library's
# build compiles every CUDA kernel with it, on a machine without a GPU; newer NVRTC emits code
# that driver 580 refuses), numpy, ml_dtypes (numpy's bf16 and fp8, which the Python tests
# cover), pytest, maturin, torch with expecttest and hypothesis for the torch.distributed tests
# (torch's own backend test suite imports those two), matplotlib for the model bench's plot,
# and mypy for the package's types. A test that needs one of them fails without it; none is
# skipped. Nothing is installed outside .venv. uv installs them (fast, and from its cache on
# later runs).
#
# Compiled kernels are kept where the library keeps them (FERROCOMM_KERNEL_CACHE, by default
# ~/.cache/ferrocomm), keyed by source hash, options, arch and NVRTC version: the build compiles
# only kernel units whose source changed since any checkout on this machine compiled them.
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
ml_dtypes
pytest
expecttest
hypothesis
maturin>=1.5,<2
torch==2.11.0
matplotlib
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

# What a machine without libcuda gets (a clear error, no GPU): tests that a plain `cargo test`
# leaves out as ignored, since on a machine with a driver they cannot run; here (CI has no GPU)
# they run and must pass.
no_driver_tests() {
  if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run -p ferrocomm --test cuda_backend --locked --run-ignored only
  else
    cargo test -p ferrocomm --test cuda_backend --locked -- --ignored
  fi
}

# The Python package built as users build it (maturin through pip, without build isolation so
# that the environment's maturin and NVRTC are used), in the dev profile (not a release build
# of everything) and in a target directory of its own: maturin configures pyo3 for the
# environment's Python, which would otherwise rebuild pyo3 and its dependents in target/debug
# back and forth between this stage and the cargo stages of the next run. The wheel is kept in
# target/wheels-test: the Python tests check the kernels inside it.
python_package() {
  rm -rf target/wheels-test
  CARGO_TARGET_DIR="$PWD/target/python" MATURIN_PEP517_ARGS="--profile dev" \
    "$PY" -m pip wheel -q --disable-pip-version-check --no-build-isolation --no-deps \
    -w target/wheels-test ./ || return
  "$PY" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps \
    target/wheels-test/ferrocomm-*.whl
}

stage python-env python_env
if [ -z "${FERROCOMM_NVRTC_LIB:-}" ] && passed python-env; then
  FERROCOMM_NVRTC_LIB="$(nvrtc_dir)"
  export FERROCOMM_NVRTC_LIB
fi
echo "NVRTC for the built-in kernels: ${FERROCOMM_NVRTC_LIB:-(none found)}"

stage fmt cargo fmt --all -- --check
# The library's build compiles every CUDA kernel unit it builds in (crates/ferrocomm/build.rs:
# sm_80, sm_90, sm_100 cubins and sm_90 PTX) with NVRTC, through the kernel cache.
echo
echo "=== kernels: the library's build compiles the CUDA kernels built into it with NVRTC where"
echo "    their source changed since any build on this machine (cold: about 19 CPU minutes, up to"
echo "    an hour on 2 busy cores; warm: seconds); cached in ${FERROCOMM_KERNEL_CACHE:-~/.cache/ferrocomm}"
stage kernels cargo build -p ferrocomm --locked
stage clippy cargo clippy --workspace --all-targets --locked -- -D warnings
stage rust-tests rust_tests
stage no-driver no_driver_tests
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
