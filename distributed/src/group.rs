//! The process group: rendezvous with rank 0 (which runs the [`crate::server`]), receipt of the
//! opaque payload rank 0 publishes (the 128-byte NCCL unique id), a heartbeat thread, and a
//! small blocking key-value [`Store`] for control-plane messages (barriers, votes to stop, CPU
//! gathers of a few numbers). Bulk data goes through NCCL, never through here.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::env::Topology;
use crate::error::{DistError, Result};
use crate::health::Health;
use crate::server::{Server, ServerOptions};
use crate::wire::{self, Failure, Hello, Reply, Request, Role, MAGIC};

/// Timeouts of the rendezvous and failure detection.
#[derive(Debug, Clone)]
pub struct GroupOptions {
    /// How long every rank has to join (rank 0 counts from its start; others keep retrying to
    /// connect for this long).
    pub join_timeout: Duration,
    /// Period of heartbeats.
    pub heartbeat_interval: Duration,
    /// Silence after which a rank is declared dead; also bounds how long a survivor takes to
    /// notice a dead rank (plus one interval).
    pub heartbeat_timeout: Duration,
    /// When set, a failed group ends this process after this grace (see [`Health::new`]).
    pub exit_grace: Option<Duration>,
    /// Address rank 0 listens on; None: for a loopback master that address (`localhost`:
    /// `127.0.0.1`), else all addresses (`0.0.0.0`, or `::` when `MASTER_ADDR` is an IPv6
    /// address).
    pub bind_host: Option<String>,
    /// This job's identity ([`crate::env::job_id_from_vars`]): rank 0 refuses a process of
    /// another job on its port, and a process reaching another job's server stops with
    /// [`DistError::ForeignJob`]. Every rank of a job must have the same value.
    pub job_id: Option<String>,
}

impl Default for GroupOptions {
    fn default() -> Self {
        GroupOptions {
            join_timeout: Duration::from_secs(600),
            heartbeat_interval: Duration::from_secs(1),
            heartbeat_timeout: Duration::from_secs(60),
            exit_grace: Some(Duration::from_secs(10)),
            bind_host: None,
            job_id: None,
        }
    }
}

impl GroupOptions {
    /// Defaults overridden by `FLAMIA_DIST_JOIN_TIMEOUT_S`, `FLAMIA_DIST_HEARTBEAT_TIMEOUT_S` and
    /// `FLAMIA_DIST_EXIT_GRACE_S` (0 disables the exit) when set, and the job identity from the
    /// environment ([`crate::env::job_id_from_vars`]: `FLAMIA_RUN_ID`, Slurm's job and step, or
    /// torchrun's run id) when there is one.
    pub fn from_env() -> Result<Self> {
        GroupOptions::default().with_env()
    }

    /// These options overridden by the `FLAMIA_DIST_*` variables of [`GroupOptions::from_env`]
    /// that are set.
    pub fn with_env(self) -> Result<Self> {
        let mut o = self;
        let secs = |var: &'static str| -> Result<Option<f64>> {
            match std::env::var(var) {
                Ok(v) if !v.trim().is_empty() => match v.trim().parse::<f64>() {
                    Ok(s) if s.is_finite() && s >= 0.0 => Ok(Some(s)),
                    _ => Err(DistError::BadEnv {
                        var,
                        value: v,
                        reason: "must be seconds >= 0".into(),
                    }),
                },
                _ => Ok(None),
            }
        };
        if let Some(s) = secs("FLAMIA_DIST_JOIN_TIMEOUT_S")? {
            o.join_timeout = Duration::from_secs_f64(s);
        }
        if let Some(s) = secs("FLAMIA_DIST_HEARTBEAT_TIMEOUT_S")? {
            o.heartbeat_timeout = Duration::from_secs_f64(s.max(0.1));
            o.heartbeat_interval = o.heartbeat_interval.min(o.heartbeat_timeout / 4);
        }
        if let Some(s) = secs("FLAMIA_DIST_EXIT_GRACE_S")? {
            o.exit_grace = (s > 0.0).then(|| Duration::from_secs_f64(s));
        }
        if let Some(job) = crate::env::job_id_from_vars(&std::env::vars().collect()) {
            o.job_id = Some(job);
        }
        Ok(o)
    }
}

/// A joined process group.
pub struct ProcessGroup {
    topo: Topology,
    hosts: Vec<String>,
    payload: Vec<u8>,
    store: Arc<Store>,
    health: Arc<Health>,
    stop_heartbeat: Arc<AtomicBool>,
    heartbeat: Option<JoinHandle<()>>,
    server: Option<Server>,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("topo", &self.topo)
            .field("hosts", &self.hosts)
            .finish()
    }
}

impl ProcessGroup {
    /// Join the group described by `topo`. Rank 0 calls `make_payload` (e.g. `ncclGetUniqueId`)
    /// and publishes the bytes; every rank returns with the same payload.
    pub fn join(
        topo: &Topology,
        opts: &GroupOptions,
        make_payload: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<ProcessGroup> {
        topo.validate()?;
        install_panic_hook();
        let server_opts = ServerOptions {
            join_timeout: opts.join_timeout,
            heartbeat_timeout: opts.heartbeat_timeout,
            job: opts.job_id.clone(),
        };
        let (server, endpoint) = if topo.rank == 0 {
            let port = if topo.world_size == 1 { 0 } else { topo.master_port };
            let server = Server::start(
                &bind_address(topo, opts.bind_host.as_deref(), port),
                topo.world_size,
                make_payload()?,
                server_opts,
            )?;
            let ep = own_endpoint(server.local_addr);
            (Some(server), ep)
        } else {
            (None, topo.master_endpoint())
        };
        let health = Health::new(topo.rank, opts.exit_grace);
        let joined = Self::rendezvous(topo, opts, &endpoint);
        if joined.is_err() {
            if let Some(server) = &server {
                // Let the other ranks receive the reason before this process exits.
                server.wait_joins_answered(Duration::from_secs(3));
            }
        }
        let (conn, payload, hosts) = joined?;

        let mut hb = connect(topo.rank, &endpoint, Instant::now() + Duration::from_secs(30))?;
        wire::send(&mut hb, &endpoint, &hello(topo, opts, Role::Heartbeat))?;
        let stop = Arc::new(AtomicBool::new(false));
        let heartbeat = spawn_heartbeat(hb, endpoint.clone(), opts.clone(), health.clone(), stop.clone())?;
        let store = Store {
            conn: Mutex::new(conn),
            peer: endpoint,
            health: health.clone(),
            rank: topo.rank,
            world_size: topo.world_size,
            generation: AtomicU64::new(0),
        };
        Ok(ProcessGroup {
            topo: topo.clone(),
            hosts,
            payload,
            store: Arc::new(store),
            health,
            stop_heartbeat: stop,
            heartbeat: Some(heartbeat),
            server,
        })
    }

    /// Connect to rank 0, say hello, wait for the welcome: `(connection, payload, hosts)`.
    fn rendezvous(
        topo: &Topology,
        opts: &GroupOptions,
        endpoint: &str,
    ) -> Result<(TcpStream, Vec<u8>, Vec<String>)> {
        let deadline = Instant::now() + opts.join_timeout;
        let mut conn = connect(topo.rank, endpoint, deadline)?;
        wire::send(&mut conn, endpoint, &hello(topo, opts, Role::Join))?;
        // Rank 0 answers at its own deadline at the latest; the slack covers clock skew of starts.
        let wait = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(10);
        conn.set_read_timeout(Some(wait))
            .map_err(|e| DistError::io(endpoint, e))?;
        let (payload, hosts) = match wire::recv::<Reply>(&mut conn, endpoint) {
            Ok(Reply::Welcome { payload, hosts }) => (payload, hosts),
            Ok(Reply::Failed(Failure::ForeignJob {
                rank,
                server_job,
                client_job,
            })) => {
                return Err(DistError::ForeignJob {
                    rank,
                    addr: format!("the rendezvous server at {endpoint}"),
                    server_job: wire::job_name(server_job.as_deref()),
                    this_job: wire::job_name(client_job.as_deref()),
                })
            }
            Ok(Reply::Failed(f)) => return Err(f.to_error()),
            Ok(other) => {
                return Err(DistError::protocol(
                    endpoint,
                    format!("expected welcome, got {other:?}"),
                ))
            }
            Err(e) if wire::is_timeout(&e) => {
                return Err(DistError::RendezvousTimeout {
                    waited: opts.join_timeout,
                    joined: 0,
                    world_size: topo.world_size,
                    missing: Vec::new(),
                })
            }
            Err(DistError::Io { source, .. }) if source.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(DistError::Rejected {
                    rank: topo.rank,
                    reason: "rank 0 closed the connection during the rendezvous".into(),
                })
            }
            Err(e) => return Err(e),
        };
        conn.set_read_timeout(None)
            .map_err(|e| DistError::io(endpoint, e))?;
        Ok((conn, payload, hosts))
    }

    pub fn rank(&self) -> usize {
        self.topo.rank
    }
    pub fn world_size(&self) -> usize {
        self.topo.world_size
    }
    pub fn topology(&self) -> &Topology {
        &self.topo
    }
    /// Host name of every rank, by rank.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }
    /// The bytes rank 0 published (the NCCL unique id).
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }
    pub fn store(&self) -> &Store {
        &self.store
    }
    /// The store as a shared handle, for a thread that outlives a borrow of the group (the
    /// trainer's overlapped gradient reducer on CPU ranks).
    pub fn shared_store(&self) -> Arc<Store> {
        self.store.clone()
    }
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// Report an error on this rank so that every rank stops (they see it on their next store
    /// call or heartbeat).
    pub fn fail(&self, reason: &str) {
        let _ = self.store.request(&Request::Fail {
            reason: reason.to_string(),
        });
        self.health
            .record(format!("rank {} failed: {reason}", self.topo.rank));
    }

    /// Clean shutdown: barrier with every rank, then leave; rank 0 waits for the others to leave
    /// before its server goes away.
    pub fn shutdown(mut self, timeout: Duration) -> Result<()> {
        let r = self.store.barrier(timeout);
        self.leave(timeout);
        r
    }

    fn leave(&mut self, timeout: Duration) {
        let _ = self.store.request(&Request::Leave);
        self.stop_heartbeat.store(true, Ordering::SeqCst);
        if let Some(h) = self.heartbeat.take() {
            let _ = h.join();
        }
        if let Some(s) = &self.server {
            s.wait_all_left(timeout);
        }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if self.heartbeat.is_none() {
            return;
        }
        if std::thread::panicking() {
            // Dropped while unwinding (a tch call that panicked, CUDA out of memory in a call
            // without an `f_` variant, ...): a clean Leave would let the others wait for this
            // rank until a timeout; report the failure so that they stop at once.
            let what = last_panic().unwrap_or_else(|| "panicked".into());
            self.fail(&format!("panicked: {what}"));
        }
        self.leave(Duration::from_secs(5));
    }
}

/// The message and place of the last panic in this process (recorded by the hook that
/// [`ProcessGroup::join`] installs), for the failure report a panicking rank sends.
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

fn last_panic() -> Option<String> {
    LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// Wraps the current panic hook (kept: it still prints the message) with one that remembers the
/// message, once per process.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".into());
            let place = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let thread = std::thread::current();
            let note = format!(
                "thread '{}' panicked{place}: {msg}",
                thread.name().unwrap_or("<unnamed>")
            );
            // try_lock: a panic while the lock is held must not deadlock the hook.
            if let Ok(mut last) = LAST_PANIC.try_lock() {
                *last = Some(note);
            }
            previous(info);
        }));
    });
}

/// This rank's hello on a new connection to rank 0 (`Join` for the control connection,
/// `Heartbeat` for the heartbeat's).
fn hello(topo: &Topology, opts: &GroupOptions, role: Role) -> Request {
    Request::Hello(Hello {
        magic: MAGIC.into(),
        role,
        rank: topo.rank,
        world_size: topo.world_size,
        host: wire::hostname(),
        pid: std::process::id(),
        job: opts.job_id.clone(),
    })
}

/// The address rank 0's server binds (`host:port`, IPv6 hosts in brackets): `bind_host` when
/// given; else loopback for a loopback master and all addresses otherwise, of the master
/// address's family (IPv6 for an IPv6 `MASTER_ADDR`, IPv4 for anything else, host names
/// included).
fn bind_address(topo: &Topology, bind_host: Option<&str>, port: u16) -> String {
    let bare = |h: &str| h.trim_start_matches('[').trim_end_matches(']').to_string();
    if let Some(h) = bind_host {
        return match bare(h).parse::<IpAddr>() {
            Ok(ip) => SocketAddr::new(ip, port).to_string(),
            Err(_) => format!("{h}:{port}"),
        };
    }
    let ip = match bare(&topo.master_addr).parse::<IpAddr>() {
        Ok(IpAddr::V6(a)) if a.is_loopback() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        Ok(IpAddr::V6(_)) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        Ok(IpAddr::V4(a)) if a.is_loopback() => IpAddr::V4(a),
        _ if topo.master_addr == "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
        _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    };
    SocketAddr::new(ip, port).to_string()
}

/// Where rank 0 reaches its own server bound at `bound`: the loopback address of its family when
/// it listens on all addresses, else the bound address itself.
fn own_endpoint(bound: SocketAddr) -> String {
    let ip = match bound.ip() {
        IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, bound.port()).to_string()
}

/// Connect with retries until `deadline` (rank 0 may start after the others).
fn connect(rank: usize, endpoint: &str, deadline: Instant) -> Result<TcpStream> {
    let start = Instant::now();
    let mut last_error = String::from("no attempt made");
    loop {
        let addrs: Vec<SocketAddr> = match endpoint.to_socket_addrs() {
            Ok(a) => a.collect(),
            Err(e) => {
                last_error = format!("cannot resolve: {e}");
                Vec::new()
            }
        };
        for addr in addrs {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(50));
            match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Err(e) => last_error = format!("{addr}: {e}"),
            }
        }
        if Instant::now() >= deadline {
            return Err(DistError::MasterUnreachable {
                rank,
                addr: endpoint.to_string(),
                waited: start.elapsed(),
                last_error,
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn spawn_heartbeat(
    mut conn: TcpStream,
    peer: String,
    opts: GroupOptions,
    health: Arc<Health>,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>> {
    let _ = conn.set_read_timeout(Some(opts.heartbeat_timeout));
    std::thread::Builder::new()
        .name("flamia-dist-heartbeat".into())
        .spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let status = wire::send(&mut conn, &peer, &Request::Beat)
                    .and_then(|_| wire::recv::<Reply>(&mut conn, &peer));
                match status {
                    Ok(Reply::Status { failure: None }) => {}
                    Ok(Reply::Status { failure: Some(f) }) | Ok(Reply::Failed(f)) => {
                        health.record(f.to_error().to_string());
                        return;
                    }
                    Ok(other) => {
                        health.record(format!("unexpected heartbeat reply {other:?}"));
                        return;
                    }
                    Err(e) => {
                        if !stop.load(Ordering::SeqCst) {
                            health.record(format!("lost contact with rank 0 at {peer} (rank 0 died?): {e}"));
                        }
                        return;
                    }
                }
                // Sleep in small steps so that shutdown is prompt.
                let until = Instant::now() + opts.heartbeat_interval;
                while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20).min(opts.heartbeat_interval));
                }
            }
            let _ = wire::send(&mut conn, &peer, &Request::Leave);
        })
        .map_err(|e| DistError::io("heartbeat thread", e))
}

/// Blocking key-value store on rank 0, shared by all ranks. Keys live for the whole job.
pub struct Store {
    conn: Mutex<TcpStream>,
    peer: String,
    health: Arc<Health>,
    rank: usize,
    world_size: usize,
    generation: AtomicU64,
}

impl Store {
    fn request(&self, req: &Request) -> Result<Reply> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let r =
            wire::send(&mut conn, &self.peer, req).and_then(|_| wire::recv::<Reply>(&mut conn, &self.peer));
        match r {
            Ok(Reply::Failed(f)) => {
                let e = f.to_error();
                self.health.record(e.to_string());
                Err(e)
            }
            Ok(reply) => Ok(reply),
            // Refused before anything was sent: the connection is intact and the caller gets
            // the typed error (it is this rank's mistake, not a lost rank 0).
            Err(e @ DistError::MessageTooLarge { .. }) => Err(e),
            Err(e) => {
                let e = DistError::PeerFailure(format!("lost the store connection to rank 0: {e}"));
                self.health.record(e.to_string());
                Err(e)
            }
        }
    }

    fn unexpected(&self, what: &str, r: Reply) -> DistError {
        DistError::protocol(&self.peer, format!("{what}: unexpected reply {r:?}"))
    }

    /// Set `key` to `value`.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        match self.request(&Request::Set {
            key: key.into(),
            value: value.to_vec(),
        })? {
            Reply::Ok => Ok(()),
            r => Err(self.unexpected("set", r)),
        }
    }

    /// Wait until `key` is set and return its value.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.health.check()?;
        let req = Request::Get {
            key: key.into(),
            timeout_ms: timeout.as_millis() as u64,
        };
        match self.request(&req)? {
            Reply::Value(v) => Ok(v),
            Reply::Timeout => Err(DistError::StoreTimeout {
                key: key.into(),
                waited: timeout,
            }),
            r => Err(self.unexpected("get", r)),
        }
    }

    /// Atomically add `delta` to the integer at `key` (0 when unset); returns the new value.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        match self.request(&Request::Add {
            key: key.into(),
            delta,
        })? {
            Reply::Int(v) => Ok(v),
            r => Err(self.unexpected("add", r)),
        }
    }

    /// Next collective sequence number (every rank must call collectives in the same order).
    fn next_generation(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::SeqCst)
    }

    /// Wait until every rank reaches this barrier.
    pub fn barrier(&self, timeout: Duration) -> Result<()> {
        let g = self.next_generation();
        let n = self.add(&format!("__barrier/{g}"), 1)?;
        if n as usize == self.world_size {
            self.set(&format!("__barrier/{g}/done"), b"1")?;
        }
        self.get(&format!("__barrier/{g}/done"), timeout).map(|_| ())
    }

    /// Gather one byte string from every rank (by rank). Control-plane sized data only.
    pub fn all_gather(&self, value: &[u8], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        let g = self.next_generation();
        self.set(&format!("__gather/{g}/{}", self.rank), value)?;
        (0..self.world_size)
            .map(|r| self.get(&format!("__gather/{g}/{r}"), timeout))
            .collect()
    }

    /// Every rank's byte string (by rank) on `root` only; the other ranks get `None` and do not
    /// wait (the store half of a reduce to one rank: only the owner downloads).
    pub fn gather_to(&self, root: usize, value: &[u8], timeout: Duration) -> Result<Option<Vec<Vec<u8>>>> {
        let g = self.next_generation();
        self.set(&format!("__gather_to/{g}/{}", self.rank), value)?;
        if self.rank != root {
            return Ok(None);
        }
        (0..self.world_size)
            .map(|r| self.get(&format!("__gather_to/{g}/{r}"), timeout))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }

    /// True on every rank when at least one rank votes true (e.g. "stop now": a signal or a
    /// time limit seen by one rank).
    /// Four small requests per rank (no all-gather), so it is cheap enough to call every step.
    pub fn vote_any(&self, mine: bool, timeout: Duration) -> Result<bool> {
        let g = self.next_generation();
        let yes = format!("__vote/{g}/yes");
        if mine {
            self.add(&yes, 1)?;
        }
        // Every rank's "yes" lands before its count, and "done" after the last count.
        if self.add(&format!("__vote/{g}/n"), 1)? as usize == self.world_size {
            self.set(&format!("__vote/{g}/done"), b"1")?;
        }
        self.get(&format!("__vote/{g}/done"), timeout)?;
        Ok(self.add(&yes, 0)? > 0)
    }

    /// Rank 0's `value` on every rank (the other ranks pass `None`). O(world size) requests.
    pub fn broadcast(&self, value: Option<&[u8]>, timeout: Duration) -> Result<Vec<u8>> {
        let key = format!("__bcast/{}", self.next_generation());
        match (self.rank, value) {
            (0, Some(v)) => {
                self.set(&key, v)?;
                Ok(v.to_vec())
            }
            (0, None) => Err(DistError::Layout("broadcast: rank 0 must give the value".into())),
            _ => self.get(&key, timeout),
        }
    }

    /// Checks that every rank has the same value of each named item (configuration, data
    /// fingerprint, checkpoint step, parameter checksums, ...). Rank 0 compares and publishes the
    /// verdict, so the traffic is O(world size); on a difference every rank gets
    /// [`DistError::Disagreement`] naming the first differing item, the ranks that differ from
    /// rank 0, and the first differing line of the value. Every rank must pass the same names.
    pub fn agree(&self, items: &[(&str, String)], timeout: Duration) -> Result<()> {
        let g = self.next_generation();
        let mine = serde_json::to_vec(items).map_err(|e| DistError::protocol(&self.peer, e.to_string()))?;
        self.set(&format!("__agree/{g}/{}", self.rank), &mine)?;
        let verdict_key = format!("__agree/{g}/verdict");
        if self.rank == 0 {
            let mut all = Vec::with_capacity(self.world_size);
            for r in 0..self.world_size {
                let bytes = self.get(&format!("__agree/{g}/{r}"), timeout)?;
                let parsed: Vec<(String, String)> = serde_json::from_slice(&bytes)
                    .map_err(|e| DistError::protocol(&self.peer, format!("rank {r}'s agreement: {e}")))?;
                all.push(parsed);
            }
            self.set(&verdict_key, compare_items(&all).as_bytes())?;
        }
        let verdict = self.get(&verdict_key, timeout)?;
        if verdict.is_empty() {
            Ok(())
        } else {
            Err(DistError::Disagreement(
                String::from_utf8_lossy(&verdict).into_owned(),
            ))
        }
    }

    /// Mean of each value across ranks, computed in f64 on the CPU (for a few metrics when no
    /// NCCL communicator exists; the trainer reduces GPU metrics with NCCL instead).
    pub fn mean_across_ranks(&self, values: &[f64], timeout: Duration) -> Result<Vec<f64>> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let all = self.all_gather(&bytes, timeout)?;
        let mut sum = vec![0.0f64; values.len()];
        for (r, b) in all.iter().enumerate() {
            if b.len() != bytes.len() {
                return Err(DistError::Layout(format!(
                    "rank {r} sent {} metric bytes, this rank {}: every rank must reduce the same metrics",
                    b.len(),
                    bytes.len()
                )));
            }
            for (s, chunk) in sum.iter_mut().zip(b.chunks_exact(8)) {
                *s += f64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
            }
        }
        Ok(sum.into_iter().map(|s| s / self.world_size as f64).collect())
    }
}

/// Rank 0's verdict for [`Store::agree`]: empty when every rank has every item equal to rank
/// 0's, else a description of the first differing item.
fn compare_items(all: &[Vec<(String, String)>]) -> String {
    let reference = &all[0];
    for (r, items) in all.iter().enumerate().skip(1) {
        let names = |v: &[(String, String)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
        if names(items) != names(reference) {
            return format!(
                "rank {r} checked the items {:?}, rank 0 {:?} (different builds?)",
                names(items),
                names(reference)
            );
        }
    }
    for (i, (name, want)) in reference.iter().enumerate() {
        let differ: Vec<usize> = (1..all.len()).filter(|&r| all[r][i].1 != *want).collect();
        let Some(&first) = differ.first() else {
            continue;
        };
        let theirs = &all[first][i].1;
        let (line, a, b) = first_difference(want, theirs);
        let clip = |s: &str| {
            if s.chars().count() > 200 {
                format!("{}...", s.chars().take(200).collect::<String>())
            } else {
                s.to_string()
            }
        };
        let others = if differ.len() > 1 {
            format!(" (ranks differing from rank 0: {differ:?})")
        } else {
            String::new()
        };
        return format!(
            "{name} differs: rank {first} has {:?} where rank 0 has {:?} (line {line}){others}",
            clip(b),
            clip(a)
        );
    }
    String::new()
}

/// 1-based number of the first line where `a` and `b` differ, and those lines (`""` past the end).
fn first_difference<'a>(a: &'a str, b: &'a str) -> (usize, &'a str, &'a str) {
    let (mut la, mut lb) = (a.lines(), b.lines());
    let mut n = 1;
    loop {
        match (la.next(), lb.next()) {
            (Some(x), Some(y)) if x == y => n += 1,
            (x, y) => return (n, x.unwrap_or(""), y.unwrap_or("")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topo_at(master_addr: &str) -> Topology {
        Topology {
            rank: 0,
            world_size: 2,
            local_rank: 0,
            local_world_size: None,
            master_addr: master_addr.into(),
            master_port: 29500,
            source: crate::env::Source::Torchrun,
            device: 0,
        }
    }

    #[test]
    fn rank_0_binds_the_master_address_family() {
        let bind = |addr: &str| bind_address(&topo_at(addr), None, 29500);
        assert_eq!(bind("127.0.0.1"), "127.0.0.1:29500");
        assert_eq!(bind("localhost"), "127.0.0.1:29500");
        assert_eq!(bind("gpu07"), "0.0.0.0:29500");
        assert_eq!(bind("10.1.2.3"), "0.0.0.0:29500");
        assert_eq!(bind("::1"), "[::1]:29500");
        assert_eq!(bind("[::1]"), "[::1]:29500");
        assert_eq!(bind("fd00::7"), "[::]:29500");
        let given = |h: &str| bind_address(&topo_at("gpu07"), Some(h), 0);
        assert_eq!(given("fd00::7"), "[fd00::7]:0");
        assert_eq!(given("[fd00::7]"), "[fd00::7]:0");
        assert_eq!(given("10.0.0.5"), "10.0.0.5:0");
        assert_eq!(given("gpu07-ib"), "gpu07-ib:0");
    }

    #[test]
    fn rank_0_reaches_its_server_in_the_bound_family() {
        let own = |a: &str| own_endpoint(a.parse().unwrap());
        assert_eq!(own("0.0.0.0:5"), "127.0.0.1:5");
        assert_eq!(own("[::]:5"), "[::1]:5");
        assert_eq!(own("[::1]:5"), "[::1]:5");
        assert_eq!(own("10.0.0.5:5"), "10.0.0.5:5");
    }

    fn items(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn agreement_names_the_item_the_rank_and_the_line() {
        let same = items(&[("config", "a = 1\nb = 2"), ("step", "10")]);
        assert_eq!(compare_items(&[same.clone(), same.clone(), same.clone()]), "");
        let other = items(&[("config", "a = 1\nb = 3"), ("step", "10")]);
        let v = compare_items(&[same.clone(), same.clone(), other.clone(), other]);
        assert!(
            v.contains("config differs: rank 2 has \"b = 3\" where rank 0 has \"b = 2\" (line 2)")
                && v.contains("[2, 3]"),
            "{v}"
        );
        let shorter = items(&[("config", "a = 1\nb = 2"), ("step", "")]);
        let v = compare_items(&[same.clone(), shorter]);
        assert!(
            v.starts_with("step differs: rank 1 has \"\" where rank 0 has \"10\""),
            "{v}"
        );
        let renamed = items(&[("config", "a = 1\nb = 2")]);
        assert!(compare_items(&[same, renamed]).contains("different builds"));
    }
}
