//! The integration suite, one test binary: every file here is a module of it (`cargo test -p
//! roar-tests --test suite archive::` runs one file's tests). One binary is linked once and its
//! tests share the machine's CPUs to the end, where 26 binaries each ended on their slowest test
//! with the other CPU idle.

// Test code drives processes through libc (kill, pipes, statvfs); the product's modules each
// allow `unsafe` by name (docs/ARCHITECTURE.md).
#![allow(unsafe_code)]

mod common;

mod archive;
mod cli;
mod cli_habits;
mod crash;
mod dist;
mod distributed;
mod ebpf;
mod environment;
mod gateway;
mod generated;
mod kept;
mod lineage;
mod mount;
mod mount_posix;
mod mount_scale;
mod observers;
mod preload;
mod recorder;
mod run;
mod s3_conformance;
mod secrets;
mod security;
mod steps;
mod team;
mod ui;
mod versions;
