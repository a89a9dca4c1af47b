//! Generated programs of file operations, run under every observer (`roar mount` and each `roar
//! run` backend): every hash a record holds must be the content of the version it names — an
//! input's the bytes the path held before the job, an output's the bytes it left — and an output
//! still on disk must have its content known. Programs come from a seed (`ROAR_GEN_SEED`, printed
//! on failure); a failing one is shrunk to the fewest operations that still fail, and printed as
//! the Python program to paste into a regression test.
//!
//! The operations are the ones that broke hashes before: several handles on one file at once,
//! positional writes through a second handle, truncates by path and by handle, `O_TRUNC` reopens,
//! appends, mmap writes, hard links written through either name, renames, unlinks and re-creates,
//! writable opens that write nothing, a forked child, a thread, an exec'd child and a
//! double-forked `setsid` daemon doing their share, files made nameless (`O_TMPFILE`) then linked
//! into place, symbolic links made, renamed and removed, and directories made, renamed onto each
//! other and removed with what they hold.
//!
//! The same programs also run bare under `strace -ff`, read by an independent model of
//! SEMANTICS.md (tests/data/strace_model.py, common::strace): every `roar run` backend must give
//! the first backend's record, and that record and the mount's the model's; so must the mount's
//! record with every access recorded a few milliseconds late (fault injection: a handler that
//! records after its reply is overtaken by the access its reply let happen). What the generator
//! found is kept, shrunk, in `shrunk_programs_the_generator_found_...`.
//!
//! `ROAR_GEN_PROGRAMS` sets how many programs each observer runs (the suite: 100 on the mount, 40
//! under each backend, 30 under all of them compared); the suite's seed is fixed, so its programs
//! are a regression test; `ROAR_GEN_RANDOM=1` draws a new seed each run. The long mode is
//! `ROAR_GEN_RANDOM=1 ROAR_GEN_PROGRAMS=10000 cargo test -p roar-tests --test suite generated:: -- --ignored`.
//! Programs run `ROAR_GEN_BATCH` (25) to a job, each in its own directory, and to a `strace` run
//! of the oracle: a job's start, its record and the model's start are paid per batch, not per
//! program; a program that disagrees is shrunk alone (it may agree alone and fail among the
//! others of its batch: `ROAR_GEN_FROM=N`, a multiple of the batch size, replays from the Nth;
//! `ROAR_GEN_OBSERVERS=mount,mountlate,strace` only the pairs between those observers).

use crate::common;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::mount::{require_fuse, Mounted};
use common::{stderr, Project, Rng};

/// File names a program works on in its directory (few, so operations meet on the same files).
const NAMES: usize = 4;
/// Directories (`d0`, `d1`), each with file names of its own (`d0/g0`, `d0/g1`, ...): made,
/// renamed onto each other and removed with what they hold.
const DIRS: usize = 2;
const IN_DIR: usize = 2;
/// Every file name: the first [`NAMES`] in the program's directory, then those in directories.
const ALL_NAMES: usize = NAMES + DIRS * IN_DIR;

/// The path of file name `i`, relative to the program's directory.
fn file_name(i: usize) -> String {
    if i < NAMES {
        format!("f{i}")
    } else {
        let k = i - NAMES;
        format!("d{}/g{}", k / IN_DIR, k % IN_DIR)
    }
}
/// Handles a program holds open at once.
const SLOTS: usize = 3;
/// Symbolic links a program makes (`l0`, `l1`: their own names, pointing at `f`-names; the
/// program reads and writes only through `f`-names, see [`Op::Symlink`]).
const LINKS: usize = 2;

#[derive(Clone, Debug)]
enum Op {
    /// open(O_WRONLY|O_CREAT|O_TRUNC), write, close.
    WriteNew {
        name: usize,
        len: usize,
        byte: u8,
    },
    /// A handle kept open in `slot` (replacing the one there).
    Hold {
        slot: usize,
        name: usize,
        mode: Mode,
    },
    Write {
        slot: usize,
        len: usize,
        byte: u8,
    },
    Pwrite {
        slot: usize,
        off: usize,
        len: usize,
        byte: u8,
    },
    Ftruncate {
        slot: usize,
        size: usize,
    },
    Close {
        slot: usize,
    },
    Append {
        name: usize,
        len: usize,
        byte: u8,
    },
    /// open(O_WRONLY) without truncating, pwrite, close.
    PwritePath {
        name: usize,
        off: usize,
        len: usize,
        byte: u8,
    },
    Truncate {
        name: usize,
        size: usize,
    },
    Read {
        name: usize,
    },
    Rename {
        from: usize,
        to: usize,
    },
    /// renameat2(RENAME_EXCHANGE).
    Exchange {
        a: usize,
        b: usize,
    },
    Link {
        from: usize,
        to: usize,
    },
    Unlink {
        name: usize,
    },
    /// One byte changed through a shared writable mapping.
    Mmap {
        name: usize,
        off: usize,
        byte: u8,
    },
    /// A forked child runs these, the parent waits for it.
    Fork(Vec<Op>),
    /// A thread of the program runs these, the program waits for it.
    Thread(Vec<Op>),
    /// A forked child exec's a new Python that runs these; the program waits for it.
    Exec(Vec<Op>),
    /// A daemon runs these: a child calls `setsid` and forks again, the grandchild does them and
    /// closes what it holds, then tells the program (through a pipe) that it is done. The
    /// program waits for that, not for the daemon's exit. SEMANTICS.md: a fork that did not exec
    /// stays in its parent's job, even in a session of its own.
    Daemon(Vec<Op>),
    /// `symlink('f<target>', 'l<link>')`. The program never reads or writes through a link: a
    /// path is the name the program gave under `roar run` and the name the kernel resolved on
    /// the mount (SEMANTICS.md), so I/O through a link is named differently by design; making,
    /// renaming, replacing and removing links, and what a kept link's target holds, are not.
    Symlink {
        link: usize,
        target: usize,
    },
    /// `rename('l<from>', 'l<to>')`.
    RenameLink {
        from: usize,
        to: usize,
    },
    /// `unlink('l<link>')`.
    UnlinkLink {
        link: usize,
    },
    /// `mkdir('d<dir>')`.
    Mkdir {
        dir: usize,
    },
    /// `rename('d<from>', 'd<to>')`: what it holds moves with it (onto an empty directory only).
    RenameDir {
        from: usize,
        to: usize,
    },
    /// `shutil.rmtree('d<dir>')`: its files unlinked, then it.
    Rmtree {
        dir: usize,
    },
    /// A file made nameless (`O_TMPFILE` in the program's directory), written, then given a
    /// name with `linkat` through `/proc/self/fd`.
    Tmpfile {
        name: usize,
        len: usize,
        byte: u8,
    },
}

#[derive(Clone, Copy, Debug)]
enum Mode {
    Trunc,
    Append,
    ReadWrite,
    Read,
}

impl Mode {
    fn flags(self) -> &'static str {
        match self {
            Mode::Trunc => "os.O_WRONLY|os.O_CREAT|os.O_TRUNC",
            Mode::Append => "os.O_WRONLY|os.O_CREAT|os.O_APPEND",
            Mode::ReadWrite => "os.O_RDWR|os.O_CREAT",
            Mode::Read => "os.O_RDONLY",
        }
    }
}

#[derive(Clone, Debug)]
struct Program {
    /// Content of the files there before the job, by name.
    before: Vec<(usize, Vec<u8>)>,
    ops: Vec<Op>,
}

fn random_op(rng: &mut Rng, depth: u32) -> Op {
    let name = |rng: &mut Rng| rng.below(ALL_NAMES as u64) as usize;
    let dir = |rng: &mut Rng| rng.below(DIRS as u64) as usize;
    let slot = |rng: &mut Rng| rng.below(SLOTS as u64) as usize;
    let len = |rng: &mut Rng| [0, 1, 100, 4096, 5000, 70_000][rng.below(6) as usize];
    let byte = |rng: &mut Rng| b'A' + rng.below(26) as u8;
    let off = |rng: &mut Rng| [0, 1, 5, 4095, 6000][rng.below(5) as usize];
    let link = |rng: &mut Rng| rng.below(LINKS as u64) as usize;
    match rng.below(if depth == 0 { 23 } else { 18 }) {
        0 | 1 => Op::WriteNew {
            name: name(rng),
            len: len(rng),
            byte: byte(rng),
        },
        2 | 3 => Op::Hold {
            slot: slot(rng),
            name: name(rng),
            mode: [Mode::Trunc, Mode::Append, Mode::ReadWrite, Mode::Read][rng.below(4) as usize],
        },
        4 | 5 => Op::Write {
            slot: slot(rng),
            len: len(rng),
            byte: byte(rng),
        },
        6 => Op::Pwrite {
            slot: slot(rng),
            off: off(rng),
            len: len(rng),
            byte: byte(rng),
        },
        7 => Op::Ftruncate {
            slot: slot(rng),
            size: off(rng),
        },
        8 => Op::Close { slot: slot(rng) },
        9 => Op::Append {
            name: name(rng),
            len: len(rng),
            byte: byte(rng),
        },
        10 => match rng.below(2) {
            0 => Op::PwritePath {
                name: name(rng),
                off: off(rng),
                len: len(rng),
                byte: byte(rng),
            },
            _ => Op::Truncate {
                name: name(rng),
                size: off(rng),
            },
        },
        11 => Op::Read { name: name(rng) },
        12 => match rng.below(5) {
            0 | 1 => Op::Rename {
                from: name(rng),
                to: name(rng),
            },
            2 => Op::Exchange {
                a: name(rng),
                b: name(rng),
            },
            _ => Op::Link {
                from: name(rng),
                to: name(rng),
            },
        },
        13 => Op::Unlink { name: name(rng) },
        14 => Op::Mmap {
            name: name(rng),
            off: off(rng),
            byte: byte(rng),
        },
        15 => Op::Tmpfile {
            name: name(rng),
            len: len(rng),
            byte: byte(rng),
        },
        16 => match rng.below(4) {
            0 | 1 => Op::Symlink {
                link: link(rng),
                target: name(rng),
            },
            2 => Op::RenameLink {
                from: link(rng),
                to: link(rng),
            },
            _ => Op::UnlinkLink { link: link(rng) },
        },
        17 => match rng.below(5) {
            0 | 1 => Op::Mkdir { dir: dir(rng) },
            2 | 3 => Op::RenameDir {
                from: dir(rng),
                to: dir(rng),
            },
            _ => Op::Rmtree { dir: dir(rng) },
        },
        n => {
            let ops = (0..1 + rng.below(4)).map(|_| random_op(rng, 1)).collect();
            match n {
                18 => Op::Fork(ops),
                19 => Op::Thread(ops),
                20 => Op::Exec(ops),
                _ => Op::Daemon(ops),
            }
        }
    }
}

fn generate(rng: &mut Rng) -> Program {
    let mut before = Vec::new();
    for n in 0..ALL_NAMES {
        if rng.below(2) == 0 {
            let len = [1, 10, 5000][rng.below(3) as usize];
            before.push((n, vec![b'a' + rng.below(26) as u8; len]));
        }
    }
    let ops = (0..2 + rng.below(12)).map(|_| random_op(rng, 0)).collect();
    Program { before, ops }
}

const PRELUDE: &str = r#"import ctypes, mmap, os, shutil, sys, threading
fds = {}
libc = ctypes.CDLL(None, use_errno=True)
def exchange(a, b):
    if libc.renameat2(-100, a.encode(), -100, b.encode(), 2) != 0:
        raise OSError(ctypes.get_errno(), 'renameat2')
def write_new(n, d):
    fd = os.open(n, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644); os.write(fd, d); os.close(fd)
def hold(k, n, fl):
    if k in fds: os.close(fds.pop(k))
    fds[k] = os.open(n, fl, 0o644)
def close(k): os.close(fds.pop(k))
def append(n, d):
    fd = os.open(n, os.O_WRONLY | os.O_APPEND); os.write(fd, d); os.close(fd)
def pwrite(n, o, d):
    fd = os.open(n, os.O_WRONLY); os.pwrite(fd, d, o); os.close(fd)
def read(n):
    fd = os.open(n, os.O_RDONLY)
    while os.read(fd, 65536): pass
    os.close(fd)
def mm(n, o, b):
    fd = os.open(n, os.O_RDWR); size = os.fstat(fd).st_size
    if size:
        m = mmap.mmap(fd, size); m[o % size] = b; m.flush(); m.close()
    os.close(fd)
def tmpfile(n, d):
    fd = os.open('.', os.O_TMPFILE | os.O_WRONLY, 0o644)
    try:
        os.write(fd, d); os.link('/proc/self/fd/%d' % fd, n)
    finally:
        os.close(fd)
def thread(f):
    t = threading.Thread(target=f); t.start(); t.join()
def run_exec(code):
    pid = os.fork()
    if pid == 0:
        try: os.execv(sys.executable, [sys.executable, '-c', code])
        finally: os._exit(1)
    os.waitpid(pid, 0)
def daemon(f):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r); os.setsid()
            if os.fork() == 0:
                try: f()
                finally:
                    for k in list(fds): os.close(fds.pop(k))
                    os.write(w, b'x'); os._exit(0)
        finally: os._exit(0)
    os.close(w); os.waitpid(pid, 0); os.read(r, 1); os.close(r)
def do(f, *a):
    try: f(*a)
    except (OSError, KeyError, ValueError): pass
"#;

fn line(op: &Op, indent: &str, out: &mut String) {
    let n = |i: &usize| format!("'{}'", file_name(*i));
    let data = |len: &usize, byte: &u8| format!("b'{}' * {len}", *byte as char);
    let call = match op {
        Op::WriteNew { name, len, byte } => format!("write_new, {}, {}", n(name), data(len, byte)),
        Op::Hold { slot, name, mode } => format!("hold, {slot}, {}, {}", n(name), mode.flags()),
        Op::Write { slot, len, byte } => {
            format!("lambda: os.write(fds[{slot}], {})", data(len, byte))
        }
        Op::Pwrite {
            slot,
            off,
            len,
            byte,
        } => format!("lambda: os.pwrite(fds[{slot}], {}, {off})", data(len, byte)),
        Op::Ftruncate { slot, size } => format!("lambda: os.ftruncate(fds[{slot}], {size})"),
        Op::Close { slot } => format!("close, {slot}"),
        Op::Append { name, len, byte } => format!("append, {}, {}", n(name), data(len, byte)),
        Op::PwritePath {
            name,
            off,
            len,
            byte,
        } => format!("pwrite, {}, {off}, {}", n(name), data(len, byte)),
        Op::Truncate { name, size } => format!("os.truncate, {}, {size}", n(name)),
        Op::Read { name } => format!("read, {}", n(name)),
        Op::Rename { from, to } => format!("os.rename, {}, {}", n(from), n(to)),
        Op::Exchange { a, b } => format!("exchange, {}, {}", n(a), n(b)),
        Op::Link { from, to } => format!("os.link, {}, {}", n(from), n(to)),
        Op::Unlink { name } => format!("os.unlink, {}", n(name)),
        Op::Mmap { name, off, byte } => format!("mm, {}, {off}, {}", n(name), byte),
        Op::Tmpfile { name, len, byte } => format!("tmpfile, {}, {}", n(name), data(len, byte)),
        Op::Symlink { link, target } => format!("os.symlink, {}, 'l{link}'", n(target)),
        Op::RenameLink { from, to } => format!("os.rename, 'l{from}', 'l{to}'"),
        Op::UnlinkLink { link } => format!("os.unlink, 'l{link}'"),
        Op::Mkdir { dir } => format!("os.mkdir, 'd{dir}'"),
        Op::RenameDir { from, to } => format!("os.rename, 'd{from}', 'd{to}'"),
        Op::Rmtree { dir } => format!("shutil.rmtree, 'd{dir}'"),
        Op::Exec(ops) => {
            let mut code = PRELUDE.to_owned();
            for op in ops {
                line(op, "", &mut code);
            }
            code.push_str("for k in list(fds): os.close(fds.pop(k))\n");
            // A JSON string of ASCII text is a Python string literal.
            format!("run_exec, {}", serde_json::to_string(&code).unwrap())
        }
        Op::Thread(ops) | Op::Daemon(ops) => {
            // A function of its own (its name unique by indentation depth and position).
            let f = format!("t{}_{}", indent.len(), out.len());
            let _ = writeln!(out, "{indent}def {f}():");
            let inner = format!("{indent}    ");
            for op in ops {
                line(op, &inner, out);
            }
            let how = if matches!(op, Op::Thread(_)) {
                "thread"
            } else {
                "daemon"
            };
            let _ = writeln!(out, "{inner}pass\n{indent}{how}({f})");
            return;
        }
        Op::Fork(ops) => {
            let _ = writeln!(out, "{indent}pid = os.fork()\n{indent}if pid == 0:");
            let inner = format!("{indent}    ");
            let _ = writeln!(out, "{inner}try:");
            for op in ops {
                line(op, &format!("{inner}    "), out);
            }
            let _ = writeln!(
                out,
                "{inner}    pass\n{inner}finally:\n{inner}    os._exit(0)"
            );
            let _ = writeln!(out, "{indent}os.waitpid(pid, 0)");
            return;
        }
    };
    let _ = writeln!(out, "{indent}do({call})");
}

fn python(p: &Program) -> String {
    let mut out = PRELUDE.to_owned();
    for op in &p.ops {
        line(op, "", &mut out);
    }
    out.push_str("for k in list(fds): os.close(fds.pop(k))\n");
    out
}

/// What a program's paths held before the job.
struct Before {
    /// Content by absolute path.
    content: HashMap<PathBuf, Vec<u8>>,
    /// The program renames directories: a file below one may be read under another's name (a
    /// record names it where it is: SEMANTICS.md), so an input below `dK/` may hold what any
    /// directory held under the same name.
    moves_dirs: bool,
}

impl Before {
    /// What an input recorded at `path` may hold: the content there before the job, or, where
    /// directories move, what any directory held under the same name.
    fn of_input(&self, path: &Path) -> Vec<&Vec<u8>> {
        let mut olds: Vec<&Vec<u8>> = self.content.get(path).into_iter().collect();
        let (Some(name), Some(work)) = (path.file_name(), path.parent().and_then(Path::parent))
        else {
            return olds;
        };
        if self.moves_dirs
            && path
                .parent()
                .is_some_and(|d| d.file_name().is_some_and(is_dir_name))
        {
            for k in 0..DIRS {
                let other = work.join(format!("d{k}")).join(name);
                if other != path {
                    olds.extend(self.content.get(&other));
                }
            }
        }
        olds
    }
}

fn is_dir_name(name: &std::ffi::OsStr) -> bool {
    (0..DIRS).any(|k| name == format!("d{k}").as_str())
}

/// Whether `ops` rename a directory, a fork's or a thread's own operations included.
fn moves_dirs(ops: &[Op]) -> bool {
    ops.iter().any(|op| match op {
        Op::RenameDir { .. } => true,
        Op::Fork(inner) | Op::Thread(inner) | Op::Exec(inner) | Op::Daemon(inner) => {
            moves_dirs(inner)
        }
        _ => false,
    })
}

/// Lays out `p` in `dir` (its files as they are before the job) and its program at `script`;
/// returns what they held.
fn lay_out(p: &Program, dir: &Path, script: &Path) -> Before {
    std::fs::create_dir_all(dir).unwrap();
    let mut before = HashMap::new();
    for (name, content) in &p.before {
        let path = dir.join(file_name(*name));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
        before.insert(path, content.clone());
    }
    let text = python(p);
    std::fs::write(script, &text).unwrap();
    before.insert(script.to_owned(), text.into_bytes());
    Before {
        content: before,
        moves_dirs: moves_dirs(&p.ops),
    }
}

fn b3(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

/// What is wrong with `job`'s hashes of the files of the program in `dir` (below it, and its
/// script), given the content its paths held before it (`before`).
fn wrong_hashes(job: &serde_json::Value, dir: &Path, before: &Before) -> Vec<String> {
    let mut wrong = Vec::new();
    for f in job["files"].as_array().into_iter().flatten() {
        let path = PathBuf::from(f["path"].as_str().unwrap());
        if !path.starts_with(dir) && !before.content.contains_key(&path) {
            // Another program's of the same batch, or the batch's driver.
            continue;
        }
        let hash = f["hash"]["blake3"].as_str();
        let role = f["role"].as_str().unwrap_or("");
        match role {
            "input" => match (hash, before.of_input(&path).as_slice()) {
                (Some(h), olds) if !olds.is_empty() && olds.iter().all(|old| h != b3(old)) => wrong
                    .push(format!(
                        "input {}: recorded {h}, the content before the job was {}",
                        path.display(),
                        olds.iter()
                            .map(|old| b3(old))
                            .collect::<Vec<_>>()
                            .join(" or ")
                    )),
                (Some(h), []) => wrong.push(format!(
                    "input {}: recorded {h}, but nothing was there before the job",
                    path.display()
                )),
                _ => {}
            },
            // A kept symbolic link: recorded without content (the mount), or with its target's
            // (`roar run`), never anything else; a dangling one has none.
            "output" if path.is_symlink() => {
                if let Some(h) = hash {
                    match std::fs::read(&path) {
                        Ok(now) if h != b3(&now) => wrong.push(format!(
                            "link {}: recorded {h}, its target holds {}",
                            path.display(),
                            b3(&now)
                        )),
                        Err(_) => wrong.push(format!(
                            "link {}: recorded {h}, but its target does not exist",
                            path.display()
                        )),
                        Ok(_) => {}
                    }
                }
            }
            "output" => match (hash, std::fs::read(&path)) {
                (Some(h), Ok(now)) if h != b3(&now) => wrong.push(format!(
                    "output {}: recorded {h}, the file holds {}",
                    path.display(),
                    b3(&now)
                )),
                (Some(h), Err(_)) => wrong.push(format!(
                    "output {}: recorded {h}, but the job left no file there",
                    path.display()
                )),
                (None, Ok(now)) => wrong.push(format!(
                    "output {}: recorded with no content, the file holds {}",
                    path.display(),
                    b3(&now)
                )),
                _ => {}
            },
            _ => {}
        }
    }
    wrong
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Observer {
    Mount,
    /// The mount recording each access up to a few milliseconds late (fault injection,
    /// `ROAR_MOUNT_RECORD_DELAY_MS`), as a busy machine may: an access recorded after its
    /// request's reply is then overtaken by the next one.
    MountLate,
    Run(&'static str),
    /// The oracle: the program run bare under strace, read by an independent model.
    Strace,
}

/// What one observer recorded of one program: each file below the program's directory as
/// (name, role), sorted, and what is wrong with the record's hashes.
#[derive(Debug, Default, Clone)]
struct Seen {
    files: Vec<(String, String)>,
    wrong: Vec<String>,
    /// On the mount: what jobs of no batch (a process taken for a job of its own) recorded of
    /// this program's files, and the daemon's warnings — said where the observers disagree.
    strays: Vec<String>,
    /// The program's files after it ran (`path size hash`): where two observers disagree, a
    /// difference here says an operation had another outcome, not that a record was lost.
    end: Vec<String>,
}

/// The files under `dir`, each as `path size hash` (a symbolic link as `path -> target`).
fn end_state(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = e.path();
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .display()
                .to_string();
            match e.file_type() {
                Ok(t) if t.is_dir() => walk(root, &path, out),
                Ok(t) if t.is_symlink() => {
                    let to = std::fs::read_link(&path).unwrap_or_default();
                    out.push(format!("{rel} -> {}", to.display()));
                }
                _ => {
                    let data = std::fs::read(&path).unwrap_or_default();
                    let hash = blake3::hash(&data).to_hex();
                    out.push(format!("{rel} {} {}", data.len(), &hash[..12]));
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

impl Seen {
    fn of(jobs: &[&serde_json::Value], dir: &Path, before: &Before) -> Seen {
        let mut seen = Seen::default();
        for job in jobs {
            seen.wrong.extend(wrong_hashes(job, dir, before));
            for f in job["files"].as_array().into_iter().flatten() {
                let path = Path::new(f["path"].as_str().unwrap());
                if let Ok(rel) = path.strip_prefix(dir) {
                    let role = f["role"].as_str().unwrap_or("").to_owned();
                    seen.files.push((rel.to_string_lossy().into_owned(), role));
                }
            }
        }
        seen.files.sort();
        seen.files.dedup();
        seen
    }
}

/// Runs every program under `observer`: what it recorded of each, in order.
fn run_all(observer: Observer, programs: &[Program]) -> Vec<Seen> {
    match observer {
        Observer::Mount => run_mounted(programs, None),
        Observer::MountLate => run_mounted(programs, Some(RECORD_DELAY_MS)),
        Observer::Run(backend) => run_traced(backend, programs),
        Observer::Strace => oracle(programs),
    }
}

/// How many programs run in one job (`ROAR_GEN_BATCH`, default 25): one after another, each in
/// its own directory (a job's roles are per file, so a program's files get
/// the roles they would get alone; what one program's files may share with another's in one
/// job, an inode number freed and taken again, is what long jobs meet anyway). A program that
/// disagrees is then shrunk alone.
fn batch_size() -> usize {
    std::env::var("ROAR_GEN_BATCH")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(25)
}

/// Lays out `programs` in `root` (`w{base + j}`, `prog_{base + j}.py`) and a shell script at
/// `driver` running each in its directory, in order, stopping at the first that fails.
fn lay_out_batch(
    programs: &[Program],
    base: usize,
    root: &Path,
    dirs: &Path,
    driver: &Path,
) -> Vec<Before> {
    let mut sh = String::from("set -e\n");
    let before = (programs.iter().enumerate())
        .map(|(j, prog)| {
            let i = base + j;
            let (dir, script) = (
                dirs.join(format!("w{i}")),
                root.join(format!("prog_{i}.py")),
            );
            let before = lay_out(prog, &dir, &script);
            let python = interpreter();
            writeln!(
                sh,
                "cd '{}'\n'{python}' '{}'",
                dir.display(),
                script.display()
            )
            .unwrap();
            before
        })
        .collect();
    std::fs::write(driver, sh).unwrap();
    before
}

/// The Python interpreter itself, not a version manager's wrapper (pyenv's `python3` is a bash
/// script that starts several processes before Python: every observer and the oracle paid for
/// them on every program, ~170 ms of a ~230 ms start here).
fn interpreter() -> &'static str {
    static PYTHON: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty() && !s.contains('\''))
            .unwrap_or_else(|| "python3".into())
    });
    &PYTHON
}

/// What the oracle says of `programs`: their files' roles as an independent model of
/// SEMANTICS.md reads `strace -ff` of each batch run bare (common::strace).
fn oracle(programs: &[Program]) -> Vec<Seen> {
    let mut seen = Vec::new();
    for batch in programs.chunks(batch_size()) {
        let root = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(root.path()).unwrap();
        let driver = root.join("batch.sh");
        lay_out_batch(batch, 0, &root, &root, &driver);
        let argv = [OsStr::new("sh"), driver.as_os_str()];
        let all = common::strace::record(&root, &argv);
        for j in 0..batch.len() {
            let prefix = format!("w{j}/");
            let mut files: Vec<(String, String)> = (all.iter())
                .filter_map(|(role, name)| {
                    Some((name.strip_prefix(&prefix)?.to_owned(), role.clone()))
                })
                .collect();
            files.sort();
            seen.push(Seen {
                files,
                end: end_state(&root.join(format!("w{j}"))),
                ..Seen::default()
            });
        }
    }
    seen
}

/// The programs whose hashes are wrong, by index.
fn wrong(seen: &[Seen]) -> Vec<(usize, Vec<String>)> {
    seen.iter()
        .enumerate()
        .filter(|(_, s)| !s.wrong.is_empty())
        .map(|(i, s)| (i, s.wrong.clone()))
        .collect()
}

fn run_traced(backend: &str, programs: &[Program]) -> Vec<Seen> {
    let p = Project::new();
    let root = std::fs::canonicalize(p.path()).unwrap();
    let mut seen = Vec::new();
    for (k, batch) in programs.chunks(batch_size()).enumerate() {
        let base = k * batch_size();
        let driver = root.join(format!("batch_{base}.sh"));
        let before = lay_out_batch(batch, base, &root, &root, &driver);
        // Files there before the job are older than its first clock tick (an open with O_CREAT
        // leaves it to the ctime to say whether what it found predates the job: SEMANTICS.md).
        std::thread::sleep(std::time::Duration::from_millis(12));
        let out = p
            .cmd(["run", "--tracer", backend, "--", "sh"])
            .arg(&driver)
            .current_dir(&root)
            .output()
            .unwrap();
        assert!(out.status.success(), "{backend}: {}", stderr(&out));
        let job = p.last_job();
        for (j, before) in before.iter().enumerate() {
            let dir = root.join(format!("w{}", base + j));
            let mut one = Seen::of(&[&job], &dir, before);
            one.end = end_state(&dir);
            seen.push(one);
        }
    }
    seen
}

/// What `jobs` recorded of the files in `dir`, a line per file with the job's command.
fn strays(jobs: &[&serde_json::Value], dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    for job in jobs {
        let argv = job["argv"].to_string();
        for f in job["files"].as_array().into_iter().flatten() {
            let path = Path::new(f["path"].as_str().unwrap_or(""));
            if let Ok(rel) = path.strip_prefix(dir) {
                let role = f["role"].as_str().unwrap_or("");
                lines.push(format!("job {argv}: {role} {}", rel.display()));
            }
        }
    }
    lines
}

/// The longest an access is recorded late on [`Observer::MountLate`], in ms.
const RECORD_DELAY_MS: u32 = 3;

/// `programs` on a mount; `late`: recording each access up to so many ms late.
fn run_mounted(programs: &[Program], late: Option<u32>) -> Vec<Seen> {
    let scripts = tempfile::tempdir().unwrap();
    let scripts = std::fs::canonicalize(scripts.path()).unwrap();
    let mut before = Vec::new();
    let lay_out = |data: &Path| {
        for (k, batch) in programs.chunks(batch_size()).enumerate() {
            let base = k * batch_size();
            let driver = scripts.join(format!("batch_{base}.sh"));
            // Laid out in the directory the mount goes over: the driver's paths are the mount's.
            before.extend(lay_out_batch(batch, base, &scripts, data, &driver));
        }
    };
    let mut m = Mounted::with(lay_out, |cmd| {
        if let Some(ms) = late {
            cmd.env("ROAR_MOUNT_RECORD_DELAY_MS", ms.to_string());
        }
    });
    for k in 0..programs.len().div_ceil(batch_size()) {
        let base = k * batch_size();
        let driver = scripts.join(format!("batch_{base}.sh"));
        let status = Command::new("sh")
            .arg(&driver)
            .process_group(0)
            .status()
            .unwrap();
        assert!(status.success(), "batch {base} failed on the mount");
    }
    m.unmount();
    let jobs = m.jobs();
    let warnings = m.warnings();
    let drivers: Vec<PathBuf> = (0..programs.len())
        .map(|i| scripts.join(format!("batch_{}.sh", i / batch_size() * batch_size())))
        .collect();
    let of_no_batch: Vec<&serde_json::Value> = jobs
        .iter()
        .filter(|j| {
            !j["argv"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|x| drivers.iter().any(|d| x.as_str() == d.to_str()))
            })
        })
        .collect();
    before
        .iter()
        .enumerate()
        .map(|(i, before)| {
            // A batch that touched nothing under the mount has no job.
            let mine: Vec<&serde_json::Value> = jobs
                .iter()
                .filter(|j| {
                    j["argv"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|x| x.as_str() == drivers[i].to_str()))
                })
                .collect();
            let dir = m.data.join(format!("w{i}"));
            let mut seen = Seen::of(&mine, &dir, before);
            seen.strays = strays(&of_no_batch, &dir);
            seen.strays.extend(warnings.iter().cloned());
            seen.end = end_state(&dir);
            seen
        })
        .collect()
}

/// The program with the fewest operations (and files before it) that still fails under
/// `observer`, removing one at a time, a fork's own operations included.
fn shrink(observer: Observer, p: Program) -> Program {
    // Failures can hang on timing (when the kernel sends a release): a candidate gets two runs.
    shrink_by(
        |q| (0..2).any(|_| !wrong(&run_all(observer, std::slice::from_ref(q))).is_empty()),
        p,
    )
}

/// The program with the fewest operations (and files before it) for which `fails` holds.
fn shrink_by(fails: impl Fn(&Program) -> bool, mut p: Program) -> Program {
    let mut tries = 0;
    let mut changed = true;
    while changed && tries < 120 {
        changed = false;
        for i in (0..p.ops.len()).rev() {
            let mut q = p.clone();
            q.ops.remove(i);
            tries += 1;
            if fails(&q) {
                p = q;
                changed = true;
                continue;
            }
            if let Op::Fork(inner) | Op::Thread(inner) | Op::Exec(inner) | Op::Daemon(inner) =
                &p.ops[i]
            {
                // The fork's (or thread's) operations in the program itself, then each removed.
                let mut flat = p.clone();
                flat.ops.splice(i..=i, inner.clone());
                tries += 1;
                if fails(&flat) {
                    p = flat;
                    changed = true;
                    break;
                }
            }
        }
        for i in (0..p.before.len()).rev() {
            let mut q = p.clone();
            q.before.remove(i);
            tries += 1;
            if fails(&q) {
                p = q;
                changed = true;
            }
        }
    }
    p
}

/// `ROAR_GEN_SEED`, else a fixed seed (the suite's programs are the same every run, so a CI
/// failure is a regression, replayable as it is), else with `ROAR_GEN_RANDOM=1` (the long mode
/// sets it) a new one each run.
fn seed() -> u64 {
    if let Some(seed) = std::env::var("ROAR_GEN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return seed;
    }
    if std::env::var("ROAR_GEN_RANDOM").is_ok_and(|v| v == "1") {
        return std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1;
    }
    20_261_128
}

fn programs(count: usize, seed: u64) -> Vec<Program> {
    let mut rng = Rng(seed);
    (0..count).map(|_| generate(&mut rng)).collect()
}

fn check(observer: Observer, count: usize) {
    let seed = seed();
    let count = std::env::var("ROAR_GEN_PROGRAMS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(count);
    let all = programs(count, seed);
    // Said first: a long run stopped half-way is replayable from its seed.
    eprintln!("{observer:?}: {count} generated programs, seed {seed} (ROAR_GEN_SEED={seed})");
    // Long runs go in batches: one project (or mount) per batch.
    for (b, batch) in all.chunks(200).enumerate() {
        let failed = wrong(&run_all(observer, batch));
        if let Some((i, wrong_hashes)) = failed.into_iter().next() {
            let small = shrink(observer, batch[i].clone());
            let again = wrong(&run_all(observer, std::slice::from_ref(&small)));
            panic!(
                "{observer:?}: program {} of seed {seed} (ROAR_GEN_SEED={seed}) recorded wrong hashes:\n  {}\n\
                 shrunk to {} operations ({:?} before the job), which gives:\n  {}\n--- program ---\n{}",
                b * 200 + i,
                wrong_hashes.join("\n  "),
                small.ops.len(),
                small.before.iter().map(|(n, c)| (file_name(*n), c.len())).collect::<Vec<_>>(),
                again.first().map_or_else(
                    || "(nothing: run again, it passed; the failure depends on timing)".to_owned(),
                    |(_, w)| w.join("\n  ")
                ),
                python(&small)
            );
        }
    }
    eprintln!("{observer:?}: {count} generated programs (seed {seed}), every hash exact");
}

#[test]
fn generated_programs_record_exact_hashes_on_the_mount_needs_root() {
    if require_fuse() {
        check(Observer::Mount, 100);
    }
}

#[test]
fn generated_programs_record_exact_hashes_under_every_backend() {
    for backend in common::backends() {
        check(Observer::Run(backend), 40);
    }
}

#[test]
#[ignore = "long: ROAR_GEN_RANDOM=1 ROAR_GEN_PROGRAMS=10000 cargo test -p roar-tests --test suite generated:: -- --ignored"]
fn generated_programs_long() {
    let observers = [Observer::Mount]
        .into_iter()
        .filter(|_| require_fuse())
        .chain(common::backends().into_iter().map(Observer::Run));
    for observer in observers {
        check(observer, 10_000);
    }
}

/// The issue's report, made once by hand: 1000 bytes through one handle, one byte at offset 5
/// through a second, then both closed — the stream alone said 1000 'A's.
#[test]
fn a_pwrite_through_a_second_handle_is_in_the_recorded_hash_on_the_mount_needs_root() {
    if !require_fuse() {
        return;
    }
    let p = Program {
        before: Vec::new(),
        ops: vec![
            Op::Hold {
                slot: 0,
                name: 0,
                mode: Mode::Trunc,
            },
            Op::Write {
                slot: 0,
                len: 1000,
                byte: b'A',
            },
            Op::Hold {
                slot: 1,
                name: 0,
                mode: Mode::ReadWrite,
            },
            Op::Pwrite {
                slot: 1,
                off: 5,
                len: 1,
                byte: b'B',
            },
            Op::Close { slot: 1 },
            Op::Close { slot: 0 },
        ],
    };
    let failed = wrong(&run_all(Observer::Mount, &[p]));
    assert!(failed.is_empty(), "{failed:?}");
}

/// Where two records of one program differ: (name, role) pairs only one of them has.
fn differences(a: &Seen, b: &Seen) -> Vec<String> {
    let only = |x: &Seen, y: &Seen| -> Vec<String> {
        x.files
            .iter()
            .filter(|f| !y.files.contains(f))
            .map(|(n, r)| format!("{r} {n}"))
            .collect()
    };
    let (ab, ba) = (only(a, b), only(b, a));
    if ab.is_empty() && ba.is_empty() {
        Vec::new()
    } else {
        vec![format!(
            "only in the first: {ab:?}; only in the second: {ba:?}"
        )]
    }
}

/// The same programs under every observer: the records must name the same files in the same
/// roles (the engine's rule is one; observers differ only in what they can see): every `roar run`
/// backend the first's, the first and the mount the oracle's. A disagreement is shrunk like a
/// wrong hash.
#[test]
fn generated_programs_give_every_observer_the_same_record() {
    let seed = seed();
    let count = std::env::var("ROAR_GEN_PROGRAMS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    // `ROAR_GEN_FROM=N` replays from the Nth program on (a multiple of the batch size keeps the
    // batches those programs ran in: a program can fail only among the others of its batch).
    let from: usize = std::env::var("ROAR_GEN_FROM")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let all = programs(count, seed);
    // `ROAR_GEN_PRINT=707,6997` prints those programs (with what is there before the job) and
    // runs nothing: what a failed run's shortened report left out.
    if let Ok(which) = std::env::var("ROAR_GEN_PRINT") {
        for i in which
            .split(',')
            .filter_map(|i| i.trim().parse::<usize>().ok())
        {
            let p = &all[i];
            let before: Vec<_> = p
                .before
                .iter()
                .map(|(n, c)| (file_name(*n), c.len()))
                .collect();
            eprintln!("program {i} ({before:?} before the job):\n{}", python(p));
        }
        return;
    }
    agree(
        &all[from.min(all.len())..],
        &format!("seed {seed} (ROAR_GEN_SEED={seed}) from program {from}"),
    );
}

/// Programs the generator found observers (or the oracle) disagreeing on, shrunk: each a class
/// of defect fixed in the rule, kept as a regression test.
#[test]
fn shrunk_programs_the_generator_found_give_every_observer_the_same_record() {
    let (d0g0, d0g1) = (NAMES, NAMES + 1);
    let (d1g0, d1g1) = (NAMES + IN_DIR, NAMES + IN_DIR + 1);
    let found = [
        // A double-forked daemon stays in its parent's job on the mount (kernel fork events).
        Program {
            before: Vec::new(),
            ops: vec![
                Op::Daemon(vec![Op::WriteNew {
                    name: 1,
                    len: 1,
                    byte: b'W',
                }]),
                Op::Unlink { name: 1 },
            ],
        },
        // A pre-existing file truncated, or written in place, then deleted is not a temp.
        Program {
            before: vec![(d0g1, vec![b'a'])],
            ops: vec![
                Op::Truncate {
                    name: d0g1,
                    size: 1,
                },
                Op::Unlink { name: d0g1 },
            ],
        },
        Program {
            before: vec![(0, vec![b'a'; 5000])],
            ops: vec![
                Op::PwritePath {
                    name: 0,
                    off: 4095,
                    len: 1,
                    byte: b'B',
                },
                Op::Unlink { name: 0 },
            ],
        },
        // A file there before, truncated by an `O_CREAT` open and deleted: a deletion under
        // every observer (each says whether its `O_CREAT` open made the file).
        Program {
            before: vec![(3, vec![b'a'; 10])],
            ops: vec![
                Op::WriteNew {
                    name: 3,
                    len: 1,
                    byte: b'W',
                },
                Op::Unlink { name: 3 },
            ],
        },
        // A file there before, truncated unread, then renamed away: what was there is gone.
        Program {
            before: vec![(0, vec![b'a'; 10])],
            ops: vec![
                Op::Truncate { name: 0, size: 1 },
                Op::Rename { from: 0, to: 1 },
            ],
        },
        // A directory moved, then removed with what it held (eBPF reports rmdir now).
        Program {
            before: vec![(d1g1, vec![b'a'; 5000])],
            ops: vec![Op::RenameDir { from: 1, to: 0 }, Op::Rmtree { dir: 0 }],
        },
        // A directory moved away and back: nothing below it touched, nothing recorded (the
        // names it passed through are a directory's: it is one where it ended up).
        Program {
            before: vec![(d0g1, vec![b'a'; 5000])],
            ops: vec![
                Op::RenameDir { from: 0, to: 1 },
                Op::RenameDir { from: 1, to: 0 },
            ],
        },
        // A directory moved onto a name whose files the job had removed: the names below it
        // hold what the moved directory held (a file read there is an input, no deletion).
        Program {
            before: vec![(d0g0, vec![b'x'; 10]), (d1g0, vec![b'y'; 5000])],
            ops: vec![
                Op::Rmtree { dir: 0 },
                Op::RenameDir { from: 1, to: 0 },
                Op::Read { name: d0g0 },
            ],
        },
        Program {
            before: vec![
                (d0g0, vec![b'x'; 10]),
                (d0g1, vec![b'z'; 10]),
                (d1g0, vec![b'y'; 1]),
            ],
            ops: vec![Op::Rmtree { dir: 0 }, Op::RenameDir { from: 1, to: 0 }],
        },
        // A file there before moved away (an input), then a directory holding a file the job
        // made moved onto its directory: the name keeps the input beside the new output. On the
        // mount, run among others (its job ends before the unmount), the new file's hash comes
        // at its release, after the move: it must reach the file under its new name.
        Program {
            before: vec![(d0g0, vec![b'x'; 10]), (d1g1, vec![b'y'; 10])],
            ops: vec![
                Op::Hold {
                    slot: 0,
                    name: d0g1,
                    mode: Mode::Trunc,
                },
                Op::Rename { from: d1g1, to: 0 },
                Op::RenameDir { from: 0, to: 1 },
            ],
        },
        // A file there before deleted unread, made again and deleted: a deletion, not a temp.
        Program {
            before: vec![(1, vec![b'a'; 5000])],
            ops: vec![
                Op::Unlink { name: 1 },
                Op::WriteNew {
                    name: 1,
                    len: 0,
                    byte: b'Y',
                },
                Op::Unlink { name: 1 },
            ],
        },
        // A file renamed onto a name the job had linked: a read there is the moved file's, not
        // the link source's (preload read f1 through f3; seed 1796058406997819105, program 13).
        Program {
            before: vec![(1, vec![b'a']), (d1g1, vec![b'b'])],
            ops: vec![
                Op::Link { from: 1, to: 3 },
                Op::Rename { from: d1g1, to: 3 },
                Op::Hold {
                    slot: 2,
                    name: 3,
                    mode: Mode::Read,
                },
            ],
        },
        // A file the job put where it had read the one there, gone at the end: a temporary
        // beside the input (preload had only the input; seed 9866626374876062354, program 314),
        // and the same for a file made again where the job had read and removed the old one.
        Program {
            before: vec![(0, vec![b'a'; 5000]), (d0g1, vec![b'b'; 10])],
            ops: vec![
                Op::Mmap {
                    name: d0g1,
                    off: 1,
                    byte: 70,
                },
                Op::Rename { from: 0, to: d0g1 },
                Op::Unlink { name: d0g1 },
            ],
        },
        Program {
            before: vec![(1, vec![b'a'; 10])],
            ops: vec![
                Op::Read { name: 1 },
                Op::Unlink { name: 1 },
                Op::WriteNew {
                    name: 1,
                    len: 3,
                    byte: b'N',
                },
                Op::Unlink { name: 1 },
            ],
        },
        // A name a directory move refilled, its file read and deleted: the input, and the
        // deletion of what was there before the job stands again (preload had no deletion;
        // seed 9866626374876062354, program 42).
        Program {
            before: vec![(d0g1, vec![b'a'; 5000]), (d1g1, vec![b'b'; 10])],
            ops: vec![
                Op::Rmtree { dir: 0 },
                Op::RenameDir { from: 1, to: 0 },
                Op::Hold {
                    slot: 0,
                    name: d0g1,
                    mode: Mode::ReadWrite,
                },
                Op::Unlink { name: d0g1 },
            ],
        },
        // A file deleted below a directory then moved: the deletion names where the file was
        // (preload named it below the new name; seed 1796058406997819105, program 300).
        Program {
            before: vec![(d0g0, vec![b'x'; 10]), (d0g1, vec![b'a'; 10])],
            ops: vec![
                Op::Read { name: d0g0 },
                Op::Unlink { name: d0g1 },
                Op::RenameDir { from: 0, to: 1 },
            ],
        },
        // A file there before deleted unread, made again (held open) and its directory moved:
        // the deletion stays where the old file was, the new file is an output where it is now
        // (every observer carried the deletion to the new name; seed 9866626374876062354,
        // program 488).
        Program {
            before: vec![(d0g1, vec![b'a'; 10])],
            ops: vec![
                Op::Unlink { name: d0g1 },
                Op::Hold {
                    slot: 0,
                    name: d0g1,
                    mode: Mode::Trunc,
                },
                Op::RenameDir { from: 0, to: 1 },
            ],
        },
        // A file there before linked, its first name removed, then read through the link: an
        // input at the first name beside its deletion (every observer lost the input; seed
        // 9866626374876062354, program 1757).
        Program {
            before: vec![(1, vec![b'a'; 5000])],
            ops: vec![
                Op::Link { from: 1, to: 3 },
                Op::Unlink { name: 1 },
                Op::Read { name: 3 },
            ],
        },
        // The same, then a file made at the first name and removed: the deletion stands (not a
        // temp; the same seed's program once the above was fixed).
        Program {
            before: vec![(1, vec![b'a'; 5000])],
            ops: vec![
                Op::Link { from: 1, to: 3 },
                Op::Unlink { name: 1 },
                Op::Read { name: 3 },
                Op::Hold {
                    slot: 0,
                    name: 1,
                    mode: Mode::Append,
                },
                Op::Unlink { name: 1 },
            ],
        },
        // A link renamed, then written through by mmap: still a name of the first file, which
        // it changes (an input and an output there; seed 9866626374876062354, program 1895).
        Program {
            before: vec![(0, vec![b'a'; 10])],
            ops: vec![
                Op::Link { from: 0, to: 2 },
                Op::Rename { from: 2, to: 1 },
                Op::Mmap {
                    name: 1,
                    off: 5,
                    byte: b'C',
                },
            ],
        },
        // A symbolic link renamed (the mount reports it as `roar run` does).
        Program {
            before: Vec::new(),
            ops: vec![
                Op::Symlink { link: 0, target: 2 },
                Op::RenameLink { from: 0, to: 1 },
            ],
        },
        // A symbolic link made by a double-forked daemon, renamed by its parent: a temp. The
        // mount recorded the link after replying to it, so the rename, which the reply let
        // happen, could reach the record first: an input and an output where the link was
        // (seed 9866626374876062354, programs 395 and 446, when the machine's pids wrapped
        // round). `MountLate` records every access late, so twelve such pairs in a row find
        // a handler that records after its reply on any run.
        Program {
            before: Vec::new(),
            ops: (0..12)
                .flat_map(|k| {
                    let make = Op::Symlink {
                        link: 2 * k,
                        target: 2,
                    };
                    let make = if k % 2 == 0 {
                        Op::Daemon(vec![make])
                    } else {
                        make
                    };
                    [
                        make,
                        Op::RenameLink {
                            from: 2 * k,
                            to: 2 * k + 1,
                        },
                    ]
                })
                .collect(),
        },
        // A file there before, truncated unread, then renamed over and the name left empty: a
        // deletion, not a temp (a file there before is never one; seed 1796093033312293485,
        // program 1255, where the oracle said temp).
        Program {
            before: vec![(d0g0, vec![b'a'; 5000]), (d1g0, vec![b'b'; 5000])],
            ops: vec![
                Op::WriteNew {
                    name: d0g0,
                    len: 1,
                    byte: b'M',
                },
                Op::Rename {
                    from: d1g0,
                    to: d0g0,
                },
                Op::Unlink { name: d0g0 },
            ],
        },
        // Files there before moved away unread, or read and removed, then new ones made at their
        // names, then the directory moved: each input stays where its file was, the new files
        // are outputs where they are now (the same program: every observer named the input
        // where the directory went).
        Program {
            before: vec![(d1g0, vec![b'a'; 5000]), (d1g1, vec![b'b'; 10])],
            ops: vec![
                Op::Rename { from: d1g0, to: 0 },
                Op::Read { name: d1g1 },
                Op::Unlink { name: d1g1 },
                Op::WriteNew {
                    name: d1g0,
                    len: 1,
                    byte: b'N',
                },
                Op::WriteNew {
                    name: d1g1,
                    len: 1,
                    byte: b'O',
                },
                Op::RenameDir { from: 1, to: 0 },
            ],
        },
        // A rename between two names of one file (a link the job made) does nothing: the
        // source name keeps its bytes, unread (seed 1796133588012499713, program 1264: every
        // observer recorded an input the oracle did not).
        Program {
            before: vec![(d0g1, vec![b'a'; 10]), (d1g1, vec![b'b'; 10])],
            ops: vec![
                Op::Link {
                    from: d1g1,
                    to: d0g0,
                },
                Op::Rename {
                    from: d1g1,
                    to: d0g0,
                },
            ],
        },
        // A link exchanged with another name: the other name takes the link's place among the
        // file's names, so a write through it changes the link's source (seed
        // 1796133588012499713, program 2534: every observer lost `f2`'s input and output).
        Program {
            before: vec![(2, vec![b'a'; 5000]), (d1g0, vec![b'b'; 5000])],
            ops: vec![
                Op::Link { from: 2, to: d1g1 },
                Op::Exchange { a: d1g1, b: d1g0 },
                Op::Mmap {
                    name: d1g0,
                    off: 5,
                    byte: b'J',
                },
            ],
        },
        // A directory moved onto the name of one the job removed, and back: the removed one's
        // file stays deleted (seed 1796095042051600215, program 68: every observer lost it).
        Program {
            before: vec![(d0g0, vec![b'a']), (d1g1, vec![b'b'; 10])],
            ops: vec![
                Op::Hold {
                    slot: 1,
                    name: d0g1,
                    mode: Mode::ReadWrite,
                },
                Op::Rmtree { dir: 1 },
                Op::RenameDir { from: 0, to: 1 },
                Op::RenameDir { from: 1, to: 0 },
            ],
        },
        // A name the job bound and then deleted, where a file there before arrives later with
        // its directory (moved onto the emptied one): not the job's output. The oracle kept the
        // name as bound by the job (seed 5304127846756344154, program 5204); every observer
        // recorded only the input.
        Program {
            before: vec![(d0g0, vec![b'a'; 10]), (d1g1, vec![b'b'])],
            ops: vec![
                Op::Rename {
                    from: d0g0,
                    to: d0g1,
                },
                Op::Unlink { name: d0g1 },
                Op::RenameDir { from: 1, to: 0 },
            ],
        },
    ];
    // `ROAR_GEN_ONLY=N` runs the Nth alone (a program can pass alone and fail among others).
    let only: Vec<Program> = match std::env::var("ROAR_GEN_ONLY") {
        Ok(i) => vec![found[i.parse::<usize>().expect("ROAR_GEN_ONLY: an index")].clone()],
        Err(_) => found.to_vec(),
    };
    agree(&only, "the shrunk programs");
}

/// Runs `all` under every observer pair of the agreement test; panics with the first
/// disagreement, shrunk.
fn agree(all: &[Program], label: &str) {
    // Said first: a long run stopped half-way is replayable from its seed.
    eprintln!("{} programs of {label}", all.len());
    let runs: Vec<Observer> = common::backends().into_iter().map(Observer::Run).collect();
    let mut pairs: Vec<(Observer, Observer)> = runs[1..].iter().map(|&o| (runs[0], o)).collect();
    if common::require_tool("strace") {
        pairs.push((runs[0], Observer::Strace));
        if require_fuse() {
            pairs.push((Observer::Mount, Observer::Strace));
            pairs.push((Observer::MountLate, Observer::Strace));
        }
    }
    // `ROAR_GEN_OBSERVERS=mount,strace` (names as printed, lower case) replays only the pairs
    // between those: a long run's remainder on the observers it did not reach.
    if let Ok(only) = std::env::var("ROAR_GEN_OBSERVERS") {
        let named = |o: &Observer| {
            let name = format!("{o:?}").to_lowercase();
            only.split(',')
                .any(|n| name == n || name == format!("run(\"{n}\")"))
        };
        pairs.retain(|(a, b)| named(a) && named(b));
        assert!(
            !pairs.is_empty(),
            "ROAR_GEN_OBSERVERS={only}: no pair of observers left"
        );
    }
    let mut seen: HashMap<Observer, Vec<Seen>> = HashMap::new();
    for &(a, b) in &pairs {
        for o in [a, b] {
            seen.entry(o).or_insert_with(|| {
                let t = std::time::Instant::now();
                let seen = run_all(o, all);
                // Said now: a disagreement found later stops the run before the check below.
                let failed = wrong(&seen);
                eprintln!(
                    "{o:?}: {:.1} s, recorded hashes: {}",
                    t.elapsed().as_secs_f64(),
                    match failed.len() {
                        0 => "every one the content of its version".to_owned(),
                        n => format!("{n} programs with wrong ones: {failed:?}"),
                    }
                );
                seen
            });
        }
        let (x, y) = (&seen[&a], &seen[&b]);
        for (i, (p, q)) in x.iter().zip(y).enumerate() {
            let diff = differences(p, q);
            if diff.is_empty() {
                continue;
            }
            let disagree = |q: &Program| {
                let one = std::slice::from_ref(q);
                !differences(&run_all(a, one)[0], &run_all(b, one)[0]).is_empty()
            };
            let small = shrink_by(disagree, all[i].clone());
            let one = std::slice::from_ref(&small);
            let again = differences(&run_all(a, one)[0], &run_all(b, one)[0]);
            // The program as generated too: shrunk, it may disagree another way.
            let text = python(&all[i]);
            for (o, s) in [(a, &x[i]), (b, &y[i])] {
                for line in &s.strays {
                    eprintln!("{o:?}, outside the program's job: {line}");
                }
                for line in s
                    .end
                    .iter()
                    .filter(|l| ![&x[i], &y[i]].iter().all(|t| t.end.contains(l)))
                {
                    eprintln!("{o:?}, files after the program, not the same under both: {line}");
                }
            }
            eprintln!(
                "program {i} as generated ({:?} before the job):\n{}",
                all[i]
                    .before
                    .iter()
                    .map(|(n, c)| (file_name(*n), c.len()))
                    .collect::<Vec<_>>(),
                text.strip_prefix(PRELUDE).unwrap_or(&text)
            );
            panic!(
                "{a:?} and {b:?} disagree on program {i} of {label}:\n  {}\n\
                 shrunk to {} operations ({:?} before the job): {}\n--- program ---\n{}",
                diff.join("\n  "),
                small.ops.len(),
                small
                    .before
                    .iter()
                    .map(|(n, c)| (file_name(*n), c.len()))
                    .collect::<Vec<_>>(),
                again.join("; "),
                python(&small)
            );
        }
    }
    // And every hash each observer recorded is the content of the version it names.
    for (observer, seen) in &seen {
        let failed = wrong(seen);
        assert!(
            failed.is_empty(),
            "{observer:?} recorded wrong hashes on {label}: {failed:?}"
        );
    }
    eprintln!("{} programs of {label}: {pairs:?} agree", all.len());
}
