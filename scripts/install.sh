#!/usr/bin/env bash
# Installs roar for real use: PREFIX/bin/roar, the preload shim at PREFIX/lib/roar/ (where roar
# looks first), the manual page and shell completions. Every file it writes is listed in
# PREFIX/lib/roar/install-manifest, which --uninstall removes again (and the directories it made).
#
#   bash scripts/install.sh [--prefix DIR]     build (release) and install; default prefix
#                                              /usr/local as root, else ~/.local
#   bash scripts/install.sh --uninstall [--prefix DIR]
#   --from DIR                                 install the roar and libroar_preload.so already
#                                              built in DIR instead of building (CI installs its
#                                              dev build this way: same steps, no second build)
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=""
from=""
uninstall=0
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
        --prefix=*) prefix="${1#--prefix=}"; shift ;;
        --uninstall) uninstall=1; shift ;;
        --from) from="${2:?--from needs a directory}"; shift 2 ;;
        --from=*) from="${1#--from=}"; shift ;;
        -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
if [ -z "$prefix" ]; then
    if [ "$(id -u)" -eq 0 ]; then prefix=/usr/local; else prefix="$HOME/.local"; fi
fi
manifest="$prefix/lib/roar/install-manifest"

if [ "$uninstall" -eq 1 ]; then
    if [ ! -f "$manifest" ]; then
        echo "install.sh: nothing to uninstall: $manifest does not exist" >&2
        exit 1
    fi
    # Files first, then the directories the install created, deepest first, if now empty.
    grep '^f ' "$manifest" | cut -c3- | while IFS= read -r f; do rm -f -- "$f"; done
    made="$(grep '^d ' "$manifest.dirs" 2>/dev/null | cut -c3- | sort -r || true)"
    rm -f -- "$manifest" "$manifest.dirs"
    rmdir -- "$prefix/lib/roar" 2>/dev/null || true
    if [ -n "$made" ]; then
        while IFS= read -r d; do rmdir -- "$d" 2>/dev/null || true; done <<< "$made"
    fi
    echo "uninstalled roar from $prefix"
    exit 0
fi

if [ -n "$from" ]; then
    target="$from"
    for f in roar libroar_preload.so; do
        [ -f "$target/$f" ] || { echo "install.sh: $target/$f does not exist" >&2; exit 1; }
    done
else
    # What building needs (clang compiles the eBPF programs, libelf/zlib link libbpf).
    missing=()
    for pkg in clang libelf-dev zlib1g-dev pkg-config make gcc cmake; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
            echo "install.sh: installing build dependencies: ${missing[*]}" >&2
            DEBIAN_FRONTEND=noninteractive apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
        else
            echo "install.sh: missing build dependencies: ${missing[*]} (install them as root, then run again)" >&2
            exit 1
        fi
    fi
    if ! command -v cargo >/dev/null; then
        echo "install.sh: cargo is missing; install Rust 1.95 with rustup first" >&2
        exit 1
    fi
    bash scripts/build.sh --release
    target="${CARGO_TARGET_DIR:-target}/release"
fi

dirs=()
for d in "$prefix/bin" "$prefix/lib/roar" "$prefix/share/man/man1" \
         "$prefix/share/bash-completion/completions" "$prefix/share/zsh/site-functions" \
         "$prefix/share/fish/vendor_completions.d"; do
    # Record every directory level this install creates, so uninstall can remove exactly those.
    p="$d"
    while [ ! -d "$p" ]; do dirs+=("$p"); p="$(dirname "$p")"; done
    mkdir -p "$d"
done
tmp="$(mktemp)"
put() { # put SRC DEST MODE
    install -m "$3" "$1" "$2.roar-new" && mv -f "$2.roar-new" "$2"
    echo "f $2" >> "$tmp"
}
put "$target/roar" "$prefix/bin/roar" 755
put "$target/libroar_preload.so" "$prefix/lib/roar/libroar_preload.so" 755
gen="$(mktemp -d)"
"$prefix/bin/roar" man > "$gen/roar.1"
"$prefix/bin/roar" completions bash > "$gen/roar.bash"
"$prefix/bin/roar" completions zsh > "$gen/_roar"
"$prefix/bin/roar" completions fish > "$gen/roar.fish"
put "$gen/roar.1" "$prefix/share/man/man1/roar.1" 644
put "$gen/roar.bash" "$prefix/share/bash-completion/completions/roar" 644
put "$gen/_roar" "$prefix/share/zsh/site-functions/_roar" 644
put "$gen/roar.fish" "$prefix/share/fish/vendor_completions.d/roar.fish" 644
rm -rf "$gen"
# A reinstall keeps the directories an earlier install recorded.
if [ -f "$manifest.dirs" ]; then cat "$manifest.dirs" >> "$tmp.dirs"; fi
for d in "${dirs[@]}"; do echo "d $d" >> "$tmp.dirs"; done
touch "$tmp.dirs"
sort -u "$tmp" > "$manifest"
sort -u "$tmp.dirs" > "$manifest.dirs"
rm -f "$tmp" "$tmp.dirs"
echo "installed roar into $prefix ($("$prefix/bin/roar" --version | head -1))"
"$prefix/bin/roar" tracer check preload
case ":$PATH:" in
    *":$prefix/bin:"*) ;;
    *) echo "note: $prefix/bin is not on PATH; add it: export PATH=\"$prefix/bin:\$PATH\"" ;;
esac
