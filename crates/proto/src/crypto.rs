//! Cryptographic primitives exactly as the WireGuard whitepaper (§5.4) names them:
//! HASH, MAC, HMAC, KDF1..3, DH, AEAD and XAEAD.
//!
//! Why these crates: BLAKE2s comes from RustCrypto's `blake2` (the handshake is not the
//! hot path); ChaCha20-Poly1305 for transport data comes from `ring`, whose assembly is
//! the fastest available on x86_64; XChaCha20-Poly1305 (cookie replies only) is ring's
//! ChaCha20-Poly1305 under a subkey from HChaCha20, written here because ring does not
//! offer the extended nonce (a generic crate's was a fifth of a cookie reply's cost).

use blake2::digest::{FixedOutput, KeyInit, Mac, Update};
use blake2::{Blake2s256, Blake2sMac, Digest};
use ring::aead::{self, LessSafeKey, UnboundKey, CHACHA20_POLY1305};
use zeroize::Zeroize;

pub const KEY_LEN: usize = 32;
pub const HASH_LEN: usize = 32;
pub const MAC_LEN: usize = 16;
pub const TAG_LEN: usize = 16;
pub const XNONCE_LEN: usize = 24;

/// BLAKE2s block size, which HMAC pads its key to.
const BLAKE2S_BLOCK: usize = 64;

/// Error returned when an AEAD tag does not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("authentication tag did not verify")]
pub struct AeadError;

/// HASH(a || b || ...): unkeyed BLAKE2s-256 over the concatenation of `parts`.
pub fn hash(parts: &[&[u8]]) -> [u8; HASH_LEN] {
    let mut h = Blake2s256::new();
    for p in parts {
        Digest::update(&mut h, p);
    }
    h.finalize().into()
}

/// MAC(key, input): keyed BLAKE2s with a 16-byte output (used for mac1, mac2, cookies).
pub fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
    let mut m = <Blake2sMac<blake2::digest::consts::U16> as KeyInit>::new_from_slice(key)
        .expect("BLAKE2s accepts keys up to 32 bytes; callers pass 16 or 32");
    for p in parts {
        Mac::update(&mut m, p);
    }
    m.finalize_fixed().into()
}

/// HMAC(key, input) with BLAKE2s-256 as the hash (RFC 2104 construction, 64-byte block).
pub fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; HASH_LEN] {
    let mut block = [0u8; BLAKE2S_BLOCK];
    if key.len() > BLAKE2S_BLOCK {
        block[..HASH_LEN].copy_from_slice(&hash(&[key]));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut ipad = [0u8; BLAKE2S_BLOCK];
    let mut opad = [0u8; BLAKE2S_BLOCK];
    for i in 0..BLAKE2S_BLOCK {
        ipad[i] = block[i] ^ 0x36;
        opad[i] = block[i] ^ 0x5c;
    }
    let mut inner = Blake2s256::new();
    Update::update(&mut inner, &ipad);
    for p in parts {
        Update::update(&mut inner, p);
    }
    let mut inner_out: [u8; HASH_LEN] = inner.finalize().into();
    let mut outer = Blake2s256::new();
    Update::update(&mut outer, &opad);
    Update::update(&mut outer, &inner_out);
    let out = outer.finalize().into();
    block.zeroize();
    ipad.zeroize();
    opad.zeroize();
    inner_out.zeroize();
    out
}

/// KDF_n(key, input) from the whitepaper: HKDF with HMAC-BLAKE2s, returning `N` outputs.
pub fn kdf<const N: usize>(key: &[u8; HASH_LEN], input: &[u8]) -> [[u8; HASH_LEN]; N] {
    let mut prk = hmac(key, &[input]);
    let mut out = [[0u8; HASH_LEN]; N];
    let mut prev: Option<[u8; HASH_LEN]> = None;
    for (i, slot) in out.iter_mut().enumerate() {
        let counter = [i as u8 + 1];
        let t = match &prev {
            None => hmac(&prk, &[&counter]),
            Some(p) => hmac(&prk, &[p, &counter]),
        };
        *slot = t;
        prev = Some(t);
    }
    prk.zeroize();
    out
}

/// The 96-bit AEAD nonce WireGuard uses: 32 zero bits followed by a little-endian counter.
fn nonce96(counter: u64) -> aead::Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&counter.to_le_bytes());
    aead::Nonce::assume_unique_for_key(n)
}

/// A ChaCha20-Poly1305 key ready for repeated in-place use (transport data and the
/// handshake's AEAD fields).
pub struct AeadKey(LessSafeKey);

impl AeadKey {
    pub fn new(key: &[u8; KEY_LEN]) -> Self {
        let unbound =
            UnboundKey::new(&CHACHA20_POLY1305, key).expect("ChaCha20-Poly1305 key is 32 bytes");
        AeadKey(LessSafeKey::new(unbound))
    }

    /// Encrypts `buf[..len - TAG_LEN]` in place and writes the tag into the last
    /// `TAG_LEN` bytes. `buf.len()` must be at least `TAG_LEN`.
    pub fn seal_in_place(&self, counter: u64, aad: &[u8], buf: &mut [u8]) {
        let split = buf.len() - TAG_LEN;
        let (data, tag_out) = buf.split_at_mut(split);
        let tag = self
            .0
            .seal_in_place_separate_tag(nonce96(counter), aead::Aad::from(aad), data)
            .expect("ChaCha20-Poly1305 seal only fails for inputs over 256 GiB");
        tag_out.copy_from_slice(tag.as_ref());
    }

    /// Decrypts `buf` (ciphertext followed by the tag) in place; on success the
    /// plaintext is `buf[..buf.len() - TAG_LEN]`.
    pub fn open_in_place(&self, counter: u64, aad: &[u8], buf: &mut [u8]) -> Result<(), AeadError> {
        if buf.len() < TAG_LEN {
            return Err(AeadError);
        }
        self.0
            .open_in_place(nonce96(counter), aead::Aad::from(aad), buf)
            .map(|_| ())
            .map_err(|_| AeadError)
    }
}

/// AEAD(key, counter, plain, aad) returning a fresh vector (handshake fields only).
pub fn aead_seal(key: &[u8; KEY_LEN], counter: u64, plain: &[u8], aad: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(plain.len() + TAG_LEN);
    buf.extend_from_slice(plain);
    buf.extend_from_slice(&[0u8; TAG_LEN]);
    AeadKey::new(key).seal_in_place(counter, aad, &mut buf);
    buf
}

/// Inverse of [`aead_seal`]: returns the plaintext.
pub fn aead_open(
    key: &[u8; KEY_LEN],
    counter: u64,
    sealed: &[u8],
    aad: &[u8],
) -> Result<Vec<u8>, AeadError> {
    let mut buf = sealed.to_vec();
    AeadKey::new(key).open_in_place(counter, aad, &mut buf)?;
    buf.truncate(buf.len() - TAG_LEN);
    Ok(buf)
}

/// HChaCha20 (draft-irtf-cfrg-xchacha §2.2): the ChaCha20 block function on the key
/// and a 16-byte nonce, without the final addition, keeping words 0–3 and 12–15. It
/// derives XChaCha20's subkey.
fn hchacha20(key: &[u8; KEY_LEN], nonce: &[u8; 16]) -> [u8; KEY_LEN] {
    let word = |b: &[u8], i: usize| {
        u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
    };
    let mut x = [0u32; 16];
    x[..4].copy_from_slice(&[0x6170_7865, 0x3320_646e, 0x7962_2d32, 0x6b20_6574]);
    for i in 0..8 {
        x[4 + i] = word(key, i);
    }
    for i in 0..4 {
        x[12 + i] = word(nonce, i);
    }
    fn quarter(x: &mut [u32; 16], a: usize, b: usize, c: usize, d: usize) {
        x[a] = x[a].wrapping_add(x[b]);
        x[d] = (x[d] ^ x[a]).rotate_left(16);
        x[c] = x[c].wrapping_add(x[d]);
        x[b] = (x[b] ^ x[c]).rotate_left(12);
        x[a] = x[a].wrapping_add(x[b]);
        x[d] = (x[d] ^ x[a]).rotate_left(8);
        x[c] = x[c].wrapping_add(x[d]);
        x[b] = (x[b] ^ x[c]).rotate_left(7);
    }
    for _ in 0..10 {
        quarter(&mut x, 0, 4, 8, 12);
        quarter(&mut x, 1, 5, 9, 13);
        quarter(&mut x, 2, 6, 10, 14);
        quarter(&mut x, 3, 7, 11, 15);
        quarter(&mut x, 0, 5, 10, 15);
        quarter(&mut x, 1, 6, 11, 12);
        quarter(&mut x, 2, 7, 8, 13);
        quarter(&mut x, 3, 4, 9, 14);
    }
    let mut out = [0u8; KEY_LEN];
    for (i, w) in x[..4].iter().chain(&x[12..]).enumerate() {
        out[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
    }
    x.zeroize();
    out
}

/// XChaCha20-Poly1305 as the IETF construction under HChaCha20's subkey, with the
/// nonce's last 8 bytes after 4 zero bytes.
fn xaead_key(key: &[u8; KEY_LEN], nonce: &[u8; XNONCE_LEN]) -> (LessSafeKey, aead::Nonce) {
    let mut head = [0u8; 16];
    head.copy_from_slice(&nonce[..16]);
    let mut subkey = hchacha20(key, &head);
    let unbound =
        UnboundKey::new(&CHACHA20_POLY1305, &subkey).expect("ChaCha20-Poly1305 key is 32 bytes");
    subkey.zeroize();
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&nonce[16..]);
    (
        LessSafeKey::new(unbound),
        aead::Nonce::assume_unique_for_key(n),
    )
}

/// XAEAD(key, nonce, plain, aad): XChaCha20-Poly1305, used only for cookie replies.
pub fn xaead_seal(
    key: &[u8; KEY_LEN],
    nonce: &[u8; XNONCE_LEN],
    plain: &[u8],
    aad: &[u8],
) -> Vec<u8> {
    let (k, n) = xaead_key(key, nonce);
    let mut buf = Vec::with_capacity(plain.len() + TAG_LEN);
    buf.extend_from_slice(plain);
    k.seal_in_place_append_tag(n, aead::Aad::from(aad), &mut buf)
        .expect("XChaCha20-Poly1305 seal only fails for inputs over 256 GiB");
    buf
}

/// Inverse of [`xaead_seal`].
pub fn xaead_open(
    key: &[u8; KEY_LEN],
    nonce: &[u8; XNONCE_LEN],
    sealed: &[u8],
    aad: &[u8],
) -> Result<Vec<u8>, AeadError> {
    if sealed.len() < TAG_LEN {
        return Err(AeadError);
    }
    let (k, n) = xaead_key(key, nonce);
    let mut buf = sealed.to_vec();
    let plain_len = k
        .open_in_place(n, aead::Aad::from(aad), &mut buf)
        .map_err(|_| AeadError)?
        .len();
    buf.truncate(plain_len);
    Ok(buf)
}

/// A user-space cryptographic random generator: the ChaCha20 keystream under a secret
/// key, as the output of sealing zeros. One `getrandom` seeds it; each refill then
/// yields 1 KiB without a system call. It serves values drawn per message (cookie reply
/// nonces, the rekey jitter of every data send) and also ephemeral keys and session
/// indices, so it erases its key as it goes: each refill's first 32 bytes become the
/// next key and are never handed out ("fast key erasure"). Memory read later therefore
/// cannot reproduce output that was already handed out, as the kernel's CRNG does.
pub struct KeystreamRng {
    key: [u8; KEY_LEN],
    counter: u64,
    buf: Vec<u8>,
    pos: usize,
}

const KEYSTREAM_REFILL: usize = 1024;

impl KeystreamRng {
    pub fn from_seed(key: [u8; KEY_LEN]) -> KeystreamRng {
        KeystreamRng {
            key,
            counter: 0,
            buf: Vec::new(),
            pos: 0,
        }
    }

    /// Keyed straight from `seed_source` (the OS generator), leaving no copy of the key
    /// behind.
    pub fn from_rng(seed_source: &mut dyn rand_core::RngCore) -> KeystreamRng {
        let mut rng = KeystreamRng::from_seed([0; KEY_LEN]);
        seed_source.fill_bytes(&mut rng.key);
        rng
    }
}

impl KeystreamRng {
    /// One keystream block run: the next key first, then the output.
    fn refill(&mut self) {
        let mut sealed = aead_seal(
            &self.key,
            self.counter,
            &[0; KEY_LEN + KEYSTREAM_REFILL],
            &[],
        );
        self.key.copy_from_slice(&sealed[..KEY_LEN]);
        // Everything in `buf` was handed out and zeroed already; reuse its allocation.
        self.buf.clear();
        self.buf
            .extend_from_slice(&sealed[KEY_LEN..KEY_LEN + KEYSTREAM_REFILL]); // no tag
        sealed.zeroize();
        self.counter += 1;
        self.pos = 0;
    }
}

impl Drop for KeystreamRng {
    fn drop(&mut self) {
        self.key.zeroize();
        self.buf.zeroize();
    }
}

impl rand_core::RngCore for KeystreamRng {
    fn next_u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.fill_bytes(&mut b);
        u32::from_le_bytes(b)
    }
    fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.fill_bytes(&mut b);
        u64::from_le_bytes(b)
    }
    fn fill_bytes(&mut self, dest: &mut [u8]) {
        let mut done = 0;
        while done < dest.len() {
            if self.pos == self.buf.len() {
                self.refill();
            }
            let n = (dest.len() - done).min(self.buf.len() - self.pos);
            dest[done..done + n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
            // Bytes handed out are not kept.
            self.buf[self.pos..self.pos + n].zeroize();
            self.pos += n;
            done += n;
        }
    }
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

impl rand_core::CryptoRng for KeystreamRng {}

/// DH(private, public): X25519. Returns `None` for a low-order public key, whose shared
/// secret is all zeros; the kernel rejects those handshakes and so do we.
pub fn dh(private: &x25519_dalek::StaticSecret, public: &[u8; KEY_LEN]) -> Option<[u8; KEY_LEN]> {
    let shared = private.diffie_hellman(&x25519_dalek::PublicKey::from(*public));
    if shared.was_contributory() {
        Some(shared.to_bytes())
    } else {
        None
    }
}

/// A Curve25519 private key in the form X25519 uses it (RFC 7748 §5): the low three
/// bits cleared, the top bit cleared and the next one set. The public key is the same
/// either way; the kernel and wireguard-go store and report keys in this form, so
/// `wg showconf` round-trips the same text everywhere.
pub fn clamp_private(mut key: [u8; KEY_LEN]) -> [u8; KEY_LEN] {
    key[0] &= 248;
    key[31] = (key[31] & 127) | 64;
    key
}

/// Derives the public key of a private key.
pub fn public_key(private: &x25519_dalek::StaticSecret) -> [u8; KEY_LEN] {
    x25519_dalek::PublicKey::from(private).to_bytes()
}

/// Constant-time comparison for MACs and keys.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    // Accumulate differences without an early exit so timing does not leak the position.
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// draft-irtf-cfrg-xchacha-03 §2.2.1.
    #[test]
    fn hchacha20_matches_the_draft_vector() {
        let key: [u8; KEY_LEN] = std::array::from_fn(|i| i as u8);
        let nonce = [
            0x00, 0x00, 0x00, 0x09, 0x00, 0x00, 0x00, 0x4a, 0x00, 0x00, 0x00, 0x00, 0x31, 0x41,
            0x59, 0x27,
        ];
        let expect = "82413b4227b27bfed30e42508a877d73a0f9e4d58a74a853c12ec41326d3ecdc";
        let hex: String = hchacha20(&key, &nonce)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hex, expect);
    }

    /// RFC 7748 §5's clamping, and the public key it leaves unchanged.
    #[test]
    fn clamping_keeps_the_public_key_and_is_idempotent() {
        let raw = [0xffu8; KEY_LEN];
        let clamped = clamp_private(raw);
        assert_eq!(clamped[0], 0xf8);
        assert_eq!(clamped[31], 0x7f);
        assert_eq!(clamped[1..31], raw[1..31]);
        assert_eq!(clamp_private(clamped), clamped);
        let low = clamp_private([0u8; KEY_LEN]);
        assert_eq!((low[0], low[31]), (0, 0x40));
        let pk = |k| public_key(&x25519_dalek::StaticSecret::from(k));
        assert_eq!(pk(raw), pk(clamped));
    }

    #[test]
    fn xaead_open_refuses_short_and_altered_input() {
        let key = [3u8; KEY_LEN];
        let nonce = [5u8; XNONCE_LEN];
        assert_eq!(
            xaead_open(&key, &nonce, &[0u8; TAG_LEN - 1], &[]),
            Err(AeadError)
        );
        let mut sealed = xaead_seal(&key, &nonce, b"cookie", b"mac1");
        assert_eq!(
            xaead_open(&key, &nonce, &sealed, b"mac1").unwrap(),
            b"cookie"
        );
        sealed[0] ^= 1;
        assert_eq!(xaead_open(&key, &nonce, &sealed, b"mac1"), Err(AeadError));
    }
    use rand_core::RngCore;

    #[test]
    fn keystream_rng_is_the_chacha20_keystream_across_refills() {
        let mut rng = KeystreamRng::from_seed([7; KEY_LEN]);
        let mut got = vec![0u8; 3 * KEYSTREAM_REFILL + 5];
        // Odd-sized draws cross refill boundaries.
        for chunk in got.chunks_mut(24) {
            rng.fill_bytes(chunk);
        }
        // Each refill: the keystream under the current key, whose first 32 bytes are the
        // next key and the rest the output.
        let mut want = Vec::new();
        let mut key = [7; KEY_LEN];
        for counter in 0..4 {
            let block = aead_seal(&key, counter, &[0; KEY_LEN + KEYSTREAM_REFILL], &[]);
            key.copy_from_slice(&block[..KEY_LEN]);
            want.extend_from_slice(&block[KEY_LEN..KEY_LEN + KEYSTREAM_REFILL]);
        }
        assert_eq!(got, want[..got.len()]);
        assert_eq!(
            rng.key, key,
            "the key in memory is the last refill's next key"
        );
    }

    /// RFC 8439 A.1 test vector #2: the ChaCha20 block for an all-zero key and nonce
    /// at block counter 1, which is where the AEAD's encryption keystream starts. Its
    /// first half replaces the seed key, and output starts at its second half.
    #[test]
    fn keystream_rng_matches_rfc8439_block_and_erases_the_seed() {
        let hex = |h: &str| -> Vec<u8> {
            (0..h.len() / 2)
                .map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap())
                .collect()
        };
        let mut rng = KeystreamRng::from_seed([0; KEY_LEN]);
        let mut got = [0u8; 32];
        rng.fill_bytes(&mut got);
        assert_eq!(
            rng.key[..],
            hex("9f07e7be5551387a98ba977c732d080dcb0f29a048e3656912c6533e32ee7aed")[..]
        );
        assert_eq!(
            got[..],
            hex("29b721769ce64e43d57133b074d839d531ed1f28510afb45ace10a1f4b794d6f")[..]
        );
    }

    #[test]
    fn keystream_rng_nonces_do_not_repeat() {
        let mut rng = KeystreamRng::from_seed([9; KEY_LEN]);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..100_000 {
            let mut nonce = [0u8; XNONCE_LEN];
            rng.fill_bytes(&mut nonce);
            assert!(seen.insert(nonce));
        }
        let other = KeystreamRng::from_seed([10; KEY_LEN]).next_u64();
        assert_ne!(other, KeystreamRng::from_seed([9; KEY_LEN]).next_u64());
    }
}
