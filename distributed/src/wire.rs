//! Wire format of the rendezvous/store protocol: each message is a 4-byte big-endian length
//! followed by that many bytes of JSON. Small and debuggable (`tcpdump -A` shows the keys); byte
//! values (the 128-byte NCCL unique id, store values) travel as base64 strings, which keeps the
//! CPU store path (gradients of tiny test models) several times faster than JSON number arrays.

use std::io::{Read, Write};
use std::net::TcpStream;

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::error::{DistError, Result};

/// Protocol tag sent in every hello; a peer with another tag is not a flamia rank of this
/// version. Version 3 added the job identity ([`Hello::job`]); a version-2 peer is refused with
/// a protocol error naming both tags.
pub const MAGIC: &str = "flamia-rdzv/3";

/// Largest message body, in bytes: `send` refuses a larger one, `recv` rejects one (guards
/// against a stray client sending garbage).
pub const MAX_MESSAGE: usize = 64 << 20;

/// What a connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// The rank's main connection: join the group, then store requests.
    Join,
    /// A second connection carrying only heartbeats.
    Heartbeat,
}

/// First message on every connection.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    pub magic: String,
    pub role: Role,
    pub rank: usize,
    pub world_size: usize,
    pub host: String,
    pub pid: u32,
    /// Which job this process belongs to ([`crate::env::job_id_from_vars`]); rank 0's server
    /// refuses a hello from another job without touching its group. `None`: no identity known.
    #[serde(default)]
    pub job: Option<String>,
}

/// Why the group refused a rank or failed (structured so each rank gets a typed error).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Failure {
    WorldSize {
        rank: usize,
        theirs: usize,
        expected: usize,
    },
    Duplicate {
        rank: usize,
        first_host: String,
        second_host: String,
    },
    OutOfRange {
        rank: usize,
        world_size: usize,
    },
    Timeout {
        waited_ms: u64,
        joined: usize,
        world_size: usize,
        missing: Vec<usize>,
    },
    Peer(String),
    /// The hello came from another job (e.g. a second job on the same port); only that
    /// connection is refused.
    ForeignJob {
        rank: usize,
        server_job: Option<String>,
        client_job: Option<String>,
    },
    /// A join refused once the group was complete; only that connection is refused, the group
    /// goes on. `reason` says why.
    Refused {
        rank: usize,
        reason: String,
    },
}

impl Failure {
    /// The typed error a rank reports for this failure.
    pub fn to_error(&self) -> DistError {
        match self.clone() {
            Failure::WorldSize {
                rank,
                theirs,
                expected,
            } => DistError::WorldSizeMismatch {
                rank,
                theirs,
                expected,
            },
            Failure::Duplicate {
                rank,
                first_host,
                second_host,
            } => DistError::DuplicateRank {
                rank,
                first_host,
                second_host,
            },
            Failure::OutOfRange { rank, world_size } => DistError::RankOutOfRange { rank, world_size },
            Failure::Timeout {
                waited_ms,
                joined,
                world_size,
                missing,
            } => DistError::RendezvousTimeout {
                waited: std::time::Duration::from_millis(waited_ms),
                joined,
                world_size,
                missing,
            },
            Failure::Peer(msg) => DistError::PeerFailure(msg),
            Failure::ForeignJob {
                rank,
                server_job,
                client_job,
            } => DistError::ForeignJob {
                rank,
                addr: "rank 0's rendezvous server".into(),
                server_job: job_name(server_job.as_deref()),
                this_job: job_name(client_job.as_deref()),
            },
            Failure::Refused { rank, reason } => DistError::Rejected { rank, reason },
        }
    }
}

/// A job identity for messages (`None` has no name).
pub fn job_name(job: Option<&str>) -> String {
    match job {
        Some(j) => format!("{j:?}"),
        None => "<unnamed> (no FLAMIA_RUN_ID, Slurm job or torchrun run id)".into(),
    }
}

/// Messages from a rank to rank 0's server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    Hello(Hello),
    Set {
        key: String,
        #[serde(with = "base64")]
        value: Vec<u8>,
    },
    /// Block until `key` exists (or `timeout_ms` passes, or the group fails).
    Get {
        key: String,
        timeout_ms: u64,
    },
    /// Atomically add to an integer counter, returning the new value.
    Add {
        key: String,
        delta: i64,
    },
    /// Report an error on this rank: the whole group fails with this reason.
    Fail {
        reason: String,
    },
    Beat,
    /// Clean disconnect: closing after this is not a failure.
    Leave,
}

/// Replies from the server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Reply {
    Welcome {
        #[serde(with = "base64")]
        payload: Vec<u8>,
        hosts: Vec<String>,
    },
    Ok,
    Value(#[serde(with = "base64")] Vec<u8>),
    Int(i64),
    Timeout,
    Status {
        failure: Option<Failure>,
    },
    Failed(Failure),
}

/// Send one message. A body over [`MAX_MESSAGE`] is refused with
/// [`DistError::MessageTooLarge`] before anything is written (the connection stays usable).
pub fn send<T: Serialize>(stream: &mut TcpStream, peer: &str, msg: &T) -> Result<()> {
    send_limited(stream, peer, msg, MAX_MESSAGE)
}

fn send_limited<T: Serialize>(stream: &mut TcpStream, peer: &str, msg: &T, max: usize) -> Result<()> {
    let body = serde_json::to_vec(msg).map_err(|e| DistError::protocol(peer, e.to_string()))?;
    let len = match u32::try_from(body.len()) {
        Ok(len) if body.len() <= max => len,
        _ => {
            return Err(DistError::MessageTooLarge {
                peer: peer.to_string(),
                bytes: body.len(),
                max,
            })
        }
    };
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&body);
    stream.write_all(&frame).map_err(|e| DistError::io(peer, e))
}

/// Receive one message (honours the stream's read timeout).
pub fn recv<T: DeserializeOwned>(stream: &mut TcpStream, peer: &str) -> Result<T> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).map_err(|e| DistError::io(peer, e))?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return Err(DistError::protocol(
            peer,
            format!("message of {len} bytes exceeds {MAX_MESSAGE}"),
        ));
    }
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).map_err(|e| DistError::io(peer, e))?;
    serde_json::from_slice(&body).map_err(|e| DistError::protocol(peer, format!("bad message: {e}")))
}

/// True when an I/O error is a read timeout (platforms differ in the kind they report).
pub fn is_timeout(e: &DistError) -> bool {
    matches!(e, DistError::Io { source, .. }
        if matches!(source.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
}

/// This machine's host name (for error messages), without a libc dependency.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".into())
}

/// Standard base64 (with padding) for the byte fields of the messages.
mod base64 {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(bytes: &[u8]) -> String {
        let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
        for chunk in bytes.chunks(3) {
            let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    pub fn decode(text: &str) -> Result<Vec<u8>, String> {
        let t = text.as_bytes();
        if !t.len().is_multiple_of(4) {
            return Err(format!("base64 of length {} (not a multiple of 4)", t.len()));
        }
        let value = |c: u8| -> Result<u32, String> {
            match c {
                b'A'..=b'Z' => Ok(u32::from(c - b'A')),
                b'a'..=b'z' => Ok(u32::from(c - b'a') + 26),
                b'0'..=b'9' => Ok(u32::from(c - b'0') + 52),
                b'+' => Ok(62),
                b'/' => Ok(63),
                _ => Err(format!("invalid base64 character {:?}", c as char)),
            }
        };
        let mut out = Vec::with_capacity(t.len() / 4 * 3);
        for quad in t.chunks(4) {
            let pad = quad.iter().rev().take_while(|&&c| c == b'=').count();
            let mut n = 0u32;
            for &c in &quad[..4 - pad] {
                n = (n << 6) | value(c)?;
            }
            n <<= 6 * pad as u32;
            out.extend_from_slice(&[(n >> 16) as u8, (n >> 8) as u8, n as u8][..3 - pad]);
        }
        Ok(out)
    }

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        decode(&text).map_err(D::Error::custom)
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn round_trips_every_length_and_matches_the_standard() {
            assert_eq!(super::encode(b"Man"), "TWFu");
            assert_eq!(super::encode(b"Ma"), "TWE=");
            assert_eq!(super::encode(b"M"), "TQ==");
            for n in 0..300usize {
                let bytes: Vec<u8> = (0..n).map(|i| (i * 37 + n) as u8).collect();
                assert_eq!(
                    super::decode(&super::encode(&bytes)).unwrap(),
                    bytes,
                    "length {n}"
                );
            }
            assert!(super::decode("abc").is_err() && super::decode("ab!=").is_err());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::time::Duration;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (a, b)
    }

    fn set(bytes: usize) -> Request {
        Request::Set {
            key: "k".into(),
            value: vec![7u8; bytes],
        }
    }

    #[test]
    fn an_oversize_message_is_refused_before_sending_and_the_connection_stays_usable() {
        let (mut a, mut b) = pair();
        b.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let e = send_limited(&mut a, "peer", &set(3000), 1000).unwrap_err();
        assert!(
            matches!(e, DistError::MessageTooLarge { bytes, max: 1000, .. } if bytes > 1000),
            "{e}"
        );
        assert!(e.to_string().contains("exceeds"), "{e}");
        send_limited(&mut a, "peer", &set(10), 1000).unwrap();
        // The receiver sees the small message first: nothing of the refused one was written.
        match recv::<Request>(&mut b, "peer").unwrap() {
            Request::Set { value, .. } => assert_eq!(value, vec![7u8; 10]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn send_applies_max_message() {
        let (mut a, mut b) = pair();
        b.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        // Were the message sent, nobody reads it: fail instead of blocking forever.
        a.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        // base64 makes 4 bytes of 3: this value's body is just over the limit.
        let e = send(&mut a, "peer", &set(MAX_MESSAGE / 4 * 3 + 3)).unwrap_err();
        assert!(
            matches!(e, DistError::MessageTooLarge { max: MAX_MESSAGE, .. }),
            "{e}"
        );
        let mut byte = [0u8; 1];
        let r = std::io::Read::read(&mut b, &mut byte);
        assert!(
            r.as_ref().is_err_and(|e| matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            )),
            "nothing was sent: {r:?}"
        );
    }

    #[test]
    fn a_version_2_hello_without_a_job_still_parses() {
        let v2 =
            r#"{"Hello":{"magic":"flamia-rdzv/2","role":"Join","rank":1,"world_size":2,"host":"h","pid":3}}"#;
        match serde_json::from_str::<Request>(v2).unwrap() {
            Request::Hello(h) => assert_eq!((h.magic.as_str(), h.job), ("flamia-rdzv/2", None)),
            other => panic!("{other:?}"),
        }
    }
}
