//! Deflate through zlib, with what random access needs and flate2 does not expose: stopping at
//! block boundaries (`Z_BLOCK`), and resuming in the middle of a stream from a saved window
//! (`inflatePrime`, `inflateSetDictionary`) — the method of zlib's own `examples/zran.c`.
#![allow(unsafe_code)]

use std::io;
use std::os::raw::c_int;

use libz_sys as z;

/// What deflate may refer back to: the last 32 KiB of output.
pub const WINDOW: usize = 32 * 1024;

/// Raw deflate, no header or trailer (zip members; gzip resumed mid-stream).
pub const RAW: c_int = -15;
/// A gzip member: header, deflate data, trailer.
pub const GZIP: c_int = 15 + 16;

unsafe extern "C" fn zalloc(_: z::voidpf, items: z::uInt, size: z::uInt) -> z::voidpf {
    // SAFETY: calloc with any sizes is sound; a null return is zlib's out-of-memory signal.
    unsafe { libc::calloc(items as usize, size as usize) }
}

unsafe extern "C" fn zfree(_: z::voidpf, p: z::voidpf) {
    // SAFETY: zlib frees only what zalloc returned.
    unsafe { libc::free(p) }
}

/// A z_stream before `inflateInit2_` or `deflateInit2_`: nothing in it, our allocators set.
/// Boxed: zlib keeps a pointer back to the stream in its state, so it must not move.
pub(crate) fn blank_stream() -> Box<z::z_stream> {
    Box::new(z::z_stream {
        next_in: std::ptr::null_mut(),
        avail_in: 0,
        total_in: 0,
        next_out: std::ptr::null_mut(),
        avail_out: 0,
        total_out: 0,
        msg: std::ptr::null_mut(),
        state: std::ptr::null_mut(),
        zalloc,
        zfree,
        opaque: std::ptr::null_mut(),
        data_type: 0,
        adler: 0,
        reserved: 0,
    })
}

/// One zlib inflate stream.
pub struct Inflater {
    // Boxed: zlib keeps a pointer back to the stream in its state, so it must not move.
    strm: Box<z::z_stream>,
}

// SAFETY: the stream and its state are owned by this value and touched only through &mut self.
unsafe impl Send for Inflater {}

/// How one call to [`Inflater::run`] ended.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub consumed: usize,
    pub produced: usize,
    /// The end of a deflate stream (raw) or of a gzip member (with its trailer).
    pub end: bool,
}

impl Inflater {
    pub fn new(window_bits: c_int) -> io::Result<Inflater> {
        let mut strm = blank_stream();
        // SAFETY: a fully initialised stream with our allocators; the version and size are the
        // library's own.
        let rc = unsafe {
            z::inflateInit2_(
                &mut *strm,
                window_bits,
                z::zlibVersion(),
                std::mem::size_of::<z::z_stream>() as c_int,
            )
        };
        check(rc, &strm)?;
        Ok(Inflater { strm })
    }

    /// Starts over, reading a new stream of the given kind.
    pub fn reset(&mut self, window_bits: c_int) -> io::Result<()> {
        // SAFETY: an initialised stream.
        let rc = unsafe { z::inflateReset2(&mut *self.strm, window_bits) };
        check(rc, &self.strm)
    }

    /// Feeds `bits` (1 to 7) bits of `value` before the next input byte: resuming at a block
    /// boundary that falls inside a byte.
    pub fn prime(&mut self, bits: u8, value: u8) -> io::Result<()> {
        // SAFETY: an initialised raw stream.
        let rc = unsafe { z::inflatePrime(&mut *self.strm, c_int::from(bits), c_int::from(value)) };
        check(rc, &self.strm)
    }

    /// The output that came before the resume point, for back-references.
    pub fn set_dictionary(&mut self, window: &[u8]) -> io::Result<()> {
        // SAFETY: zlib copies the dictionary; the slice outlives the call.
        let rc = unsafe {
            z::inflateSetDictionary(&mut *self.strm, window.as_ptr(), window.len() as z::uInt)
        };
        check(rc, &self.strm)
    }

    /// Inflates from `input` into `output`. With `block`, stops at the end of each deflate block
    /// too, so the caller can see [`Inflater::at_block_boundary`], and at the end of each block's
    /// header ([`Inflater::at_header_end`]).
    pub fn run(&mut self, input: &[u8], output: &mut [u8], block: bool) -> io::Result<Step> {
        let in_len = input.len().min(z::uInt::MAX as usize);
        let out_len = output.len().min(z::uInt::MAX as usize);
        self.strm.next_in = input.as_ptr().cast_mut();
        self.strm.avail_in = in_len as z::uInt;
        self.strm.next_out = output.as_mut_ptr();
        self.strm.avail_out = out_len as z::uInt;
        let flush = if block { z::Z_TREES } else { z::Z_NO_FLUSH };
        // SAFETY: next_in/next_out point into slices valid for this call; zlib reads at most
        // avail_in and writes at most avail_out bytes. It never writes through next_in.
        let rc = unsafe { z::inflate(&mut *self.strm, flush) };
        let step = Step {
            consumed: in_len - self.strm.avail_in as usize,
            produced: out_len - self.strm.avail_out as usize,
            end: rc == z::Z_STREAM_END,
        };
        self.strm.next_in = std::ptr::null_mut();
        self.strm.next_out = std::ptr::null_mut();
        match rc {
            z::Z_OK | z::Z_STREAM_END => Ok(step),
            // No progress possible: more input is needed (or no room), not an error in itself.
            z::Z_BUF_ERROR => Ok(step),
            z::Z_NEED_DICT => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "deflate data needs a preset dictionary",
            )),
            _ => {
                check(rc, &self.strm)?;
                Ok(step)
            }
        }
    }

    /// At the end of a deflate block that is not the last one: a point where decoding can
    /// resume from the window and [`Inflater::pending_bits`].
    pub fn at_block_boundary(&self) -> bool {
        self.strm.data_type & 128 != 0 && self.strm.data_type & 64 == 0
    }

    /// Just after a block's header, before any of its data: for a stored block, the next input
    /// byte is the first of the bytes it stores.
    pub fn at_header_end(&self) -> bool {
        self.strm.data_type & 256 != 0
    }

    /// Where the code being decoded began, as bits back from the current input position, and
    /// how many of its bytes were written: `None` between blocks (zlib's `inflateMark`). Exact
    /// only after a call that decoded a code itself, not through its fast loop: one with less
    /// than 258 bytes of output room.
    pub fn mark(&self) -> Option<(u64, u64)> {
        // SAFETY: an initialised stream; inflateMark only reads its state.
        let mark = unsafe { z::inflateMark(std::ptr::from_ref(&*self.strm).cast_mut()) };
        let back = mark >> 16;
        (back >= 0).then_some((back as u64, (mark & 0xffff) as u64))
    }

    /// The bits taken from the input and not yet used (zlib keeps up to 64).
    pub fn held_bits(&self) -> u64 {
        (self.strm.data_type & 63) as u64
    }

    /// Drops the bits taken from the input and not yet used: to go on from another place in it.
    pub fn drop_held_bits(&mut self) -> io::Result<()> {
        // SAFETY: an initialised stream; a negative count empties its bit buffer.
        let rc = unsafe { z::inflatePrime(&mut *self.strm, -1, 0) };
        check(rc, &self.strm)
    }

    /// How many bits of the last consumed byte are not yet used (0 to 7).
    pub fn pending_bits(&self) -> u8 {
        (self.strm.data_type & 7) as u8
    }
}

impl Drop for Inflater {
    fn drop(&mut self) {
        // SAFETY: initialised in new(); ended once.
        unsafe {
            z::inflateEnd(&mut *self.strm);
        }
    }
}

fn check(rc: c_int, strm: &z::z_stream) -> io::Result<()> {
    if rc == z::Z_OK {
        return Ok(());
    }
    let msg = if strm.msg.is_null() {
        format!("zlib error {rc}")
    } else {
        // SAFETY: zlib's messages are static NUL-terminated strings.
        unsafe { std::ffi::CStr::from_ptr(strm.msg) }
            .to_string_lossy()
            .into_owned()
    };
    let kind = match rc {
        z::Z_MEM_ERROR => io::ErrorKind::OutOfMemory,
        _ => io::ErrorKind::InvalidData,
    };
    Err(io::Error::new(kind, format!("corrupt deflate data: {msg}")))
}
