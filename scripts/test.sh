#!/usr/bin/env bash
# Sets up what is missing, then runs every check CI runs: format, lints, the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# The integration tests drive the real `roar` binary and the preload shim: build them first.
cargo build --workspace --locked
log=$(mktemp)
cargo test --workspace --locked 2>&1 | tee "$log"
# One closing line for the whole suite (cargo's own last line is a doc-test binary's).
awk '/^test result:/ { p += $4; f += $6; s += $8 } END { printf "%d passed, %d failed, %d skipped\n", p, f, s }' "$log"
rm -f "$log"
