#!/usr/bin/env bash
# Sets up what is missing, then runs every check CI runs: format, lints, the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# What setup could not install is named here, before any compiling.
source scripts/preflight.sh
roar_preflight
# A clean build takes ~4 GiB and the scale tests ~4 GiB more (a million-file tree) in the temp
# directory: with less, failures would be ENOSPC in whichever test ran out first.
for dir in . "${TMPDIR:-/tmp}"; do
    free_gib=$(df -Pk "$dir" | awk 'NR == 2 { printf "%d", $4 / 1048576 }')
    if [ "$free_gib" -lt 9 ]; then
        echo "scripts/test.sh: warning: only $free_gib GiB free on $(df -P "$dir" | awk 'NR == 2 { print $6 }') ($dir); the suite needs about 9 GiB: tests may fail with ENOSPC" >&2
    fi
done
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Functions over 100 lines, files over 600, import circles: never more than scripts/structure.toml.
python3 scripts/structure.py --check
# The preload shim is a workspace of its own (crates/preload/Cargo.toml): checked the same way.
shim=(--manifest-path crates/preload/Cargo.toml)
cargo fmt "${shim[@]}" --check
cargo clippy "${shim[@]}" --all-targets --locked --target-dir "${CARGO_TARGET_DIR:-target}" -- -D warnings
# The integration tests drive the real `roar` binary and the preload shim: build them first (the
# shim beside roar, as an install has it).
# The lean build (no eBPF) first, kept aside: the full build below then puts roar back. Built
# for the whole workspace, so its dependencies are the full build's (the same features).
target="${CARGO_TARGET_DIR:-$PWD/target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
cargo build --workspace --locked --no-default-features
cp "$target/debug/roar" "$target/roar-lean"
export ROAR_LEAN_BIN="$target/roar-lean"
cargo build --workspace --locked
bash scripts/build.sh
# What users install (a wheel, a .deb), from a release build, for tests/tests/suite/dist.rs.
bash scripts/dist.sh --out "$target/dist"
export ROAR_DIST_DIR="$target/dist"
# FUSE over io_uring (Linux 6.14+) is off until this module parameter turns it on: on for the
# suite, so the mount tests that ask for it (ROAR_MOUNT_URING=1) run over it, and put back as it
# was afterwards.
uring=/sys/module/fuse/parameters/enable_uring
if [ -w "$uring" ]; then
    uring_was=$(cat "$uring")
    echo Y > "$uring"
    trap 'echo "$uring_was" > "$uring"' EXIT
fi
log=$(mktemp)
# Tests list here what they could not do on this machine (tests/tests/suite/common: `skip`; under
# CI=true that is a failure instead).
export ROAR_SKIPPED=$(mktemp)
# Every test binary runs even after one fails: the log then names every failure, not the first.
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log"
# The vendored fuser's own tests (the request counts and the adaptive poll roar added:
# vendor/fuser/VENDORED.md): a path dependency outside the workspace, so not in --workspace.
cargo test -p fuser --lib --locked 2>&1 | tee -a "$log"
# One closing line for the whole suite (cargo's own last line is a doc-test binary's): a test
# that skipped what cannot run here is not counted as a plain pass.
partial=$(cut -f1 "$ROAR_SKIPPED" | sort -u | wc -l)
if [ "$partial" -gt 0 ]; then
    echo "tests that skipped what cannot run here:"
    sort -u "$ROAR_SKIPPED" | sed 's/^/  /; s/\t/: /'
fi
awk -v partial="$partial" '/^test result:/ { p += $4; f += $6; s += $8 } END { printf "%d passed, %d failed, %d skipped what cannot run here (listed above), %d ignored\n", p - partial, f, partial, s }' "$log"
rm -f "$log" "$ROAR_SKIPPED"
