#!/usr/bin/env bash
# Regenerates crates/cli/link/symbol-order.txt: the functions of the `roar` binary that a
# `roar run` (and the commands run most after it) executes, in the order callgrind first met
# them. crates/cli/build.rs hands the file to the linker (lld's --symbol-ordering-file), which
# places those functions first and together in .text. Why: the kernel maps 16 pages around
# every page fault of the binary and unmaps each of them at exit; scattered over 25 MB of code,
# a `roar run`'s functions touch ~170 64 KiB windows (bench/NOTES.md, "The fixed
# cost, cut by cut").
#
# Names the binary no longer has (after a toolchain or dependency change) are skipped by the
# linker: a stale file costs only the layout it no longer gives. Needs valgrind.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "symbol-order.sh: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
# The layout the profile is taken from does not matter: every function is named.
cargo build --release -p roar-cli --locked
target="${CARGO_TARGET_DIR:-$PWD/target}"
case "$target" in /*) ;; *) target="$PWD/$target" ;; esac
roar=$target/release/roar
work=$(mktemp -d)
trap 'pkill -f "__recorder $work" 2>/dev/null || true; rm -rf "$work"' EXIT
cg() { valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/cg.%p" "$@" >/dev/null 2>&1 || true; }
# The same, answering the run's --json line.
cg_json() { valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/cg.%p" "$@" 2>&1 >/dev/null | grep '^{' || true; }
mkdir -p "$work/p" && cd "$work/p"
git init -q && echo a > a.txt && git add a.txt && git -c user.email=r@r -c user.name=r commit -qm a
"$roar" init >/dev/null
# A run that records its own job, then one through a recorder. Under valgrind /proc/self/exe is
# valgrind's, so the recorder a valgrind run finds is one also started under valgrind.
ROAR_RECORDER=0 cg "$roar" run true
cg "$roar" __recorder "$work/p/.roar/roar.db" 2>/dev/null &
recorder=$!
sleep 3
recorded_by=$(cg_json "$roar" run --json true)
case "$recorded_by" in
    *'"recorded_by":"recorder"'*) ;;
    *) echo "symbol-order.sh: the run under valgrind did not find the recorder: $recorded_by" >&2; exit 1 ;;
esac
cg "$roar" run -- sh -c 'cat a.txt > b.txt'
cg "$roar" run --tracer ptrace -- sh -c 'cat b.txt > c.txt'
cg "$roar" log
cg "$roar" show 1
cg "$roar" status
pkill -f "__recorder $work" || true
wait "$recorder" 2>/dev/null || true
cd - >/dev/null
python3 - "$work" > crates/cli/link/symbol-order.txt <<'PY'
import glob, os, re, sys
# Callgrind's compressed names: "fn=(12) name" defines id 12, "fn=(12)" reuses it; "ob=" is the
# object file the following functions belong to.
pat = re.compile(r'^(ob|cob|fn|cfn)=\((\d+)\)(?: (.*))?$')
seen, out = set(), []
files = sorted(glob.glob(os.path.join(sys.argv[1], 'cg.*')), key=os.path.getmtime)
for path in files:
    obs, fns, ob = {}, {}, None
    for line in open(path, errors='replace'):
        m = pat.match(line.rstrip('\n'))
        if not m:
            continue
        kind, i, name = m.groups()
        if kind in ('ob', 'cob'):
            if name:
                obs[i] = name
            if kind == 'ob':
                ob = obs[i]
        else:
            if name:
                fns[i] = name
            if kind == 'fn' and ob and os.path.basename(ob) == 'roar' and fns[i] not in seen:
                seen.add(fns[i])
                out.append(fns[i])
print('\n'.join(out))
PY
echo "crates/cli/link/symbol-order.txt: $(wc -l < crates/cli/link/symbol-order.txt) functions" >&2
