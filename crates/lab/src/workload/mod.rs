//! Built-in workloads, so the lab needs neither iperf3 nor netperf. Each side runs in
//! threads of this process that enter the host's namespace; every loop is bounded by a
//! deadline.

pub mod rr;
pub mod tcp;
pub mod udp;

use crate::Result;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Spawns `f` on a thread inside namespace `ns`. As it ends, the thread adds its CPU
/// and run-queue time to the workload threads' sum (`cpu::finished_workload_threads`).
pub fn in_ns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> JoinHandle<Result<T>> {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        let out = crate::netns::enter(&ns).and_then(|()| f());
        crate::cpu::add_finished_workload_thread();
        out
    })
}

/// A helper thread of a workload (a stream's reader or writer), started in the caller's
/// namespace, whose CPU and run-queue wait count with the applications' as it ends.
pub fn spawn_counted<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
    std::thread::spawn(move || {
        let out = f();
        crate::cpu::add_finished_workload_thread();
        out
    })
}

pub fn join<T>(h: JoinHandle<Result<T>>) -> Result<T> {
    h.join().map_err(|_| "workload thread panicked")?
}

/// Receives the port a server thread bound, or fails after a few seconds.
pub fn port_from(rx: &mpsc::Receiver<u16>) -> Result<u16> {
    Ok(rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| "server did not start")?)
}

/// Accepts one connection, giving up at `deadline` (so a failed client never leaves
/// the server thread blocked forever).
pub fn accept_until(
    l: &std::net::TcpListener,
    deadline: std::time::Instant,
) -> Result<std::net::TcpStream> {
    l.set_nonblocking(true)?;
    loop {
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if std::time::Instant::now() > deadline {
                    return Err("no connection arrived in time".into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e.into()),
        }
    }
}
