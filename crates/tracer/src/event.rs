//! The event vocabulary is the engine's (`roar_engine::event`); what is here decodes the shim's and
//! eBPF's stream identities into it.

pub use roar_engine::event::*;

/// Splits decoded stream identities (see `roar_wire::STDIO_LEN`) into files and pipes.
pub fn split_stdio(ids: [(u8, u64, u64); 3]) -> (Stdio, Stdio) {
    let of = |want: u8| ids.map(|(kind, dev, ino)| (kind == want).then_some((dev, ino)));
    (of(roar_wire::STREAM_FILE), of(roar_wire::STREAM_PIPE))
}
