//! The pipeline's two ports, as small traits: the TUN device on the plaintext side and
//! the UDP sockets on the outer side. The daemon plugs in `wirelane_io`'s real ones;
//! the benchmark and the scheduling stress test plug in the in-memory pairs of
//! `memory`, so that they run the real stages, executor and runtime without system
//! calls. Every method is one the pipeline already called on the real type; the real
//! implementations here only forward.

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use wirelane_io::tun::Tun;
use wirelane_io::udp::{LocalAddr, Outgoing, Received, RecvBatch, UdpSocket};

/// The plaintext side: a TUN device, or a double.
pub trait TunPort: Send + Sync {
    /// Queue 0's descriptor: readable (for `poll`) when a packet can be read there.
    fn fd(&self) -> RawFd;
    /// Queues the device has, each read by its own reader.
    fn queues(&self) -> usize {
        1
    }
    /// Readable when a packet can be read from queue `q`.
    fn queue_fd(&self, _q: usize) -> RawFd {
        self.fd()
    }
    /// Reads one packet (or super-packet, with a virtio header first when
    /// [`TunPort::has_vnet_hdr`]) from queue `q`; `WouldBlock` when none is queued;
    /// another error when the device is gone.
    fn read(&self, q: usize, buf: &mut [u8]) -> io::Result<usize>;
    /// Writes one packet given as pieces laid end to end, through queue `q`.
    fn write_pieces(&self, q: usize, pieces: &[IoSlice<'_>]) -> io::Result<usize>;
    /// Writes one plain packet, adding an empty virtio header where one is expected.
    fn write_packet(&self, pkt: &[u8]) -> io::Result<usize>;
    fn has_vnet_hdr(&self) -> bool;
    fn has_uso(&self) -> bool;
    fn name(&self) -> String;
    /// The real device, for what only it can answer (its namespace, its MTU).
    fn as_tun(&self) -> Option<&Tun> {
        None
    }
}

impl TunPort for Tun {
    fn fd(&self) -> RawFd {
        Tun::fd(self)
    }
    fn queues(&self) -> usize {
        Tun::queues(self)
    }
    fn queue_fd(&self, q: usize) -> RawFd {
        Tun::queue_fd(self, q)
    }
    fn read(&self, q: usize, buf: &mut [u8]) -> io::Result<usize> {
        Tun::read(self, q, buf)
    }
    fn write_pieces(&self, q: usize, pieces: &[IoSlice<'_>]) -> io::Result<usize> {
        Tun::write_pieces(self, q, pieces)
    }
    fn write_packet(&self, pkt: &[u8]) -> io::Result<usize> {
        Tun::write_packet(self, pkt)
    }
    fn has_vnet_hdr(&self) -> bool {
        Tun::has_vnet_hdr(self)
    }
    fn has_uso(&self) -> bool {
        Tun::has_uso(self)
    }
    fn name(&self) -> String {
        Tun::name(self).to_string()
    }
    fn as_tun(&self) -> Option<&Tun> {
        Some(self)
    }
}

/// The outer side: one UDP socket, or a double.
pub trait UdpPort: Send + Sync {
    /// Readable (for `poll`) when a datagram can be received.
    fn fd(&self) -> RawFd;
    /// Whether received buffers may hold several coalesced datagrams.
    fn gro_enabled(&self) -> bool;
    /// Whether segmented sends are (still) believed to work.
    fn gso_enabled(&self) -> bool;
    /// Receives what is queued, up to one batch, without blocking, and hands each
    /// buffer to `each`; returns how many. `WouldBlock` when nothing is queued.
    fn recv_each(
        &self,
        batch: &mut RecvBatch,
        each: &mut dyn FnMut(Received<'_>),
    ) -> io::Result<usize>;
    /// See [`UdpSocket::send_each`].
    fn send_each(&self, msgs: &[Outgoing<'_>], sent: &mut [bool]) -> io::Result<usize>;
    /// See [`UdpSocket::try_send_replies`].
    fn try_send_replies(
        &self,
        msgs: &[(&[u8], SocketAddr, Option<LocalAddr>)],
    ) -> io::Result<usize>;
    /// See [`UdpSocket::send_segmented`].
    fn send_segmented(
        &self,
        dgrams: &[&[u8]],
        segment: u16,
        dst: &SocketAddr,
        src: Option<LocalAddr>,
        ecn: u8,
    ) -> io::Result<bool>;
    /// See [`UdpSocket::send_from`].
    fn send_from(
        &self,
        payload: &[u8],
        dst: &SocketAddr,
        src: Option<LocalAddr>,
        ecn: u8,
    ) -> io::Result<usize>;
    /// Datagrams the kernel dropped on this socket since it was bound.
    fn drops(&self) -> io::Result<u32> {
        Ok(0)
    }
    /// Sets SO_MARK (the fwmark) on outgoing packets.
    fn set_mark(&self, _mark: u32) -> io::Result<()> {
        Ok(())
    }
    /// Sets the receive buffer's size (see [`UdpSocket::set_receive_buffer`]).
    fn set_receive_buffer(&self, _bytes: usize) -> io::Result<()> {
        Ok(())
    }
}

impl UdpPort for UdpSocket {
    fn fd(&self) -> RawFd {
        UdpSocket::fd(self)
    }
    fn gro_enabled(&self) -> bool {
        UdpSocket::gro_enabled(self)
    }
    fn gso_enabled(&self) -> bool {
        UdpSocket::gso_enabled(self)
    }
    fn recv_each(
        &self,
        batch: &mut RecvBatch,
        each: &mut dyn FnMut(Received<'_>),
    ) -> io::Result<usize> {
        let n = self.recv_batch(batch)?;
        for i in 0..n {
            if let Some(r) = batch.datagram(i) {
                each(r);
            }
        }
        Ok(n)
    }
    fn send_each(&self, msgs: &[Outgoing<'_>], sent: &mut [bool]) -> io::Result<usize> {
        UdpSocket::send_each(self, msgs, sent)
    }
    fn try_send_replies(
        &self,
        msgs: &[(&[u8], SocketAddr, Option<LocalAddr>)],
    ) -> io::Result<usize> {
        UdpSocket::try_send_replies(self, msgs)
    }
    fn send_segmented(
        &self,
        dgrams: &[&[u8]],
        segment: u16,
        dst: &SocketAddr,
        src: Option<LocalAddr>,
        ecn: u8,
    ) -> io::Result<bool> {
        UdpSocket::send_segmented(self, dgrams, segment, dst, src, ecn)
    }
    fn send_from(
        &self,
        payload: &[u8],
        dst: &SocketAddr,
        src: Option<LocalAddr>,
        ecn: u8,
    ) -> io::Result<usize> {
        UdpSocket::send_from(self, payload, dst, src, ecn)
    }
    fn drops(&self) -> io::Result<u32> {
        UdpSocket::drops(self)
    }
    fn set_mark(&self, mark: u32) -> io::Result<()> {
        UdpSocket::set_mark(self, mark)
    }
    fn set_receive_buffer(&self, bytes: usize) -> io::Result<()> {
        UdpSocket::set_receive_buffer(self, bytes)
    }
}
