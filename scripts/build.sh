#!/usr/bin/env bash
# Builds roar and, beside it in the same target directory, the preload shim, which is a cargo
# workspace of its own (crates/preload/Cargo.toml says why): `bash scripts/build.sh [--lean]
# [--release] [cargo options]`. roar also carries a copy of the shim inside it
# (crates/cli/build.rs), used when none is installed beside it; building both keeps the one
# beside it current.
set -euo pipefail
cd "$(dirname "$0")/.."
target="${CARGO_TARGET_DIR:-$PWD/target}"
source scripts/preflight.sh
# --lean: roar without the eBPF backend, so without clang and libelf (crates/tracer/Cargo.toml).
lean=()
if [ "${1:-}" = "--lean" ]; then
    shift
    lean=(--no-default-features)
    roar_preflight --lean
else
    roar_preflight
fi
cargo build --locked -p roar-cli "${lean[@]}" "$@"
cargo build --locked --manifest-path crates/preload/Cargo.toml --target-dir "$target" "$@"
