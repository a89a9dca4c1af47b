//! `roar mount ARCHIVE... DIR` with real FUSE mounts of archives made by the real tools (tar,
//! gzip, zstd, xz, zip): every member's bytes through the mount equal extraction, every recorded
//! member hash equals `b3sum` of the extracted file, jobs record exactly the members they read
//! (through the mount's own attribution and under `roar run` with every backend), the index is
//! reused across mounts and rebuilt when the archive changes, and `roar status` sees a changed
//! member.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::mount::require_fuse;
use common::{stderr, Project, Rng};

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", stderr(&out));
}

/// 10,000 files in nested directories, with hostile names, a symlink and a hard link.
fn dataset(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut rng = Rng(0x5eed_1234_abcd_ef01);
    let mut files = BTreeMap::new();
    for i in 0..9_990 {
        let size = match i % 10 {
            0 => 0,
            1..=7 => rng.below(4_000) as usize,
            _ => rng.below(200_000) as usize,
        };
        let content: Vec<u8> = (0..size).map(|_| (rng.next() % 13) as u8 + b'a').collect();
        files.insert(
            format!("shard-{:02}/class-{}/{:05}.bin", i % 37, i % 5, i),
            content,
        );
    }
    let odd = [
        "odd/with space.txt",
        "odd/new\nline.txt",
        "odd/ünïcødé-名前.txt",
        "odd/-leading-dash",
        "odd/percent%2Fand+plus",
        "odd/back\\slash",
        "odd/quote'\"s",
        "odd/tab\there",
        "odd/.hidden",
        &format!("odd/{}", "long".repeat(40)),
    ];
    for (k, name) in odd.iter().enumerate() {
        files.insert(name.to_string(), format!("odd file {k}\n").into_bytes());
    }
    for (name, content) in &files {
        let p = root.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    std::os::unix::fs::symlink("../odd/with space.txt", root.join("shard-00/link")).unwrap();
    // A hard link: tar stores it as a link to the first name, zip as a second copy.
    std::fs::hard_link(root.join("odd/.hidden"), root.join("shard-01/hard")).unwrap();
    files.insert("shard-01/hard".into(), files["odd/.hidden"].clone());
    files
}

struct Archives {
    p: Project,
    src: PathBuf,
    files: BTreeMap<String, Vec<u8>>,
}

impl Archives {
    fn new() -> Archives {
        let p = Project::new();
        let src = std::fs::canonicalize(p.path()).unwrap().join("src");
        let files = dataset(&src);
        Archives { p, src, files }
    }

    fn root(&self) -> PathBuf {
        std::fs::canonicalize(self.p.path()).unwrap()
    }

    /// Makes `name` with `tool`: tar, tar.gz, tar.zst, tar.xz, tar.bz2 or zip.
    fn make(&self, name: &str) -> PathBuf {
        let out = self.root().join(name);
        let mut cmd = match name.rsplit_once('.').map(|(_, e)| e) {
            Some("zip") => {
                let mut c = Command::new("zip");
                c.args(["-q", "-r", "--symlinks"]).arg(&out).arg(".");
                c
            }
            Some("tar") => {
                let mut c = Command::new("tar");
                c.arg("-cf").arg(&out).arg(".");
                c
            }
            Some("gz") => {
                let mut c = Command::new("tar");
                c.arg("-czf").arg(&out).arg(".");
                c
            }
            // pzstd, as the note on a one-frame archive advises: frames of a few MiB.
            Some("zst") => {
                let mut c = Command::new("tar");
                c.args(["-I", "pzstd -q -p 2"])
                    .arg("-cf")
                    .arg(&out)
                    .arg(".");
                c
            }
            // xz in 1 MiB blocks, as `xz -T0` and pixz write it (an access point at each); the
            // fastest preset (-6 takes a minute on this data set).
            Some("xz") => {
                let mut c = Command::new("tar");
                c.args(["-I", "xz -0 -T2 --block-size=1MiB"])
                    .arg("-cf")
                    .arg(&out)
                    .arg(".");
                c
            }
            Some("bz2") => {
                let mut c = Command::new("tar");
                c.arg("-cjf").arg(&out).arg(".");
                c
            }
            _ => panic!("unknown archive kind {name}"),
        };
        run(cmd.current_dir(&self.src));
        out
    }

    fn mount(&self, archives: &[&Path], dir: &str) -> std::process::Output {
        let mut args: Vec<&std::ffi::OsStr> = vec!["mount".as_ref()];
        args.extend(archives.iter().map(|a| a.as_os_str()));
        args.push(dir.as_ref());
        self.p.roar(args)
    }

    fn unmount(&self, dir: &str) {
        let out = self.p.roar(["unmount", dir]);
        assert!(out.status.success(), "unmount: {}", stderr(&out));
    }

    /// Runs `sh -c script` in the project as its own process group (a command line of an
    /// interactive shell): one job of the mount.
    fn sh(&self, script: &str) {
        sh_job(self.p.path(), script);
    }

    /// The mount's job of a shell that ran `script` ([`Archives::sh`]).
    fn job_with_script(&self, script: &str) -> serde_json::Value {
        mount_job(&self.p, script)
    }
}

/// The job's inputs: path -> blake3.
fn inputs(job: &serde_json::Value) -> BTreeMap<String, String> {
    job["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["role"] == "input")
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_owned(),
                f["hash"]["blake3"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// blake3 of every extracted file, by `b3sum` (one line per file: hash, two spaces, path; a
/// name with a newline or backslash is escaped and the line starts with a backslash).
fn b3sum_of_extraction(archive: &Path, scratch: &Path) -> BTreeMap<String, String> {
    let x = scratch.join(format!(
        "x-{}",
        archive.file_name().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all(&x).unwrap();
    if archive.extension().is_some_and(|e| e == "zip") {
        // Python's zipfile keeps every name as stored (unzip rewrites control characters); Info-ZIP
        // stores UTF-8 names without the UTF-8 flag, so say how they are encoded.
        run(Command::new("python3")
            .args(["-m", "zipfile", "--metadata-encoding", "utf-8", "-e"])
            .arg(archive)
            .arg(&x));
    } else {
        run(Command::new("tar")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(&x));
    }
    let mut names = Vec::new();
    let mut stack = vec![x.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                names.push(e.path());
            }
        }
    }
    let mut out = BTreeMap::new();
    for chunk in names.chunks(500) {
        let o = Command::new("b3sum").args(chunk).output().unwrap();
        assert!(o.status.success(), "b3sum: {}", stderr(&o));
        // One line per file, in argument order; a name with a newline or backslash is escaped
        // and its line starts with a backslash, before the hash.
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), chunk.len(), "b3sum: one line per file");
        for (line, path) in lines.iter().zip(chunk) {
            let hash = line.trim_start_matches('\\')[..64].to_owned();
            let rel = path
                .strip_prefix(&x)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.insert(rel, hash);
        }
    }
    out
}

#[test]
fn every_member_through_the_mount_equals_extraction_in_every_format() {
    if !require_fuse()
        || !["tar", "pzstd", "xz", "zip", "python3", "b3sum"]
            .iter()
            .all(|t| common::require_tool(t))
    {
        return;
    }
    let a = Archives::new();
    for name in [
        "data.tar",
        "data.tar.gz",
        "data.tar.zst",
        // bzip2 (a block codec read as xz is, ~10 MB/s to make) is in the library's tests and
        // bench/archive.sh, which checks every member it reads against the extraction.
        "data.tar.xz",
        "data.zip",
    ] {
        let archive = a.make(name);
        let dir = format!("mnt-{name}");
        let out = a.mount(&[&archive], &dir);
        assert!(out.status.success(), "mount {name}: {}", stderr(&out));
        assert!(stderr(&out).contains("indexed"), "{}", stderr(&out));
        let mnt = a.root().join(&dir);
        // Members in archive order, as a streaming loader reads them (out of order, a compressed
        // stream decodes from the access point before each member; the library's tests read at
        // random offsets, and the next test reads random members).
        let order: Vec<String> = roar_archive::scan::scan(&archive, &|_| {})
            .unwrap()
            .members
            .iter()
            .filter(|m| m.kind == roar_archive::Kind::File)
            .map(|m| String::from_utf8(m.path.clone()).unwrap())
            .collect();
        assert_eq!(
            order.iter().collect::<BTreeSet<_>>(),
            a.files.keys().collect::<BTreeSet<_>>(),
            "{name}: members"
        );
        // Bytes: every file read back through the mount (by this test's process).
        for rel in &order {
            let got =
                std::fs::read(mnt.join(rel)).unwrap_or_else(|e| panic!("{name}: {rel:?}: {e}"));
            assert!(
                got == a.files[rel],
                "{name}: {rel:?} differs from the file archived"
            );
        }
        assert_eq!(
            std::fs::read_link(mnt.join("shard-00/link")).unwrap(),
            Path::new("../odd/with space.txt"),
            "{name}: symlink"
        );
        let listed = walk(&mnt);
        let want: BTreeSet<String> = a
            .files
            .keys()
            .cloned()
            .chain(["shard-00/link".to_owned()])
            .collect();
        assert_eq!(listed, want, "{name}: the tree listed through the mount");
        // Hashes: one job reads every member; each recorded hash equals b3sum of extraction.
        let list = a.root().join(format!("order-{name}"));
        let mut nul = Vec::new();
        for rel in &order {
            nul.extend_from_slice(format!("{dir}/{rel}").as_bytes());
            nul.push(0);
        }
        std::fs::write(&list, nul).unwrap();
        let script = format!("xargs -0 cat < '{}' > /dev/null", list.display());
        a.sh(&script);
        a.unmount(&dir);
        let job = a.job_with_script(&script);
        let recorded = inputs(&job);
        let b3 = b3sum_of_extraction(&archive, &a.root());
        let prefix = format!("{}!/", archive.display());
        let members: BTreeMap<String, String> = recorded
            .iter()
            .filter_map(|(p, h)| p.strip_prefix(&prefix).map(|m| (m.to_owned(), h.clone())))
            .collect();
        assert_eq!(
            members.len(),
            a.files.len(),
            "{name}: every member read is recorded"
        );
        for (m, h) in &members {
            assert_eq!(
                Some(h),
                b3.get(m),
                "{name}: {m:?} hash vs b3sum of the extracted file"
            );
        }
        // And the archive itself, the version the members came from.
        let whole = blake3::hash(&std::fs::read(&archive).unwrap())
            .to_hex()
            .to_string();
        assert_eq!(
            recorded.get(&archive.display().to_string()),
            Some(&whole),
            "{name}"
        );
        assert_eq!(recorded.len(), a.files.len() + 1, "{name}: nothing else");
    }
}

fn walk(root: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut stack = vec![root.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                stack.push(e.path());
            } else {
                out.insert(
                    e.path()
                        .strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    out
}

#[test]
fn jobs_record_exactly_the_members_they_read_under_the_mount_and_every_backend() {
    if !require_fuse() {
        return;
    }
    let a = Archives::new();
    let archive = a.make("shards.tar.gz");
    let out = a.mount(&[&archive], "mnt");
    assert!(out.status.success(), "{}", stderr(&out));
    let names: Vec<&String> = a.files.keys().filter(|k| k.starts_with("shard-")).collect();
    let mut backends = vec!["mount", "preload", "ptrace"];
    if common::ebpf_available() {
        backends.push("ebpf");
    }
    let mut sample = String::new();
    for (k, backend) in backends.iter().enumerate() {
        let mut rng = Rng(77 + k as u64);
        let mut picked = BTreeSet::new();
        while picked.len() < 100 {
            picked.insert(names[rng.below(names.len() as u64) as usize].clone());
        }
        let list: Vec<String> = picked.iter().map(|n| format!("'mnt/{n}'")).collect();
        let script = format!("cat {} > model-{backend}.bin", list.join(" "));
        sample = picked.first().unwrap().to_string();
        let job = if *backend == "mount" {
            a.sh(&script);
            None
        } else {
            let out =
                a.p.roar(["run", "--tracer", backend, "--", "sh", "-c", &script]);
            assert!(out.status.success(), "{backend}: {}", stderr(&out));
            Some(a.p.last_job())
        };
        let want: BTreeMap<String, String> = picked
            .iter()
            .map(|n| {
                (
                    format!("{}!/{n}", archive.display()),
                    blake3::hash(&a.files[n]).to_hex().to_string(),
                )
            })
            .chain([(
                archive.display().to_string(),
                blake3::hash(&std::fs::read(&archive).unwrap())
                    .to_hex()
                    .to_string(),
            )])
            .collect();
        if let Some(job) = job {
            assert_eq!(inputs(&job), want, "{backend}: the job's inputs");
            // Lineage of what the job made goes through the members.
            let out =
                a.p.roar(["lineage", &format!("model-{backend}.bin"), "--json"]);
            assert!(out.status.success(), "{}", stderr(&out));
            let text = String::from_utf8_lossy(&out.stdout);
            for m in picked.iter().take(5) {
                assert!(
                    text.contains(
                        &serde_json::to_string(&format!("{}!/{m}", archive.display())).unwrap()
                            [1..]
                    ),
                    "{backend}: lineage lacks {m}"
                );
            }
        } else {
            a.unmount("mnt");
            let job = a.job_with_script(&script);
            assert_eq!(inputs(&job), want, "mount: the job's inputs");
            let out = a.mount(&[&archive], "mnt");
            assert!(out.status.success(), "{}", stderr(&out));
        }
    }
    // Which jobs read this sample: `roar show ARCHIVE!/member`, relative to the project too.
    a.unmount("mnt");
    let out = a.p.roar(["show", &format!("shards.tar.gz!/{sample}")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("input") && text.contains("model-"),
        "the last job read it: {text}"
    );
}

#[test]
fn the_index_is_reused_across_mounts_and_rebuilt_when_the_archive_changes() {
    if !require_fuse() {
        return;
    }
    let a = Archives::new();
    let archive = a.make("d.tar");
    let first = a.mount(&[&archive], "mnt");
    assert!(stderr(&first).contains("indexed"), "{}", stderr(&first));
    // A traced job makes out.txt from one member.
    let out = a.p.roar([
        "run",
        "--",
        "sh",
        "-c",
        "cat 'mnt/odd/with space.txt' > out.txt",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // A job reading the archive file itself and a member: the archive is one input, not two.
    let script = "cat d.tar 'mnt/odd/with space.txt' > /dev/null";
    let out = a.p.roar(["run", "--", "sh", "-c", script]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job = a.p.last_job();
    let paths: Vec<&str> = job["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["role"] == "input")
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths.len(), 2, "{paths:?}");
    assert!(
        paths
            .iter()
            .any(|p| p.ends_with("d.tar!/odd/with space.txt")),
        "{paths:?}"
    );
    a.unmount("mnt");
    let again = a.mount(&[&archive], "mnt");
    assert!(again.status.success());
    assert!(
        !stderr(&again).contains("indexed"),
        "reused: {}",
        stderr(&again)
    );
    a.unmount("mnt");
    // The archive changes: a member rewritten (appended later, as `tar -r` does) and a new one.
    std::fs::write(a.src.join("odd/with space.txt"), b"changed\n").unwrap();
    std::fs::write(a.src.join("added.txt"), b"new\n").unwrap();
    run(Command::new("tar")
        .arg("-rf")
        .arg(&archive)
        .arg("odd/with space.txt")
        .arg("added.txt")
        .current_dir(&a.src));
    let third = a.mount(&[&archive], "mnt");
    assert!(
        stderr(&third).contains("indexed"),
        "rebuilt: {}",
        stderr(&third)
    );
    let mnt = a.root().join("mnt");
    assert_eq!(
        std::fs::read(mnt.join("odd/with space.txt")).unwrap(),
        b"changed\n"
    );
    assert_eq!(std::fs::read(mnt.join("added.txt")).unwrap(), b"new\n");
    a.unmount("mnt");
    // What the job made from the old member is stale, by that member.
    let status = String::from_utf8_lossy(&a.p.roar(["status"]).stdout).into_owned();
    let stale = status.split("untracked").next().unwrap();
    assert!(
        stale.contains("stale")
            && stale.contains("out.txt")
            && stale.contains("d.tar!/odd/with space.txt modified"),
        "{stale}"
    );
}

#[test]
fn several_archives_are_one_tree_and_the_last_one_wins() {
    if !require_fuse() {
        return;
    }
    let p = Project::new();
    let root = std::fs::canonicalize(p.path()).unwrap();
    for (name, files) in [
        (
            "one",
            vec![("common.txt", "from one"), ("only1/a.txt", "a")],
        ),
        (
            "two",
            vec![("common.txt", "from two"), ("only2/b.txt", "b")],
        ),
    ] {
        let d = root.join(name);
        for (f, c) in files {
            std::fs::create_dir_all(d.join(f).parent().unwrap()).unwrap();
            std::fs::write(d.join(f), c).unwrap();
        }
        run(Command::new("tar")
            .arg("-czf")
            .arg(root.join(format!("{name}.tgz")))
            .arg(".")
            .current_dir(&d));
    }
    let out = p.roar(["mount", "one.tgz", "two.tgz", "u"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let u = root.join("u");
    assert_eq!(
        std::fs::read_to_string(u.join("common.txt")).unwrap(),
        "from two"
    );
    assert_eq!(std::fs::read_to_string(u.join("only1/a.txt")).unwrap(), "a");
    assert_eq!(std::fs::read_to_string(u.join("only2/b.txt")).unwrap(), "b");
    // Read-only: nothing can be written, made or removed.
    assert!(std::fs::write(u.join("new.txt"), b"x").is_err());
    assert!(std::fs::remove_file(u.join("common.txt")).is_err());
    let list: serde_json::Value =
        serde_json::from_slice(&p.roar(["mount", "--list", "--json"]).stdout).unwrap();
    assert_eq!(list[0]["archives"].as_array().unwrap().len(), 2);
    let out = p.roar(["unmount", "u"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn bad_archives_and_mount_points_are_refused_in_one_line() {
    if !require_fuse() {
        return;
    }
    let p = Project::new();
    p.write("notes.txt", b"not an archive\n");
    p.write("full/x", b"x");
    run(Command::new("tar")
        .arg("-cf")
        .arg(p.path().join("ok.tar"))
        .arg("notes.txt")
        .current_dir(p.path()));
    // Damaged: compressed archives cut short, and a tar whose first header is valid and whose
    // second is control characters and invalid UTF-8 (what the reader says may quote them).
    for (name, flag) in [("damaged.tar.xz", "-J"), ("damaged.tar.bz2", "-j")] {
        let made = p.path().join(name);
        run(Command::new("tar")
            .arg(flag)
            .arg("-cf")
            .arg(&made)
            .arg("notes.txt")
            .current_dir(p.path()));
        let bytes = std::fs::read(&made).unwrap();
        std::fs::write(&made, &bytes[..bytes.len() * 2 / 3]).unwrap();
    }
    // Damaged inside: a byte in the middle of a bzip2 block changed (roar's own decoder reads it).
    let flipped = p.path().join("flipped.tar.bz2");
    run(Command::new("tar")
        .arg("-jcf")
        .arg(&flipped)
        .arg("notes.txt")
        .current_dir(p.path()));
    let mut bytes = std::fs::read(&flipped).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x5a;
    std::fs::write(&flipped, bytes).unwrap();
    let mut garbage = std::fs::read(p.path().join("ok.tar")).unwrap();
    garbage.truncate(1024);
    let mut bad: Vec<u8> = (0..512u32)
        .map(|i| [0x1b, 0x07, 0xff, b'\n'][i as usize % 4])
        .collect();
    bad[148..156].copy_from_slice(b"0000000\0");
    garbage.extend(bad);
    garbage.extend(vec![0u8; 1024]);
    std::fs::write(p.path().join("garbage.tar"), garbage).unwrap();
    run(Command::new("mkfifo").arg(p.path().join("pipe")));
    for (args, says) in [
        (
            vec!["mount", "notes.txt", "m"],
            "not an archive roar can mount",
        ),
        (vec!["mount", "missing.tar", "m"], "cannot read"),
        (vec!["mount", "ok.tar", "full"], "not empty"),
        (vec!["mount", "pipe", "m"], "neither a file nor a folder"),
        (vec!["mount", "ok.tar", ".", "m"], "inside"),
        (vec!["mount", "ok.tar"], "roar mount ARCHIVE DIR"),
        (vec!["mount", "damaged.tar.xz", "m"], "is damaged"),
        (vec!["mount", "damaged.tar.bz2", "m"], "is damaged"),
        (vec!["mount", "flipped.tar.bz2", "m"], "is damaged"),
        (vec!["mount", "garbage.tar", "m"], "is damaged"),
    ] {
        let out = p.roar(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = stderr(&out);
        assert!(err.contains(says), "{args:?}: {err}");
        assert_eq!(
            err.trim_end().lines().count(),
            1,
            "{args:?}: one line: {err}"
        );
        assert!(
            !err.trim_end()
                .chars()
                .any(|c| c.is_control() || c == '\u{fffd}'),
            "{args:?}: printable: {err:?}"
        );
    }
}

/// Runs `sh -c script` in `dir` as its own process group (a command line of an interactive
/// shell): one job of a mount it reads through.
fn sh_job(dir: &Path, script: &str) {
    let st = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .process_group(0)
        .status()
        .unwrap();
    assert!(st.success(), "{script}");
}

/// The job the mount recorded (not `roar run`) for a shell that ran `script`.
fn mount_job(p: &Project, script: &str) -> serde_json::Value {
    let log: serde_json::Value =
        serde_json::from_slice(&p.roar(["log", "--json", "-n", "0"]).stdout).unwrap();
    log.as_array()
        .unwrap()
        .iter()
        .filter(|j| j["argv"].as_array().and_then(|a| a.last()) == Some(&script.into()))
        .map(|j| p.job_json(j["id"].as_i64().unwrap()))
        .find(|job| job["backend"] == "mount")
        .unwrap_or_else(|| panic!("no mount job ran {script:?}: {log:#}"))
}

/// Files by path.
type Contents = BTreeMap<String, Vec<u8>>;

/// Makes `data.tar.gz` in the project: a tar, a zip and (inside `deep/mid.tar`) a multi-block
/// tar.xz of the files of `in/`, a tar listing `f.txt` three times, and a text named `fake.tar`.
/// Returns what the nested archives hold (path -> content) and the bytes of each inner archive.
fn nested_dataset(root: &Path, changed: &str) -> (Contents, BTreeMap<&'static str, Vec<u8>>) {
    let src = root.join("nest-src");
    let outer = root.join("nest-outer");
    let _ = std::fs::remove_dir_all(&src);
    let _ = std::fs::remove_dir_all(&outer);
    std::fs::create_dir_all(outer.join("deep")).unwrap();
    let mut rng = Rng(0x0063_5eed);
    let mut files = BTreeMap::new();
    for i in 0..24 {
        let name = match i % 3 {
            0 => format!("in/{i:02} späce.bin"),
            1 => format!("in/sub/{i:02}\nnl"),
            _ => format!("in/{i:02}.dat"),
        };
        let size = if i % 5 == 0 {
            400_000
        } else {
            rng.below(20_000) as usize
        };
        let mut content: Vec<u8> = (0..size).map(|_| (rng.next() % 9) as u8 + b'a').collect();
        if name == changed {
            content.extend_from_slice(b"changed");
        }
        let p = src.join(&name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, &content).unwrap();
        files.insert(name, content);
    }
    let tar = |out: &Path, flags: &[&str], dir: &Path, what: &str| {
        run(Command::new("tar")
            .args(flags)
            .arg("-cf")
            .arg(out)
            .arg(what)
            .current_dir(dir));
    };
    tar(&outer.join("inner.tar"), &[], &src, "in");
    run(Command::new("zip")
        .args(["-q", "-r"])
        .arg(outer.join("inner.zip"))
        .arg("in")
        .current_dir(&src));
    let txz = root.join("inner.tar.xz");
    tar(&txz, &["-I", "xz -0 -T2 --block-size=128KiB"], &src, "in");
    tar(&outer.join("deep/mid.tar"), &[], root, "inner.tar.xz");
    for (k, v) in ["one\n", "two\n", "three\n"].iter().enumerate() {
        std::fs::write(src.join("f.txt"), v).unwrap();
        let flag = if k == 0 { "-cf" } else { "-rf" };
        run(Command::new("tar")
            .arg(flag)
            .arg(outer.join("dup.tar"))
            .arg("f.txt")
            .current_dir(&src));
    }
    std::fs::write(outer.join("fake.tar"), b"a text, not a tar\n").unwrap();
    tar(&root.join("data.tar.gz"), &["-z"], &outer, ".");
    let made = [
        ("inner.tar", outer.join("inner.tar")),
        ("inner.zip", outer.join("inner.zip")),
        ("deep/mid.tar", outer.join("deep/mid.tar")),
        ("inner.tar.xz", txz),
        ("dup.tar", outer.join("dup.tar")),
    ]
    .into_iter()
    .map(|(k, p)| (k, std::fs::read(p).unwrap()))
    .collect();
    (files, made)
}

#[test]
fn archives_inside_archives_and_earlier_versions_read_and_record_through_every_level() {
    if !require_fuse() || !["tar", "zip", "xz"].iter().all(|t| common::require_tool(t)) {
        return;
    }
    let p = Project::new();
    let root = std::fs::canonicalize(p.path()).unwrap();
    let (files, made) = nested_dataset(&root, "");
    let out = p.roar(["mount", "--recursive", "data.tar.gz", "mnt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("fake.tar stays a file") && said.contains("indexed"),
        "{said}"
    );
    let mnt = root.join("mnt");
    let levels = ["inner.tar", "inner.zip", "deep/mid.tar/inner.tar.xz"];
    // The tree: every level's files, the text named like a tar, the file listed three times
    // once (its versions are not listed).
    let want: BTreeSet<String> = (levels.iter())
        .flat_map(|l| files.keys().map(move |f| format!("{l}/{f}")))
        .chain(["fake.tar".into(), "dup.tar/f.txt".into()])
        .collect();
    assert_eq!(walk(&mnt), want);
    for l in levels {
        for (f, content) in &files {
            let got = std::fs::read(mnt.join(l).join(f)).unwrap();
            assert!(got == *content, "{l}/{f:?} differs from the file archived");
        }
    }
    // And as the tools extract them, level by level.
    let x = |script: &str| {
        let o = Command::new("sh")
            .args(["-c", script])
            .current_dir(&root)
            .output()
            .unwrap();
        assert!(o.status.success(), "{script}: {}", stderr(&o));
        o.stdout
    };
    assert_eq!(
        std::fs::read(mnt.join("inner.tar/in/02.dat")).unwrap(),
        x("tar -xOzf data.tar.gz ./inner.tar | tar -xOf - in/02.dat")
    );
    assert_eq!(
        std::fs::read(mnt.join("deep/mid.tar/inner.tar.xz/in/05.dat")).unwrap(),
        x("tar -xOzf data.tar.gz ./deep/mid.tar | tar -xOf - inner.tar.xz | tar -xOJf - in/05.dat")
    );
    assert_eq!(
        std::fs::read(mnt.join("fake.tar")).unwrap(),
        b"a text, not a tar\n"
    );
    for (k, v) in ["one\n", "two\n", "three\n"].iter().enumerate() {
        let at = mnt.join(format!("dup.tar/f.txt.versions/{}", k + 1));
        assert_eq!(std::fs::read_to_string(at).unwrap(), *v);
    }
    assert_eq!(
        std::fs::read_to_string(mnt.join("dup.tar/f.txt")).unwrap(),
        "three\n"
    );

    // A job reads one file of each level and the oldest version: each is recorded by the name
    // it has through every level, with every enclosing archive's version — under the mount's
    // own attribution and under `roar run`.
    let read = [
        "inner.tar/in/02.dat",
        "inner.zip/in/sub/01\nnl",
        "deep/mid.tar/inner.tar.xz/in/05.dat",
        "dup.tar/f.txt.versions/1",
    ];
    let top = root.join("data.tar.gz").display().to_string();
    let b3 = |b: &[u8]| blake3::hash(b).to_hex().to_string();
    let want: BTreeMap<String, String> = [
        (
            format!("{top}!/inner.tar!/in/02.dat"),
            b3(&files["in/02.dat"]),
        ),
        (format!("{top}!/inner.tar"), b3(&made["inner.tar"])),
        (
            format!("{top}!/inner.zip!/in/sub/01\nnl"),
            b3(&files["in/sub/01\nnl"]),
        ),
        (format!("{top}!/inner.zip"), b3(&made["inner.zip"])),
        (
            format!("{top}!/deep/mid.tar!/inner.tar.xz!/in/05.dat"),
            b3(&files["in/05.dat"]),
        ),
        (
            format!("{top}!/deep/mid.tar!/inner.tar.xz"),
            b3(&made["inner.tar.xz"]),
        ),
        (format!("{top}!/deep/mid.tar"), b3(&made["deep/mid.tar"])),
        (format!("{top}!/dup.tar!/f.txt.versions/1"), b3(b"one\n")),
        (format!("{top}!/dup.tar"), b3(&made["dup.tar"])),
        (top.clone(), b3(&std::fs::read(&top).unwrap())),
    ]
    .into_iter()
    .collect();
    let quoted: Vec<String> = read.iter().map(|r| format!("'mnt/{r}'")).collect();
    let script = format!("cat {} > /dev/null", quoted.join(" "));
    let out = p.roar(["run", "--", "sh", "-c", &script]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(inputs(&p.last_job()), want, "roar run: the job's inputs");
    sh_job(&root, &script);
    let out = p.roar(["unmount", "mnt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        inputs(&mount_job(&p, &script)),
        want,
        "mount: the job's inputs"
    );

    // `roar status` follows the levels: nothing changed, then one file inside inner.tar did.
    let status = |p: &Project| -> BTreeSet<String> {
        let out = p.roar(["status", "--json"]);
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr(&out)));
        v["changed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["path"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(status(&p), BTreeSet::new());
    nested_dataset(&root, "in/02.dat");
    let changed = status(&p);
    let rel = |s: &str| {
        s.strip_prefix(&format!("{}/", root.display()))
            .unwrap_or(s)
            .to_owned()
    };
    let changed: BTreeSet<String> = changed.iter().map(|c| rel(c)).collect();
    // The changed file and every archive that holds it (each level holds in/02.dat); not the
    // other files read, at any level.
    for must in [
        "data.tar.gz",
        "data.tar.gz!/inner.tar",
        "data.tar.gz!/inner.tar!/in/02.dat",
        "data.tar.gz!/inner.zip",
        "data.tar.gz!/deep/mid.tar",
        "data.tar.gz!/deep/mid.tar!/inner.tar.xz",
    ] {
        assert!(changed.contains(must), "{must} not in {changed:?}");
    }
    for unchanged in [
        "data.tar.gz!/inner.zip!/in/sub/01\nnl",
        "data.tar.gz!/deep/mid.tar!/inner.tar.xz!/in/05.dat",
        "data.tar.gz!/dup.tar!/f.txt.versions/1",
    ] {
        assert!(!changed.contains(unchanged), "{unchanged:?} in {changed:?}");
    }
}

#[test]
fn a_union_of_archives_and_folders_says_where_each_file_came_from() {
    if !require_fuse() {
        return;
    }
    let p = Project::new();
    let root = std::fs::canonicalize(p.path()).unwrap();
    let layer = |name: &str, files: &[(&str, &str)]| {
        let d = root.join(name);
        for (f, c) in files {
            std::fs::create_dir_all(d.join(f).parent().unwrap()).unwrap();
            std::fs::write(d.join(f), c).unwrap();
        }
        d
    };
    for (name, files) in [
        (
            "one",
            &[("common.txt", "from one"), ("only1/a.txt", "a")][..],
        ),
        (
            "two",
            &[("only3/c.txt", "c from two"), ("only2/b.txt", "b")][..],
        ),
    ] {
        let d = layer(name, files);
        run(Command::new("tar")
            .arg("-czf")
            .arg(root.join(format!("{name}.tgz")))
            .arg(".")
            .current_dir(&d));
    }
    let extra = layer(
        "extra",
        &[
            ("common.txt", "from the folder"),
            ("only3/c.txt", "c from the folder"),
        ],
    );
    std::os::unix::fs::symlink("common.txt", extra.join("link")).unwrap();
    let pack = layer("pack", &[("p.txt", "packed")]);
    run(Command::new("tar")
        .arg("-cf")
        .arg(extra.join("pack.tar"))
        .arg("p.txt")
        .current_dir(&pack));
    // Later wins: the folder over one.tgz, two.tgz over the folder.
    let out = p.roar(["mount", "one.tgz", "extra", "two.tgz", "u"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let u = root.join("u");
    let read = |rel: &str| std::fs::read_to_string(u.join(rel)).unwrap();
    assert_eq!(read("common.txt"), "from the folder");
    assert_eq!(read("only3/c.txt"), "c from two");
    assert_eq!(read("only1/a.txt"), "a");
    assert_eq!(read("link"), "from the folder");
    assert_eq!(
        std::fs::read_link(u.join("link")).unwrap(),
        Path::new("common.txt")
    );
    assert!(
        std::fs::write(u.join("common.txt"), b"x").is_err(),
        "read-only"
    );
    assert!(
        std::fs::write(u.join("new.txt"), b"x").is_err(),
        "read-only"
    );
    assert!(
        u.join("pack.tar").is_file(),
        "an archive in a folder is a file"
    );

    // Each input is named by where it came from: the folder's file by its own path.
    let b3 = |s: &str| blake3::hash(s.as_bytes()).to_hex().to_string();
    let archive = |name: &str| {
        let a = root.join(name);
        (
            a.display().to_string(),
            blake3::hash(&std::fs::read(&a).unwrap())
                .to_hex()
                .to_string(),
        )
    };
    let expect = |common: &str| -> BTreeMap<String, String> {
        [
            (extra.join("common.txt").display().to_string(), b3(common)),
            (
                format!("{}!/only3/c.txt", root.join("two.tgz").display()),
                b3("c from two"),
            ),
            archive("two.tgz"),
            (
                format!("{}!/only1/a.txt", root.join("one.tgz").display()),
                b3("a"),
            ),
            archive("one.tgz"),
        ]
        .into_iter()
        .collect()
    };
    let script = "cat u/common.txt u/only3/c.txt u/only1/a.txt > /dev/null";
    let out = p.roar(["run", "--", "sh", "-c", script]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(inputs(&p.last_job()), expect("from the folder"), "roar run");
    // The folder's file changes while mounted: the next read sees it and records its new hash,
    // under the mount's own attribution too.
    std::fs::write(extra.join("common.txt"), "changed in the folder!").unwrap();
    // Its attributes are asked again within a second (FOLDER_TTL): the new size shows then.
    assert!(
        common::wait_for(std::time::Duration::from_secs(10), || {
            read("common.txt") == "changed in the folder!"
        }),
        "the folder's changed file read through the mount: {:?}",
        read("common.txt")
    );
    let out = p.roar(["run", "--", "sh", "-c", script]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        inputs(&p.last_job()),
        expect("changed in the folder!"),
        "roar run, after"
    );
    sh_job(&root, script);
    let out = p.roar(["unmount", "u"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        inputs(&mount_job(&p, script)),
        expect("changed in the folder!"),
        "mount"
    );

    // With --recursive, an archive among the folder's files is a directory whose members are
    // named through it.
    let out = p.roar(["mount", "--recursive", "extra", "u"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(read("pack.tar/p.txt"), "packed");
    let out = p.roar(["run", "--", "cat", "u/pack.tar/p.txt"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let tar = extra.join("pack.tar");
    let want: BTreeMap<String, String> = [
        (format!("{}!/p.txt", tar.display()), b3("packed")),
        (
            tar.display().to_string(),
            blake3::hash(&std::fs::read(&tar).unwrap())
                .to_hex()
                .to_string(),
        ),
    ]
    .into_iter()
    .collect();
    assert_eq!(
        inputs(&p.last_job()),
        want,
        "a member of an archive in a folder"
    );
    let out = p.roar(["unmount", "u"]);
    assert!(out.status.success(), "{}", stderr(&out));
}
