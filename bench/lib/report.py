#!/usr/bin/env python3
"""Writes bench/RESULTS.md from one `bench/all.sh` run: the machine and the versions measured,
then for each benchmark its exact command, what it measures (the script's header comment), how
long it took, and everything it printed (every table is a ratio against bare execution or a peer
measured in the same run).

usage: report.py OUT_DIR   (OUT_DIR holds NAME.log, NAME.rc, NAME.secs and env.txt per benchmark)
"""
import datetime
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sh(cmd):
    try:
        out = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=60)
        return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else "not installed"
    except (subprocess.SubprocessError, IndexError):
        return "not installed"


def machine():
    cpu = sh("lscpu | sed -n 's/^Model name: *//p'")
    mem = sh("awk '/MemTotal/ {printf \"%.0f GiB\", $2/1048576}' /proc/meminfo")
    os_name = sh(". /etc/os-release && echo \"$PRETTY_NAME\"")
    commit = sh(f"git -C {REPO} rev-parse --short HEAD")
    dirty = sh(f"git -C {REPO} status --porcelain --untracked-files=no | head -1")
    boto3 = sh("python3 -c 'import boto3; print(boto3.__version__)'")
    peer = sh("/tmp/roar-bench-peer-venv/bin/pip show roar-cli 2>/dev/null | sed -n 's/^Version: //p'")
    rows = [
        ("date (UTC)", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")),
        ("CPU", f"{cpu}, {os.cpu_count()} cores"),
        ("memory", mem),
        ("OS, kernel", f"{os_name}, Linux {os.uname().release}"),
        ("roar", f"commit {commit}{' (with uncommitted changes)' if dirty not in ('', 'not installed') else ''}, `cargo build --release`"),
        ("rustc", sh("rustc --version")),
        ("roar-cli (Python peer)", peer if peer != "not installed" else "not installed (peer rows missing)"),
        ("python3, boto3", f"{sh('python3 --version')}, boto3 {boto3}"),
        ("strace", sh("strace -V")),
        ("bindfs", sh("bindfs --version")),
        ("b3sum", sh("b3sum --version")),
        ("hyperfine", sh("hyperfine --version")),
    ]
    return "\n".join(f"| {k} | {v} |" for k, v in rows)


def description(script):
    """The header comment of a benchmark script, as one paragraph."""
    lines = []
    for line in open(os.path.join(REPO, "bench", script)):
        if line.startswith("#!"):
            continue
        if not line.startswith("#"):
            break
        lines.append(line[1:].strip())
    return " ".join(lines)


def main():
    out = sys.argv[1]
    names = [l.strip() for l in open(os.path.join(out, "order.txt")) if l.strip()]
    print("# Benchmark results\n")
    print("Written by `bash bench/all.sh` (installs what the benchmarks need, runs every benchmark in")
    print("`bench/`, then writes this file from what they printed). Every figure is a ratio or a")
    print("difference against bare execution or a peer **measured in the same run**, commands")
    print("interleaved round by round so the machine's drift hits all of them alike; medians with")
    print("interquartile ranges, and each benchmark's noise floor (bare vs bare). Absolute times only")
    print("show the scale. What the figures mean, where the time goes and which targets are met:")
    print("[NOTES.md](NOTES.md).\n")
    print("| machine | |\n|---|---|")
    print(machine())
    for name in names:
        rc = open(os.path.join(out, f"{name}.rc")).read().strip()
        secs = int(open(os.path.join(out, f"{name}.secs")).read().strip())
        env = open(os.path.join(out, f"{name}.env")).read().strip()
        log = open(os.path.join(out, f"{name}.log"), errors="replace", newline="").read()
        # Progress bars and carriage-return redraws are noise in a document.
        log = re.sub(r"[^\n]*\r", "", log).rstrip()
        print(f"\n## bench/{name}\n")
        print(f"Command: `{(env + ' ') if env else ''}bash bench/{name}` ({secs // 60} min {secs % 60} s"
              f"{'' if rc == '0' else f'; **failed with exit status {rc}**'}).\n")
        print(description(name) + "\n")
        print("```text")
        print(log)
        print("```")


if __name__ == "__main__":
    main()
