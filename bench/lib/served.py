"""What a `roar mount` daemon served, for the benchmarks: requests by kind, how many the caller
waited for, the daemon's CPU and its polls (issue 65: counts that do not depend on how fast the
machine wakes up, reported beside every time).

    served.py snap ROAR DIR OUT.json     the mount at DIR now (waits for the daemon's next tick)
    served.py per BEFORE.json AFTER.json N WHAT
                                         one line: per each of N operations named WHAT
"""
import json
import subprocess
import sys
import time


def snap(roar, mount_dir, out):
    # The daemon writes its counts at each tick (200 ms) when they changed.
    time.sleep(0.5)
    mounts = json.loads(subprocess.check_output([roar, "mount", "--list", "--json"]))
    m = next(m for m in mounts if m["dir"].rstrip("/") == mount_dir.rstrip("/"))
    served = m.get("served") or {"requests": {}, "waited": 0, "total": 0,
                                 "polls": {"caught": 0, "ran_out": 0}}
    served["daemon_cpu_ms"] = m.get("daemon_cpu_ms") or 0.0
    json.dump(served, open(out, "w"))


def per(before, after, n, what):
    a, b = json.load(open(before)), json.load(open(after))
    kinds = {k: v - a["requests"].get(k, 0) for k, v in b["requests"].items()}
    kinds = {k: v for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]) if v > 0}
    n = float(n)
    caught = b["polls"]["caught"] - a["polls"]["caught"]
    ran_out = b["polls"]["ran_out"] - a["polls"]["ran_out"]
    total = b["total"] - a["total"]
    print(f"per {what}: {total / n:.2f} requests, {(b['waited'] - a['waited']) / n:.2f} waited for "
          f"({', '.join(f'{k} {v / n:.2f}' for k, v in kinds.items())}); "
          f"daemon CPU {(b['daemon_cpu_ms'] - a['daemon_cpu_ms']) * 1e3 / n:.0f} us; "
          f"caught polling {100 * caught / max(total, 1):.0f} % of requests, windows run out {ran_out / n:.2f}")


if __name__ == "__main__":
    if sys.argv[1] == "snap":
        snap(*sys.argv[2:5])
    elif sys.argv[1] == "per":
        per(*sys.argv[2:6])
    else:
        sys.exit(__doc__)
