//! Between steps: who last changed each path before a step touched it, and each step's files.

use std::ffi::OsStr;
use std::path::Path;

use roar_store::{Made, StepContent, StepFile};

use crate::collect::{Classified, HashMap};
use crate::event::Event;

/// Who wrote what when, across the job's steps.
pub(super) struct Links<'e> {
    /// The last change to each path: the step that made it, the event's index, and whether the
    /// path existed after it (not after an unlink or a rename away).
    last_change: HashMap<&'e OsStr, (usize, usize, bool)>,
    /// For each (step, path), the step's first touch: the event's index, and the step that had
    /// last changed the path by then, if that change left content there.
    first_touch: HashMap<(usize, &'e OsStr), (usize, Option<usize>)>,
}

impl<'e> Links<'e> {
    pub(super) fn trace(events: &'e [Event], step_of: &[usize]) -> Links<'e> {
        let mut links = Links {
            last_change: HashMap::default(),
            first_touch: HashMap::default(),
        };
        for (i, ev) in events.iter().enumerate() {
            let s = step_of[i];
            let paths = touched(ev);
            if paths[0].is_none() {
                continue;
            }
            for &(p, _) in paths.iter().flatten() {
                let writer = links
                    .last_change
                    .get(p.as_os_str())
                    .filter(|w| w.2)
                    .map(|w| w.0);
                links
                    .first_touch
                    .entry((s, p.as_os_str()))
                    .or_insert((i, writer));
            }
            for (p, change) in paths.into_iter().flatten() {
                if let Some(exists) = change {
                    links.last_change.insert(p.as_os_str(), (s, i, exists));
                }
            }
        }
        links
    }
}

/// The paths an event touches, each with what it left there: `Some(exists)` for a change,
/// `None` for a mere touch (a read, the source of a link).
pub(super) fn touched(ev: &Event) -> [Option<(&Path, Option<bool>)>; 2] {
    match ev {
        Event::Open { path, flags, .. } => {
            let acc = flags & libc::O_ACCMODE;
            let writes = acc == libc::O_WRONLY || acc == libc::O_RDWR;
            [Some((path.as_path(), writes.then_some(true))), None]
        }
        Event::Rename { from, to, .. } => [
            Some((from.as_path(), Some(false))),
            Some((to.as_path(), Some(true))),
        ],
        Event::Exchange { a, b, .. } => [
            Some((a.as_path(), Some(true))),
            Some((b.as_path(), Some(true))),
        ],
        Event::Link { from, to, .. } => [
            Some((from.as_path(), None)),
            Some((to.as_path(), Some(true))),
        ],
        Event::Unlink { path, .. } => [Some((path.as_path(), Some(false))), None],
        Event::Truncate { path, .. } | Event::Symlink { path, .. } => {
            [Some((path.as_path(), Some(true))), None]
        }
        _ => [None, None],
    }
}

/// The files of step `s`, from the classification of its own events.
///
/// One fact the classification of a step's events alone cannot know: that a file it first
/// touched by writing without truncating (`>>`, an in-place update) held another step's content.
/// The job's rule judges such bytes by the file's ctime against the job's start, which says
/// nothing between steps; here the order of events does: content another step left there is
/// kept by the write, so it is an input from that step.
pub(super) fn step_files(
    s: usize,
    events: &[Event],
    part: &Classified,
    links: &Links,
    job: &HashMap<&OsStr, roar_store::PathUse>,
) -> Vec<StepFile> {
    let mut files = Vec::new();
    for (path, used, ops, first_ns, last_ns) in part.uses() {
        let key = path.as_os_str();
        let job_use = job.get(key).copied().unwrap_or_default();
        let job_output = job_use.records().1 == Some(Made::Output);
        let (mut input, made) = used.records();
        if let Some(&(at, Some(_))) = links.first_touch.get(&(s, key)) {
            if let Event::Open { flags, .. } = &events[at] {
                let acc = flags & libc::O_ACCMODE;
                input |=
                    (acc == libc::O_WRONLY || acc == libc::O_RDWR) && flags & libc::O_TRUNC == 0;
            }
        }
        let file = |role, from_step, content| StepFile {
            path: path.to_owned(),
            role,
            ops,
            from_step,
            content,
            first_ns: Some(first_ns),
            last_ns: Some(last_ns),
        };
        if input {
            let (touched_at, writer) = links
                .first_touch
                .get(&(s, key))
                .copied()
                .unwrap_or((usize::MAX, None));
            let writer = writer.filter(|&w| w != s);
            let unchanged_since = links
                .last_change
                .get(key)
                .is_none_or(|&(_, at, _)| at < touched_at);
            let content = match writer {
                None if job_use.read_prior => StepContent::Prior,
                Some(_) if unchanged_since && job_output => StepContent::Final,
                _ => StepContent::Unknown,
            };
            files.push(file(
                roar_store::Role::Input,
                writer.map(|w| w as u32),
                content,
            ));
        }
        let last_by_me = links.last_change.get(key).is_some_and(|&(w, ..)| w == s);
        match made {
            Some(Made::Output) => {
                let content = if last_by_me && job_output {
                    StepContent::Final
                } else {
                    StepContent::Unknown
                };
                files.push(file(roar_store::Role::Output, None, content));
            }
            Some(Made::Deleted) => {
                files.push(file(roar_store::Role::Output, None, StepContent::Unknown))
            }
            Some(Made::Temp) => {
                files.push(file(roar_store::Role::Temp, None, StepContent::Unknown))
            }
            None => {}
        }
    }
    files
}
