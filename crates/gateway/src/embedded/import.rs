//! Stores in the layout older roars (s3s-fs) left, imported at open.

use std::path::{Path, PathBuf};

use super::index::{self, Refused};
use super::{db_error, Embedded};

/// Where a store in the old layout is moved once imported.
pub(super) const OLD_LAYOUT: &str = "s3s-fs-layout";

/// The buckets a store directory holds in the layout older roars (s3s-fs) left: a directory per
/// bucket, a file per object.
/// (Looked for at every open: an import cut short is taken up again; keys are written again as
/// they were.)
pub(super) fn old_layout(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    Ok(std::fs::read_dir(root)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            p.is_dir() && !matches!(name, "blobs" | "tmp" | OLD_LAYOUT) && !name.starts_with('.')
        })
        .collect())
}

/// Imports a store in the old layout: every object file becomes an object (its bytes, an MD5
/// ETag; the old layout's metadata files are not read), then the old tree is moved, untouched,
/// to `s3s-fs-layout/`: nothing is lost, and nothing is served over it.
pub(super) fn import_old_layout(
    root: &Path,
    buckets: &[PathBuf],
    store: &Embedded,
) -> anyhow::Result<u64> {
    let mut imported = 0;
    for dir in buckets {
        let bucket = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        match store.index.create_bucket(&bucket, None) {
            Ok(()) | Err(index::Error::Refused(Refused::BucketExists)) => {}
            Err(e) => return Err(db_error(e)),
        }
        let mut stack = vec![dir.clone()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d)? {
                let entry = entry?;
                let path = entry.path();
                if entry.file_type()?.is_dir() {
                    stack.push(path);
                    continue;
                }
                let Some(key) = path
                    .strip_prefix(dir)
                    .ok()
                    .and_then(|k| k.to_str())
                    .filter(|k| !k.is_empty())
                else {
                    tracing::warn!("not importing {}: its name is not UTF-8", path.display());
                    continue;
                };
                let mut w = store.blobs.writer(Default::default())?;
                let mut f = std::fs::File::open(&path)?;
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = std::io::Read::read(&mut f, &mut buf)?;
                    if n == 0 {
                        break;
                    }
                    w.write(&buf[..n])?;
                }
                let written = w.finish()?;
                let etag = written.md5_hex();
                let size = written.size;
                let _committing = store.blobs.committing()?;
                let new = index::NewVersion {
                    etag,
                    size,
                    blob: written.keep(&store.blobs)?,
                    ..Default::default()
                };
                store
                    .index
                    .put(&bucket, key, &new, &index::WriteIf::default())
                    .map_err(db_error)?;
                imported += 1;
            }
        }
    }
    let keep = root.join(OLD_LAYOUT);
    std::fs::create_dir_all(&keep)?;
    for dir in buckets {
        if let Some(name) = dir.file_name() {
            std::fs::rename(dir, keep.join(name))?;
        }
    }
    Ok(imported)
}
