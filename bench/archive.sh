#!/usr/bin/env bash
# Archives as datasets (issues 33, 63), the method of the ratarmount benchmark post: MEMBERS files
# in a tar, tar.gz, tar.zst, tar.xz (one block, as `xz` alone writes it; and 1 MiB blocks, as
# pixz and `xz -T0` do), tar.bz2 and zip (FORMATS picks some), READ of them picked at random and
# md5summed (SINGLE_BLOCK_READ of them, default 100, from the one-block tar.xz, which both tools
# decode from its start for every read), side by side with ratarmount
# (pip, in a venv cached outside the repository) and with the extracted files; interleaved,
# page cache dropped before each measurement (root). Prints the first mount (index build) and
# read times as ratios; bench/lib/archive_bench.py checks the three md5sum outputs are equal.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
bash scripts/build.sh --release -q
ROAR="$PWD/target/release/roar"
W="${BENCH_DIR:-/tmp/roar-bench-archive}"
ROUNDS="${ROUNDS:-5}" MEMBERS="${MEMBERS:-10000}" READ="${READ:-1000}"

VENV="${RATARMOUNT_VENV:-$HOME/.cache/roar-bench/ratarmount-venv}"
if [ ! -x "$VENV/bin/ratarmount" ]; then
    echo "installing ratarmount 1.3.0 into $VENV (once)" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check ratarmount==1.3.0
fi
RATARMOUNT="$VENV/bin/ratarmount"
# ratarmount's FUSE binding (mfusepy) loads libfuse at run time; roar needs none.
if ! dpkg -s libfuse3-3 > /dev/null 2>&1; then
    echo "installing libfuse3 for ratarmount (once)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfuse3-3 > /dev/null
fi

for d in "$W/p/m-roar" "$W/m-rat"; do
    fusermount -u "$d" 2> /dev/null || umount -l "$d" 2> /dev/null || true
done
rm -rf "$W" && mkdir -p "$W/p"
cd "$W/p"
"$ROAR" init > /dev/null
# Member sizes: MIN_KIB to MAX_KIB (4-200 by default; the seed's own set is ~50,000 of ~12 KB).
MIN_KIB="${MIN_KIB:-4}" MAX_KIB="${MAX_KIB:-200}"
echo "== $MEMBERS members (half text-like, half random bytes; $MIN_KIB-$MAX_KIB KiB)"
python3 - "$MEMBERS" "$MIN_KIB" "$MAX_KIB" <<'PY'
import os, random, sys
n, lo, hi = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(33)
words = [bytes(rng.choice(b"abcdefghij ,.0123456789") for _ in range(rng.randint(3, 9))) for _ in range(500)]
for i in range(n):
    d = f"src/shard-{i % 100:03d}"
    os.makedirs(d, exist_ok=True)
    size = rng.randint(lo << 10, hi << 10)
    if i % 2:
        data = rng.randbytes(size)
    else:
        out = bytearray()
        while len(out) < size:
            out += rng.choice(words) + b" "
        data = bytes(out[:size])
    open(f"{d}/{i:06d}.{'jpg' if i % 2 else 'txt'}", "wb").write(data)
PY
FORMATS="${FORMATS:-tar tar.gz tar.zst tar.xz blocks.tar.xz tar.bz2 zip}"
archives=()
for f in $FORMATS; do
    case "$f" in
        tar) (cd src && tar -cf ../data.tar .) ;;
        tar.gz) (cd src && tar -czf ../data.tar.gz .) ;;
        # pzstd: frames of a few MiB (plain `zstd` writes one frame, read from its start each time).
        tar.zst) (cd src && tar -I 'pzstd -q -p 2' -cf ../data.tar.zst .) ;;
        tar.xz) (cd src && tar -I 'xz -T1' -cf ../data.tar.xz .) ;;
        blocks.tar.xz) (cd src && tar -I 'xz -T0 --block-size=1MiB' -cf ../data.blocks.tar.xz .) ;;
        tar.bz2) (cd src && tar -cjf ../data.tar.bz2 .) ;;
        zip) (cd src && zip -q -r ../data.zip .) ;;
        *) echo "bench/archive.sh: unknown format $f" >&2; exit 2 ;;
    esac
    name="data.$f"
    [ "$f" = blocks.tar.xz ] && name=data.blocks.tar.xz
    archives+=("$name")
    echo "  $name $(du -m "$name" | cut -f1) MiB"
done
(cd src && find . -type f | shuf -n "$READ" --random-source=<(yes 33)) > "$W/members.txt"
echo "  $(nproc) CPUs"
ARCHIVES="${archives[*]}" python3 "$REPO/bench/lib/archive_bench.py" "$W" "$ROAR" "$RATARMOUNT" "$ROUNDS"
