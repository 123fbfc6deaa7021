//! Store operations among ranks that are threads of one process (same code path as processes:
//! each rank has its own TCP connections to rank 0's server).

use std::time::Duration;

use flamia_dist::{env::Source, DistError, GroupOptions, ProcessGroup, Topology};

#[path = "../../tests/support/mod.rs"]
mod support;
use support::free_port;

fn topo(rank: usize, world: usize, port: u16) -> Topology {
    Topology {
        rank,
        world_size: world,
        local_rank: rank,
        local_world_size: None,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        source: Source::Torchrun,
        device: rank,
    }
}

fn opts() -> GroupOptions {
    GroupOptions {
        join_timeout: Duration::from_secs(20),
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_secs(2),
        exit_grace: None, // never exit the test process
        bind_host: None,
        job_id: None,
    }
}

fn opts_of(job: &str) -> GroupOptions {
    GroupOptions {
        job_id: Some(job.into()),
        ..opts()
    }
}

/// Joins `world` ranks (threads) of job `job` on `port`; each runs `body` on its group.
fn spawn_group(
    world: usize,
    port: u16,
    job: &'static str,
    body: impl Fn(ProcessGroup) + Send + Sync + Clone + 'static,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..world)
        .map(|rank| {
            let body = body.clone();
            std::thread::spawn(move || {
                let pg = ProcessGroup::join(&topo(rank, world, port), &opts_of(job), || Ok(vec![3u8; 128]))
                    .unwrap_or_else(|e| panic!("rank {rank} of job {job}: {e}"));
                body(pg)
            })
        })
        .collect()
}

/// Once every rank has joined, a join that does not fit (duplicate rank, another world size, a
/// rank out of range) or a heartbeat connection nobody owns is refused on its own connection:
/// the running group goes on.
#[test]
fn stray_joins_after_the_group_is_complete_are_refused_alone() {
    use flamia_dist::wire::{self, Failure, Hello, Reply, Request, Role, MAGIC};
    let port = free_port();
    let (joined_tx, joined_rx) = std::sync::mpsc::channel::<()>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let joined_tx = std::sync::Arc::new(std::sync::Mutex::new(joined_tx));
    let go_rx = std::sync::Arc::new(std::sync::Mutex::new(go_rx));
    let ranks = spawn_group(2, port, "job-a", move |pg| {
        let t = Duration::from_secs(10);
        pg.store().barrier(t).unwrap();
        joined_tx.lock().unwrap().send(()).unwrap();
        go_rx
            .lock()
            .unwrap()
            .recv_timeout(Duration::from_secs(30))
            .unwrap();
        // Longer than a heartbeat period: a group failure would have reached every rank.
        std::thread::sleep(Duration::from_millis(500));
        pg.health()
            .check()
            .unwrap_or_else(|e| panic!("rank {}: the group failed: {e}", pg.rank()));
        pg.store().barrier(t).unwrap();
        pg.shutdown(t).unwrap();
    });
    for _ in 0..2 {
        joined_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    }
    let e = ProcessGroup::join(&topo(1, 2, port), &opts_of("job-a"), || Ok(vec![]))
        .expect_err("a second rank 1 is refused");
    assert!(
        matches!(e, DistError::Rejected { rank: 1, .. })
            && e.to_string().contains("duplicate rank 1")
            && e.to_string().contains("already complete and running"),
        "{e}"
    );
    for (role, rank, world, expect) in [
        (Role::Join, 1, 3, "world size mismatch"),
        (Role::Join, 5, 2, "out of range"),
        (Role::Heartbeat, 1, 2, "second heartbeat connection"),
    ] {
        // Raw hellos (ProcessGroup::join checks the rank range before connecting), each
        // connection then closed without a goodbye.
        let mut conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let hello = Hello {
            magic: MAGIC.into(),
            role,
            rank,
            world_size: world,
            host: "stray".into(),
            pid: 1,
            job: Some("job-a".into()),
        };
        wire::send(&mut conn, "rank 0", &Request::Hello(hello)).unwrap();
        match wire::recv::<Reply>(&mut conn, "rank 0").unwrap() {
            Reply::Failed(Failure::Refused { reason, .. }) => {
                assert!(
                    reason.contains(expect),
                    "{role:?} rank {rank} of {world}: {reason}"
                )
            }
            other => panic!("{role:?} rank {rank} of {world}: expected a refusal, got {other:?}"),
        }
    }
    for _ in 0..2 {
        go_tx.send(()).unwrap();
    }
    for h in ranks {
        h.join().unwrap();
    }
}

/// A process of another job reaching this job's port while it forms is refused with the reason,
/// and the forming group is not touched (here the stray even has another world size, which
/// would fail a group of its own job).
#[test]
fn a_process_of_another_job_is_refused_during_the_rendezvous() {
    let port = free_port();
    let rank0 = std::thread::spawn(move || {
        let pg = ProcessGroup::join(&topo(0, 2, port), &opts_of("job-a"), || Ok(vec![5u8; 128])).unwrap();
        pg.store().barrier(Duration::from_secs(10)).unwrap();
        pg.shutdown(Duration::from_secs(10)).unwrap();
    });
    let e = ProcessGroup::join(&topo(1, 3, port), &opts_of("job-b"), || Ok(vec![]))
        .expect_err("another job's process is refused");
    let msg = e.to_string();
    assert!(
        matches!(e, DistError::ForeignJob { rank: 1, .. })
            && msg.contains("belongs to job \"job-a\"")
            && msg.contains("this process is job \"job-b\"")
            && msg.contains("MASTER_PORT"),
        "{msg}"
    );
    // Unnamed (no identity) is another job too.
    let e = ProcessGroup::join(&topo(1, 2, port), &opts(), || Ok(vec![])).unwrap_err();
    assert!(matches!(e, DistError::ForeignJob { .. }), "{e}");
    let pg = ProcessGroup::join(&topo(1, 2, port), &opts_of("job-a"), || Ok(vec![])).unwrap();
    assert_eq!(pg.payload(), &[5u8; 128][..]);
    pg.store().barrier(Duration::from_secs(10)).unwrap();
    pg.shutdown(Duration::from_secs(10)).unwrap();
    rank0.join().unwrap();
}

/// An IPv6 master address: rank 0 listens on IPv6 (`::1` here) and the others reach it there.
#[test]
fn ipv6_loopback_master() {
    if let Err(e) = std::net::TcpListener::bind("[::1]:0") {
        eprintln!("SKIPPED ipv6_loopback_master: this machine cannot listen on [::1] ({e})");
        return;
    }
    let port = free_port();
    let world = 2;
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            std::thread::spawn(move || {
                let t = Topology {
                    master_addr: "::1".into(),
                    ..topo(rank, world, port)
                };
                assert_eq!(t.master_endpoint(), format!("[::1]:{port}"));
                let o = GroupOptions {
                    join_timeout: Duration::from_secs(5),
                    ..opts()
                };
                let pg = ProcessGroup::join(&t, &o, || Ok(vec![9u8; 128]))
                    .unwrap_or_else(|e| panic!("rank {rank}: {e}"));
                assert_eq!(pg.payload(), &[9u8; 128][..]);
                let all = pg
                    .store()
                    .all_gather(&[rank as u8], Duration::from_secs(10))
                    .unwrap();
                assert_eq!(all, vec![vec![0], vec![1]]);
                pg.shutdown(Duration::from_secs(10)).unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn barrier_gather_vote_and_mean_across_ranks() {
    let port = free_port();
    let world = 3;
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            std::thread::spawn(move || {
                let pg =
                    ProcessGroup::join(&topo(rank, world, port), &opts(), || Ok(vec![42u8; 128])).unwrap();
                assert_eq!(pg.payload(), &[42u8; 128][..]);
                let t = Duration::from_secs(10);
                let s = pg.store();
                s.barrier(t).unwrap();
                assert!(s.add("counter", rank as i64 + 1).unwrap() > 0);
                s.barrier(t).unwrap();
                assert_eq!(s.add("counter", 0).unwrap(), 6);
                let all = s.all_gather(&[rank as u8], t).unwrap();
                assert_eq!(all, vec![vec![0], vec![1], vec![2]]);
                let to1 = s.gather_to(1, &[10 + rank as u8], t).unwrap();
                let want = (rank == 1).then(|| vec![vec![10], vec![11], vec![12]]);
                assert_eq!(to1, want, "rank {rank}: only the root gets the values");
                assert!(!s.vote_any(false, t).unwrap());
                assert!(s.vote_any(rank == 1, t).unwrap());
                let mean = s.mean_across_ranks(&[rank as f64, 10.0], t).unwrap();
                assert_eq!(mean, vec![1.0, 10.0]);
                let root = (rank == 0).then_some(&b"from rank 0"[..]);
                assert_eq!(s.broadcast(root, t).unwrap(), b"from rank 0");
                let same = [("config", "a = 1\nb = 2".to_string()), ("step", "7".to_string())];
                s.agree(&same, t).unwrap();
                let b = if rank == 2 { "b = 5" } else { "b = 2" };
                let differing = [("config", format!("a = 1\n{b}")), ("step", "7".to_string())];
                let e = s.agree(&differing, t).unwrap_err();
                assert!(
                    matches!(e, DistError::Disagreement(_))
                        && e.to_string().contains("config differs: rank 2 has \"b = 5\""),
                    "{e}"
                );
                let e = s.get("never-set", Duration::from_millis(100)).unwrap_err();
                assert!(matches!(e, DistError::StoreTimeout { .. }), "{e}");
                pg.shutdown(t).unwrap();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn a_rank_reporting_failure_stops_the_others() {
    let port = free_port();
    let world = 2;
    let handles: Vec<_> = (0..world)
        .map(|rank| {
            std::thread::spawn(move || {
                let pg = match ProcessGroup::join(&topo(rank, world, port), &opts(), || Ok(vec![1u8; 128])) {
                    Ok(pg) => pg,
                    // Rank 1 may report before rank 0's join has returned: then the join itself
                    // must carry the reason.
                    Err(e) => {
                        assert!(
                            rank == 0 && e.to_string().contains("loss is NaN"),
                            "rank {rank}: {e}"
                        );
                        return;
                    }
                };
                if rank == 1 {
                    pg.fail("loss is NaN at step 7");
                }
                // Rank 0 blocks in a barrier rank 1 never reaches: it must be released with the reason.
                let e = pg.store().barrier(Duration::from_secs(10)).unwrap_err();
                assert!(e.to_string().contains("loss is NaN"), "rank {rank}: {e}");
                assert!(pg.health().check().is_err());
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

/// A value too large for the protocol is refused on this rank with the typed error, before
/// anything is sent: the connection and the group stay healthy.
#[test]
fn an_oversize_store_value_is_a_typed_error_and_the_group_goes_on() {
    let t = Topology::single();
    let pg = ProcessGroup::join(&t, &opts(), || Ok(vec![])).unwrap();
    let big = vec![1u8; flamia_dist::wire::MAX_MESSAGE / 4 * 3 + 3];
    let e = pg.store().set("big", &big).unwrap_err();
    assert!(
        matches!(e, DistError::MessageTooLarge { .. }) && e.to_string().contains("nothing was sent"),
        "{e}"
    );
    assert!(pg.health().check().is_ok(), "{:?}", pg.health().failure());
    pg.store().set("small", b"ok").unwrap();
    assert_eq!(pg.store().get("small", Duration::from_secs(5)).unwrap(), b"ok");
    pg.shutdown(Duration::from_secs(5)).unwrap();
}
