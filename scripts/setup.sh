#!/usr/bin/env bash
# Installs what roar needs to build and test on a fresh Debian 12 machine (run as root).
# Idempotent and quiet when everything is already there.
set -euo pipefail

need_apt=()
for pkg in clang libelf-dev zlib1g-dev pkg-config make b3sum strace hyperfine git gcc; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "setup: installing ${need_apt[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "setup: cargo is missing; install Rust 1.95 (rustup) first" >&2
    exit 1
fi

# numpy is one of the coverage workloads (np.save / np.load under roar run).
if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import numpy' >/dev/null 2>&1; then
    echo "setup: installing numpy" >&2
    python3 -m pip install --quiet --disable-pip-version-check numpy
fi
