#!/usr/bin/env bash
# What redaction costs (issue 25). Interleaved in one run: bare `true` with a wide command line and
# environment (200 arguments, 300 variables, every other one secret-shaped: tokens, URLs with
# passwords, `--password X`, PEM blocks), the same under `roar run` (preload, ptrace) and under
# the Python peer roar-cli; then `roar run true` with this shell's own environment. Then
# `Policy::job` alone per job shape (crates/store/examples/redact_cost.rs), set against roar's
# fixed cost measured here, and a check that the hostile job's secrets are not in the store.
#
# Then (issue 59) this checkout against the roar before gitleaks' rules, generated-value and
# positional rules, the sender check and the spawn's signal fix (ROAR_BEFORE=/path/to/roar, or
# built from BEFORE_REV, default 2c0c9aa), interleaved with bare: P1 (`roar run true` with this
# shell's environment, and with a 60-variable CI-like one) and P2 (write+read N x 4 KiB), each
# backend.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
TARGET="${CARGO_TARGET_DIR:-$PWD/target}"
bash scripts/build.sh --release -q
cargo build --release --locked -q -p roar-store --example redact_cost
ROAR="$TARGET/release/roar"
W="${BENCH_DIR:-/tmp/roar-bench-security}"
rm -rf "$W" && mkdir -p "$W" && cd "$W"
"$ROAR" init > /dev/null
RUNS="${RUNS:-20}"
CMP="python3 $REPO/bench/lib/compare.py"

# The hostile command line and environment, as a script that execs `true` with them.
python3 - > hostile.sh <<'PY'
import shlex
def secret(i):
    return [f"ghp_{i:036d}", f"https://user:pw{i}@host/x",
            f"-----BEGIN RSA PRIVATE KEY-----\nMIIE{i}\n-----END RSA PRIVATE KEY-----",
            f"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIx{i}In0.sig{i}abcdefgh"][i % 4]
args = []
for i in range(100):
    args += ["--password", f"pw{i}"] if i % 2 == 0 else [secret(i), f"plain/arg/{i}.csv"]
env = {f"VAR_{i}": (secret(i) if i % 2 == 0 else f"/plain/{i}") for i in range(300)}
print("exec env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) + " true " + " ".join(map(shlex.quote, args)))
PY
chmod +x hostile.sh
echo "== a wide hostile job: 200 arguments, 300 variables, half of them secrets"
# The peer refuses dirty git trees: it runs in a committed scratch repository of its own (roar's
# project is not a git repository, so neither side pays for reading git state).
source "$REPO/bench/lib/peer.sh"
PEER_DIR="$W/peer"
mkdir -p "$PEER_DIR" && cp hostile.sh "$PEER_DIR/"
PEER=()
if (cd "$PEER_DIR" && git init -q && "$PEER_VENV/bin/roar" init > /dev/null 2>&1 &&
    git add -A && git -c user.email=b@b -c user.name=b commit -qm init &&
    "$PEER_VENV/bin/roar" run -q --tracer preload --no-tracer-fallback true > /dev/null 2>&1); then
    PEER=("roar-cli preload=sh -c 'cd $PEER_DIR && exec $PEER_VENV/bin/roar run -q --tracer preload --no-tracer-fallback sh hostile.sh'")
else
    echo "roar-cli --tracer preload does not work here; left out"
fi
$CMP hostile.json "$RUNS" "bare=sh hostile.sh" "roar preload=$ROAR run --tracer preload -- sh hostile.sh" \
    "roar ptrace=$ROAR run --tracer ptrace -- sh hostile.sh" "${PEER[@]}"
echo "== roar run true, this shell's environment"
$CMP fixed.json "$RUNS" bare=true "roar preload=$ROAR run --tracer preload -- true"
echo "== Policy::job alone (the writer's redaction of one job)"
"$TARGET/release/examples/redact_cost" 500 | tee cost.txt
python3 - <<'PY'
import json, re
h, f = json.load(open("hostile.json")), json.load(open("fixed.json"))
bare = h["bare"]["median"]
for name in h:
    if name != "bare":
        print(f"  {name:24s} {h[name]['median'] / bare:5.2f}x bare (+{(h[name]['median'] - bare) * 1e3:.1f} ms)")
fixed = (f["roar preload"]["median"] - f["bare"]["median"]) * 1e6
cost = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\w+):.*first (\d+) us", open("cost.txt").read(), re.M)}
print(f"  roar run true: +{fixed / 1e3:.2f} ms over bare; redaction of a typical job (first in its process) "
      f"{cost['typical']:.0f} us = {100 * cost['typical'] / fixed:.1f} % of it")
PY
echo "== the hostile job's secrets in the store's bytes (expect 0)"
cat .roar/roar.db* | grep -a -c -E 'pw[0-9]+@|ghp_0|MIIE[0-9]|sig[0-9]+abcdefgh' || true

source "$REPO/bench/lib/builds.sh"
roar_before 2c0c9aa
N="${N:-2000}"
cc -O2 -o files "$REPO/bench/lib/files.c"
BACKENDS=(preload ptrace)
"$ROAR" tracer check ebpf > /dev/null && BACKENDS+=(ebpf)
mkdir -p "$W/after" "$W/before" "$W/plain/out" && cp files "$W/plain/"
"$ROAR" init "$W/after" > /dev/null && "$ROAR_BEFORE" init "$W/before" > /dev/null
# A CI runner's environment: 60 variables, paths, ids, a few tokens under names that say so.
CI_ENV="env"
for i in $(seq 1 20); do CI_ENV+=" RUNNER_PATH_$i=/opt/hostedtoolcache/tool$i/1.$i.0/x64/bin"; done
for i in $(seq 1 20); do CI_ENV+=" GITHUB_ID_$i=$((1000000 + i * 7919))"; done
for i in $(seq 1 17); do CI_ENV+=" CI_FLAG_$i=true"; done
CI_ENV+=" GITHUB_TOKEN=ghs_16C7e42F292c6912E7710c838347Ae178B4a ACTIONS_RUNTIME_URL=https://pipelines.actions.example/abc/ AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYzq3m8Pq2Lk"
echo "== P1 after/before: roar run true (this shell's environment, then a CI-like one)"
rows=()
for b in "${BACKENDS[@]}"; do
    rows+=("$b after=sh -c 'cd $W/after && exec $ROAR run --tracer $b -- true'"
           "$b before=sh -c 'cd $W/before && exec $ROAR_BEFORE run --tracer $b -- true'"
           "$b ci after=sh -c 'cd $W/after && exec $CI_ENV $ROAR run --tracer $b -- true'"
           "$b ci before=sh -c 'cd $W/before && exec $CI_ENV $ROAR_BEFORE run --tracer $b -- true'")
done
$CMP p1.json "${P1_RUNS:-60}" "bare=sh -c 'cd $W/after && exec true'" "${rows[@]}"
echo "== P2 after/before: write+read $N x 4 KiB under roar run"
rows=()
for b in "${BACKENDS[@]}"; do
    rows+=("$b after=env ROAR_DIR=$W/after/.roar $ROAR run --tracer $b -- ./files $N"
           "$b before=env ROAR_DIR=$W/before/.roar $ROAR_BEFORE run --tracer $b -- ./files $N")
done
(cd "$W/plain" && $CMP "$W/p2.json" "${P2_RUNS:-10}" \
    --prepare "rm -rf out $W/after/.roar $W/before/.roar; mkdir out; $ROAR init $W/after > /dev/null; $ROAR_BEFORE init $W/before > /dev/null" \
    "bare=./files $N" "${rows[@]}")
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
for name in ("p1", "p2"):
    r = json.load(open(f"{w}/{name}.json" if name == "p2" else f"{name}.json"))
    for k in r:
        if k.endswith(" after"):
            base = k[: -len(" after")]
            print(f"  {name.upper()} {base:12s} after/before {r[k]['median'] / r[base + ' before']['median']:.3f}"
                  f"  (after {r[k]['median'] / r['bare']['median']:.2f}x bare)")
PY
