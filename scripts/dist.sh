#!/usr/bin/env bash
# Builds, from a clean clone, what a user installs without a compiler:
#
#   dist/roar-VERSION-py3-none-manylinux_2_N_x86_64.whl   pip install it (a venv, --user or system):
#                                                         bin/roar, lib/roar/libroar_preload.so,
#                                                         share/man/man1/roar.1, completions
#   dist/roar_VERSION_amd64.deb                           apt install ./dist/roar_VERSION_amd64.deb
#   dist/SHA256SUMS                                       sha256sum -c SHA256SUMS
#
#   bash scripts/dist.sh [--out DIR]
#
# One release build feeds both (the shim, the man page and the completions are made from it);
# maturin packs the wheel (crates/cli/pyproject.toml) and tags it with the oldest glibc the binary
# and the shim both run on: the highest GLIBC_ symbol version either of them needs. Both carry
# binaries stripped of their symbol tables, as distributions ship them (a panic still names its
# file and line).
set -euo pipefail
cd "$(dirname "$0")/.."
out=dist
while [ $# -gt 0 ]; do
    case "$1" in
        --out) out="${2:?--out needs a directory}"; shift 2 ;;
        --out=*) out="${1#--out=}"; shift ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "dist.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
for tool in python3 dpkg-deb objdump strip; do
    command -v "$tool" > /dev/null || {
        echo "dist.sh: $tool is missing (Debian: apt-get install python3-venv dpkg binutils)" >&2
        exit 1
    }
done
target="${CARGO_TARGET_DIR:-$PWD/target}"
rel="$target/release"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

bash scripts/build.sh --release

# The wheel's data and the package's files, from this build: staged where
# crates/cli/pyproject.toml points (the repository's target/, whatever CARGO_TARGET_DIR says).
data="$PWD/target/wheel-data/data"
rm -rf "$PWD/target/wheel-data"
mkdir -p "$data/lib/roar" "$data/share/man/man1" "$data/share/bash-completion/completions" \
         "$data/share/zsh/site-functions" "$data/share/fish/vendor_completions.d"
install -m 755 "$rel/libroar_preload.so" "$data/lib/roar/libroar_preload.so"
strip --strip-unneeded "$data/lib/roar/libroar_preload.so"
"$rel/roar" man > "$data/share/man/man1/roar.1"
"$rel/roar" completions bash > "$data/share/bash-completion/completions/roar"
"$rel/roar" completions zsh > "$data/share/zsh/site-functions/_roar"
"$rel/roar" completions fish > "$data/share/fish/vendor_completions.d/roar.fish"

# The oldest glibc both run on: the newest symbol version either one asks for.
glibc_minor="$(objdump -T "$rel/roar" "$data/lib/roar/libroar_preload.so" |
    grep -o 'GLIBC_2\.[0-9]*' | cut -d. -f2 | sort -n | tail -1)"

# maturin from PyPI, in a venv of its own kept in the target directory.
venv="$target/maturin-venv"
if [ ! -x "$venv/bin/maturin" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "maturin>=1.9,<2"
fi
rm -f "$out"/roar-*.whl "$out"/roar_*.deb "$out/SHA256SUMS"
# The same profile, features and target directory as the build above: cargo relinks roar only.
"$venv/bin/maturin" build --release --locked --strip --quiet \
    -m crates/cli/Cargo.toml --compatibility "manylinux_2_$glibc_minor" --out "$out"
wheel="$(ls "$out"/roar-"$version"-*.whl)"

# The Debian package: the binary maturin just linked (the wheel's own), stripped the same way.
deb="$target/deb-root"
rm -rf "$deb"
mkdir -p "$deb/DEBIAN" "$deb/usr/bin" "$deb/usr/share/doc/roar" "$deb/usr/share/zsh/vendor-completions"
strip -o "$deb/usr/bin/roar" "$rel/roar"
cp -r "$data/lib" "$data/share" "$deb/usr/"
mv "$deb/usr/share/zsh/site-functions/_roar" "$deb/usr/share/zsh/vendor-completions/_roar"
rmdir "$deb/usr/share/zsh/site-functions"
gzip -9n "$deb/usr/share/man/man1/roar.1"
printf 'roar %s\nLicense: Apache-2.0\n' "$version" > "$deb/usr/share/doc/roar/copyright"
chmod -R u=rwX,go=rX "$deb"
cat > "$deb/DEBIAN/control" <<EOF
Package: roar
Version: $version
Architecture: amd64
Maintainer: roar developers <roar@example.invalid>
Installed-Size: $(du -sk --exclude=DEBIAN "$deb" | cut -f1)
Depends: libc6 (>= 2.$glibc_minor)
Recommends: fuse3
Section: devel
Priority: optional
Homepage: https://example.invalid/roar
Description: data lineage by observing execution
 roar records, for every file a command reads or writes, the exact content
 (blake3 hash) and the job that made it, by watching the command run
 (LD_PRELOAD, ptrace, eBPF, a FUSE mount or an S3 endpoint), not by asking you
 to declare a pipeline.
EOF
debfile="$out/roar_${version}_amd64.deb"
dpkg-deb --root-owner-group -Zxz --build "$deb" "$debfile" > /dev/null

(cd "$out" && sha256sum "$(basename "$wheel")" "$(basename "$debfile")" > SHA256SUMS)
echo "dist.sh: built in $out (glibc >= 2.$glibc_minor):"
(cd "$out" && ls -l "$(basename "$wheel")" "$(basename "$debfile")" SHA256SUMS | awk '{ print "  " $5 "  " $9 }')
