#!/usr/bin/env python3
"""roar mount ARCHIVE against ratarmount and native files (bench/archive.sh drives it).

usage: archive_bench.py W ROAR RATARMOUNT ROUNDS

W holds a roar project `p/` with the archives ARCHIVES names (data.tar, data.tar.gz, ...) made
from `p/src/` (the extraction), and `members.txt` (the members to read, one per line; the first
SINGLE_BLOCK_READ of them, default 100, for `data.tar.xz`, one xz block). For each
archive, interleaved in
shuffled order each round, with the page cache dropped before every measurement:
- first mount: the index built from nothing (roar's index deleted; ratarmount --recreate-index),
  timed until the mount command returns (both return once the mount serves);
- mount again: the index reused;
- peak resident memory of each mount's processes, over the reads (the mount was made with the index
  already built);
- read: `md5sum` of the members (each run its own process group: one job of the mount), through
  roar's mount, ratarmount's, and from the extracted files; the outputs must be identical.
"""
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kw)


def peak_rss_mb(mountpoint):
    """The peak resident memory (VmHWM) of the processes whose arguments name `mountpoint`: the
    mount's daemon (roar) or its Python process (ratarmount), in MB."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if mountpoint.encode() not in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0"):
                continue
            total += sum(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("VmHWM:"))
        except OSError:
            continue
    return total / 1024


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def main():
    w, roar, ratarmount, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    p = os.path.join(w, "p")
    members = open(os.path.join(w, "members.txt")).read().split("\n")
    members = [m for m in members if m]
    results = {}

    def umount(d):
        # fusermount is libfuse 2's (Debian's fuse3 has fusermount3); as root umount does it.
        for cmd in (["fusermount3", "-u", d], ["fusermount", "-u", d], ["umount", "-l", d]):
            if shutil.which(cmd[0]):
                subprocess.run(cmd, stderr=subprocess.DEVNULL)

    all_members = members
    for archive in os.environ.get("ARCHIVES", "data.tar data.tar.gz").split():
        a = os.path.join(p, archive)
        # One xz block: every random read decodes from the archive's start in both tools (a
        # member in the middle of 315 MB: ~2 s), so fewer of the same members are read.
        single = archive == "data.tar.xz"
        members = all_members[: int(os.environ.get("SINGLE_BLOCK_READ", "100"))] if single else all_members
        mr, mt = os.path.join(p, "m-roar"), os.path.join(w, "m-rat")
        for d in (mr, mt):
            os.makedirs(d, exist_ok=True)

        def mount_roar(cold):
            if cold:
                shutil.rmtree(os.path.join(p, ".roar", "archives"), ignore_errors=True)
            t = time.perf_counter()
            sh([roar, "mount", a, mr], cwd=p)
            return time.perf_counter() - t

        def unmount_roar():
            sh([roar, "unmount", mr], cwd=p)

        def mount_rat(cold):
            args = [ratarmount] + (["--recreate-index"] if cold else []) + [a, mt]
            t = time.perf_counter()
            sh(args, cwd=w)
            return time.perf_counter() - t

        def unmount_rat():
            umount(mt)

        times = {k: [] for k in ["first mount roar", "first mount ratarmount", "mount again roar", "mount again ratarmount"]}
        for _ in range(rounds):
            for cold in (True, False):
                order = [("roar", mount_roar, unmount_roar), ("ratarmount", mount_rat, unmount_rat)]
                random.shuffle(order)
                for name, mount, unmount in order:
                    drop_caches()
                    times[f"{'first mount' if cold else 'mount again'} {name}"].append(mount(cold))
                    unmount()

        # Reads: both mounted (indexes warm), and the extracted tree.
        mount_roar(False)
        mount_rat(False)
        dirs = {"roar": mr, "ratarmount": mt, "native": os.path.join(p, "src")}
        outputs = {}
        reads = {k: [] for k in dirs}
        for _ in range(rounds):
            order = list(dirs.items())
            random.shuffle(order)
            for name, d in order:
                drop_caches()
                t = time.perf_counter()
                out = subprocess.run(["xargs", "-d", "\n", "md5sum"], input="\n".join(members).encode(),
                                     cwd=d, check=True, capture_output=True, process_group=0)
                reads[name].append(time.perf_counter() - t)
                outputs.setdefault(name, out.stdout)
        rss = {"roar": peak_rss_mb(mr), "ratarmount": peak_rss_mb(mt)}
        unmount_roar()
        unmount_rat()
        if len(set(outputs.values())) != 1:
            sys.exit(f"{archive}: md5sum outputs differ between {list(outputs)}")
        for k, ts in reads.items():
            times[f"read {k}"] = ts
        results[archive] = {k: {"median": statistics.median(v), "times": v} for k, v in times.items()}
        results[archive]["peak RSS MB"] = rss

        r = results[archive]
        med = lambda k: r[k]["median"]
        print(f"== {archive} ({os.path.getsize(a) / 2**20:.0f} MiB, {len(members)} members read)")
        for k in times:
            print(f"  {k:26s} {med(k) * 1e3:9.1f} ms")
        print(f"  peak RSS over the mounts and reads: roar {rss['roar']:.0f} MB, ratarmount {rss['ratarmount']:.0f} MB")
        print(f"  first mount: roar / ratarmount {med('first mount roar') / med('first mount ratarmount'):.2f}x")
        print(f"  mount again: roar / ratarmount {med('mount again roar') / med('mount again ratarmount'):.2f}x")
        print(f"  read: roar / ratarmount {med('read roar') / med('read ratarmount'):.2f}x, "
              f"roar / native {med('read roar') / med('read native'):.2f}x, "
              f"ratarmount / native {med('read ratarmount') / med('read native'):.2f}x")
    json.dump(results, open(os.path.join(w, "archive.json"), "w"))


if __name__ == "__main__":
    main()
