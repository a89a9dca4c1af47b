#!/usr/bin/env bash
# Archives as datasets (issue 33), the method of the ratarmount benchmark post: MEMBERS files in a
# tar and a tar.gz, READ of them picked at random and md5summed, side by side with ratarmount
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

for d in "$W/p/m-roar" "$W/m-rat"; do
    fusermount -u "$d" 2> /dev/null || umount -l "$d" 2> /dev/null || true
done
rm -rf "$W" && mkdir -p "$W/p"
cd "$W/p"
"$ROAR" init > /dev/null
echo "== $MEMBERS members (half text-like, half random bytes; 4-200 KiB)"
python3 - "$MEMBERS" <<'PY'
import os, random, sys
n = int(sys.argv[1])
rng = random.Random(33)
words = [bytes(rng.choice(b"abcdefghij ,.0123456789") for _ in range(rng.randint(3, 9))) for _ in range(500)]
for i in range(n):
    d = f"src/shard-{i % 100:03d}"
    os.makedirs(d, exist_ok=True)
    size = rng.randint(4 << 10, 200 << 10)
    if i % 2:
        data = rng.randbytes(size)
    else:
        out = bytearray()
        while len(out) < size:
            out += rng.choice(words) + b" "
        data = bytes(out[:size])
    open(f"{d}/{i:06d}.{'jpg' if i % 2 else 'txt'}", "wb").write(data)
PY
(cd src && tar -cf ../data.tar . && tar -czf ../data.tar.gz .)
(cd src && find . -type f | shuf -n "$READ" --random-source=<(yes 33)) > "$W/members.txt"
echo "  data.tar $(du -m data.tar | cut -f1) MiB, data.tar.gz $(du -m data.tar.gz | cut -f1) MiB; $(nproc) CPUs"
python3 "$REPO/bench/lib/archive_bench.py" "$W" "$ROAR" "$RATARMOUNT" "$ROUNDS"
