//! A block of a compressed file made of independently decodable blocks, as its codec
//! ([`crate::xz`], [`crate::bz2`]) finds it and [`crate::blocks`] reads it: where it starts, what
//! decoding it alone needs, and the access points inside it.

/// A block of the file, before decoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// Where it starts in the file, in bits (xz blocks start on a byte).
    pub start_bit: u64,
    /// Its decoded size when the file says so before decoding (xz's index), else None.
    pub size: Option<u64>,
    /// What decoding it alone needs, kept as the access point's `window`.
    pub meta: Vec<u8>,
}

/// Whether a block's integrity check is verified as it is decoded: on the index pass, always
/// (every block once); for a read of members, xz's is not (it re-hashes the block's bytes up to
/// the member at every random read: an eighth of the decoding), as no stored member's bytes are
/// checked either — a change to the file is caught by its identity at each open. bzip2 checks
/// each block's CRC as part of decoding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Verify,
    Trust,
}

/// Access points inside a block: the bytes of the block before each, and its meta.
pub type Inner = Vec<(u64, Vec<u8>)>;
