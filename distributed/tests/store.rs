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
