#!/usr/bin/env python3
"""The record a job should have, from strace's view of it: an oracle for the differential suite
(tests/tests/suite/observers.rs) that shares no code with roar.

    strace_model.py DIR PRE LOG...

LOG: the per-process files of `strace -ff -ttt -y -o PREFIX` of the bare command (no roar),
started in DIR; PRE: the files under DIR before it ran, relative, comma-separated. Prints a JSON list of [role, path relative to DIR] for files under DIR, by the
rules of docs/SEMANTICS.md, applied to files as objects (inodes), names bound to them:

- input: a file that existed before the job, under its name then, if the job read it, opened it
  for writing without truncating it (the bytes it kept are an input), or moved it away (a rename
  of it, an exchange); a file another was renamed over is superseded, as by a truncating open,
  not consumed;
- output: a name that exists at the end and is bound to a file the job wrote, or that the job
  bound (a rename, a link, a symlink, an O_TMPFILE linked into place); also the name of a file
  that existed before and that the job deleted without reading it, or truncated unread and moved
  away or renamed over, then left empty (recorded without content: what was there is gone);
- temp: a name the job bound (a file it made or wrote there, a rename or link onto it), gone at
  the end (deleted, renamed away); the old names of files moved with their directory are not
  separate temps, nor is a file that was there before, written in place under its own name and
  then deleted (an input the job consumed).
Directories are not files of a job.
"""

import json
import os
import re
import sys

O_ACCMODE, O_WRONLY, O_RDWR = 0o3, 0o1, 0o2
FLAGS = {"O_WRONLY": O_WRONLY, "O_RDWR": O_RDWR, "O_CREAT": 0o100, "O_TRUNC": 0o1000,
         "O_DIRECTORY": 0o200000, "O_TMPFILE": 0o20200000, "O_PATH": 0o10000000}
LINE = re.compile(r"^(\d+\.\d+) (\w+)\((.*)\) += (-?\d+)(?:<(.*)>)?")


def args_of(text):
    """Top-level arguments of a strace call: quoted strings unescaped, `N</path>` as (N, path)."""
    out, cur, i, depth = [], "", 0, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            j, s = i + 1, ""
            while text[j] != '"':
                if text[j] == "\\":
                    s += text[j:j + 2]
                    j += 2
                else:
                    s += text[j]
                    j += 1
            cur += '"' + s.encode("latin-1").decode("unicode_escape") + '"'
            i = j + 1
            continue
        if c in "<[{":
            depth += 1
        elif c in ">]}":
            depth -= 1
        if c == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += c
        i += 1
    if cur.strip():
        out.append(cur.strip())
    return out


def string(arg):
    return arg[1:-1] if arg.startswith('"') else None


def fd_path(arg):
    """The path strace -y shows for a descriptor (AT_FDCWD: the working directory)."""
    m = re.match(r"^(?:AT_FDCWD|-?\d+)<(.*)>$", arg)
    return m.group(1) if m else None


class Model:
    def __init__(self, root, pre):
        self.root = root
        self.cwd = root
        self.names = {}  # path -> object id
        self.objects = {}  # id -> dict
        self.dirs = set()
        self.ever = {}  # names ever bound to an object the job made or wrote -> object id
        self.bound = set()  # names whose binding the job changed
        self.anon = {}  # O_TMPFILE "#inode" -> object id
        self.deleted = set()  # names of files that existed before, unlinked by the job
        for name in pre:
            self.new(os.path.join(root, name), pre=True)

    def new(self, name, pre=False, written=False):
        oid = len(self.objects)
        self.objects[oid] = {"pre": pre, "pre_names": {name} if pre else set(), "read": False,
                             "written": written, "made": not pre}
        if name is not None:
            self.names[name] = oid
            if not pre:
                self.ever[name] = oid
        return oid

    def resolve(self, dirfd, path):
        if path.startswith("/"):
            return os.path.normpath(path)
        base = self.cwd if dirfd in (None, "AT_FDCWD") else fd_path(dirfd) or self.cwd
        return os.path.normpath(os.path.join(base, path))

    def open(self, name, flags, ret):
        if flags & FLAGS["O_TMPFILE"] == FLAGS["O_TMPFILE"]:
            m = re.search(r"#(\d+)", ret or "")
            if m:
                self.anon[m.group(1)] = self.new(None, written=True)
            return
        if flags & (FLAGS["O_DIRECTORY"] | FLAGS["O_PATH"]) or name in self.dirs:
            return
        write = flags & O_ACCMODE in (O_WRONLY, O_RDWR)
        trunc = flags & FLAGS["O_TRUNC"]
        oid = self.names.get(name)
        if oid is None:
            if not flags & FLAGS["O_CREAT"]:
                return
            oid = self.new(name)
        o = self.objects[oid]
        if o["pre"] and not o["written"] and not (write and trunc):
            o["read"] = True
        if write:
            o["written"] = True
            # A file that was there before, changed in place under its own name, was not made
            # by the job: gone at the end, it is an input the job consumed, not a temp.
            if not (o["pre"] and name in o["pre_names"]):
                self.ever[name] = oid

    def unbind(self, name, deleted=False, replaced=False):
        oid = self.names.pop(name, None)
        # The job's binding of the name ends here: a file that comes to the name later by moving
        # with its directory was not bound there by the job.
        self.bound.discard(name)
        if oid is not None and replaced:
            o = self.objects[oid]
            if o["pre"] and name in o["pre_names"] and o["written"] and not o["read"]:
                # Truncated unread, then renamed over: what was there before is gone, and the
                # job showed it was there (a file there before is never a temp): gone at the
                # end, the name records a deletion.
                self.deleted.add(name)
        elif oid is not None:
            o = self.objects[oid]
            if o["pre"] and name in o["pre_names"]:
                if deleted:
                    # Deleted unread: the deletion is the job's doing (an output without
                    # content); read first, it is an input that the job consumed.
                    if not o["read"]:
                        self.deleted.add(name)
                elif o["written"] and not o["read"]:
                    # Truncated unread, then moved away: what was there before is gone.
                    self.deleted.add(name)
                else:
                    o["read"] = True  # moved away (or exchanged): its content is consumed

    def bind(self, name, oid):
        if self.names.get(name) != oid:
            self.unbind(name, replaced=True)
        self.names[name] = oid
        self.bound.add(name)
        self.ever[name] = oid

    def rename(self, old, new, exchange=False):
        if old in self.dirs or any(n.startswith(old + "/") for n in self.names):
            # A directory: its files move with it, their old names forgotten.
            move = lambda n: new + n[len(old):] if n == old or n.startswith(old + "/") else n
            was = dict(self.names)
            self.dirs = {move(d) for d in self.dirs}
            self.names = {move(n): o for n, o in self.names.items()}
            # A name the job bound, empty by now, names where the file was (a temporary there).
            self.ever = {move(n) if n in was else n: o for n, o in self.ever.items()}
            self.bound = {move(n) for n in self.bound}
            # What was there before moves too where its file still is: the record names a file
            # below a moved directory by where it is now (SEMANTICS.md: files recorded below it
            # move with it); one gone by then (moved away, removed) is named where it was.
            for oid, o in self.objects.items():
                o["pre_names"] = {move(n) if was.get(n) == oid else n for n in o["pre_names"]}
            return
        a, b = self.names.get(old), self.names.get(new)
        if a is not None and a == b:
            return  # one file at both names: a rename or an exchange changes nothing
        if exchange:
            for name, oid in ((old, b), (new, a)):
                self.unbind(name)
                self.bind(name, oid)
            return
        if a is None:
            return
        self.unbind(old)
        self.bind(new, a)

    def apply(self, call, args, ret, ret_path):
        # strace -y shows the working directory of every *at call (`AT_FDCWD</dir>`); calls that
        # take a plain path (unlink, rename, mkdir...) are resolved against the last one seen.
        # Programs run one after another (a batch, each in its own directory) never run at once.
        for a in args:
            if a.startswith("AT_FDCWD<"):
                self.cwd = fd_path(a) or self.cwd
        if call in ("open", "creat"):
            flags = parse_flags(args[1]) if call == "open" else O_WRONLY | 0o100 | 0o1000
            self.open(self.resolve(None, string(args[0])), flags, ret_path)
        elif call == "openat":
            self.open(self.resolve(args[0], string(args[1])), parse_flags(args[2]), ret_path)
        elif call in ("rename", "renameat", "renameat2"):
            if call == "rename":
                old, new = self.resolve(None, string(args[0])), self.resolve(None, string(args[1]))
            else:
                old, new = self.resolve(args[0], string(args[1])), self.resolve(args[2], string(args[3]))
            self.rename(old, new, exchange=call == "renameat2" and "RENAME_EXCHANGE" in args[4])
        elif call in ("link", "linkat"):
            if call == "link":
                src, dst = self.resolve(None, string(args[0])), self.resolve(None, string(args[1]))
                oid = self.names.get(src)
            else:
                dst = self.resolve(args[2], string(args[3]))
                if "AT_EMPTY_PATH" in args[4] and string(args[1]) == "":
                    m = re.search(r"#(\d+)", args[0])
                    oid = self.anon.get(m.group(1)) if m else None
                else:
                    oid = self.names.get(self.resolve(args[0], string(args[1])))
            if oid is not None:
                self.bind(dst, oid)
        elif call in ("symlink", "symlinkat"):
            dst = self.resolve(None, string(args[1])) if call == "symlink" else self.resolve(args[1], string(args[2]))
            self.unbind(dst)
            self.bind(dst, self.new(None, written=True))
        elif call in ("unlink", "unlinkat"):
            name = self.resolve(None, string(args[0])) if call == "unlink" else self.resolve(args[0], string(args[1]))
            if call == "unlinkat" and "AT_REMOVEDIR" in args[2]:
                self.dirs.discard(name)
            else:
                self.unbind(name, deleted=True)
        elif call in ("mkdir", "mkdirat"):
            self.dirs.add(self.resolve(None, string(args[0])) if call == "mkdir" else self.resolve(args[0], string(args[1])))
        elif call == "truncate":
            self.open(self.resolve(None, string(args[0])), O_WRONLY | 0o1000, None)
        elif call == "ftruncate":
            path = fd_path(args[0])
            if path:
                self.open(path, O_WRONLY | 0o1000, None)

    def record(self):
        rel = lambda p: os.path.relpath(p, self.root)
        under = lambda p: p.startswith(self.root + "/")
        out = set()
        for name, oid in self.names.items():
            o = self.objects[oid]
            if under(name) and (o["written"] or name in self.bound):
                out.add(("output", rel(name)))
        for o in self.objects.values():
            if o["pre"] and o["read"]:
                out.update(("input", rel(n)) for n in o["pre_names"] if under(n))
        for name, oid in self.ever.items():
            if under(name) and name not in self.names and name not in self.deleted:
                out.add(("temp", rel(name)))
        out.update(("output", rel(n)) for n in self.deleted if under(n) and n not in self.names)
        return sorted(out)


def parse_flags(arg):
    return sum(FLAGS.get(f, 0) for f in arg.split("|"))


def main():
    root, pre, logs = os.path.realpath(sys.argv[1]), sys.argv[2], sys.argv[3:]
    calls = []
    for log in logs:
        for line in open(log, errors="replace"):
            m = LINE.match(line)
            if m and int(m.group(4)) >= 0:
                calls.append((float(m.group(1)), m.group(2), m.group(3), m.group(4), m.group(5)))
    calls.sort(key=lambda c: c[0])
    model = Model(root, [n for n in pre.split(",") if n])
    for _, call, args, ret, ret_path in calls:
        model.apply(call, args_of(args), ret, ret_path)
    print(json.dumps(model.record()))


if __name__ == "__main__":
    main()
