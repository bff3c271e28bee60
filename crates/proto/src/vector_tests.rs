//! Published test vectors: BLAKE2s (RFC 7693 and the BLAKE2 KAT), HMAC-BLAKE2s (the
//! kernel's selftest), X25519 (RFC 7748), ChaCha20-Poly1305 (RFC 8439),
//! XChaCha20-Poly1305 (draft-irtf-cfrg-xchacha) and the Noise IKpsk2 BLAKE2s vector
//! (cacophony), which exercises HASH, HMAC, the KDF and the whole handshake core.

use crate::crypto;
use crate::handshake::noise_vector;
use std::collections::HashMap;

type Block = HashMap<String, String>;

fn blocks(text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut cur = Block::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') {
            continue;
        }
        if line.is_empty() {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            continue;
        }
        let (k, v) = line.split_once('=').expect("key = value line");
        cur.insert(k.trim().to_string(), v.trim().to_string());
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn h32(s: &str) -> [u8; 32] {
    hex(s).try_into().expect("32 bytes")
}

fn field(b: &Block, k: &str) -> Vec<u8> {
    hex(b.get(k).unwrap_or_else(|| panic!("missing {k}")))
}

#[test]
fn blake2s() {
    let v = blocks(include_str!("../tests/vectors/blake2s.txt"));
    assert!(v.len() >= 10);
    for b in v {
        let key = field(&b, "key");
        let input = field(&b, "in");
        let out = field(&b, "out");
        if key.is_empty() {
            assert_eq!(crypto::hash(&[&input]).to_vec(), out);
        } else {
            // Keyed BLAKE2s-256 through the MAC type with a 32-byte output.
            use blake2::digest::{KeyInit, Mac};
            let mut m = <blake2::Blake2sMac256 as KeyInit>::new_from_slice(&key).unwrap();
            m.update(&input);
            assert_eq!(m.finalize().into_bytes().to_vec(), out);
        }
    }
}

#[test]
fn hmac_blake2s() {
    let v = blocks(include_str!("../tests/vectors/hmac_blake2s.txt"));
    assert_eq!(v.len(), 2);
    for b in v {
        let got = crypto::hmac(&field(&b, "key"), &[&field(&b, "in")]);
        assert_eq!(got.to_vec(), field(&b, "out"));
    }
}

#[test]
fn x25519() {
    for b in blocks(include_str!("../tests/vectors/x25519.txt")) {
        if let Some(n) = b.get("iterations") {
            let n: usize = n.parse().unwrap();
            let mut k = [0u8; 32];
            k[0] = 9;
            let mut u = k;
            for _ in 0..n {
                let next = x25519_dalek::x25519(k, u);
                u = k;
                k = next;
            }
            assert_eq!(k.to_vec(), field(&b, "out"), "{n} iterations");
        } else if b.contains_key("scalar") {
            let out = x25519_dalek::x25519(h32(&b["scalar"]), h32(&b["u"]));
            assert_eq!(out.to_vec(), field(&b, "out"));
        } else {
            let a = x25519_dalek::StaticSecret::from(h32(&b["alice_priv"]));
            let bb = x25519_dalek::StaticSecret::from(h32(&b["bob_priv"]));
            assert_eq!(crypto::public_key(&a).to_vec(), field(&b, "alice_pub"));
            assert_eq!(crypto::public_key(&bb).to_vec(), field(&b, "bob_pub"));
            let s1 = crypto::dh(&a, &h32(&b["bob_pub"])).unwrap();
            let s2 = crypto::dh(&bb, &h32(&b["alice_pub"])).unwrap();
            assert_eq!(s1, s2);
            assert_eq!(s1.to_vec(), field(&b, "shared"));
        }
    }
    // A low-order point must be refused, as the kernel refuses it.
    let s = x25519_dalek::StaticSecret::from([7u8; 32]);
    assert_eq!(crypto::dh(&s, &[0u8; 32]), None);
}

#[test]
fn chacha20poly1305() {
    let v = blocks(include_str!("../tests/vectors/chacha20poly1305.txt"));
    assert_eq!(v.len(), 2);
    for b in v {
        let key = h32(&b["key"]);
        let nonce: [u8; 12] = field(&b, "nonce").try_into().unwrap();
        let aad = field(&b, "aad");
        let pt = field(&b, "plaintext");
        let mut expect = field(&b, "ciphertext");
        expect.extend(field(&b, "tag"));
        // WireGuard nonces are 4 zero bytes and a little-endian counter; the RFC vectors
        // use other prefixes, so go through ring directly for them.
        use ring::aead::*;
        let k = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &key).unwrap());
        let mut buf = pt.clone();
        k.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(&aad),
            &mut buf,
        )
        .unwrap();
        assert_eq!(buf, expect);
        let opened = k
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&aad),
                &mut buf,
            )
            .unwrap();
        assert_eq!(opened.to_vec(), pt);
        if nonce[..4] == [0, 0, 0, 0] {
            let counter = u64::from_le_bytes(nonce[4..].try_into().unwrap());
            assert_eq!(crypto::aead_seal(&key, counter, &pt, &aad), expect);
            assert_eq!(crypto::aead_open(&key, counter, &expect, &aad).unwrap(), pt);
        }
        let mut bad = expect.clone();
        bad[0] ^= 1;
        assert!(k
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&aad),
                &mut bad
            )
            .is_err());
    }
}

#[test]
fn xchacha20poly1305() {
    let v = blocks(include_str!("../tests/vectors/xchacha20poly1305.txt"));
    assert_eq!(v.len(), 1);
    let b = &v[0];
    let key = h32(&b["key"]);
    let nonce: [u8; 24] = field(b, "nonce").try_into().unwrap();
    let aad = field(b, "aad");
    let pt = field(b, "plaintext");
    let mut expect = field(b, "ciphertext");
    expect.extend(field(b, "tag"));
    assert_eq!(crypto::xaead_seal(&key, &nonce, &pt, &aad), expect);
    assert_eq!(crypto::xaead_open(&key, &nonce, &expect, &aad).unwrap(), pt);
    assert!(crypto::xaead_open(&key, &nonce, &expect, b"other aad").is_err());
}

#[test]
fn noise_ikpsk2_blake2s() {
    let v = blocks(include_str!("../tests/vectors/noise_ikpsk2.txt"));
    let b = &v[0];
    assert_eq!(
        field(b, "protocol_name_hex"),
        crate::handshake::CONSTRUCTION.to_vec()
    );
    let t = noise_vector::run(
        &field(b, "prologue"),
        h32(&b["init_static"]),
        h32(&b["init_ephemeral"]),
        h32(&b["resp_static"]),
        h32(&b["resp_ephemeral"]),
        h32(&b["psk"]),
        &field(b, "msg0_payload"),
        &field(b, "msg1_payload"),
    );
    assert_eq!(t.msg0, field(b, "msg0_ciphertext"));
    assert_eq!(t.msg1, field(b, "msg1_ciphertext"));
    assert_eq!(t.handshake_hash.to_vec(), field(b, "handshake_hash"));
    // Transport messages alternate directions, each direction counting from zero.
    for (i, n) in [(2, 0u64), (3, 0), (4, 1), (5, 1)] {
        let key = if i % 2 == 0 {
            &t.initiator_send
        } else {
            &t.initiator_recv
        };
        let ct = crypto::aead_seal(key, n, &field(b, &format!("msg{i}_payload")), &[]);
        assert_eq!(ct, field(b, &format!("msg{i}_ciphertext")), "msg{i}");
    }
}

/// Hands out one fixed 32-byte value: the ephemeral seed a handshake step draws.
struct FixedSeed([u8; 32]);

impl rand_core::RngCore for FixedSeed {
    fn next_u32(&mut self) -> u32 {
        unimplemented!("a handshake step draws its seed with fill_bytes")
    }
    fn next_u64(&mut self) -> u64 {
        unimplemented!("a handshake step draws its seed with fill_bytes")
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        dest.copy_from_slice(&self.0[..dest.len()]);
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

/// The handshake the daemon runs (`Handshake`, both sides, with its own prologue, the
/// WireGuard identifier, and a TAI64N timestamp as the first payload) gives the same
/// messages and transport keys as the Noise vector's reference run with those inputs:
/// the vector pins the production path, not only its own re-implementation.
#[test]
fn the_production_handshake_matches_the_noise_vector() {
    use crate::handshake::{
        consume_initiation_phase1, tai64n, Handshake, HandshakeError, IDENTIFIER,
    };
    use crate::LocalIdentity;
    let v = blocks(include_str!("../tests/vectors/noise_ikpsk2.txt"));
    let b = &v[0];
    let (init_static, resp_static) = (h32(&b["init_static"]), h32(&b["resp_static"]));
    let psk = h32(&b["psk"]);
    let wall = std::time::Duration::from_secs(1_795_000_000);
    let reference = noise_vector::run(
        IDENTIFIER,
        init_static,
        h32(&b["init_ephemeral"]),
        resp_static,
        h32(&b["resp_ephemeral"]),
        psk,
        &tai64n(wall),
        &[],
    );

    let (me, them) = (
        LocalIdentity::new(init_static),
        LocalIdentity::new(resp_static),
    );
    let mut initiator = Handshake::new(them.public, psk);
    let (init, _) = initiator
        .create_initiation(&me, 1, wall, &mut FixedSeed(h32(&b["init_ephemeral"])))
        .unwrap();
    let mut sent = init.ephemeral.to_vec();
    sent.extend(init.encrypted_static);
    sent.extend(init.encrypted_timestamp);
    assert_eq!(sent, reference.msg0, "the initiation");

    let phase1 = consume_initiation_phase1(&them, &init).unwrap();
    assert_eq!(phase1.remote_static, me.public);
    let mut responder = Handshake::new(me.public, psk);
    let (resp, resp_keys, _) = responder
        .consume_initiation_and_respond(
            &them,
            phase1,
            2,
            wall,
            &mut FixedSeed(h32(&b["resp_ephemeral"])),
        )
        .unwrap();
    let mut answered = resp.ephemeral.to_vec();
    answered.extend(resp.encrypted_nothing);
    assert_eq!(answered, reference.msg1, "the response");

    // In the three steps a daemon takes to keep its lock free of the Diffie-Hellman
    // operations: copied out, computed, then taken only while the initiation they
    // answer is still in flight.
    let work = initiator.response_work(&resp).unwrap();
    let init_keys = work.compute(&me, &resp).unwrap();
    initiator.finish_response(&init_keys).unwrap();
    assert_eq!(
        initiator.finish_response(&init_keys),
        Err(HandshakeError::UnexpectedResponse),
        "taken once"
    );
    initiator
        .create_initiation(&me, 3, wall, &mut FixedSeed([5; 32]))
        .unwrap();
    assert_eq!(
        initiator.finish_response(&init_keys),
        Err(HandshakeError::UnexpectedResponse),
        "a newer initiation is in flight"
    );
    assert_eq!(init_keys.send, reference.initiator_send);
    assert_eq!(init_keys.recv, reference.initiator_recv);
    assert_eq!(
        (resp_keys.send, resp_keys.recv),
        (reference.initiator_recv, reference.initiator_send)
    );
}

#[test]
fn kdf_matches_hkdf_definition() {
    // KDF_n is HKDF over HMAC: check the chaining rule against hmac() directly.
    let key = [3u8; 32];
    let [a, b, c] = crypto::kdf::<3>(&key, b"input");
    let prk = crypto::hmac(&key, &[b"input"]);
    assert_eq!(a, crypto::hmac(&prk, &[&[1]]));
    assert_eq!(b, crypto::hmac(&prk, &[&a, &[2]]));
    assert_eq!(c, crypto::hmac(&prk, &[&b, &[3]]));
}
