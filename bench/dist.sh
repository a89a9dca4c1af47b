#!/usr/bin/env bash
# What installing roar costs a user, against the Python peer `roar-cli` (a pure-Python wheel
# with its dependencies): the size of what is downloaded and installed, and the time of
# `pip install` into a fresh venv from local files (no index: the network is not measured),
# interleaved round by round; then the binary sizes (full, stripped, lean) and, with BUILD=1,
# clean release build times of the full and the lean build (each in a fresh target directory).
#
#   bash bench/dist.sh                 # sizes and install times (RUNS=5 rounds)
#   BUILD=1 bash bench/dist.sh         # also the two clean builds (~15 min on 2 cores)
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
RUNS="${RUNS:-5}"
W="${W:-/tmp/roar-bench-dist}"
rm -rf "$W" && mkdir -p "$W/peer-wheels"
cd "$REPO"

bash scripts/dist.sh --out "$W/dist" > "$W/dist.log" 2>&1 || { cat "$W/dist.log"; exit 1; }
wheel="$(ls "$W"/dist/roar-*.whl)"
deb="$(ls "$W"/dist/roar_*_amd64.deb)"
python3 -m pip download --quiet --disable-pip-version-check --dest "$W/peer-wheels" roar-cli

kib() { du -k --apparent-size "$@" | awk '{ s += $1 } END { print s }'; }
install_roar() { rm -rf "$W/v" && python3 -m venv --without-pip "$W/v" &&
    python3 -m pip --python "$W/v/bin/python" install -q --no-index --no-deps "$wheel"; }
install_peer() { rm -rf "$W/v" && python3 -m venv --without-pip "$W/v" &&
    python3 -m pip --python "$W/v/bin/python" install -q --no-index --find-links "$W/peer-wheels" roar-cli; }
export -f install_roar install_peer
export W wheel

echo "== downloaded (KiB)"
printf '  roar wheel        %8d\n  roar .deb         %8d\n  peer wheels       %8d  (%d files)\n' \
    "$(kib "$wheel")" "$(kib "$deb")" "$(kib "$W"/peer-wheels/*)" "$(ls "$W/peer-wheels" | wc -l)"

echo "== pip install into a fresh venv, from local files ($RUNS rounds, interleaved)"
python3 bench/lib/compare.py "$W/install.json" "$RUNS" \
    "venv only=bash -c 'rm -rf $W/v && python3 -m venv --without-pip $W/v'" \
    "roar wheel=bash -c install_roar" \
    "roar-cli (peer)=bash -c install_peer"
python3 - "$W/install.json" <<'PY'
import json, sys
r = {k: v["median"] for k, v in json.load(open(sys.argv[1])).items()}
base = r["venv only"]
roar, peer = r["roar wheel"] - base, r["roar-cli (peer)"] - base
print(f"  install beyond the venv: roar {roar * 1e3:.0f} ms, peer {peer * 1e3:.0f} ms; roar/peer {roar / peer:.3f}")
PY

echo "== installed (KiB, venv minus an empty one)"
python3 -m venv --without-pip "$W/empty"
base="$(du -sk "$W/empty" | cut -f1)"
bash -c install_roar && echo "  roar              $(( $(du -sk "$W/v" | cut -f1) - base ))"
bash -c install_peer && echo "  peer              $(( $(du -sk "$W/v" | cut -f1) - base ))"

target="${CARGO_TARGET_DIR:-$REPO/target}"
echo "== binary (bytes)"
printf '  roar in packages  %10d  (symbol table stripped)\n' "$(unzip -p "$wheel" 'roar-*.data/scripts/roar' | wc -c)"
printf '  preload shim      %10d\n' "$(stat -c %s "$target/release/libroar_preload.so")"

if [ "${BUILD:-0}" = 1 ]; then
    echo "== clean release build (s), a fresh target directory each"
    for kind in full lean; do
        rm -rf "$W/target-$kind"
        flag=(); [ "$kind" = lean ] && flag=(--lean)
        start=$(date +%s)
        CARGO_TARGET_DIR="$W/target-$kind" bash scripts/build.sh "${flag[@]}" --release -q
        took=$(( $(date +%s) - start ))
        strip -o "$W/roar-$kind" "$W/target-$kind/release/roar"
        size="$(stat -c %s "$W/roar-$kind")"
        printf '  %-5s %5d s   stripped binary %10d bytes\n' "$kind" "$took" "$size"
        rm -rf "$W/target-$kind"
    done
fi
