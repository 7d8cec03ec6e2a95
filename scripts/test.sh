#!/usr/bin/env bash
# The whole test suite: Rust (lint, unit, multi-process) and Python. What CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast
else
  cargo test --workspace --locked --no-fail-fast
fi
cargo test --workspace --doc --locked

if [ -d python ] && [ -f crates/ferrocomm-py/Cargo.toml ]; then
  python3 -m pip install -q --upgrade ./ 
  python3 -m pytest -q python/tests
fi
