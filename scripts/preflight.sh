# Sourced by scripts/build.sh (so by install.sh, demo.sh and test.sh): checks, before any
# compiling, what a build needs from the system, and names what is missing in one line.
# libbpf-sys compiles libbpf with make against libelf and zlib, the eBPF programs need clang
# (neither in the lean build), zlib-ng is built with cmake, and the shim's C files and every
# -sys crate need a C compiler; a build started without them
# fails ten minutes in, with a long log.
roar_preflight() { # roar_preflight [--lean]: the lean build needs no clang and no libelf
    local missing=() tool header pkg lean=0
    [ "${1:-}" = "--lean" ] && lean=1
    local tools=(cargo:rustup cc:gcc cmake:cmake make:make)
    [ "$lean" -eq 1 ] || tools+=(clang:clang pkg-config:pkg-config)
    for tool in "${tools[@]}"; do
        command -v "${tool%%:*}" > /dev/null 2>&1 || missing+=("${tool#*:}")
    done
    if [ "$lean" -eq 0 ] && command -v cc > /dev/null 2>&1; then
        for header in libelf.h:libelf-dev zlib.h:zlib1g-dev; do
            printf '#include <%s>\n' "${header%%:*}" | cc -E -x c - > /dev/null 2>&1 ||
                missing+=("${header#*:}")
        done
    fi
    if [ ${#missing[@]} -gt 0 ]; then
        pkg="${missing[*]}"
        echo "roar build: missing ${pkg// /, } — run \`bash scripts/setup.sh\` (Debian/Ubuntu: apt-get install ${pkg//rustup/}; Rust from https://rustup.rs)" >&2
        return 1
    fi
}
