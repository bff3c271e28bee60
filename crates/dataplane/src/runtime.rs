//! The process-wide runtime: the execution model's threads, the readers
//! (`tun_readers`, one per TUN queue index, and `udp_readers`, one per kind of socket
//! and family, each over every interface), the handshake threads (the niced one and
//! its urgent half) and the timer thread, serving every interface of the process. An
//! interface has no thread of its own: a tunnel beyond the first costs its state and
//! descriptors, never another thread or pool.

use crate::exec::{self, ExecModel, Model, Shared};
use crate::interface::Interface;
use crate::loops::{self, HandshakeHub};
use crate::sched::Scheduler;
use crate::stages::StageCtx;
use crate::threads::{Registry, ThreadStats};
use crate::tun_readers::TunReaders;
use crate::udp_readers::UdpReaders;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use wirelane_io::netlink::Monitor;
use wirelane_io::poll::Waker;

pub struct Runtime {
    model: Arc<dyn ExecModel>,
    sched: Arc<dyn Scheduler>,
    shared: Shared,
    workers: usize,
    interfaces: Arc<RwLock<Vec<Arc<Interface>>>>,
    tun_readers: TunReaders,
    udp_readers: UdpReaders,
    service: Mutex<Vec<JoinHandle<()>>>,
    /// Stops the timer thread (it polls this beside the interfaces' monitors).
    timer_stop: Arc<Waker>,
    handshake_stop: exec::StopSignal,
}

impl Runtime {
    /// Starts `model` with `workers` crypt workers, and the handshake and timer threads.
    /// `monitor` (rtnetlink notifications, opened while privileges allowed) serves
    /// every interface; without one, interfaces keep the MTU they start with.
    pub fn start(
        model: Model,
        workers: usize,
        monitor: Option<Monitor>,
    ) -> std::io::Result<Runtime> {
        let shared = Shared {
            threads: Arc::new(Registry::default()),
            handshakes: Arc::new(HandshakeHub::default()),
        };
        let running = exec::start(model, workers, shared.clone())?;
        let sched: Arc<dyn Scheduler> = running.clone();
        let rt = Runtime {
            model: running,
            tun_readers: TunReaders::new(sched.clone(), shared.threads.clone()),
            udp_readers: UdpReaders::new(sched.clone(), shared.threads.clone()),
            sched,
            shared,
            workers,
            interfaces: Arc::default(),
            service: Mutex::default(),
            timer_stop: Arc::new(Waker::new()?),
            handshake_stop: exec::StopSignal::default(),
        };
        // Both handshake threads share the hub's lanes and the stop signal.
        let handshake_threads: [(&str, loops::HandshakeLoop); 2] = [
            ("wl-handshake", loops::handshake_loop),
            ("wl-hs-urgent", loops::urgent_handshake_loop),
        ];
        for (name, run) in handshake_threads {
            let (hub, s, stop) = (
                rt.shared.handshakes.clone(),
                rt.sched.clone(),
                rt.handshake_stop.rx.clone(),
            );
            let h = rt
                .shared
                .threads
                .spawn(name.into(), move || run(&hub, &*s, &stop))?;
            rt.service_push(h);
        }
        let (list, s, stop) = (
            rt.interfaces.clone(),
            rt.sched.clone(),
            rt.timer_stop.clone(),
        );
        let h = rt.shared.threads.spawn("wl-timers".into(), move || {
            loops::timer_loop(&list, monitor.as_ref(), &*s, &stop)
        })?;
        rt.service_push(h);
        Ok(rt)
    }

    fn service_push(&self, h: JoinHandle<()>) {
        self.service
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(h);
    }

    /// Starts serving `iface`: its TUN queues and UDP sockets join the runtime's
    /// readers, and its timers and handshakes join the runtime's.
    pub fn serve(&self, iface: &Arc<Interface>) -> std::io::Result<()> {
        self.tun_readers
            .serve(iface)
            .and_then(|()| self.udp_readers.serve(iface))
            .inspect_err(|_| self.tun_readers.unserve(iface))?;
        self.interfaces
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(iface.clone());
        Ok(())
    }

    /// Stops serving `iface`: the readers let its TUN queues and UDP sockets go, and it
    /// leaves the timer and handshake threads' view. Work of it still queued runs to
    /// completion or finds its peers removed; the other interfaces are not disturbed.
    pub fn unserve(&self, iface: &Arc<Interface>) {
        iface.stop();
        self.tun_readers.unserve(iface);
        self.udp_readers.unserve(iface);
        self.interfaces
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|i| i.id != iface.id);
        // Announce the peers' departure (models with per-peer threads let them go).
        let peers: Vec<_> = iface.table().by_id.values().cloned().collect();
        for p in peers {
            self.sched.peer_removed(iface, &p);
        }
    }

    /// The interfaces served now.
    pub fn interfaces(&self) -> Vec<Arc<Interface>> {
        self.interfaces
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The scheduler stages call, with `iface`: what the UAPI applies updates with.
    pub fn ctx<'a>(&'a self, iface: &'a Arc<Interface>) -> StageCtx<'a> {
        StageCtx {
            iface,
            sched: &*self.sched,
        }
    }

    pub fn model(&self) -> Model {
        self.model.model()
    }

    /// Work items queued for `iface`, where the model keeps them apart.
    pub fn queued_for(&self, iface: &Interface) -> usize {
        self.model.queued_for(iface.id)
    }

    pub fn workers(&self) -> usize {
        self.workers
    }

    /// Every runtime thread's CPU time and context switches.
    pub fn thread_stats(&self) -> Vec<ThreadStats> {
        self.shared.threads.snapshot()
    }

    /// Stops every interface and thread and waits for them.
    pub fn stop(&self) {
        for iface in self.interfaces() {
            self.unserve(&iface);
        }
        self.tun_readers.stop();
        self.udp_readers.stop();
        self.timer_stop.wake();
        self.handshake_stop.stop();
        self.model.stop();
        let service = std::mem::take(&mut *self.service.lock().unwrap_or_else(|p| p.into_inner()));
        for h in service {
            let _ = h.join();
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop();
    }
}
