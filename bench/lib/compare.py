#!/usr/bin/env python3
"""Times commands side by side, interleaved: each round runs every command once, in a shuffled
order, so drift in the machine's speed (these VMs are noisy) hits all commands alike.

usage: compare.py OUT.json RUNS [--prepare CMD] [--cpu] NAME=CMD [NAME=CMD ...]
Writes {name: {"median": s, "q1": s, "q3": s, "times": [...]}} and prints one line per command.
--cpu also records the CPU time (user + system) of each command's whole process tree, as
"cpu": [...] and "cpu_median".
"""
import json
import random
import resource
import shlex
import statistics
import subprocess
import sys
import time


def main():
    out, runs, rest = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    prepare = None
    if rest and rest[0] == "--prepare":
        prepare, rest = rest[1], rest[2:]
    cpu = bool(rest) and rest[0] == "--cpu"
    if cpu:
        rest = rest[1:]
    cmds = [arg.split("=", 1) for arg in rest]
    times = {name: [] for name, _ in cmds}
    cpus = {name: [] for name, _ in cmds}

    def children_cpu():
        r = resource.getrusage(resource.RUSAGE_CHILDREN)
        return r.ru_utime + r.ru_stime

    for name, cmd in cmds:  # one warm-up each
        subprocess.run(shlex.split(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(runs):
        order = list(cmds)
        random.shuffle(order)
        for name, cmd in order:
            if prepare:
                subprocess.run(prepare, shell=True, check=True)
            c, t = children_cpu(), time.perf_counter()
            r = subprocess.run(shlex.split(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times[name].append(time.perf_counter() - t)
            cpus[name].append(children_cpu() - c)
            if r.returncode != 0:
                sys.exit(f"{name}: `{cmd}` exited {r.returncode}")
    result = {}
    for name, ts in times.items():
        q = statistics.quantiles(ts, n=4) if len(ts) >= 4 else [min(ts), statistics.median(ts), max(ts)]
        result[name] = {"median": statistics.median(ts), "q1": q[0], "q3": q[2], "times": ts}
        line = f"  {name:34s} median {statistics.median(ts) * 1e3:9.2f} ms  (IQR {q[0] * 1e3:.2f}-{q[2] * 1e3:.2f})"
        if cpu:
            result[name]["cpu"] = cpus[name]
            result[name]["cpu_median"] = statistics.median(cpus[name])
            line += f"  cpu {statistics.median(cpus[name]) * 1e3:9.2f} ms"
        print(line)
    json.dump(result, open(out, "w"))


if __name__ == "__main__":
    main()
