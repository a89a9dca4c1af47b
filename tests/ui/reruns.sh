#!/usr/bin/env bash
# A store of re-runs for the lineage page at scale (tests/tests/suite/ui.rs, bench/ui.sh): ROUNDS runs
# of a pipeline of STAGES jobs, each stage reading the previous stage's FILES outputs (the first
# reads raw.txt) and writing FILES of its own with new content every round — ROUNDS x STAGES jobs
# and ROUNDS x STAGES x FILES file versions. Run in an initialised project with ROAR set.
#     ROAR=roar bash reruns.sh ROUNDS STAGES FILES
set -euo pipefail
rounds=$1 stages=$2 files=$3
: "${ROAR:?ROAR names the roar binary}"
seq 1 1000 > raw.txt
for round in $(seq 1 "$rounds"); do
    for stage in $(seq 1 "$stages"); do
        if [ "$stage" = 1 ]; then from=raw.txt; else from="s$((stage - 1))/o*.txt"; fi
        "$ROAR" run --name "stage$stage" -- sh -c 'mkdir -p s$1; n=$(cat $2 | wc -l); for i in $(seq $3); do echo "stage $1 file $i round $4 of $n" > s$1/o$i.txt; done' \
            sh "$stage" "$from" "$files" "$round" >/dev/null 2>&1
    done
done
