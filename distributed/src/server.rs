//! Rank 0's rendezvous and store server. One thread accepts connections; each connection gets a
//! thread. Joining ranks are validated (magic, world size, rank range, duplicates) and held until
//! all `world_size` ranks are present, then every rank gets the payload (the NCCL unique id) and
//! the host of every rank. Afterwards the same connections serve store requests (set / blocking
//! get / add), and a second connection per rank carries heartbeats. Any failure (a bad join while
//! the group forms, a rank that disconnects without saying goodbye, missing heartbeats, a rank
//! reporting an error) is recorded once and returned to every rank on its next request or
//! heartbeat.
//!
//! Connections that are not part of this group are refused on that connection only, never
//! failing the group: a hello of another protocol version or of another job (the job identity of
//! [`ServerOptions::job`], e.g. a second job started on the same port), and, once every rank has
//! joined, any further join (duplicate rank, other world size, rank out of range) or a heartbeat
//! connection that no joined rank owns.

use std::collections::HashMap;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{DistError, Result};
use crate::wire::{self, Failure, Hello, Reply, Request, Role, MAGIC};

/// Server timing and identity.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// How long the ranks have to join, from server start.
    pub join_timeout: Duration,
    /// A rank silent for longer than this on its heartbeat connection is declared dead.
    pub heartbeat_timeout: Duration,
    /// This job's identity: a hello with another one is refused (that connection only).
    pub job: Option<String>,
}

struct Member {
    host: String,
    pid: u32,
}

#[derive(Default)]
struct State {
    world_size: usize,
    payload: Vec<u8>,
    members: Vec<Option<Member>>,
    failure: Option<Failure>,
    kv: HashMap<String, Vec<u8>>,
    left: Vec<bool>,
    /// Ranks whose heartbeat connection is open or was (one per rank).
    heartbeats: Vec<bool>,
    open_connections: usize,
    /// Join requests not yet answered (rank 0 waits for these before exiting on a failure, so
    /// every rank gets the reason rather than a closed connection).
    unanswered_joins: usize,
}

impl State {
    fn joined(&self) -> usize {
        self.members.iter().filter(|m| m.is_some()).count()
    }
    fn fail(&mut self, f: Failure) {
        if self.failure.is_none() {
            self.failure = Some(f);
        }
    }
    fn describe(&self, rank: usize) -> String {
        match self.members.get(rank).and_then(|m| m.as_ref()) {
            Some(m) => format!("rank {rank} ({} pid {})", m.host, m.pid),
            None => format!("rank {rank}"),
        }
    }
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    started: Instant,
    opts: ServerOptions,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking connection thread must not take the whole server down with it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Handle to a running server (owned by rank 0).
pub struct Server {
    shared: Arc<Shared>,
    pub(crate) local_addr: std::net::SocketAddr,
}

impl Server {
    /// Bind `bind_addr` and start serving a group of `world_size` ranks that will receive `payload`.
    pub fn start(
        bind_addr: &str,
        world_size: usize,
        payload: Vec<u8>,
        opts: ServerOptions,
    ) -> Result<Server> {
        let listener = TcpListener::bind(bind_addr).map_err(|e| DistError::Bind {
            addr: bind_addr.to_string(),
            reason: e.to_string(),
        })?;
        let local_addr = listener.local_addr().map_err(|e| DistError::io(bind_addr, e))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                world_size,
                payload,
                members: (0..world_size).map(|_| None).collect(),
                left: vec![false; world_size],
                heartbeats: vec![false; world_size],
                ..State::default()
            }),
            changed: Condvar::new(),
            started: Instant::now(),
            opts,
        });
        let acc = shared.clone();
        thread::Builder::new()
            .name("flamia-rdzv-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    let Ok(conn) = conn else { continue };
                    let sh = acc.clone();
                    let _ = thread::Builder::new()
                        .name("flamia-rdzv-conn".into())
                        .spawn(move || serve(sh, conn));
                }
            })
            .map_err(|e| DistError::io("accept thread", e))?;
        Ok(Server { shared, local_addr })
    }

    /// Wait (up to `timeout`) until every pending join has been answered (used by rank 0 before it
    /// returns a rendezvous error, so that the other ranks receive the reason).
    pub fn wait_joins_answered(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        while st.unanswered_joins > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Wait (up to `timeout`) until every rank has disconnected, so that rank 0 exiting first
    /// neither looks like a failure to the others nor cuts off the failure reason they are owed.
    pub fn wait_all_left(&self, timeout: Duration) {
        let start = Instant::now();
        let deadline = start + timeout;
        let mut st = self.shared.lock();
        // Every connection closed: the other ranks left cleanly, or (after a failure) received the
        // reason and exited. Rank 0's own two connections close in `ProcessGroup::leave` first.
        while st.open_connections > 0 {
            let now = Instant::now();
            // After a failure, the replies carrying the reason are already on their way
            // (milliseconds); a frozen rank would keep its connections open forever.
            let failed_grace = Duration::from_secs(1);
            if now >= deadline || (st.failure.is_some() && now >= start + failed_grace) {
                break;
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, (deadline - now).min(Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

fn serve(sh: Arc<Shared>, mut conn: TcpStream) {
    let peer = conn
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "unknown peer".into());
    let _ = conn.set_nodelay(true);
    // A connection that does not say hello promptly is not one of ours.
    let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
    let hello = match wire::recv::<Request>(&mut conn, &peer) {
        Ok(Request::Hello(h)) if h.magic == MAGIC => h,
        Ok(Request::Hello(h)) => {
            let reason = format!("protocol {:?}, expected {MAGIC:?}", h.magic);
            let _ = wire::send(&mut conn, &peer, &Reply::Failed(Failure::Peer(reason)));
            return;
        }
        _ => return,
    };
    if hello.job != sh.opts.job {
        // Another job on this port: refuse this connection, leave the group alone.
        let f = Failure::ForeignJob {
            rank: hello.rank,
            server_job: sh.opts.job.clone(),
            client_job: hello.job,
        };
        let _ = wire::send(&mut conn, &peer, &Reply::Failed(f));
        return;
    }
    sh.lock().open_connections += 1;
    match hello.role {
        Role::Join => {
            sh.lock().unanswered_joins += 1;
            serve_member(&sh, conn, &peer, hello)
        }
        Role::Heartbeat => serve_heartbeat(&sh, conn, &peer, &hello),
    }
    sh.lock().open_connections -= 1;
    sh.changed.notify_all();
}

/// Validate a join, wait for the full group, then serve store requests.
fn serve_member(sh: &Shared, mut conn: TcpStream, peer: &str, h: Hello) {
    let rank = h.rank;
    {
        let mut st = sh.lock();
        let rejection = if h.world_size != st.world_size {
            Some(Failure::WorldSize {
                rank,
                theirs: h.world_size,
                expected: st.world_size,
            })
        } else if rank >= st.world_size {
            Some(Failure::OutOfRange {
                rank,
                world_size: st.world_size,
            })
        } else if let Some(m) = &st.members[rank] {
            Some(Failure::Duplicate {
                rank,
                first_host: format!("{} pid {}", m.host, m.pid),
                second_host: format!("{} pid {}", h.host, h.pid),
            })
        } else {
            None
        };
        if let Some(f) = rejection {
            if st.joined() == st.world_size {
                // The group is complete and running: this process is not one of its ranks (a
                // second job on the same port, a restarted rank). Refuse it alone.
                let reason = format!(
                    "{}; rank 0's group of {} ranks is already complete and running, and goes on \
                     without this process (another job on the same rendezvous port? give each job \
                     its own MASTER_PORT or FLAMIA_DIST_PORT)",
                    f.to_error(),
                    st.world_size
                );
                drop(st);
                let _ = wire::send(&mut conn, peer, &Reply::Failed(Failure::Refused { rank, reason }));
                answered(sh);
                return;
            }
            // While the group forms, a misconfigured launch cannot succeed: fail it fast.
            st.fail(f.clone());
            drop(st);
            sh.changed.notify_all();
            let _ = wire::send(&mut conn, peer, &Reply::Failed(f));
            answered(sh);
            return;
        }
        st.members[rank] = Some(Member {
            host: h.host.clone(),
            pid: h.pid,
        });
    }
    sh.changed.notify_all();

    let deadline = sh.started + sh.opts.join_timeout;
    let welcome = {
        let mut st = sh.lock();
        loop {
            if let Some(f) = &st.failure {
                break Reply::Failed(f.clone());
            }
            if st.joined() == st.world_size {
                let hosts = st
                    .members
                    .iter()
                    .map(|m| m.as_ref().map(|m| m.host.clone()).unwrap_or_default());
                break Reply::Welcome {
                    payload: st.payload.clone(),
                    hosts: hosts.collect(),
                };
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = (0..st.world_size).filter(|&r| st.members[r].is_none()).collect();
                let joined = st.joined();
                let ws = st.world_size;
                let waited_ms = sh.opts.join_timeout.as_millis() as u64;
                st.fail(Failure::Timeout {
                    waited_ms,
                    joined,
                    world_size: ws,
                    missing,
                });
                continue;
            }
            st = sh
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    };
    sh.changed.notify_all();
    let joined_ok = matches!(welcome, Reply::Welcome { .. });
    let sent = wire::send(&mut conn, peer, &welcome);
    answered(sh);
    if sent.is_err() || !joined_ok {
        return;
    }

    // Store phase: requests until Leave or disconnect.
    let _ = conn.set_read_timeout(None);
    loop {
        let req = match wire::recv::<Request>(&mut conn, peer) {
            Ok(r) => r,
            Err(_) => {
                let mut st = sh.lock();
                if !st.left[rank] {
                    let who = st.describe(rank);
                    st.fail(Failure::Peer(format!(
                        "{who} closed its connection without leaving (process died?)"
                    )));
                }
                drop(st);
                sh.changed.notify_all();
                return;
            }
        };
        let reply = handle(sh, rank, req);
        let leaving = reply.is_none();
        if wire::send(&mut conn, peer, &reply.unwrap_or(Reply::Ok)).is_err() || leaving {
            return;
        }
    }
}

fn answered(sh: &Shared) {
    sh.lock().unanswered_joins -= 1;
    sh.changed.notify_all();
}

/// One store request; `None` means the rank left cleanly.
fn handle(sh: &Shared, rank: usize, req: Request) -> Option<Reply> {
    let mut st = sh.lock();
    let reply = match req {
        Request::Leave => {
            st.left[rank] = true;
            drop(st);
            sh.changed.notify_all();
            return None;
        }
        _ if st.failure.is_some() => {
            Reply::Failed(st.failure.clone().unwrap_or(Failure::Peer(String::new())))
        }
        Request::Set { key, value } => {
            st.kv.insert(key, value);
            Reply::Ok
        }
        Request::Add { key, delta } => {
            let cur = st
                .kv
                .get(&key)
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<i64>().ok())
                .unwrap_or(0);
            let new = cur + delta;
            st.kv.insert(key, new.to_string().into_bytes());
            Reply::Int(new)
        }
        Request::Get { key, timeout_ms } => {
            let deadline = Instant::now() + Duration::from_millis(timeout_ms);
            loop {
                if let Some(f) = &st.failure {
                    break Reply::Failed(f.clone());
                }
                if let Some(v) = st.kv.get(&key) {
                    break Reply::Value(v.clone());
                }
                let now = Instant::now();
                if now >= deadline {
                    break Reply::Timeout;
                }
                st = sh
                    .changed
                    .wait_timeout(st, deadline - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        Request::Fail { reason } => {
            let who = st.describe(rank);
            st.fail(Failure::Peer(format!("{who} reported: {reason}")));
            Reply::Ok
        }
        Request::Beat => Reply::Status {
            failure: st.failure.clone(),
        },
        Request::Hello(_) => Reply::Failed(Failure::Peer("unexpected second hello".into())),
    };
    drop(st);
    sh.changed.notify_all();
    Some(reply)
}

/// Heartbeats: each beat is answered with the group status; silence or a lost connection
/// (without a Leave) fails the group. Only a joined rank's first heartbeat connection is
/// accepted; any other is refused alone.
fn serve_heartbeat(sh: &Shared, mut conn: TcpStream, peer: &str, h: &Hello) {
    let rank = h.rank;
    {
        let mut st = sh.lock();
        let refusal = if h.world_size != st.world_size || rank >= st.world_size {
            Some(format!(
                "heartbeat connection for rank {rank} of {} ranks, but this group has {} ranks",
                h.world_size, st.world_size
            ))
        } else if st.members[rank].is_none() {
            Some(format!(
                "heartbeat connection for rank {rank}, which has not joined"
            ))
        } else if st.heartbeats[rank] {
            Some(format!(
                "second heartbeat connection for rank {rank} (from {} pid {}, rank held by {})",
                h.host,
                h.pid,
                st.describe(rank)
            ))
        } else {
            st.heartbeats[rank] = true;
            None
        };
        if let Some(reason) = refusal {
            drop(st);
            let _ = wire::send(&mut conn, peer, &Reply::Failed(Failure::Refused { rank, reason }));
            return;
        }
    }
    let _ = conn.set_read_timeout(Some(sh.opts.heartbeat_timeout));
    loop {
        let started_wait = Instant::now();
        match wire::recv::<Request>(&mut conn, peer) {
            Ok(Request::Beat) => {
                let status = Reply::Status {
                    failure: sh.lock().failure.clone(),
                };
                if wire::send(&mut conn, peer, &status).is_err() {
                    return;
                }
            }
            Ok(Request::Leave) => return,
            Ok(_) => return,
            Err(e) => {
                let mut st = sh.lock();
                if !st.left[rank] {
                    let who = st.describe(rank);
                    let reason = if wire::is_timeout(&e) {
                        format!("{who} sent no heartbeat for {:.1?}", started_wait.elapsed())
                    } else {
                        format!("{who} lost its heartbeat connection (process died?): {e}")
                    };
                    st.fail(Failure::Peer(reason));
                }
                drop(st);
                sh.changed.notify_all();
                return;
            }
        }
    }
}
