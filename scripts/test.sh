#!/usr/bin/env bash
# The whole test suite: Rust (format, lint, unit, multi-process) and Python. CI runs exactly this.
# It installs what the tests need first: NVRTC 13.0 (so every CUDA kernel is compile-checked on a
# machine without a GPU; newer NVRTC emits code that driver 580 refuses), numpy and pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m pip install -q --disable-pip-version-check "nvidia-cuda-nvrtc==13.0.88" numpy pytest
if [ -z "${FERROCOMM_NVRTC_LIB:-}" ]; then
  FERROCOMM_NVRTC_LIB="$(python3 - <<'PY'
import os, nvidia
hits = [os.path.join(p, "cu13", "lib") for p in nvidia.__path__
        if os.path.exists(os.path.join(p, "cu13", "lib", "libnvrtc.so.13"))]
print(hits[0] if hits else "")
PY
)"
  export FERROCOMM_NVRTC_LIB
fi
echo "NVRTC for kernel compile checks: $FERROCOMM_NVRTC_LIB"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast
else
  cargo test --workspace --locked --no-fail-fast
fi
cargo test --workspace --doc --locked
# The library's API docs build without warnings (broken or private links).
RUSTDOCFLAGS="-D warnings" cargo doc -p ferrocomm --no-deps --locked

# The Python package, built as users build it, tested on the host backend with real processes.
python3 -m pip install -q --disable-pip-version-check --upgrade ./
python3 -m pytest -q python/tests
