#!/usr/bin/env python3
"""Writes bench/RESULTS.md from one `bench/all.sh` run: the machine and the versions measured,
then for each benchmark its exact command, what it measures (the script's header comment), how
long it took, and everything it printed (every table is a ratio against bare execution or a peer
measured in the same run).

usage: report.py OUT_DIR RESULTS.md
OUT_DIR holds order.txt and, per benchmark NAME, NAME.log, .rc, .secs, .env and .when (date and
commit). Sections of benchmarks that did not run this time are kept from the existing RESULTS.md.
"""
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
    boto3 = sh("python3 -c 'import boto3; print(boto3.__version__)'")
    peer = sh("/tmp/roar-bench-peer-venv/bin/pip show roar-cli 2>/dev/null | sed -n 's/^Version: //p'")
    rows = [
        ("CPU", f"{cpu}, {os.cpu_count()} cores"),
        ("memory", mem),
        ("OS, kernel", f"{os_name}, Linux {os.uname().release}"),
        ("roar", "`cargo build --release` at the commit each section names"),
        ("rustc", sh("rustc --version")),
        ("roar-cli (Python peer)", peer if peer != "not installed" else "not installed (peer rows missing)"),
        ("python3, boto3", f"{sh('python3 --version')}, boto3 {boto3}"),
        ("strace", sh("strace -V")),
        ("bindfs", sh("bindfs --version")),
        ("b3sum", sh("b3sum --version")),
        ("hyperfine", sh("hyperfine --version")),
        ("chromium, graphviz", f"{sh('chromium --version')}, {sh('dot -V 2>&1')}"),
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


def previous_sections(path):
    """{NAME: section text} of an existing RESULTS.md."""
    if not os.path.exists(path):
        return {}
    parts = open(path).read().split("\n## bench/")[1:]
    return {p.split("\n", 1)[0].strip(): "## bench/" + p.rstrip() + "\n" for p in parts}


def section(out, name):
    rc = open(os.path.join(out, f"{name}.rc")).read().strip()
    secs = int(open(os.path.join(out, f"{name}.secs")).read().strip())
    env = open(os.path.join(out, f"{name}.env")).read().strip()
    when = open(os.path.join(out, f"{name}.when")).read().strip()
    log = open(os.path.join(out, f"{name}.log"), errors="replace", newline="").read()
    # Progress bars and carriage-return redraws are noise in a document.
    log = re.sub(r"[^\n]*\r", "", log).rstrip()
    status = "" if rc == "0" else f"; **failed with exit status {rc}**"
    day, hour, commit = when.split(" ", 2)
    return (
        f"## bench/{name}\n\n"
        f"Command: `{(env + ' ') if env else ''}bash bench/{name}`; run {day} {hour} UTC at commit {commit}, "
        f"{secs // 60} min {secs % 60} s{status}.\n\n"
        f"{description(name)}\n\n```text\n{log}\n```\n"
    )


def main():
    out, results = sys.argv[1], sys.argv[2]
    sections = previous_sections(results)
    for name in [l.strip() for l in open(os.path.join(out, "order.txt")) if l.strip()]:
        sections[name] = section(out, name)
    order = ["hash.sh", "run.sh", "recorder.sh", "query.sh", "mount.sh", "archive.sh", "s3.sh", "security.sh", "env.sh", "ui.sh", "pipeline.sh"]
    names = sorted(sections, key=lambda n: (order.index(n) if n in order else len(order), n))
    with open(results, "w") as f:
        f.write("""# Benchmark results

Written by `bash bench/all.sh` (installs what the benchmarks need, runs every benchmark in
`bench/`, then writes this file from what they printed; `bash bench/all.sh s3.sh` re-runs one and
replaces its section). Every figure is a ratio or a difference against bare execution or a peer
**measured in the same run**, commands interleaved round by round so the machine's drift hits all
of them alike; medians with interquartile ranges, and each benchmark's noise floor (bare vs bare).
Absolute times only show the scale. What the figures mean, where the time goes and which targets
are met: [NOTES.md](NOTES.md).

| machine | |
|---|---|
""")
        f.write(machine() + "\n")
        for name in names:
            f.write("\n" + sections[name])


if __name__ == "__main__":
    main()
