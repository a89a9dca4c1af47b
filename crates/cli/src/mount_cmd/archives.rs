//! What an archive mount serves: the archives given indexed (or their index reused) in the
//! foreground with a progress line, the archives inside them (`--recursive`), and folders as
//! layers of the union.

use super::*;

/// Where archive indexes are kept: beside the store.
pub(crate) fn index_dir(project: &Project) -> PathBuf {
    project.dir().join("archives")
}

/// A layer of an archive union, as given.
pub(super) enum Given {
    Archive(roar_archive::Index),
    /// Canonical.
    Folder(PathBuf),
}

impl Given {
    pub(super) fn path(&self) -> &Path {
        match self {
            Given::Archive(index) => &index.archive,
            Given::Folder(p) => p,
        }
    }
}

/// Checks the archives, folders and the mount point, and gives each archive's index: reused if
/// the archive is unchanged since it was built, else built now with a progress bar (and, with
/// `recursive`, the indexes of the archives inside).
pub(super) fn index_archives(
    project: &Project,
    dir: &Path,
    archives: &[PathBuf],
    recursive: bool,
) -> anyhow::Result<Vec<Given>> {
    anyhow::ensure!(
        std::fs::read_dir(dir)?.next().is_none(),
        "{} is not empty; archives are mounted on an empty directory (a mount would hide its files)",
        dir.display()
    );
    // Every path is checked before any archive is indexed.
    let mut metas = Vec::new();
    for a in archives {
        let meta = std::fs::metadata(a).with_context(|| format!("cannot read {}", a.display()))?;
        if meta.is_dir() {
            let folder = std::fs::canonicalize(a)?;
            anyhow::ensure!(
                !dir.starts_with(&folder),
                "the mount point {} is inside {}, a folder of the union: reading it would go through the mount itself; mount elsewhere",
                dir.display(),
                folder.display()
            );
        }
        anyhow::ensure!(
            meta.is_file() || meta.is_dir(),
            "{} is neither a file nor a folder; `roar mount ARCHIVE|FOLDER... DIR` mounts archives and folders read-only on DIR, `roar mount DIR` records a directory",
            a.display()
        );
        metas.push(meta);
    }
    let mut indexes = Vec::new();
    for (a, meta) in archives.iter().zip(metas) {
        if meta.is_dir() {
            let folder = std::fs::canonicalize(a)?;
            if recursive {
                let walked = roar_roarfs::folder::Folder::walk(&folder)
                    .with_context(|| format!("cannot read {}", folder.display()))?;
                archives_in_folder(project, &walked, &mut say_found);
            }
            indexes.push(Given::Folder(folder));
            continue;
        }
        let bar = crate::hash_cmd::Progress::new(meta.len());
        let started = Instant::now();
        let (index, origin) =
            roar_archive::cache::open(a, &index_dir(project), &|pos| bar.set(pos))?;
        bar.finish();
        if origin == roar_archive::cache::Origin::Built {
            eprintln!(
                "roar: indexed {} ({}, {} members{}) in {}",
                index.archive.display(),
                index.format.name(),
                index.members.len(),
                if index.skipped.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; {} entries not shown, see the mount log",
                        index.skipped.len()
                    )
                },
                crate::fmt::duration_ns(started.elapsed().as_nanos() as i64)
            );
        }
        // gzip gets an access point every MiB; zstd only has its frames, xz its blocks.
        let stretch = index.longest_stretch();
        let unit = match index.format {
            roar_archive::Format::TarXz => Some(("xz", "block", "`xz -T0` and pixz make")),
            roar_archive::Format::TarZst => Some(("zstd", "frame", "`pzstd` makes")),
            _ => None,
        };
        if let Some((codec, unit, remedy)) = unit.filter(|_| stretch > 64 << 20) {
            eprintln!(
                "roar: note: {} has {codec} {unit}s of up to {} decompressed: a member read out of archive order decodes its {unit} from the start; {remedy} archives with small {unit}s",
                index.archive.display(),
                crate::fmt::size(stretch),
            );
        }
        if recursive {
            let source = roar_archive::read::Source::open(index.clone())
                .with_context(|| format!("cannot read {}", index.archive.display()))?;
            roar_archive::nested::expand(source, &index_dir(project), &|_| {}, &mut say_found);
        }
        indexes.push(Given::Archive(index));
    }
    Ok(indexes)
}

/// Says which index of an archive inside another `roar mount --recursive` built, and which
/// archive-named file it leaves as a file, and why.
pub(super) fn say_found(found: roar_archive::nested::Found) {
    use roar_archive::nested::Found;
    match found {
        Found::Indexed(inner, roar_archive::cache::Origin::Built) => eprintln!(
            "roar: indexed {} ({}, {} members)",
            inner.archive.display(),
            inner.format.name(),
            inner.members.len()
        ),
        Found::Indexed(..) => {}
        Found::Left(name, why) => eprintln!(
            "roar: note: {} stays a file, not a directory: {why}",
            name.display()
        ),
    }
}

/// The archives among a folder's files (`--recursive`), each with the archives inside it: the
/// layers that show them as directories over the folder's files.
pub(super) fn archives_in_folder(
    project: &Project,
    folder: &roar_roarfs::folder::Folder,
    found: &mut dyn FnMut(roar_archive::nested::Found),
) -> Vec<Layer> {
    use roar_archive::nested::{self, Found};
    let mut layers = Vec::new();
    for (m, e) in folder.entries.iter().enumerate() {
        if e.kind != roar_archive::Kind::File || !nested::named_like_an_archive(&e.path) {
            continue;
        }
        let path = folder.path(m);
        let opened = roar_archive::cache::open(&path, &index_dir(project), &|_| {}).and_then(
            |(index, origin)| {
                found(Found::Indexed(&index, origin));
                roar_archive::read::Source::open(index).map_err(|source| {
                    roar_archive::ArchiveError::Io {
                        path: path.clone(),
                        source,
                    }
                })
            },
        );
        match opened {
            Ok(source) => {
                let dir = index_dir(project);
                let placed = nested::expand_at(source, e.path.clone(), &dir, &|_| {}, found);
                layers.extend(placed.into_iter().map(Layer::Archive));
            }
            Err(why) => found(Found::Left(path, why)),
        }
    }
    layers
}

/// The layers of the tree: each archive given, then (`recursive`) the archives inside it; each
/// folder given, as it is now.
pub(super) fn place(
    project: &Project,
    given: Given,
    recursive: bool,
) -> Result<Vec<Layer>, roar_roarfs::MountError> {
    pub(super) fn log_left(f: roar_archive::nested::Found) {
        if let roar_archive::nested::Found::Left(name, why) = f {
            tracing::warn!("roarfs: {} stays a file: {why}", name.display());
        }
    }
    let index = match given {
        Given::Archive(index) => index,
        Given::Folder(path) => {
            let folder = roar_roarfs::folder::Folder::walk(&path)
                .map_err(|source| roar_roarfs::MountError::Open { path, source })?;
            let inside = if recursive {
                archives_in_folder(project, &folder, &mut log_left)
            } else {
                Vec::new()
            };
            return Ok([Layer::Folder(folder)].into_iter().chain(inside).collect());
        }
    };
    for (path, why) in &index.skipped {
        tracing::warn!(
            "roarfs: {}: {} not shown: {why}",
            index.archive.display(),
            roar_store::quote::shown(&String::from_utf8_lossy(path))
        );
    }
    let archive = index.archive.clone();
    let source = roar_archive::read::Source::open(index).map_err(|source| {
        roar_roarfs::MountError::Open {
            path: archive,
            source,
        }
    })?;
    if !recursive {
        return Ok(vec![Layer::Archive(roar_archive::nested::Placed {
            at: Vec::new(),
            source: std::sync::Arc::new(source),
            within: Vec::new(),
        })]);
    }
    let placed = roar_archive::nested::expand(source, &index_dir(project), &|_| {}, &mut log_left);
    Ok(placed.into_iter().map(Layer::Archive).collect())
}
