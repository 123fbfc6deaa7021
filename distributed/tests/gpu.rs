//! One-GPU NCCL check: a one-rank process group publishes a real NCCL unique id, a one-rank
//! communicator all-reduces a buffer on `cuda:0`, and the result is verified. Needs a CUDA GPU and
//! `libnccl.so` on `LD_LIBRARY_PATH` (see launch/README.md).

use std::time::Duration;

use flamia_dist::{gpu_check, nccl::NcclId, GroupOptions, ProcessGroup, Topology};

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored (and libnccl.so on LD_LIBRARY_PATH)"]
fn one_rank_nccl_all_reduce_on_the_device() {
    let topo = Topology::single();
    let opts = GroupOptions {
        exit_grace: None,
        ..GroupOptions::default()
    };
    let pg = ProcessGroup::join(&topo, &opts, || Ok(NcclId::new()?.0.to_vec())).expect("rendezvous");
    let id = NcclId::from_bytes(pg.payload()).unwrap();
    let report = gpu_check::all_reduce_check(&id, 0, 1, 0, 1 << 24, 5, Some(pg.health().clone()))
        .expect("one-rank all-reduce");
    assert_eq!(report.world_size, 1);
    assert!(report.seconds > 0.0);
    eprintln!("{}", serde_json::to_string(&report).unwrap());
    pg.shutdown(Duration::from_secs(5)).unwrap();
}
