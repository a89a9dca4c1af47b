#!/usr/bin/env bash
# Regenerates crates/tracer/src/bpf/vmlinux.h (the kernel's types for the eBPF tracer) from the
# running kernel's BTF. Only needed when the BPF program uses a type the committed header lacks:
# CO-RE relocations adapt field offsets to whatever kernel loads the program.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v bpftool >/dev/null 2>&1; then
    echo "vmlinux.sh: installing bpftool" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bpftool >/dev/null
fi
bpftool btf dump file /sys/kernel/btf/vmlinux format c > crates/tracer/src/bpf/vmlinux.h
echo "wrote crates/tracer/src/bpf/vmlinux.h for $(uname -r)"
