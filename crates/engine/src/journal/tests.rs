use super::codec::frame;
use super::*;
use roar_store::job_bytes::Bytes;
use roar_store::FileStat;
use std::ffi::OsString;

fn stat() -> FileStat {
    FileStat {
        dev: 7,
        ino: 99,
        size: 3,
        mtime_ns: -5,
        ctime_ns: 1 << 40,
    }
}

fn hash(b: &str) -> ContentHash {
    ContentHash {
        blake3: b.into(),
        sha256: Some("s".into()),
        size: 12,
    }
}

/// One record of every kind, every event kind among them, with bytes that are not UTF-8.
fn every_record() -> Vec<Record> {
    use std::os::unix::ffi::OsStringExt;
    let odd = PathBuf::from(OsString::from_vec(b"/w/\xff\nname".to_vec()));
    let p = |s: &str| PathBuf::from(s);
    let events = vec![
        Event::Exec {
            pid: 1,
            ppid: 0,
            exe: p("/bin/sh"),
            argv: vec!["sh".into(), OsString::from_vec(vec![0xfe]), "".into()],
            cwd: odd.clone(),
            stdio: [Some((1, 2)), None, Some((3, 4))],
            pipes: [None, Some((5, 6)), None],
            ts_ns: 10,
        },
        Event::Fork {
            pid: 2,
            ppid: 1,
            ts_ns: 11,
        },
        Event::Exit { pid: 2, ts_ns: 12 },
        Event::Open {
            pid: 1,
            path: odd.clone(),
            flags: libc::O_WRONLY | libc::O_CREAT,
            stat: Some(stat()),
            ts_ns: 13,
        },
        Event::Open {
            pid: 1,
            path: p("/a"),
            flags: 0,
            stat: None,
            ts_ns: 14,
        },
        Event::Rename {
            pid: 1,
            from: p("/a"),
            to: p("/b"),
            ts_ns: 15,
        },
        Event::Link {
            pid: 1,
            from: p("/b"),
            to: p("/c"),
            ts_ns: 16,
        },
        Event::Exchange {
            pid: 1,
            a: p("/b"),
            b: p("/c"),
            ts_ns: 17,
        },
        Event::Unlink {
            pid: 1,
            path: p("/c"),
            ts_ns: 18,
        },
        Event::Truncate {
            pid: 1,
            path: p("/b"),
            ts_ns: 19,
        },
        Event::Mkdir {
            pid: 1,
            path: p("/d"),
            ts_ns: 20,
        },
        Event::Rmdir {
            pid: 1,
            path: p("/d"),
            ts_ns: 21,
        },
        Event::Symlink {
            pid: 1,
            path: p("/s"),
            ts_ns: 22,
        },
        Event::Untraced {
            pid: 1,
            path: p("/static"),
            why: "statically linked",
            ts_ns: 23,
        },
    ];
    let fact = Fact {
        file: (7, 99),
        content: hash("ab"),
        mark: 4,
    };
    let job = JobRecord {
        name: Some("train".into()),
        argv: vec!["python".into(), "t.py".into()],
        cwd: p("/w"),
        started_ns: 5,
        ended_ns: None,
        outcome: roar_store::Outcome::Running,
        incomplete: false,
        backend: "preload".into(),
        git: None,
        env: Default::default(),
        host: Some("h".into()),
        processes: Vec::new(),
        steps: Vec::new(),
        files: Vec::new(),
        environment: None,
        uid: Some("u1".into()),
        dist: None,
    };
    let mut out = vec![
        Record::Job(Box::new(job)),
        Record::Ring {
            ring: p("/dev/shm/r"),
            late: p("/dev/shm/r.late"),
        },
        Record::RingPos(1 << 33),
        Record::CtimeFloor(-1),
        Record::Found {
            path: odd,
            fact: fact.clone(),
            ts: 3,
        },
        Record::FoundIn(fact),
        Record::FoundNamed {
            path: p("s3://b/k"),
            content: hash("cd"),
            mark: 9,
            ts: 5,
        },
        Record::MovedDir {
            from: p("/x"),
            to: p("/y"),
        },
        Record::Holds {
            path: p("/y/g0"),
            holds: true,
        },
        Record::Extra(vec![0, 255, 3]),
        Record::RootGone,
    ];
    out.extend(events.into_iter().map(Record::Event));
    out
}

fn dbg(records: &[Record]) -> String {
    format!("{records:?}")
}

fn framed(records: &[Record]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        frame(r, &mut out);
    }
    out
}

#[test]
fn every_record_reads_back_as_written() {
    let records = every_record();
    let (back, torn) = parse(&framed(&records));
    assert_eq!(torn, 0);
    assert_eq!(dbg(&back), dbg(&records));
}

#[test]
fn a_record_cut_anywhere_ends_the_journal_before_it() {
    let records = every_record();
    let bytes = framed(&records);
    let ends: Vec<usize> = (0..=records.len())
        .map(|n| framed(&records[..n]).len())
        .collect();
    for cut in 0..bytes.len() {
        let (back, torn) = parse(&bytes[..cut]);
        let whole = ends.iter().rposition(|e| *e <= cut).unwrap();
        assert_eq!(dbg(&back), dbg(&records[..whole]), "cut at {cut}");
        assert_eq!(torn, cut - ends[whole]);
    }
}

#[test]
fn a_damaged_byte_ends_the_journal_at_its_record() {
    let records = every_record();
    let bytes = framed(&records);
    let first = framed(&records[..1]).len();
    for at in [0, 4, 8, first - 1] {
        let mut bad = bytes.clone();
        bad[at] ^= 0x40;
        assert!(parse(&bad).0.is_empty(), "damage at {at}");
    }
    let mut bad = bytes.clone();
    bad[first + 9] ^= 1;
    assert_eq!(dbg(&parse(&bad).0), dbg(&records[..1]));
}

#[test]
fn a_journal_is_an_orphan_only_once_its_writer_let_go() {
    let dir = tempfile::tempdir().unwrap();
    let jdir = dir.path().join("journal");
    let j = Journal::create(&jdir, "job1", Writer::Mount).unwrap();
    j.append(&Policy::default(), &every_record()[..3]).unwrap();
    // Another process's view: a lock taken through another open file description.
    assert!(orphans(&jdir).is_empty(), "its writer still holds it");
    drop(j);
    let found = orphans(&jdir);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].writer, Writer::Mount);
    assert_eq!(dbg(&found[0].records), dbg(&every_record()[..3]));
    assert!(orphans(&jdir).is_empty(), "a recovery holds it");
    found.into_iter().next().unwrap().remove();
    assert!(orphans(&jdir).is_empty());
    assert!(orphans(&dir.path().join("none")).is_empty());
}

#[test]
fn a_file_that_is_not_a_journal_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.journal");
    std::fs::write(&path, b"roarjnl9 something").unwrap();
    let e = open_orphan(&path).unwrap_err();
    assert!(e.to_string().contains("not a roar journal"), "{e}");
}

#[test]
fn a_journal_whose_writer_died_before_its_first_write_is_an_empty_orphan() {
    let dir = tempfile::tempdir().unwrap();
    for (i, bytes) in [&b""[..], b"roar", b"roarjnl1"].iter().enumerate() {
        std::fs::write(dir.path().join(format!("{i}.journal")), bytes).unwrap();
    }
    let found = orphans(dir.path());
    assert_eq!(found.len(), 3);
    assert!(found.iter().all(|o| o.records.is_empty()));
}

/// A seeded random call into the rule, over a few paths and files.
fn random_call(x: &mut u64, rules: &Rules) -> Record {
    let mut next = |n: u64| {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x % n
    };
    let paths = ["/w/a", "/w/b", "/w/d/c", "/w/d/e", "/w/f.tmp"];
    let path = PathBuf::from(paths[next(paths.len() as u64) as usize]);
    let other = PathBuf::from(paths[next(paths.len() as u64) as usize]);
    let ts = next(1000) as i64;
    let fact = |n: &mut dyn FnMut(u64) -> u64| Fact {
        file: (7, 1 + n(4)),
        content: hash(&format!("h{}", n(6))),
        mark: rules.mark().saturating_sub(n(3)),
    };
    match next(11) {
        9 => Record::Holds {
            path,
            holds: next(2) == 0,
        },
        0 => Record::Event(Event::Open {
            pid: 1,
            path,
            flags: libc::O_RDONLY,
            stat: None,
            ts_ns: ts,
        }),
        1 => Record::Event(Event::Open {
            pid: 1,
            path,
            flags: libc::O_WRONLY
                | libc::O_CREAT
                | [0, libc::O_TRUNC, libc::O_APPEND][next(3) as usize],
            stat: Some(FileStat {
                ino: 1 + next(4),
                ..stat()
            }),
            ts_ns: ts,
        }),
        2 => Record::Event(Event::Rename {
            pid: 1,
            from: path,
            to: other,
            ts_ns: ts,
        }),
        3 => Record::Event(Event::Link {
            pid: 1,
            from: path,
            to: other,
            ts_ns: ts,
        }),
        4 => Record::Event(Event::Unlink {
            pid: 1,
            path,
            ts_ns: ts,
        }),
        5 => Record::Event(Event::Truncate {
            pid: 1,
            path,
            ts_ns: ts,
        }),
        6 => Record::Found {
            path,
            fact: fact(&mut next),
            ts,
        },
        7 => Record::FoundIn(fact(&mut next)),
        8 => Record::FoundNamed {
            path,
            content: hash(&format!("n{}", next(4))),
            mark: rules.mark(),
            ts,
        },
        _ => Record::MovedDir {
            from: PathBuf::from("/w/d"),
            to: PathBuf::from("/w/g"),
        },
    }
}

fn snapshot(rules: &Rules) -> String {
    // `finish` consumes the rule: a copy made by replaying is not available here, so compare
    // what the rule answers about every path, and its mark.
    let paths = [
        "/w/a", "/w/b", "/w/d/c", "/w/d/e", "/w/f.tmp", "/w/g/c", "/w/g/e",
    ];
    let mut s = format!("mark {}\n", rules.mark());
    for p in paths {
        s += &format!("{p}: {:?}\n", rules.state(Path::new(p)));
    }
    s
}

/// The generator for "a recovered rule is the live one": seeded random calls go through a
/// `Journaled` rule writing a real journal; the journal read back and replayed gives, after every
/// prefix (a kill at any record), the state the live rule had after the same calls — and the
/// same classification at the end. The first prefix that differs is the shortest failing case.
#[test]
fn a_journal_replayed_is_the_live_rule_after_every_call() {
    let dir = tempfile::tempdir().unwrap();
    let (dirs, ignored) = (crate::HashSet::default(), crate::HashSet::default());
    let judge = crate::Judge::Known(&ignored);
    let cx = Context {
        dirs: &dirs,
        ctime_floor_ns: 0,
        ignore: &judge,
        ask_filesystem: false,
    };
    for seed in 1..=200u64 {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let journal = Journal::create(dir.path(), &format!("s{seed}"), Writer::Mount).unwrap();
        let path = journal.path().to_owned();
        let mut live = Journaled::new(Some(journal), Policy::default());
        let mut states = Vec::new();
        for _ in 0..60 {
            let call = random_call(&mut x, live.rules());
            live.call(&cx, &call);
            states.push(snapshot(live.rules()));
        }
        let (live_rules, journal) = live.into_parts();
        drop(journal);
        let orphan = open_orphan(&path).unwrap().expect("the writer let go");
        assert_eq!(
            orphan.records.len(),
            states.len(),
            "seed {seed}: every call written"
        );
        let mut replayed = Rules::default();
        for (i, r) in orphan.records.iter().enumerate() {
            assert!(replayed.replay(&cx, r), "seed {seed}: record {i} is a call");
            assert_eq!(
                snapshot(&replayed),
                states[i],
                "seed {seed}: replaying the first {} records differs from the live rule; the calls: {:?}",
                i + 1,
                &orphan.records[..=i]
            );
        }
        assert_eq!(
            format!("{:?}", replayed.finish()),
            format!("{:?}", live_rules.finish()),
            "seed {seed}"
        );
    }
}

/// A journal past the size where it is mapped: every record written before the writer let go
/// reads back (the space allocated ahead is not a torn record), and one that takes it over
/// appends after the last record, not after that space.
#[test]
fn a_big_journal_reads_back_whole_and_is_taken_over_at_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let records: Vec<Record> = (0..3000)
        .map(|i| {
            Record::Event(Event::Open {
                pid: i,
                path: PathBuf::from(format!("/w/file-{i}")),
                flags: libc::O_RDONLY,
                stat: None,
                ts_ns: i64::from(i),
            })
        })
        .collect();
    let j = Journal::create(dir.path(), "big", Writer::Run).unwrap();
    let path = j.path().to_owned();
    // Batches of every size, across the switch to the mapping and its growth.
    let mut i = 0;
    let mut n = 1;
    while i < records.len() {
        let end = (i + n).min(records.len());
        j.append(&Policy::default(), &records[i..end]).unwrap();
        i = end;
        n = n % 7 + 1;
    }
    drop(j);
    let orphan = open_orphan(&path).unwrap().unwrap();
    assert_eq!(orphan.torn, 0);
    assert_eq!(dbg(&orphan.records), dbg(&records));
    drop(orphan);
    let taken = Journal::adopt(&path, std::time::Duration::from_secs(1))
        .unwrap()
        .unwrap();
    taken
        .append(&Policy::default(), &[Record::RootGone])
        .unwrap();
    drop(taken);
    let orphan = open_orphan(&path).unwrap().unwrap();
    assert_eq!(orphan.records.len(), records.len() + 1);
    assert!(matches!(orphan.records.last(), Some(Record::RootGone)));
}

/// A journal an older roar wrote (format 1: blake3 checksums) is still recovered after an upgrade,
/// and its damage is still found.
#[test]
fn a_journal_of_format_1_is_still_read() {
    let records = every_record();
    let mut bytes = MAGIC_V1.to_vec();
    bytes.push(Writer::Mount as u8);
    for r in &records {
        let mut body = Vec::new();
        r.put(&mut body);
        bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&checksum_as(Sum::Blake3, &body).to_le_bytes());
        bytes.extend_from_slice(&body);
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.journal");
    std::fs::write(&path, &bytes).unwrap();
    let found = orphans(dir.path());
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].writer, Writer::Mount);
    assert_eq!(dbg(&found[0].records), dbg(&records));
    drop(found);
    // The same bytes under this format's magic: every checksum is wrong, nothing is read.
    bytes[..MAGIC.len()].copy_from_slice(MAGIC);
    std::fs::write(&path, &bytes).unwrap();
    assert!(orphans(dir.path())[0].records.is_empty());
}

/// Journals made ahead come with fresh uids, each locked by its taker; the ones never taken are
/// gone once the `Ahead` is dropped, and those taken stay until their jobs remove them.
#[test]
fn journals_made_ahead_are_taken_once_and_the_rest_removed() {
    let dir = tempfile::tempdir().unwrap();
    let ahead = Ahead::new(dir.path(), Writer::Mount);
    let taken: Vec<(String, Journal)> = (0..5).map(|_| ahead.take().unwrap()).collect();
    let uids: std::collections::HashSet<&String> = taken.iter().map(|(u, _)| u).collect();
    assert_eq!(uids.len(), 5);
    for (uid, j) in &taken {
        assert_eq!(j.path(), dir.path().join(format!("{uid}.journal")));
    }
    // Give the thread time to make the next one, then stop.
    std::thread::sleep(std::time::Duration::from_millis(50));
    drop(ahead);
    let left = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(left, 5, "only the journals taken are left");
    // Every one taken is its taker's: no recovery can take it while it is held.
    assert!(orphans(dir.path()).is_empty());
    for (_, j) in taken {
        j.remove();
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

/// Recoveries running while journals are made (every `roar` command recovers what it finds):
/// none may take a journal whose writer is alive — before, one running in the instant between a
/// journal's making and its lock took the empty file for a dead writer's and removed it (seen as
/// a killed `roar run` with nothing to recover, in CI).
#[test]
fn a_journal_being_made_is_never_taken_for_an_orphan() {
    let dir = tempfile::tempdir().unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut lost = Vec::new();
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for orphan in orphans(dir.path()) {
                    orphan.remove();
                }
            }
        });
        let mut live = Vec::new();
        for i in 0..2000 {
            let j = Journal::create(dir.path(), &format!("j{i}"), Writer::Run).unwrap();
            if !j.path().exists() {
                lost.push(i);
            }
            live.push(j);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        lost.extend(
            live.iter()
                .enumerate()
                .filter(|(_, j)| !j.path().exists())
                .map(|(i, _)| i),
        );
    });
    assert!(lost.is_empty(), "live journals removed: {lost:?}");
    // A half-made journal (its writer died before renaming it) is passed over, and kept while
    // young.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join(".dead.journal.new"), b"").unwrap();
    assert!(orphans(other.path()).is_empty());
    assert!(other.path().join(".dead.journal.new").exists());
}

#[test]
fn a_journal_is_never_seen_before_it_is_headed() {
    // A writer killed at any moment leaves either nothing or a headed journal under its own
    // name: the directory never shows a file in between (where the filesystem makes unnamed
    // files, as the ones tests run on do).
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let seen = std::thread::scope(|s| {
        let watcher = s.spawn(|| {
            let mut seen = std::collections::BTreeSet::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for e in std::fs::read_dir(dir.path()).unwrap().flatten() {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let headed = std::fs::read(e.path()).is_ok_and(|b| b.len() > MAGIC.len());
                    if !name.ends_with(".journal") || !headed {
                        seen.insert(name);
                    }
                }
            }
            seen
        });
        for i in 0..500 {
            let j = Journal::create(dir.path(), &format!("j{i}"), Writer::Run).unwrap();
            let mode = std::fs::metadata(j.path()).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", j.path().display());
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        watcher.join().unwrap()
    });
    assert!(seen.is_empty(), "seen before it was headed: {seen:?}");
}
