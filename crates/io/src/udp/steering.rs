//! Steering one port's datagrams between the sockets of its SO_REUSEPORT group with a
//! classic BPF program, by first byte and, for cookie proofs, by length and field.

use crate::cvt;
use std::io;
use std::mem::size_of;
use std::os::fd::RawFd;

/// How the kernel steers the datagrams arriving on one port between the three sockets
/// of its SO_REUSEPORT group (see [`super::UdpSocket::bind_steered`]).
#[derive(Debug, Clone)]
pub struct Steering {
    /// First byte of the datagrams for the data socket.
    pub data_first_byte: u8,
    /// Datagrams for the proof socket: each rule names a first byte, an exact length,
    /// and the offset of a 16-byte field that must not be all zeros. Everything else
    /// goes to the handshake socket.
    pub proof: Vec<ProofRule>,
}

#[derive(Debug, Clone, Copy)]
pub struct ProofRule {
    pub first_byte: u8,
    pub len: u32,
    pub field: u32,
}

/// Where a steering instruction jumps.
#[derive(Clone, Copy, PartialEq)]
enum To {
    Next,
    Data,
    Handshake,
    Proof,
    Rule(usize),
}

/// Socket indices in the group, in the order the sockets joined it.
pub(super) const DATA: u32 = 0;
pub(super) const HANDSHAKE: u32 = 1;
pub(super) const PROOF: u32 = 2;

/// The classic BPF program for `steering`. The kernel runs it with the UDP payload at
/// offset 0 and the payload's length as the packet length; a load past the end would
/// end the program with 0, the data socket, which is why a rule checks the length
/// before it loads its field. Layout: dispatch on the first byte, then one block per
/// rule, then the three returns.
pub(super) fn steering_program(steering: &Steering) -> Vec<libc::sock_filter> {
    use libc::{BPF_ABS, BPF_B, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_LEN, BPF_RET, BPF_W};
    let jeq = BPF_JMP | BPF_JEQ | BPF_K;
    let mut code: Vec<(u32, u32, To, To)> = vec![
        (BPF_LD | BPF_B | BPF_ABS, 0, To::Next, To::Next),
        (jeq, steering.data_first_byte.into(), To::Data, To::Next),
    ];
    for (i, r) in steering.proof.iter().enumerate() {
        code.push((jeq, r.first_byte.into(), To::Rule(i), To::Next));
    }
    code.push((BPF_RET | BPF_K, HANDSHAKE, To::Next, To::Next));
    let mut starts = Vec::new();
    for r in &steering.proof {
        starts.push(code.len());
        code.push((BPF_LD | BPF_W | BPF_LEN, 0, To::Next, To::Next));
        code.push((jeq, r.len, To::Next, To::Handshake));
        for word in 0..4 {
            code.push((
                BPF_LD | BPF_W | BPF_ABS,
                r.field + 4 * word,
                To::Next,
                To::Next,
            ));
            code.push((jeq, 0, To::Next, To::Proof));
        }
        code.push((BPF_RET | BPF_K, HANDSHAKE, To::Next, To::Next));
    }
    let returns = code.len();
    for index in [DATA, HANDSHAKE, PROOF] {
        code.push((BPF_RET | BPF_K, index, To::Next, To::Next));
    }
    let target = |to: To, at: usize| -> u8 {
        let abs = match to {
            To::Next => at + 1,
            To::Data => returns,
            To::Handshake => returns + 1,
            To::Proof => returns + 2,
            To::Rule(i) => starts[i],
        };
        // Jumps are forward and relative to the next instruction; the program is a few
        // dozen instructions, well within a jump's 8 bits.
        (abs - at - 1) as u8
    };
    code.iter()
        .enumerate()
        .map(|(at, &(c, k, jt, jf))| libc::sock_filter {
            code: c as u16,
            jt: target(jt, at),
            jf: target(jf, at),
            k,
        })
        .collect()
}

/// Installs the steering program on the SO_REUSEPORT group `fd` belongs to.
pub(super) fn attach_steering(fd: RawFd, steering: &Steering) -> io::Result<()> {
    let program = steering_program(steering);
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: fprog points at `program`, which outlives the call; the kernel copies it.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            &fprog as *const _ as *const libc::c_void,
            size_of::<libc::sock_fprog>() as _,
        )
    })
    .map(|_| ())
}
