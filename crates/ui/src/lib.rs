//! roar's web page of the lineage graph, and the server of `roar ui`.
//!
//! - [`page`]: the page itself, one HTML file with its script and style inlined, either told to
//!   fetch its data from the server or carrying it embedded (`roar dag --html FILE`).
//! - [`Server`]: 127.0.0.1 only, every request holding a random token; the page, a stream of
//!   change events, and an API whose answers come from whoever runs it ([`Answers`]): this crate
//!   knows HTTP and the page, not what a store answers, so it is tested with answers of its own.

pub mod page;
mod server;

pub use server::{Answers, ApiError, Params, Server, UiError};
