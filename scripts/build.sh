#!/usr/bin/env bash
# Builds roar and, beside it in the same target directory, the preload shim, which is a cargo
# workspace of its own (crates/preload/Cargo.toml says why): `bash scripts/build.sh [--release]
# [cargo options]`. roar also carries a copy of the shim inside it (crates/cli/build.rs), used
# when none is installed beside it; building both keeps the one beside it current.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-$PWD/target}"
source scripts/preflight.sh
roar_preflight
cargo build --locked -p roar-cli "$@"
cargo build --locked --manifest-path crates/preload/Cargo.toml --target-dir "$target" "$@"
