//! The values a job's parameter and metrics files held (`roar_env::values`), read from the
//! versions the job read or wrote: the kept copy of that content (`.roar/s3/blobs`), else the
//! file where it is if it still has that content. A value is named `FILE:KEY`
//! (`params.yaml:model.max_depth`), FILE as the job named it relative to its directory.

use std::path::Path;

use roar_env::params::Param;
use roar_env::values::{metrics_file, param_file, read, MAX_BYTES};
use roar_store::objects::Objects;
use roar_store::{JobDetail, Role};

/// The kept versions of the project here, if there is one.
pub fn objects_here() -> Option<Objects> {
    let cwd = std::env::current_dir().ok()?;
    roar_store::Project::find(&cwd).ok().map(|p| p.objects())
}

/// The parameters (`Role::Input`: files the job read) or metrics (`Role::Output`: files it
/// wrote) of `job`, in the order of its files.
pub fn of_files(job: &JobDetail, role: Role, objects: Option<&Objects>) -> Vec<Param> {
    let mut out = Vec::new();
    for f in job.files.iter().filter(|f| f.role == role) {
        let path = Path::new(&f.path);
        let format = match role {
            Role::Input => param_file(path),
            _ => metrics_file(path),
        };
        let (Some(format), Some(hash)) = (format, f.hash.as_ref()) else {
            continue;
        };
        if hash.size > MAX_BYTES {
            continue;
        }
        let Some(bytes) = content(objects, path, &hash.blake3) else {
            continue;
        };
        let name = path
            .strip_prefix(&job.summary.cwd)
            .unwrap_or(path)
            .to_string_lossy()
            .into_owned();
        out.extend(read(&bytes, format).into_iter().map(|(k, v)| Param {
            name: format!("{name}:{k}"),
            value: v,
        }));
    }
    out
}

/// The bytes of the version `blake3`: kept, or at `path` still.
pub fn content(objects: Option<&Objects>, path: &Path, blake3: &str) -> Option<Vec<u8>> {
    let kept = objects
        .filter(|o| o.has(blake3))
        .and_then(|o| std::fs::read(o.path(blake3)).ok());
    let bytes = kept.or_else(|| std::fs::read(path).ok())?;
    (blake3::hash(&bytes).to_hex().as_str() == blake3).then_some(bytes)
}
