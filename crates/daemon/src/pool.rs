//! Pools: one wirelane process serving several tunnels from one set of threads.
//!
//! `wirelane --pool NAME IFNAME` (or `WIRELANE_POOL=NAME wirelane IFNAME`, which is how
//! `wg-quick` can ask for it) joins the pool NAME if a wirelane process serves it in
//! this network namespace, asking it to add IFNAME; otherwise it becomes that pool.
//! The pool is found by its control socket,
//! `/var/run/wireguard/wirelane-pool-NAME-NSID.ctl`, mode 0600, where NSID is the
//! network namespace's inode: a pool serves the namespace it runs in, so every
//! tunnel's TUN and UDP sockets live in the namespace of whoever asked for it, and a
//! request from another namespace finds no pool there and starts one of its own. The
//! name does not end in `.sock`, so `wg show all` does not take it for an interface.
//!
//! The control protocol is one request line and one answer line per connection:
//! `add IFNAME`, `remove IFNAME`, `list` → `ok [DETAIL]` or `error: MESSAGE`.

use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::places::Places;
use crate::timed::Timed;

/// The environment variable that names a pool for `wirelane IFNAME`.
pub const POOL_ENV: &str = "WIRELANE_POOL";
/// Longest request line.
const MAX_LINE: usize = 256;
/// A pool's refusal while it is on its way out (its last tunnel went): the requester
/// starts a pool of its own instead.
pub const CLOSING: &str = "the pool is shutting down";
/// A pool's answer when every control connection place is taken: ask again shortly.
pub const BUSY: &str = "the pool is answering as many control requests as it can";

/// How long [`ask_patiently`] keeps asking a busy pool.
const BUSY_PATIENCE: Duration = Duration::from_secs(30);

/// [`ask`], asked again while the pool answers [`BUSY`] (many tunnels joining at
/// once, as at boot), for at most [`BUSY_PATIENCE`].
pub fn ask_patiently(path: &PathBuf, req: &Request) -> io::Result<Result<String, String>> {
    let deadline = std::time::Instant::now() + BUSY_PATIENCE;
    loop {
        match ask(path, req)? {
            Err(e) if e == BUSY && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            answer => return Ok(answer),
        }
    }
}

/// Whether `e`, from [`ask`], means that no pool is there to answer (it exited, or
/// closed the request unanswered on its way out), rather than one that did not
/// answer in time, which may still carry the request out.
pub fn gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
    )
}

/// Checks a pool name: 1 to 32 letters, digits, '-' or '_'.
pub fn validate_name(name: &str) -> Result<(), String> {
    let ok = (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "'{name}' is not a valid pool name (1-32 letters, digits, '-' or '_')"
        ))
    }
}

/// The control socket of pool `name` in this process's network namespace.
pub fn control_path(name: &str) -> io::Result<PathBuf> {
    let ns = std::fs::metadata("/proc/thread-self/ns/net")?.ino();
    Ok(PathBuf::from(crate::listener::SOCKET_DIR).join(format!("wirelane-pool-{name}-{ns}.ctl")))
}

/// One request to a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Add(String),
    Remove(String),
    List,
}

impl Request {
    pub fn parse(line: &str) -> Result<Request, String> {
        match line.split_once(' ') {
            Some(("add", name)) => Ok(Request::Add(name.to_string())),
            Some(("remove", name)) => Ok(Request::Remove(name.to_string())),
            None if line == "list" => Ok(Request::List),
            _ => Err(format!(
                "unknown request '{line}' (add IFNAME, remove IFNAME, list)"
            )),
        }
    }

    fn line(&self) -> String {
        match self {
            Request::Add(n) => format!("add {n}"),
            Request::Remove(n) => format!("remove {n}"),
            Request::List => "list".into(),
        }
    }
}

/// Asks the pool at `path`; Err(io) when no pool answers there, Ok(Err) for its refusal.
pub fn ask(path: &PathBuf, req: &Request) -> io::Result<Result<String, String>> {
    let mut s = UnixStream::connect(path)?;
    // Adding a tunnel creates an interface and sockets: seconds at worst.
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    // A busy pool answers without reading the request and closes (`refuse_busy`): the
    // write may then fail, and its answer is still there to read.
    let wrote = writeln!(s, "{}", req.line());
    let mut answer = String::new();
    // A `list` answer names every tunnel of the pool on one line.
    let read = BufReader::new(io::Read::take(s, 64 * 1024)).read_line(&mut answer);
    if answer.trim_end().is_empty() {
        wrote?;
        read?;
    }
    let answer = answer.trim_end();
    if answer.is_empty() {
        // Closed unanswered: the pool exited while the request waited.
        return Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "the pool closed the connection without answering",
        ));
    }
    Ok(match answer.strip_prefix("ok") {
        Some(detail) => Ok(detail.trim_start().to_string()),
        None => Err(answer.strip_prefix("error: ").unwrap_or(answer).to_string()),
    })
}

/// Opens `path` (mode 0600) and holds an exclusive `flock` on it until it drops.
///
/// Race (removal): the pool removes its lock file on exit, under the lock. A process
/// that opened the file before the removal and then waited in `flock` holds a lock on
/// an unlinked inode, which excludes nobody; so once locked, the path must still name
/// the locked inode, or the lock is taken again on whatever the path names now.
fn lock_file(path: &std::path::Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    loop {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(path)?;
        // SAFETY: flock on a descriptor we own; the lock goes when the file closes.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let locked = f.metadata()?.ino();
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.ino() == locked) {
            return Ok(f);
        }
    }
}

/// A pool's control socket, removed when it drops.
pub struct Control {
    listener: UnixListener,
    path: PathBuf,
    inode: u64,
}

impl Control {
    /// Binds pool `name`'s control socket; AddrInUse when a live pool already answers
    /// there (join it instead). A socket nobody answers on is stale and replaced.
    pub fn bind(name: &str) -> io::Result<Control> {
        crate::listener::ensure_socket_dir()?;
        let path = control_path(name)?;
        // Race: two processes starting pool `name` at once (after a crash left a stale
        // socket) could each find it dead, and the second unlink the first's new
        // socket. Checking, unlinking and binding under an exclusive lock on a file
        // beside it makes the second find the first's socket alive.
        let _lock = lock_file(&path.with_extension("lock"))?;
        if path.exists() {
            if UnixStream::connect(&path).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("pool '{name}' is already served"),
                ));
            }
            std::fs::remove_file(&path)?;
        }
        let (listener, inode) = crate::listener::bind_private(&path)?;
        Ok(Control {
            listener,
            path,
            inode,
        })
    }

    pub fn fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }

    /// Accepts one waiting connection: None when none waits, an error when accepting
    /// failed (out of descriptors, say).
    pub fn accept(&self) -> io::Result<Option<UnixStream>> {
        let s = match self.listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(e) => return Err(e),
        };
        s.set_nonblocking(false)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(Some(s))
    }
}

impl Drop for Control {
    /// Removes the socket, if it is still ours, and the lock file beside it, both under
    /// the lock (see [`lock_file`]), so that nothing of the pool is left behind.
    fn drop(&mut self) {
        let lock_path = self.path.with_extension("lock");
        let lock = lock_file(&lock_path);
        crate::listener::remove_if_ours(&self.path, self.inode);
        if lock.is_ok() {
            let _ = std::fs::remove_file(&lock_path);
        }
    }
}

/// Time one control connection has for all of it: its request line, the answer, and
/// the drain of what the client sent beyond the line.
const CONTROL_LIMIT: Duration = Duration::from_secs(10);

/// Control connections served at once; past that, a new one is closed unanswered, so
/// that clients that connect and wait cannot make the daemon start a thread each.
pub const MAX_CONTROL_CONNECTIONS: usize = 16;

/// The places of [`MAX_CONTROL_CONNECTIONS`], one per control connection served.
pub static CONTROL_PLACES: LazyLock<Arc<Places>> =
    LazyLock::new(|| Places::new(MAX_CONTROL_CONNECTIONS));

/// Answers a control connection [`BUSY`] without waiting on it (the main loop calls
/// this): what the client sent is read as far as it is there, so that closing with it
/// unread does not reset the connection before the answer is read; an answer the
/// socket has no room for is dropped, and the client, finding the connection closed
/// unanswered, asks again as it would a pool on its way out.
pub fn refuse_busy(mut stream: UnixStream) {
    if stream.set_nonblocking(true).is_err() {
        return;
    }
    let _ = io::Read::read(&mut stream, &mut [0u8; MAX_LINE]);
    let _ = writeln!(stream, "error: {BUSY}");
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

/// Whether the client of `stream` asks from the pool's network namespace. A tunnel's
/// TUN belongs in the namespace of whoever asked for it and its UDP sockets where it
/// was created, which for a pool are one: a request from elsewhere (the socket's
/// directory is shared by every namespace) is refused, not served in the pool's.
///
/// The connection's server end is made in the client's namespace (`unix_stream_connect`
/// creates it in the connecting socket's), so its namespace cookie is the client's. A
/// kernel without `SO_NETNS_COOKIE` (before 5.14) cannot tell, and is not refused.
fn same_namespace(stream: &UnixStream) -> Result<(), String> {
    let ours =
        std::os::unix::net::UnixDatagram::unbound().and_then(|s| netns_cookie(s.as_raw_fd()));
    match (netns_cookie(stream.as_raw_fd()), ours) {
        (Ok(theirs), Ok(ours)) if theirs != ours => Err(
            "the request comes from another network namespace than the pool's; run it in \
             the pool's, or start a pool in yours"
                .into(),
        ),
        _ => Ok(()),
    }
}

/// The network namespace cookie of socket `fd`'s namespace.
fn netns_cookie(fd: RawFd) -> io::Result<u64> {
    /// `SO_NETNS_COOKIE` from asm-generic/socket.h.
    const SO_NETNS_COOKIE: libc::c_int = 71;
    let mut cookie = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into the u64 it is given.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(cookie)
}

/// Reads one request from a control connection and writes `handle`'s answer, all
/// within [`CONTROL_LIMIT`].
pub fn serve(stream: UnixStream, handle: impl FnOnce(Request) -> Result<String, String>) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut input = Timed::new(read_half, CONTROL_LIMIT, CONTROL_LIMIT);
    let mut line = String::new();
    let read = BufReader::new(io::Read::take(&mut input, MAX_LINE as u64)).read_line(&mut line);
    let answer = match read {
        Ok(_) if line.ends_with('\n') => same_namespace(&stream)
            .and_then(|()| Request::parse(line.trim_end()))
            .and_then(handle),
        _ => Err("request line missing, too long or unterminated".into()),
    };
    let mut w = Timed::new(stream, CONTROL_LIMIT, CONTROL_LIMIT);
    let _ = match answer {
        Ok(detail) if detail.is_empty() => writeln!(w, "ok"),
        Ok(detail) => writeln!(w, "ok {detail}"),
        Err(e) => writeln!(w, "error: {e}"),
    };
    // Closing with unread input would reset the connection and could discard the
    // answer before the client reads it: read what is left first, bounded in bytes and
    // by the connection's deadline.
    let _ = w.shutdown_write();
    let _ = io::copy(&mut io::Read::take(&mut input, 64 * 1024), &mut io::sink());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_places_are_bounded_and_given_back() {
        let held: Vec<_> = std::iter::from_fn(|| CONTROL_PLACES.take())
            .take(100)
            .collect();
        assert_eq!(held.len(), MAX_CONTROL_CONNECTIONS);
        assert!(CONTROL_PLACES.take().is_none());
        drop(held);
        assert!(CONTROL_PLACES.take().is_some());
    }

    /// A busy pool's answer is read whether or not the pool closed before the request
    /// was written (the write then fails with EPIPE): it is a refusal to ask again,
    /// not a pool that went away.
    #[test]
    fn a_busy_answer_is_read_even_when_the_request_could_not_be_written() {
        let dir = std::env::temp_dir().join(format!("wl-busy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ctl");
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            for _ in 0..20 {
                let (s, _) = listener.accept().unwrap();
                refuse_busy(s);
            }
        });
        for _ in 0..20 {
            let answer = ask(&path, &Request::List).unwrap();
            assert_eq!(answer, Err(BUSY.to_string()));
        }
        server.join().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn requests_and_names() {
        assert_eq!(Request::parse("add wg0"), Ok(Request::Add("wg0".into())));
        assert_eq!(
            Request::parse("remove wg0"),
            Ok(Request::Remove("wg0".into()))
        );
        assert_eq!(Request::parse("list"), Ok(Request::List));
        assert!(Request::parse("frob wg0").is_err());
        assert!(Request::parse("").is_err());
        assert!(validate_name("gateway_1").is_ok());
        for bad in ["", "a/b", "with space", &"x".repeat(33)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }
}
