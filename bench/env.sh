#!/usr/bin/env bash
# Environment capture (issue 29), every figure against bare execution in the same run:
# - `roar run true` outside git, in a small repository, and in a 100,000-file repository (clean
#   and dirty): the code state is read from the repository's files and the dirty check runs
#   beside the command, so the fixed cost must not grow with the repository; `git status`
#   (what roar spawned before the command until this change) is timed alongside for scale;
# - `roar run python3 -c 'import numpy'` (packages found from the files the interpreter loaded)
#   against bare and against the Python peer roar-cli on the same command (it resolves imported
#   modules in-process; bench/lib/peer.sh; in a committed repository of its own: it refuses dirty
#   trees), and against roar with `env.packages = false`;
# - the first job on a machine (empty package cache: dpkg and the site directory are indexed)
#   against the next ones.
# ROAR_BEFORE=/path/to/roar adds an older roar binary to the `true` rows (before/after in one run).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
bash scripts/build.sh --release -q
ROAR="$PWD/target/release/roar"
W="${BENCH_DIR:-/tmp/roar-bench-env}"
rm -rf "$W" && mkdir -p "$W"
RUNS="${RUNS:-20}"
CMP="python3 $REPO/bench/lib/compare.py"
export ROAR_CACHE_DIR="$W/cache"

runs_of() { # name=command pairs: roar (and the older roar) running "$@"
    printf '%s\n' "roar=$ROAR run --tracer preload -- $*"
    if [ -n "${ROAR_BEFORE:-}" ]; then
        # Its own store (it refuses a newer schema and config): ROAR_DIR, same working tree.
        local store="$W/before-$RANDOM/.roar"
        mkdir -p "${store%/.roar}" && (cd "${store%/.roar}" && "$ROAR_BEFORE" init > /dev/null)
        printf '%s\n' "roar-before=env ROAR_DIR=$store $ROAR_BEFORE run --tracer preload -- $*"
    fi
}

commit() { git add -A && git -c user.email=b@b -c user.name=b commit -qm "$1"; }

# A project outside git, a small repository, a 100,000-file repository.
mkdir -p "$W/nogit" "$W/small" "$W/big"
(cd "$W/nogit" && "$ROAR" init > /dev/null)
(cd "$W/small" && git init -q && printf '.roar/\n' > .gitignore && echo x > a.py && commit init &&
    "$ROAR" init > /dev/null)
echo "== building a 100,000-file repository"
(cd "$W/big" && git init -q && printf '.roar/\n' > .gitignore &&
    python3 -c '
import os
for d in range(100):
    os.makedirs(f"src/d{d}", exist_ok=True)
    for f in range(1000):
        open(f"src/d{d}/f{f}.py", "w").write(f"x = {d * 1000 + f}\n")
' && commit init && "$ROAR" init > /dev/null)
# Warm the package cache and the runtime probe: the `true` rows are the steady state.
for d in nogit small big; do (cd "$W/$d" && "$ROAR" run true 2> /dev/null); done

for d in nogit small big; do
    echo "== roar run true: $d"
    mapfile -t T < <(runs_of true)
    if [ "$d" != nogit ]; then
        T+=("git status=git --no-optional-locks status --porcelain=v2 --branch --untracked-files=no")
    fi
    (cd "$W/$d" && $CMP "$W/true-$d.json" "$RUNS" bare=true bare2=true "${T[@]}")
done
echo "== roar run true: big, dirty (one tracked file edited: the diff is kept)"
echo 'x = -1' >> "$W/big/src/d7/f7.py"
mapfile -t T < <(runs_of true)
(cd "$W/big" && $CMP "$W/true-big-dirty.json" "$RUNS" bare=true "${T[@]}" \
    "git diff HEAD=git --no-optional-locks diff HEAD --binary")
(cd "$W/big" && "$ROAR" run --name dirty true 2>&1 | sed 's/^/  /' &&
    "$ROAR" show dirty --env | sed -n '/^code/,/^machine/p' | sed 's/^/  /')
echo "== roar run sleep 0.3: big, dirty (a command longer than the diff hides it)"
mapfile -t T < <(runs_of sleep 0.3)
(cd "$W/big" && $CMP "$W/sleep-big-dirty.json" "${SLEEP_RUNS:-10}" "bare=sleep 0.3" "${T[@]}")

# Python: roar in a project of its own.
source "$REPO/bench/lib/peer.sh"
PY="$W/py"
mkdir -p "$PY"
(cd "$PY" && "$ROAR" init > /dev/null)
# roar-cli in a committed repository of its own (it refuses dirty trees; its store is `.roar` too).
mkdir -p "$W/peer"
(cd "$W/peer" && git init -q && "$PEER_VENV/bin/roar" init > /dev/null 2>&1 && commit init)
IMPORT="python3 -c import\ numpy"
echo "== roar run python3 -c 'import numpy' (numpy $(python3 -c 'import numpy; print(numpy.__version__)'))"
(cd "$PY" && "$ROAR" run -- python3 -c 'import numpy' 2> /dev/null &&
    "$ROAR" show @1 --env | sed -n '/^packages/,$p' | sed 's/^/  /')
# The same project with `env.packages = false`: what finding the packages costs.
mkdir -p "$W/py-nopkg"
(cd "$W/py-nopkg" && "$ROAR" init > /dev/null && "$ROAR" config set env.packages false > /dev/null)
mapfile -t T < <(runs_of "$IMPORT")
(cd "$PY" && $CMP "$W/numpy.json" "${PY_RUNS:-10}" "bare=$IMPORT" "bare2=$IMPORT" "${T[@]}" \
    "roar, no packages=env ROAR_DIR=$W/py-nopkg/.roar $ROAR run --tracer preload -- $IMPORT" \
    "roar-cli preload=env -C $W/peer $PEER_VENV/bin/roar run -q --tracer preload --no-tracer-fallback $IMPORT")

echo "== first job on a machine (empty package cache) vs the next: roar run python3 -c 'import numpy'"
for i in 1 2 3; do
    rm -rf "$W/cache"
    s=$(date +%s%N); (cd "$PY" && "$ROAR" run -- python3 -c 'import numpy' 2> /dev/null); e=$(date +%s%N)
    s2=$(date +%s%N); (cd "$PY" && "$ROAR" run -- python3 -c 'import numpy' 2> /dev/null); e2=$(date +%s%N)
    s3=$(date +%s%N); (cd "$PY" && python3 -c 'import numpy'); e3=$(date +%s%N)
    echo "  first $(( (e - s) / 1000000 )) ms, next $(( (e2 - s2) / 1000000 )) ms, bare $(( (e3 - s3) / 1000000 )) ms"
done
printf '  cache: %s\n' "$(du -h "$W/cache/packages.db" | cut -f1)"

python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
def med(f, k):
    return json.load(open(f"{w}/{f}.json"))[k]["median"] * 1e3
print("== summary (medians; + is over bare)")
for f in ["true-nogit", "true-small", "true-big", "true-big-dirty", "sleep-big-dirty"]:
    d = f.split("-", 1)[1] + (" (sleep 0.3)" if f.startswith("sleep") else "")
    r = json.load(open(f"{w}/{f}.json"))
    bare = r["bare"]["median"] * 1e3
    row = [f"roar +{r['roar']['median'] * 1e3 - bare:.2f} ms"]
    if "roar-before" in r:
        row.append(f"before +{r['roar-before']['median'] * 1e3 - bare:.2f} ms")
    for k in ("git status", "git diff HEAD"):
        if k in r:
            row.append(f"{k} {r[k]['median'] * 1e3:.2f} ms")
    print(f"  {d:22s} bare {bare:.2f} ms; " + "; ".join(row))
r = json.load(open(f"{w}/numpy.json"))
bare = r["bare"]["median"] * 1e3
for k, v in r.items():
    if k != "bare":
        print(f"  import numpy: {k:22s} +{v['median'] * 1e3 - bare:8.1f} ms  ({v['median'] * 1e3 / bare:.2f}x bare {bare:.0f} ms)")
PY
