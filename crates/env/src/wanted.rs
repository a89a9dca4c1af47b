//! What a job's packages are found from ([`Wanted`]), owned so it can travel from a run to the
//! resident recorder, and [`resolve`], which finds them (in the run or in the recorder) with the
//! machine it ran on.

use std::path::PathBuf;

use roar_store::job_bytes::{self, Bytes};
use roar_store::{Environment, Runtime};

use crate::{Cache, Evidence};

/// What a job's packages are found from, owned so it can travel to the recorder (see
/// [`Evidence`]); `packages` false: none are looked for (`[env] packages = false`).
#[derive(Debug, Default)]
pub struct Wanted {
    pub packages: bool,
    pub files: Vec<PathBuf>,
    pub inputs: Vec<PathBuf>,
    pub programs: Vec<PathBuf>,
    /// roar's own files (the shim, the binary): never a package of the job's.
    pub exclude: Vec<PathBuf>,
}

impl Bytes for Wanted {
    fn put(&self, out: &mut Vec<u8>) {
        let Wanted {
            packages,
            files,
            inputs,
            programs,
            exclude,
        } = self;
        packages.put(out);
        files.put(out);
        inputs.put(out);
        programs.put(out);
        exclude.put(out);
    }
    fn get(input: &mut &[u8]) -> Result<Self, job_bytes::Malformed> {
        Ok(Wanted {
            packages: Bytes::get(input)?,
            files: Bytes::get(input)?,
            inputs: Bytes::get(input)?,
            programs: Bytes::get(input)?,
            exclude: Bytes::get(input)?,
        })
    }
}

/// Fills in the packages `wanted` finds and the machine.
pub fn resolve(env: &mut Environment, wanted: &Wanted, cache: &mut Cache, machine: &Runtime) {
    if wanted.packages {
        let evidence = Evidence {
            files: &wanted.files,
            inputs: wanted.inputs.iter().map(PathBuf::as_path).collect(),
            programs: wanted.programs.iter().map(PathBuf::as_path).collect(),
        };
        env.packages = crate::packages(cache, &evidence, &wanted.exclude);
    }
    env.runtime = Some(machine.clone());
}
