//! The sealed channel a store connection becomes once its handshake is done.
//!
//! Each direction has its own key (`StoreKey::session_keys`: from the job's key and both
//! handshake nonces) and numbers its frames from 0. A frame is
//!
//! ```text
//! len: u32 (little-endian)   bytes that follow: the sealed plaintext and a 16-byte tag
//! ChaCha20-Poly1305(key of this direction, nonce = frame number, associated data = len)
//! ```
//!
//! so whoever relays the connection sees lengths and ciphertext only, and a frame that was
//! altered, replayed, reordered or injected does not open: the receiver expects the next number
//! of its direction and nothing else. A frame that does not open ends the connection (nothing
//! after it can be trusted), and every read has a deadline, so a slow peer cannot hold a
//! reader forever.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use chacha20poly1305::aead::AeadInOut;
use chacha20poly1305::{ChaCha20Poly1305, KeyInit, Nonce};

/// Bytes of a frame's authentication tag.
pub(super) const SEAL: usize = 16;

/// Why a frame could not be read.
#[derive(Debug)]
pub(super) enum FrameError {
    /// The connection failed, closed or missed its deadline.
    Io(io::Error),
    /// A length past what the reader accepts: no frame of this protocol is that long.
    TooLong(usize),
    /// The frame did not open: altered, replayed, reordered or injected on the way.
    Forged,
}

impl From<io::Error> for FrameError {
    fn from(e: io::Error) -> Self {
        FrameError::Io(e)
    }
}

/// One direction of a channel: a key and the number of the next frame.
pub(super) struct Direction {
    cipher: ChaCha20Poly1305,
    next: u64,
}

impl Direction {
    pub(super) fn new(key: &[u8; 32]) -> Self {
        Direction {
            cipher: ChaCha20Poly1305::new(&(*key).into()),
            next: 0,
        }
    }

    /// The nonce of the next frame, then counts it. A direction never numbers 2^64 frames (at
    /// one frame a nanosecond, 584 years); refusing beats ever reusing a nonce.
    fn take_nonce(&mut self) -> io::Result<Nonce> {
        let n = self.next;
        self.next = n
            .checked_add(1)
            .ok_or_else(|| io::Error::other("the channel numbered 2^64 frames"))?;
        let mut nonce = [0u8; 12];
        nonce[..8].copy_from_slice(&n.to_le_bytes());
        Ok(nonce.into())
    }

    /// `plain` as one frame, ready to write.
    pub(super) fn seal(&mut self, plain: &[u8]) -> io::Result<Vec<u8>> {
        let len = plain
            .len()
            .checked_add(SEAL)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| io::Error::other("a frame longer than 4 GiB"))?;
        let nonce = self.take_nonce()?;
        let aad = len.to_le_bytes();
        let mut body = Vec::with_capacity(4 + len as usize);
        body.extend_from_slice(plain);
        self.cipher
            .encrypt_in_place(&nonce, &aad, &mut body)
            .map_err(|_| io::Error::other("sealing a frame"))?;
        let mut frame = Vec::with_capacity(4 + body.len());
        frame.extend_from_slice(&aad);
        frame.extend_from_slice(&body);
        Ok(frame)
    }

    /// Reads and opens the next frame, of at most `max` plaintext bytes. Its first byte must
    /// arrive by `first_by` (`None`: whenever the peer likes, as an idle connection's next
    /// request); the rest by `rest_within` after it (`None`: by `first_by`).
    pub(super) fn read(
        &mut self,
        s: &mut TcpStream,
        max: usize,
        first_by: Option<Instant>,
        rest_within: Option<Duration>,
    ) -> Result<Vec<u8>, FrameError> {
        let mut head = [0u8; 4];
        read_by(s, &mut head[..1], first_by)?;
        let rest_by = match rest_within {
            Some(d) => Instant::now().checked_add(d),
            None => first_by,
        };
        read_by(s, &mut head[1..], rest_by)?;
        let len = u32::from_le_bytes(head) as usize;
        if len < SEAL || len - SEAL > max {
            return Err(FrameError::TooLong(len));
        }
        let mut body = vec![0u8; len];
        read_by(s, &mut body, rest_by)?;
        let nonce = self.take_nonce()?;
        self.cipher
            .decrypt_in_place(&nonce, &head, &mut body)
            .map_err(|_| FrameError::Forged)?;
        Ok(body)
    }
}

/// Fills `buf` from `s` by `deadline` (`None`: no limit), however the peer spaces its bytes: a
/// peer sending one byte now and then does not reset the clock, as a per-read timeout would.
pub(super) fn read_by(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: Option<Instant>,
) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = match deadline {
            None => None,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the peer did not send in time",
                    ));
                }
                Some(left)
            }
        };
        s.set_read_timeout(left)?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the peer did not send in time",
                ))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes `bytes` to `s`, giving up once `deadline` has passed (a peer that stops reading
/// cannot hold the writer forever either).
pub(super) fn write_by(s: &mut TcpStream, bytes: &[u8], deadline: Instant) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the peer did not read in time",
        ));
    }
    s.set_write_timeout(Some(left))?;
    s.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    fn soon() -> Option<Instant> {
        Some(Instant::now() + Duration::from_secs(10))
    }

    #[test]
    fn frames_open_in_order_only_and_not_once_altered() {
        let key = [7u8; 32];
        let (mut a, mut b) = pair();
        let (mut tx, mut rx) = (Direction::new(&key), Direction::new(&key));
        let f0 = tx.seal(b"first").unwrap();
        let f1 = tx.seal(b"second").unwrap();
        assert!(
            !f0.windows(5).any(|w| w == b"first"),
            "plaintext on the wire"
        );
        a.write_all(&f0).unwrap();
        a.write_all(&f1).unwrap();
        assert_eq!(rx.read(&mut b, 64, soon(), None).unwrap(), b"first");
        assert_eq!(rx.read(&mut b, 64, soon(), None).unwrap(), b"second");
        // Replayed: frame 0 again where frame 2 is due.
        a.write_all(&f0).unwrap();
        assert!(matches!(
            rx.read(&mut b, 64, soon(), None),
            Err(FrameError::Forged)
        ));
        // Altered, and reordered (frame 1 where frame 0 is due).
        let (mut tx, mut rx) = (Direction::new(&key), Direction::new(&key));
        let mut bad = tx.seal(b"payload").unwrap();
        bad[6] ^= 1;
        a.write_all(&bad).unwrap();
        assert!(matches!(
            rx.read(&mut b, 64, soon(), None),
            Err(FrameError::Forged)
        ));
        let (mut tx, mut rx) = (Direction::new(&key), Direction::new(&key));
        let _skipped = tx.seal(b"zero").unwrap();
        a.write_all(&tx.seal(b"one").unwrap()).unwrap();
        assert!(matches!(
            rx.read(&mut b, 64, soon(), None),
            Err(FrameError::Forged)
        ));
        // Another key (the other direction's, say) does not open it either.
        let mut other = Direction::new(&[8u8; 32]);
        a.write_all(&Direction::new(&key).seal(b"x").unwrap())
            .unwrap();
        assert!(matches!(
            other.read(&mut b, 64, soon(), None),
            Err(FrameError::Forged)
        ));
        // A length past the reader's limit is refused before anything is allocated.
        a.write_all(&u32::MAX.to_le_bytes()).unwrap();
        assert!(matches!(
            rx.read(&mut b, 64, soon(), None),
            Err(FrameError::TooLong(n)) if n == u32::MAX as usize
        ));
    }

    #[test]
    fn a_half_sent_frame_ends_at_its_deadline() {
        let (mut a, mut b) = pair();
        // Half a frame, then silence: the reader gives up at its deadline.
        a.write_all(&[40, 0]).unwrap();
        let t0 = Instant::now();
        let e = Direction::new(&[1u8; 32])
            .read(&mut b, 64, Some(t0 + Duration::from_millis(300)), None)
            .unwrap_err();
        assert!(
            matches!(&e, FrameError::Io(e) if e.kind() == io::ErrorKind::TimedOut),
            "{e:?}"
        );
        assert!(t0.elapsed() >= Duration::from_millis(300));
    }
}
