//! FUSE over io_uring (Linux 6.14 and later, with `/sys/module/fuse/parameters/enable_uring`
//! set): requests reach the filesystem through per-CPU queues instead of `/dev/fuse` reads.
//!
//! Why: over `/dev/fuse` the kernel hands a request to whichever reader thread is waiting, which
//! usually sleeps on another CPU, so every synchronous request costs two cross-CPU wake-ups. With
//! io_uring the kernel puts a request in the queue of the CPU its caller runs on, and that queue's
//! threads are pinned to the same CPU: the caller blocks, the server runs there, replies, and the
//! caller resumes on its own CPU.
//!
//! How: after FUSE_INIT (negotiated with `FUSE_OVER_IO_URING`), each queue gets
//! [`THREADS_PER_QUEUE`] threads, each with its own ring and one *slot*: a header buffer (the
//! request's `fuse_in_header`, its fixed per-opcode argument, and the `fuse_uring_ent_in_out`
//! trailer) and a payload buffer (names, write data; the reply's arguments). A slot is
//! registered once (`FUSE_IO_URING_CMD_REGISTER`); the kernel completes the command when it has
//! put a request there. The thread rebuilds the request as `/dev/fuse` would have delivered it
//! (header, argument, payload), dispatches it like the classic loop does, and the reply is
//! written into the same slot and committed with `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which
//! also hands the slot back for the next request. One slot per thread means a thread busy in a
//! slow request (hashing a large file at open) holds no other request: the kernel gives the next
//! one to a free slot.
//!
//! The kernel still sends FORGET and INTERRUPT through `/dev/fuse`, and uses it for every request
//! until each CPU's queue has a slot, so the classic reader threads keep running.

use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::os::fd::FromRawFd;
use std::os::fd::OwnedFd;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::thread;
use std::thread::JoinHandle;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::warn;

use crate::Filesystem;
use crate::channel::ChannelSender;
use crate::ll::Operation;
use crate::reply::ReplyEmpty;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// Threads (and slots) per CPU queue: requests served at once for callers on one CPU.
pub(crate) const THREADS_PER_QUEUE: usize = 2;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `fuse_uring_req_header`: `in_out[128]`, `op_in[128]`, then `fuse_uring_ent_in_out`
/// (`flags: u64, commit_id: u64, payload_sz: u32, padding: u32, reserved: u64`).
const OP_IN: usize = 128;
const ENT_IN_OUT: usize = 256;
const HEADER_LEN: usize = ENT_IN_OUT + 32;
const IN_HEADER_LEN: usize = 40;
const OUT_HEADER_LEN: usize = 16;
/// The `user_data` of the wake-up poll; slots use their index.
const WAKE: u64 = u64::MAX;

/// Anonymous memory the kernel copies requests into and replies out of. Pages are only touched
/// as requests need them (a slot must be as large as the largest write, most requests use a few
/// hundred bytes). Never unmapped: a ring's registered commands are cancelled asynchronously
/// after the ring is closed, and until then the kernel may still write a request at the slot's
/// address, which must not be reused by another mapping. Slots are made once per session.
#[derive(Debug)]
struct Region {
    ptr: *mut u8,
    len: usize,
}

impl Region {
    fn new(len: usize) -> io::Result<Region> {
        // SAFETY: an anonymous private mapping; no file or address is involved.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Region {
            ptr: ptr.cast(),
            len,
        })
    }
}

/// One registered request buffer. Between the kernel's completion and the commit, the request
/// in it belongs to exactly one dispatch and its one reply; the kernel writes it only while the
/// slot is registered and not yet completed.
#[derive(Debug)]
struct Slot {
    header: Region,
    payload: Region,
    iov: [libc::iovec; 2],
}

/// A queue's shared half: its slots, and the replies waiting to be committed by the thread that
/// owns the ring (a reply may be sent from any thread).
#[derive(Debug)]
pub(crate) struct Queue {
    qid: u16,
    slots: Vec<Slot>,
    committed: Mutex<Vec<usize>>,
    /// Written when a reply is sent from another thread, or to stop the queue's threads.
    wake: Vec<OwnedFd>,
}

// SAFETY: the raw pointers in `Slot` point into mappings owned by the `Queue`; which thread may
// touch a slot's memory is decided by the protocol above (one dispatch and one reply at a time),
// and the list of committed slots is behind a mutex.
unsafe impl Send for Queue {}
// SAFETY: as above.
unsafe impl Sync for Queue {}

/// The reply half of a request that came through a ring slot.
#[derive(Debug, Clone)]
pub(crate) struct RingReply {
    queue: Arc<Queue>,
    slot: usize,
    /// For what replies need besides sending: registering passthrough backing files.
    pub(crate) ch: ChannelSender,
}

impl RingReply {
    /// Writes a reply (`fuse_out_header` and its arguments) into the slot and queues the commit.
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let slot = &self.queue.slots[self.slot];
        let total: usize = data.iter().map(|d| d.len()).sum();
        if total < OUT_HEADER_LEN || total - OUT_HEADER_LEN > slot.payload.len {
            // Still commit the slot (an EIO under the request's id): an uncommitted slot would
            // leave its caller waiting and the slot out of use.
            let head: Vec<u8> = data
                .iter()
                .flat_map(|d| d.iter().copied())
                .take(16)
                .collect();
            if head.len() == OUT_HEADER_LEN {
                let mut out = [0u8; OUT_HEADER_LEN];
                out[0..4].copy_from_slice(&(OUT_HEADER_LEN as u32).to_ne_bytes());
                out[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
                out[8..16].copy_from_slice(&head[8..16]);
                self.send(&[IoSlice::new(&out)])?;
            }
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a reply of {total} bytes does not fit a ring slot"),
            ));
        }
        // The first 16 bytes (`fuse_out_header`) go to the header's `in_out`, the rest to the
        // payload, whichever slices they come in.
        let mut at = 0usize;
        for part in data {
            let mut src: &[u8] = part;
            if at < OUT_HEADER_LEN {
                let n = src.len().min(OUT_HEADER_LEN - at);
                // SAFETY: the slot is this reply's until committed; `at + n` <= 16, inside the
                // header's 128-byte `in_out` area.
                unsafe {
                    std::ptr::copy_nonoverlapping(src.as_ptr(), slot.header.ptr.add(at), n);
                }
                at += n;
                src = &src[n..];
            }
            if src.is_empty() {
                continue;
            }
            // SAFETY: as above; here `at` >= 16, and the payload's bytes end at `total - 16`,
            // checked against its length.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.as_ptr(),
                    slot.payload.ptr.add(at - OUT_HEADER_LEN),
                    src.len(),
                );
            }
            at += src.len();
        }
        let payload_sz = (total - OUT_HEADER_LEN) as u32;
        // SAFETY: as above; `payload_sz` is at a fixed offset inside the 288-byte header.
        unsafe {
            std::ptr::copy_nonoverlapping(
                payload_sz.to_ne_bytes().as_ptr(),
                slot.header.ptr.add(ENT_IN_OUT + 16),
                4,
            );
        }
        self.queue
            .committed
            .lock()
            .expect("ring commit list")
            .push(self.slot);
        if CURRENT_SLOT.with(|c| c.get()) != Some((self.queue.qid, self.slot)) {
            wake(&self.queue.wake[self.slot]);
        }
        Ok(())
    }
}

thread_local! {
    /// The queue and slot a ring thread is dispatching: a reply sent from there is committed
    /// when the dispatch returns, without a wake-up.
    static CURRENT_SLOT: std::cell::Cell<Option<(u16, usize)>> = const { std::cell::Cell::new(None) };
}

fn wake(fd: &OwnedFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writing 8 bytes to an eventfd.
    unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), 8) };
}

/// The CPU queues the kernel expects: one per possible CPU (`nr_cpu_ids`), not per online one.
fn possible_cpus() -> usize {
    std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| {
            s.trim()
                .split(',')
                .filter_map(|r| r.rsplit('-').next()?.parse::<usize>().ok())
                .max()
        })
        .map_or_else(
            || thread::available_parallelism().map_or(1, |n| n.get()),
            |last| last + 1,
        )
}

/// The running ring threads; [`Rings::stop`] ends them.
#[derive(Debug)]
pub(crate) struct Rings {
    stop: Arc<AtomicBool>,
    queues: Vec<Arc<Queue>>,
    threads: Vec<JoinHandle<()>>,
}

impl Rings {
    /// Starts the queues' threads, serving `se`'s filesystem. `payload` is the largest request
    /// or reply payload the kernel may send (it refuses smaller buffers).
    pub(crate) fn start<FS: Filesystem + Send + Sync + 'static>(
        se: &SessionEventLoop<FS>,
        payload: usize,
    ) -> io::Result<Rings> {
        let fuse_fd = se.ch.as_fd().as_raw_fd();
        // Every buffer and descriptor first: a failure then leaves no thread behind.
        let mut queues = Vec::new();
        for qid in 0..possible_cpus() {
            let mut slots = Vec::with_capacity(THREADS_PER_QUEUE);
            let mut wakes = Vec::with_capacity(THREADS_PER_QUEUE);
            for _ in 0..THREADS_PER_QUEUE {
                let header = Region::new(4096)?;
                let payload = Region::new(payload)?;
                let iov = [
                    libc::iovec {
                        iov_base: header.ptr.cast(),
                        iov_len: HEADER_LEN,
                    },
                    libc::iovec {
                        iov_base: payload.ptr.cast(),
                        iov_len: payload.len,
                    },
                ];
                slots.push(Slot {
                    header,
                    payload,
                    iov,
                });
                // SAFETY: eventfd returns a new descriptor or -1.
                let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // SAFETY: a descriptor just created and owned by nothing else.
                wakes.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
            queues.push(Arc::new(Queue {
                qid: qid as u16,
                slots,
                committed: Mutex::new(Vec::new()),
                wake: wakes,
            }));
        }
        let mut rings = Rings {
            stop: Arc::new(AtomicBool::new(false)),
            queues,
            threads: Vec::new(),
        };
        for queue in rings.queues.clone() {
            for t in 0..THREADS_PER_QUEUE {
                let qid = queue.qid;
                let worker = Worker {
                    queue: queue.clone(),
                    slot: t,
                    fuse_fd,
                    stop: rings.stop.clone(),
                    se: SessionEventLoop {
                        thread_name: format!("fuser-ring-{qid}-{t}"),
                        ch: se.ch.clone(),
                        filesystem: se.filesystem.clone(),
                        allowed: se.allowed,
                        session_owner: se.session_owner,
                        stats: se.stats.clone(),
                    },
                };
                let spawned = thread::Builder::new()
                    .name(format!("fuser-ring-{qid}"))
                    .spawn(move || worker.run());
                match spawned {
                    Ok(handle) => rings.threads.push(handle),
                    Err(e) => {
                        // The threads already running hold the filesystem: end them, so the
                        // session can still call `destroy` at its end.
                        rings.stop();
                        return Err(e);
                    }
                }
            }
        }
        Ok(rings)
    }

    /// Ends the ring threads once the session is over (the kernel no longer sends requests).
    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for q in &self.queues {
            for fd in &q.wake {
                wake(fd);
            }
        }
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// One ring thread: its slot in its queue, pinned to the queue's CPU.
struct Worker<FS: Filesystem> {
    queue: Arc<Queue>,
    slot: usize,
    fuse_fd: RawFd,
    stop: Arc<AtomicBool>,
    se: SessionEventLoop<FS>,
}

impl<FS: Filesystem> Worker<FS> {
    fn run(self) {
        pin_to(self.queue.qid as usize);
        if let Err(e) = self.serve() {
            warn!(
                "io_uring queue {} slot {}: {e}; its requests go through /dev/fuse",
                self.queue.qid, self.slot
            );
        }
    }

    fn serve(&self) -> io::Result<()> {
        let mut ring: IoUring<squeue::Entry128, cqueue::Entry> = IoUring::builder().build(4)?;
        let slot = &self.queue.slots[self.slot];
        let wake_fd = self.queue.wake[self.slot].as_raw_fd();
        self.push(&mut ring, self.register())?;
        self.push(&mut ring, self.poll_wake(wake_fd))?;
        // The command in flight for the slot, to resubmit after EINTR/EAGAIN.
        let mut last = self.register();
        let mut request = Vec::with_capacity(IN_HEADER_LEN + OP_IN + 4096);
        loop {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            let done: Vec<(u64, i32)> = ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (user_data, res) in done {
                if user_data == WAKE {
                    if self.stop.load(Ordering::SeqCst) {
                        return Ok(());
                    }
                    let mut count = [0u8; 8];
                    // SAFETY: reading the eventfd's 8-byte counter into a local buffer.
                    unsafe { libc::read(wake_fd, count.as_mut_ptr().cast(), 8) };
                    self.push(&mut ring, self.poll_wake(wake_fd))?;
                } else if res == -libc::EINTR || res == -libc::EAGAIN {
                    self.push(&mut ring, last.clone())?;
                } else if res < 0 {
                    if self.stop.load(Ordering::SeqCst)
                        || res == -libc::ENOTCONN
                        || res == -libc::ENODEV
                    {
                        debug!("io_uring queue {} ends: {res}", self.queue.qid);
                        return Ok(());
                    }
                    return Err(io::Error::from_raw_os_error(-res));
                } else {
                    let commit_id = self.dispatch(slot, &mut request);
                    last = self.commit(commit_id);
                }
            }
            // The slot's reply, sent on this thread or (with a wake-up) from another one.
            let replied = {
                let mut list = self.queue.committed.lock().expect("ring commit list");
                let before = list.len();
                list.retain(|&s| s != self.slot);
                list.len() != before
            };
            if replied {
                self.push(&mut ring, last.clone())?;
            }
        }
    }

    /// Rebuilds the request in the slot as `/dev/fuse` delivers it and dispatches it. Returns the
    /// commit id the reply is committed under.
    fn dispatch(&self, slot: &Slot, request: &mut Vec<u8>) -> u64 {
        // SAFETY: the kernel completed the command, so the header holds a request and is ours
        // until the commit.
        let header = unsafe { std::slice::from_raw_parts(slot.header.ptr, HEADER_LEN) };
        let u32_at = |at: usize| u32::from_ne_bytes(header[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_ne_bytes(header[at..at + 8].try_into().unwrap());
        let len = u32_at(0) as usize;
        let commit_id = u64_at(ENT_IN_OUT + 8);
        let payload_sz = u32_at(ENT_IN_OUT + 16) as usize;
        let reply = RingReply {
            queue: self.queue.clone(),
            slot: self.slot,
            ch: self.se.ch.sender(),
        };
        // The first argument (the opcode's fixed struct) is in `op_in`, the rest in the payload.
        let arg0 = len.checked_sub(IN_HEADER_LEN + payload_sz);
        request.clear();
        match arg0 {
            Some(arg0) if arg0 <= OP_IN && payload_sz <= slot.payload.len => {
                request.extend_from_slice(&header[..IN_HEADER_LEN]);
                request.extend_from_slice(&header[OP_IN..OP_IN + arg0]);
                // SAFETY: `payload_sz` bytes the kernel wrote, bounded by the buffer's length.
                request.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(slot.payload.ptr, payload_sz)
                });
            }
            _ => {
                warn!(
                    "io_uring: a request of {len} bytes with a payload of {payload_sz} does not parse"
                );
            }
        }
        CURRENT_SLOT.with(|c| c.set(Some((self.queue.qid, self.slot))));
        match RequestWithSender::new_ring(reply.clone(), request) {
            Some(req) => {
                if let Ok(Operation::Destroy(_)) = req.request.operation() {
                    req.reply::<ReplyEmpty>().ok();
                } else {
                    req.dispatch(&self.se);
                }
            }
            None => {
                // Never leave the caller waiting: an error reply under the request's id.
                let mut out = [0u8; OUT_HEADER_LEN];
                out[0..4].copy_from_slice(&(OUT_HEADER_LEN as u32).to_ne_bytes());
                out[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
                out[8..16].copy_from_slice(&header[8..16]);
                let _ = reply.send(&[IoSlice::new(&out)]);
            }
        }
        CURRENT_SLOT.with(|c| c.set(None));
        commit_id
    }

    fn cmd(&self, commit_id: u64) -> [u8; 80] {
        // `fuse_uring_cmd_req`: flags, commit_id, qid, padding.
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&self.queue.qid.to_ne_bytes());
        cmd
    }

    fn register(&self) -> squeue::Entry128 {
        let slot = &self.queue.slots[self.slot];
        let sqe = opcode::UringCmd80::new(types::Fd(self.fuse_fd), CMD_REGISTER)
            .cmd(self.cmd(0))
            .addr(Some(slot.iov.as_ptr() as u64))
            .build()
            .user_data(self.slot as u64);
        with_len(sqe, 2)
    }

    fn commit(&self, commit_id: u64) -> squeue::Entry128 {
        opcode::UringCmd80::new(types::Fd(self.fuse_fd), CMD_COMMIT_AND_FETCH)
            .cmd(self.cmd(commit_id))
            .build()
            .user_data(self.slot as u64)
    }

    fn poll_wake(&self, fd: RawFd) -> squeue::Entry128 {
        opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
            .build()
            .user_data(WAKE)
            .into()
    }

    fn push(
        &self,
        ring: &mut IoUring<squeue::Entry128, cqueue::Entry>,
        sqe: squeue::Entry128,
    ) -> io::Result<()> {
        // SAFETY: what the entries point to (the slot's iovecs and buffers) lives in the queue,
        // which outlives the ring.
        unsafe { ring.submission().push(&sqe) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))
    }
}

/// Sets the SQE's `len` field, which io-uring's `UringCmd80` has no setter for: FUSE's
/// REGISTER reads the number of iovecs at `addr` from it.
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
    // SAFETY: `Entry128` is `repr(C)`: the kernel's 64-byte `io_uring_sqe` followed by 64 bytes
    // of command; `len` is the u32 at offset 24 of `io_uring_sqe`.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    raw[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: the same bytes back, any value of `len` being valid.
    unsafe { std::mem::transmute(raw) }
}

/// Runs this thread on `cpu` only, so that it serves its callers where they run.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET stays within it for cpu < CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu < libc::CPU_SETSIZE as usize {
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}
