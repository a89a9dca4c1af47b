//! Step attribution on synthetic event streams.

use super::*;
use crate::ignore::Ignore;
use roar_store::{Role, StepContent};

const D: &str = "/nonexistent-roar-steps";

fn p(name: &str) -> PathBuf {
    Path::new(D).join(name)
}

fn exec(pid: i32, ppid: i32, argv: &[&str], ts_ns: i64) -> Event {
    Event::Exec {
        pid,
        ppid,
        exe: PathBuf::from(format!("/usr/bin/{}", argv[0])),
        argv: argv.iter().map(OsString::from).collect(),
        cwd: PathBuf::from(D),
        stdio: [None; 3],
        pipes: [None; 3],
        ts_ns,
    }
}

fn fork(pid: i32, ppid: i32, ts_ns: i64) -> Event {
    Event::Fork { pid, ppid, ts_ns }
}

fn read(pid: i32, name: &str, ts_ns: i64) -> Event {
    Event::Open {
        pid,
        path: p(name),
        flags: libc::O_RDONLY,
        stat: None,
        ts_ns,
    }
}

fn write(pid: i32, name: &str, ts_ns: i64) -> Event {
    Event::Open {
        pid,
        path: p(name),
        flags: libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
        stat: None,
        ts_ns,
    }
}

fn steps_of(events: &[Event], rule: &Rule) -> Vec<StepRecord> {
    let ignore = Ignore::new(&[]);
    let job = collect::classify(events, 0, &ignore);
    steps(events, &job, 0, rule)
}

/// (seq, parent, argv[0]) of each step, and (seq, role, name, from_step, content) per file.
type Files = Vec<(u32, Role, String, Option<u32>, StepContent)>;

fn shape(steps: &[StepRecord]) -> (Vec<(u32, Option<u32>, String)>, Files) {
    let tree = steps
        .iter()
        .map(|s| (s.seq, s.parent, s.argv[0].to_string_lossy().into_owned()))
        .collect();
    let files = steps
        .iter()
        .flat_map(|s| {
            s.files.iter().map(move |f| {
                let name = f.path.file_name().unwrap().to_string_lossy().into_owned();
                (s.seq, f.role, name, f.from_step, f.content)
            })
        })
        .collect();
    (tree, files)
}

#[test]
fn a_script_is_cut_into_its_commands_and_redirections_belong_to_the_command() {
    // bash s.sh: `sort a > b; cat b > c; rm b` (the shell opens each redirection in the child).
    let events = [
        exec(1, 0, &["bash", "s.sh"], 1),
        read(1, "s.sh", 2),
        fork(2, 1, 3),
        write(2, "b", 4),
        exec(2, 1, &["sort", "a"], 5),
        read(2, "a", 6),
        Event::Exit { pid: 2, ts_ns: 7 },
        fork(3, 1, 8),
        write(3, "c", 9),
        exec(3, 1, &["cat", "b"], 10),
        read(3, "b", 11),
        Event::Exit { pid: 3, ts_ns: 12 },
        fork(4, 1, 13),
        exec(4, 1, &["rm", "b"], 14),
        Event::Unlink {
            pid: 4,
            path: p("b"),
            ts_ns: 15,
        },
    ];
    let (tree, files) = shape(&steps_of(&events, &Rule::default()));
    assert_eq!(
        tree,
        [
            (1, None, "bash".into()),
            (2, Some(1), "sort".into()),
            (3, Some(1), "cat".into()),
            (4, Some(1), "rm".into()),
        ]
    );
    use StepContent::*;
    assert_eq!(
        files,
        [
            (1, Role::Input, "s.sh".into(), None, Prior),
            (2, Role::Output, "b".into(), None, Unknown),
            (2, Role::Input, "a".into(), None, Prior),
            (3, Role::Output, "c".into(), None, Final),
            (3, Role::Input, "b".into(), Some(2), Unknown),
            (4, Role::Output, "b".into(), None, Unknown),
        ]
    );
}

#[test]
fn forked_workers_stay_in_their_step_and_non_drivers_do_not_begin_steps() {
    // python train.py with a dataloader worker (fork, no exec): one step, so none recorded.
    let events = [
        exec(1, 0, &["python3", "train.py"], 1),
        fork(2, 1, 2),
        read(2, "shard0", 3),
        read(1, "shard1", 4),
        write(1, "model", 5),
    ];
    assert!(steps_of(&events, &Rule::default()).is_empty());
    // make spawns gcc (vfork: no fork event), gcc runs cc1 and as: all in gcc's step.
    let events = [
        exec(1, 0, &["make"], 1),
        read(1, "Makefile", 2),
        exec(2, 1, &["gcc", "-c", "x.c"], 3),
        fork(3, 2, 4),
        exec(3, 2, &["cc1", "x.c"], 5),
        read(3, "x.c", 6),
        write(3, "x.s", 7),
        Event::Exit { pid: 3, ts_ns: 8 },
        fork(4, 2, 9),
        exec(4, 2, &["as", "x.s"], 10),
        read(4, "x.s", 11),
        write(4, "x.o", 12),
    ];
    let (tree, files) = shape(&steps_of(&events, &Rule::default()));
    assert_eq!(tree, [(1, None, "make".into()), (2, Some(1), "gcc".into())]);
    let names: Vec<(u32, Role, &str)> = files
        .iter()
        .map(|(s, r, n, ..)| (*s, *r, n.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            (1, Role::Input, "Makefile"),
            (2, Role::Input, "x.c"),
            (2, Role::Output, "x.s"),
            (2, Role::Output, "x.o"),
        ]
    );
    // No drivers: every job is one step.
    assert!(steps_of(&events, &Rule::new([])).is_empty());
}

#[test]
fn a_step_with_one_step_below_and_no_files_of_its_own_is_folded_into_it() {
    // make runs `sh -c 'sort a > b'` and `time sh -c 'cat b > c'`; each shell forks its
    // command rather than exec'ing it.
    let events = [
        exec(1, 0, &["make"], 1),
        read(1, "Makefile", 2),
        exec(2, 1, &["sh", "-c", "sort a > b"], 3),
        fork(3, 2, 4),
        write(3, "b", 5),
        exec(3, 2, &["sort", "a"], 6),
        read(3, "a", 7),
        Event::Exit { pid: 3, ts_ns: 8 },
        Event::Exit { pid: 2, ts_ns: 9 },
        exec(4, 1, &["time", "sh", "-c", "cat b > c"], 10),
        fork(5, 4, 11),
        exec(5, 4, &["sh", "-c", "cat b > c"], 12),
        fork(6, 5, 13),
        write(6, "c", 14),
        exec(6, 5, &["cat", "b"], 15),
        read(6, "b", 16),
    ];
    let steps = steps_of(&events, &Rule::default());
    let (tree, files) = shape(&steps);
    assert_eq!(
        tree,
        [
            (1, None, "make".into()),
            (2, Some(1), "sh".into()),
            (3, Some(1), "time".into()),
        ]
    );
    assert_eq!(steps[1].exe, Some(PathBuf::from("/usr/bin/sort")));
    assert_eq!(steps[2].exe, Some(PathBuf::from("/usr/bin/cat")));
    assert!(files.contains(&(3, Role::Input, "b".into(), Some(2), StepContent::Final)));
    // A job whose command only wraps one other (`time python t.py`) is one step.
    let events = [
        exec(1, 0, &["time", "python", "t.py"], 1),
        fork(2, 1, 2),
        exec(2, 1, &["python", "t.py"], 3),
        write(2, "m", 4),
    ];
    assert!(steps_of(&events, &Rule::default()).is_empty());
}

#[test]
fn appending_to_another_steps_file_reads_it_but_not_after_it_was_removed() {
    // sh -c 'wc -l t > r && cat s >> r; rm x; cat s >> x'
    let append = |pid, name: &str, ts_ns| Event::Open {
        pid,
        path: p(name),
        flags: libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND,
        stat: None,
        ts_ns,
    };
    let events = [
        exec(1, 0, &["sh", "-c", "..."], 1),
        read(1, "x", 2),
        exec(2, 1, &["wc", "-l", "t"], 3),
        write(2, "r", 4),
        read(2, "t", 5),
        exec(3, 1, &["cat", "s"], 6),
        append(3, "r", 7),
        read(3, "s", 8),
        exec(4, 1, &["rm", "x"], 9),
        Event::Unlink {
            pid: 4,
            path: p("x"),
            ts_ns: 10,
        },
        exec(5, 1, &["cat", "s"], 11),
        append(5, "x", 12),
        read(5, "s", 13),
    ];
    let (_, files) = shape(&steps_of(&events, &Rule::default()));
    assert!(files.contains(&(3, Role::Input, "r".into(), Some(2), StepContent::Unknown)));
    assert!(files.contains(&(3, Role::Output, "r".into(), None, StepContent::Final)));
    assert!(!files
        .iter()
        .any(|f| f.0 == 5 && f.1 == Role::Input && f.2 == "x"));
}

/// `exec` with standard streams that are pipes: (fd, pipe inode).
fn exec_piped(pid: i32, ppid: i32, argv: &[&str], ts_ns: i64, piped: &[(usize, u64)]) -> Event {
    let mut ev = exec(pid, ppid, argv, ts_ns);
    if let Event::Exec { pipes, .. } = &mut ev {
        for &(fd, ino) in piped {
            pipes[fd] = Some((9, ino));
        }
    }
    ev
}

#[test]
fn programs_joined_by_a_pipe_stay_in_the_step_that_runs_them() {
    // sh -c 'sort x > y; cat a | wc -l > n', its stdout a pipe to the world (inode 1).
    let events = [
        exec_piped(1, 0, &["sh", "-c", "..."], 1, &[(1, 1)]),
        exec_piped(2, 1, &["sort", "x"], 2, &[(1, 1)]),
        read(2, "x", 3),
        write(2, "y", 4),
        Event::Exit { pid: 2, ts_ns: 5 },
        exec_piped(3, 1, &["cat", "a"], 6, &[(1, 7)]),
        read(3, "a", 7),
        exec_piped(4, 1, &["wc", "-l"], 8, &[(0, 7), (1, 1)]),
        write(4, "n", 9),
    ];
    let (tree, files) = shape(&steps_of(&events, &Rule::default()));
    // sort's own step; cat and wc share the shell's, so n is known to come from a.
    assert_eq!(tree, [(1, None, "sh".into()), (2, Some(1), "sort".into())]);
    assert!(files.contains(&(1, Role::Input, "a".into(), None, StepContent::Prior)));
    assert!(files.contains(&(1, Role::Output, "n".into(), None, StepContent::Final)));
    // Python's multiprocessing spawn workers are the parent's too.
    let events = [
        exec(1, 0, &["python3", "t.py"], 1),
        read(1, "cfg", 2),
        exec(
            2,
            1,
            &[
                "python3",
                "-c",
                "from multiprocessing.spawn import spawn_main; spawn_main()",
            ],
            3,
        ),
        read(2, "shard", 4),
    ];
    assert!(steps_of(&events, &Rule::default()).is_empty());
}

#[test]
fn a_fork_reported_after_the_childs_exec_changes_nothing() {
    // ptrace: the vfork child's exec stop can be handled before its parent's vfork stop.
    let events = [
        exec(1, 0, &["sh", "-c", "wc -l t > r"], 1),
        read(1, "x", 2),
        exec(2, 1, &["wc", "-l", "t"], 3),
        fork(2, 1, 4),
        read(2, "t", 5),
        write(2, "r", 6),
        Event::Exit { pid: 2, ts_ns: 7 },
    ];
    let (tree, files) = shape(&steps_of(&events, &Rule::default()));
    assert_eq!(tree, [(1, None, "sh".into()), (2, Some(1), "wc".into())]);
    assert!(files.contains(&(2, Role::Input, "t".into(), None, StepContent::Prior)));
}

#[test]
fn a_step_that_touched_nothing_is_dropped_and_numbers_close_up() {
    // python drive.py runs `uname` (no files), then `prep` and `train` by subprocess.
    let events = [
        exec(1, 0, &["python3", "drive.py"], 1),
        exec(2, 1, &["uname", "-m"], 2),
        Event::Exit { pid: 2, ts_ns: 3 },
        exec(3, 1, &["prep"], 4),
        write(3, "x", 5),
        Event::Exit { pid: 3, ts_ns: 6 },
        exec(4, 1, &["train"], 7),
        read(4, "x", 8),
        write(4, "m", 9),
    ];
    let (tree, files) = shape(&steps_of(&events, &Rule::default()));
    assert_eq!(
        tree,
        [
            (1, None, "python3".into()),
            (2, Some(1), "prep".into()),
            (3, Some(1), "train".into()),
        ]
    );
    assert!(files.contains(&(3, Role::Input, "x".into(), Some(2), StepContent::Final)));
}

#[test]
fn an_exec_in_place_keeps_the_step_and_its_command() {
    // make runs `sh -c 'env X=1 python t.py'`; sh execs env, env execs python, whose
    // subprocess begins a step of its own.
    let events = [
        exec(1, 0, &["make"], 1),
        read(1, "Makefile", 1),
        exec(2, 1, &["sh", "-c", "env X=1 python t.py"], 2),
        exec(2, 1, &["env", "X=1", "python", "t.py"], 3),
        exec(2, 1, &["python", "t.py"], 4),
        write(2, "log", 5),
        exec(3, 2, &["tool"], 6),
        write(3, "out", 7),
    ];
    let steps = steps_of(&events, &Rule::default());
    let (tree, _) = shape(&steps);
    assert_eq!(
        tree,
        [
            (1, None, "make".into()),
            (2, Some(1), "sh".into()),
            (3, Some(2), "tool".into()),
        ]
    );
    assert_eq!(steps[1].exe, Some(PathBuf::from("/usr/bin/python")));
}
