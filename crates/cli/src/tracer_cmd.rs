//! `roar tracer check`: for each backend of `roar run`, whether it works here, and why not.

use clap::Subcommand;
use roar_tracer::Backend;
use serde::Serialize;

use crate::entry::ExitCode;
use crate::fmt;

#[derive(Subcommand)]
pub enum TracerCommand {
    /// Say for each backend whether it will work here, and why not.
    Check {
        /// Check only this backend.
        #[arg(value_parser = ["preload", "ptrace", "ebpf"])]
        backend: Option<String>,
    },
}

pub fn tracer(command: TracerCommand, json: bool) -> anyhow::Result<ExitCode> {
    let TracerCommand::Check { backend } = command;
    let lib = crate::shim::path();
    let backends: Vec<Backend> = match &backend {
        Some(b) => vec![Backend::parse(b).expect("clap checked the name")],
        None => Backend::ALL.to_vec(),
    };
    let verdicts: Vec<_> = backends
        .iter()
        .map(|b| roar_tracer::check(*b, lib.as_deref()))
        .collect();
    if json {
        #[derive(Serialize)]
        struct Out<'a> {
            backend: &'a str,
            ok: bool,
            reason: &'a str,
        }
        let out: Vec<_> = verdicts
            .iter()
            .map(|v| Out {
                backend: v.backend.name(),
                ok: v.ok,
                reason: &v.reason,
            })
            .collect();
        fmt::print_json(&out)?;
    } else {
        for v in &verdicts {
            println!(
                "{:<8} {:<4} {}",
                v.backend.name(),
                if v.ok { "ok" } else { "no" },
                v.reason
            );
        }
    }
    let all_ok = verdicts.iter().all(|v| v.ok);
    Ok(if all_ok || backend.is_none() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::FAILURE)
    })
}
