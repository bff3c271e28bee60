//! The UAPI socket at /var/run/wireguard/IFNAME.sock: created mode 0600, accepted on
//! by the daemon's main loop (`supervisor`), which hands each connection to a
//! short-lived thread of its own, and watched with inotify so that deleting it stops
//! the interface (as wireguard-go does).

use crate::uapi;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wirelane_dataplane::{Interface, Runtime};
use wirelane_io::poll::Waker;

pub const SOCKET_DIR: &str = "/var/run/wireguard";
/// Connections served at once, over every interface.
const MAX_CLIENTS: usize = 64;

pub struct UapiListener {
    listener: UnixListener,
    path: PathBuf,
    inode: u64,
    watch: OwnedFd,
    /// Its file was removed (`remove`): dropping does not try again, where a successor
    /// may have made a file that the inode alone could take for ours.
    removed: std::sync::atomic::AtomicBool,
}

pub fn socket_path(ifname: &str) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("{ifname}.sock"))
}

/// How long a new daemon waits for an earlier owner of its interface to finish exiting.
/// An exiting daemon removes its socket first, within a millisecond of deciding to
/// stop, and its TUN once its threads are joined (a few milliseconds more).
pub const EXITING_OWNER_WAIT: Duration = Duration::from_secs(1);

/// Fails if a live process already answers on this interface's UAPI socket.
///
/// Race: right after `ip link del IFNAME` the old daemon may still be answering for the
/// instant it takes to notice; so may one that got SIGTERM. Each removes its socket as
/// its first step of stopping, so a socket that stays connectable past
/// [`EXITING_OWNER_WAIT`] belongs to a live owner.
pub fn ensure_not_served(ifname: &str) -> io::Result<()> {
    let path = socket_path(ifname);
    let deadline = Instant::now() + EXITING_OWNER_WAIT;
    // Each probe is a connection the owner accepts and serves: a few milliseconds
    // apart at first (an exiting owner goes within one), then further apart, so that
    // a live owner sees a dozen, not hundreds.
    let mut pause = Duration::from_millis(5);
    while UnixStream::connect(&path).is_ok() {
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} is already served by another process", path.display()),
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
    Ok(())
}

/// Runs `create` again while it fails with EBUSY, for at most [`EXITING_OWNER_WAIT`]: a
/// TUN interface of this name may still be held by a daemon that removed its socket and
/// is closing its descriptors.
pub fn retry_while_exiting<T>(mut create: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let deadline = Instant::now() + EXITING_OWNER_WAIT;
    loop {
        match create() {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

/// Creates the socket directory if it is missing (mode 0755, as wireguard-go does,
/// whatever the umask allows beyond it), and refuses one that anyone but root (or
/// us) owns or that others may write to: they could delete a tunnel's socket, which
/// stops the tunnel, or put their own in its place and be handed the private key of
/// the next `wg setconf`.
pub fn ensure_socket_dir() -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(SOCKET_DIR)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot create {SOCKET_DIR}: {e}")))?;
    let m = std::fs::symlink_metadata(SOCKET_DIR)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let unsafe_dir = if !m.is_dir() {
        Some("it is not a directory")
    } else if m.uid() != 0 && m.uid() != me {
        Some("another user owns it")
    } else if m.mode() & 0o002 != 0 {
        Some("anyone may write to it")
    } else {
        None
    };
    match unsafe_dir {
        Some(why) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("refusing {SOCKET_DIR} for the UAPI sockets: {why}"),
        )),
        None => Ok(()),
    }
}

impl UapiListener {
    pub fn bind(ifname: &str) -> io::Result<UapiListener> {
        ensure_socket_dir()?;
        let path = socket_path(ifname);
        if path.exists() {
            ensure_not_served(ifname)?;
            std::fs::remove_file(&path)?; // Stale socket of a process that died.
        }
        let (listener, inode) = bind_private(&path)?;
        let watch = watch_path(&path)?;
        Ok(UapiListener {
            listener,
            path,
            inode,
            watch,
            removed: Default::default(),
        })
    }

    /// The inotify descriptor: readable when the socket file changes or disappears.
    pub fn watch_fd(&self) -> RawFd {
        self.watch.as_raw_fd()
    }

    /// True once the socket file is gone or replaced (after a `watch_fd` event).
    pub fn removed(&self) -> bool {
        // Drain pending events so the descriptor is not readable forever.
        let mut buf = [0u8; 4096];
        // SAFETY: reads into a local buffer from our own non-blocking inotify fd.
        while unsafe { libc::read(self.watch.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0
        {
        }
        std::fs::symlink_metadata(&self.path).map_or(true, |m| m.ino() != self.inode)
    }

    /// The listening descriptor: readable when a client connects.
    pub fn fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }

    /// Accepts one waiting connection (the listener is non-blocking): None when none
    /// waits, an error when accepting failed (out of descriptors, say).
    pub fn accept(&self) -> io::Result<Option<UnixStream>> {
        match self.listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                Ok(Some(s))
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Removes the socket file if it is still ours (once).
    pub fn remove(&self) {
        if !self.removed.swap(true, Ordering::SeqCst) {
            remove_if_ours(&self.path, self.inode);
        }
    }
}

/// Binds a non-blocking listening socket at `path` that only its owner may use (mode
/// 0600, from the moment it exists); returns it with the socket file's inode, by which
/// [`remove_if_ours`] later tells our file from a successor's.
pub fn bind_private(path: &Path) -> io::Result<(UnixListener, u64)> {
    // The mask is the process's: two binds at once (a pool adding tunnels) could each
    // restore the other's. One at a time.
    static UMASK: Mutex<()> = Mutex::new(());
    let umask_held = UMASK.lock().unwrap_or_else(|p| p.into_inner());
    // SAFETY: umask only changes this process's file-creation mask. It is set around
    // bind so the socket never exists with looser permissions, even briefly.
    let old = unsafe { libc::umask(0o077) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    drop(umask_held);
    let listener = bound?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    listener.set_nonblocking(true)?;
    let inode = std::fs::metadata(path)?.ino();
    Ok((listener, inode))
}

/// Removes the socket file at `path` if it is still the one with `inode`: a process
/// that replaced it (a restart) keeps its own.
pub fn remove_if_ours(path: &Path, inode: u64) {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.ino() == inode) {
        let _ = std::fs::remove_file(path);
    }
}

impl Drop for UapiListener {
    // A listener that goes (on any path, failed start-up included) takes its file.
    fn drop(&mut self) {
        self.remove();
    }
}

fn watch_path(path: &Path) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; result checked before use.
    let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "socket path has a NUL byte"))?;
    let mask = libc::IN_ATTRIB | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF;
    // SAFETY: valid fd and C string.
    if unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), mask) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Connections served at once over every interface; more wait in the listen backlog
/// until one ends (the main loop stops polling the listeners meanwhile).
static CLIENTS: AtomicUsize = AtomicUsize::new(0);

/// Whether another connection may be served now.
pub fn room_for_client() -> bool {
    CLIENTS.load(Ordering::Acquire) < MAX_CLIENTS
}

/// The UAPI connections open on one tunnel, so that removing the tunnel ends them:
/// a connection holds the interface, and with it the TUN and the UDP port, until it
/// ends (its idle timeout is 30 s).
#[derive(Default, Clone)]
pub struct Connections(Arc<Mutex<(u64, HashMap<u64, UnixStream>)>>);

impl Connections {
    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, HashMap<u64, UnixStream>)> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Shuts every open connection down both ways: its reads end, its thread returns.
    pub fn shutdown_all(&self) {
        for s in self.lock().1.values() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Counts a connection from its start to its thread's end, even if serving it panics,
/// and tells the main loop when it ends (it may be waiting for room).
struct Served {
    conns: Connections,
    id: u64,
    ended: Arc<Waker>,
}

impl Drop for Served {
    fn drop(&mut self) {
        self.conns.lock().1.remove(&self.id);
        CLIENTS.fetch_sub(1, Ordering::AcqRel);
        self.ended.wake();
    }
}

/// Serves one UAPI connection for `dev` on a short-lived thread of its own, tracked
/// in `conns`; `ended` is woken when it ends.
pub fn spawn_connection(
    stream: UnixStream,
    dev: Arc<Interface>,
    rt: Arc<Runtime>,
    conns: &Connections,
    ended: &Arc<Waker>,
) {
    let Ok(handle) = stream.try_clone() else {
        return; // Out of descriptors: the connection is closed unanswered.
    };
    CLIENTS.fetch_add(1, Ordering::AcqRel);
    let served = {
        let mut c = conns.lock();
        c.0 += 1;
        let id = c.0;
        c.1.insert(id, handle);
        Served {
            conns: conns.clone(),
            id,
            ended: ended.clone(),
        }
    };
    // If the thread cannot start, the closure (and `served`) drops here, undoing the count.
    let _ = std::thread::Builder::new()
        .name("wl-uapi-conn".into())
        .spawn(move || {
            let _served = served;
            if let Err(e) = uapi::serve_connection(stream, &dev, &rt) {
                tracing::debug!(error = %e, "UAPI connection ended with an error");
            }
        });
}
