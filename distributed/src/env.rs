//! Who am I in the job: rank, world size, local rank and the master's address, read from the
//! launcher's environment. Precedence: torchrun variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) when `RANK` or `WORLD_SIZE` is set; else
//! Slurm's (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NTASKS_PER_NODE`, first host of
//! the step's nodes: `SLURM_STEP_NODELIST`, else `SLURM_NODELIST`, else `SLURM_JOB_NODELIST`;
//! port from `MASTER_PORT` or derived from the job and step ids) when `SLURM_PROCID` is set
//! inside a step; else a single process (rank 0 of 1).
//! `MASTER_ADDR`/`MASTER_PORT` override the Slurm-derived values when set.
//!
//! Without `LOCAL_RANK`, torchrun-style variables give the local rank as `RANK % LOCAL_WORLD_SIZE`
//! (ranks numbered node by node, as torchrun and `launch/local.sh` do), or `RANK` itself when
//! `MASTER_ADDR` is a loopback address (every rank on this node); otherwise it is an error.
//!
//! The job identity ([`job_id_from_vars`]) lets rank 0 refuse processes of another job that reach
//! its port.
//!
//! Under torchrun itself (`TORCHELASTIC_RUN_ID` set) the elastic agent already holds a TCP store
//! on `MASTER_PORT`, so flamia's rendezvous uses `MASTER_PORT + 1`. `FLAMIA_DIST_PORT` overrides
//! the rendezvous port and `FLAMIA_DIST_ADDR` rank 0's address in every mode (under Slurm,
//! `launch/slurm-task.sh` clears the torchrun variables, so these are the overrides that survive).

use std::collections::HashMap;

use crate::error::{DistError, Result};
use crate::hostlist;

/// Default rendezvous port when nothing sets one (torchrun's default).
pub const DEFAULT_PORT: u16 = 29500;

/// Where the rank information came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Torchrun,
    Slurm,
    Single,
}

/// One process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Topology {
    /// Global rank in `0..world_size`.
    pub rank: usize,
    /// Number of processes (one per GPU).
    pub world_size: usize,
    /// Rank within this node; selects the GPU (`cuda:<local_rank>`).
    pub local_rank: usize,
    /// Processes on this node, when the launcher says (None when unknown).
    pub local_world_size: Option<usize>,
    /// Host of rank 0 (rendezvous server).
    pub master_addr: String,
    /// Port of the rendezvous server.
    pub master_port: u16,
    /// Which launcher's variables were used.
    pub source: Source,
    /// CUDA ordinal this process should use: `local_rank`, or 0 when `CUDA_VISIBLE_DEVICES`
    /// leaves exactly one device visible (the launcher already bound one GPU per process).
    pub device: usize,
}

impl Topology {
    /// Single-process defaults: rank 0 of 1 on 127.0.0.1.
    pub fn single() -> Self {
        Topology {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: Some(1),
            master_addr: "127.0.0.1".into(),
            master_port: DEFAULT_PORT,
            source: Source::Single,
            device: 0,
        }
    }

    /// Read from the process environment.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(&std::env::vars().collect())
    }

    /// Read from an explicit variable map (testable; `from_env` passes the real environment).
    pub fn from_vars(vars: &HashMap<String, String>) -> Result<Self> {
        let get = |k: &str| get(vars, k);
        let topo = if source_of(vars) == Source::Torchrun {
            let world_size = parse_usize(vars, "WORLD_SIZE")?.ok_or_else(|| missing("WORLD_SIZE", "RANK"))?;
            let rank = parse_usize(vars, "RANK")?.ok_or_else(|| missing("RANK", "WORLD_SIZE"))?;
            let local_world_size = parse_usize(vars, "LOCAL_WORLD_SIZE")?;
            let master_addr = get("MASTER_ADDR").unwrap_or("127.0.0.1").to_string();
            let local_rank = match (parse_usize(vars, "LOCAL_RANK")?, local_world_size) {
                (Some(l), _) => l,
                // torchrun numbers ranks node by node, every node with LOCAL_WORLD_SIZE of them.
                (None, Some(lws)) if lws > 0 => {
                    if world_size % lws != 0 {
                        return Err(DistError::BadEnv {
                            var: "LOCAL_RANK",
                            value: String::new(),
                            reason: format!(
                                "unset, and WORLD_SIZE={world_size} is not a multiple of \
                                 LOCAL_WORLD_SIZE={lws}, so the local rank cannot be derived; set it"
                            ),
                        });
                    }
                    rank % lws
                }
                // Every rank reaches rank 0 on loopback: they all run on this node.
                (None, _) if world_size == 1 || is_loopback(&master_addr) => rank,
                (None, _) => {
                    return Err(DistError::BadEnv {
                        var: "LOCAL_RANK",
                        value: String::new(),
                        reason: format!(
                            "unset, with neither LOCAL_WORLD_SIZE set nor MASTER_ADDR={master_addr:?} \
                             a loopback address: the job may span several nodes, where the global \
                             rank is not this node's GPU index; set LOCAL_RANK (or LOCAL_WORLD_SIZE, \
                             with ranks numbered node by node)"
                        ),
                    });
                }
            };
            Topology {
                rank,
                world_size,
                local_rank,
                local_world_size,
                master_addr,
                master_port: match parse_port(vars, "MASTER_PORT")?.unwrap_or(DEFAULT_PORT) {
                    // torchrun's agent store owns MASTER_PORT.
                    p if get("TORCHELASTIC_RUN_ID").is_some() => {
                        p.checked_add(1).ok_or(DistError::BadEnv {
                            var: "MASTER_PORT",
                            value: p.to_string(),
                            reason:
                                "under torchrun flamia listens on MASTER_PORT + 1, which must be <= 65535"
                                    .into(),
                        })?
                    }
                    p => p,
                },
                source: Source::Torchrun,
                device: 0,
            }
        } else if source_of(vars) == Source::Slurm {
            let rank = parse_usize(vars, "SLURM_PROCID")?.unwrap_or(0);
            let world_size =
                parse_usize(vars, "SLURM_NTASKS")?.ok_or_else(|| missing("SLURM_NTASKS", "SLURM_PROCID"))?;
            // SLURM_PROCID and SLURM_NTASKS describe the step, so rank 0 is on the step's first
            // node (the job's may differ when the step runs on part of the allocation).
            let nodelist_var = ["SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST"]
                .into_iter()
                .find(|k| get(k).is_some());
            let master_addr = match (get("MASTER_ADDR"), nodelist_var) {
                (Some(a), _) => a.to_string(),
                (None, Some(var)) => hostlist::first_host(get(var).unwrap_or_default())?,
                (None, None) => {
                    return Err(DistError::BadEnv {
                        var: "SLURM_NODELIST",
                        value: String::new(),
                        reason: "unset (as are SLURM_STEP_NODELIST and SLURM_JOB_NODELIST): one of \
                                 them (or MASTER_ADDR) is needed to find rank 0's host under Slurm"
                            .into(),
                    })
                }
            };
            let master_port = match parse_port(vars, "MASTER_PORT")? {
                Some(p) => p,
                None => match parse_usize(vars, "SLURM_JOB_ID")? {
                    Some(id) => slurm_port(id, parse_usize(vars, "SLURM_STEP_ID")?.unwrap_or(0)),
                    None => DEFAULT_PORT,
                },
            };
            // SLURM_NTASKS_PER_NODE may be "8" or "8(x2)": keep the leading number.
            let local_world_size = get("SLURM_NTASKS_PER_NODE")
                .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|s| s.parse().ok());
            Topology {
                rank,
                world_size,
                local_rank: parse_usize(vars, "SLURM_LOCALID")?.unwrap_or(0),
                local_world_size,
                master_addr,
                master_port,
                source: Source::Slurm,
                device: 0,
            }
        } else {
            Topology::single()
        };
        let mut topo = match parse_port(vars, "FLAMIA_DIST_PORT")? {
            Some(p) => Topology {
                master_port: p,
                ..topo
            },
            None => topo,
        };
        if let Some(a) = get("FLAMIA_DIST_ADDR") {
            topo.master_addr = a.to_string();
        }
        let visible =
            get("CUDA_VISIBLE_DEVICES").map(|v| v.split(',').filter(|d| !d.trim().is_empty()).count());
        topo.device = if visible == Some(1) { 0 } else { topo.local_rank };
        topo.validate()?;
        Ok(topo)
    }

    /// Check internal consistency.
    pub fn validate(&self) -> Result<()> {
        if self.world_size == 0 {
            return Err(DistError::BadTopology("world size 0: must be at least 1".into()));
        }
        if self.rank >= self.world_size {
            return Err(DistError::RankOutOfRange {
                rank: self.rank,
                world_size: self.world_size,
            });
        }
        if let Some(lws) = self.local_world_size {
            if lws == 0 || self.local_rank >= lws {
                return Err(DistError::BadTopology(format!(
                    "local rank {} is out of range for {lws} processes on this node",
                    self.local_rank
                )));
            }
        }
        if self.master_addr.is_empty() {
            return Err(DistError::BadTopology("empty master address".into()));
        }
        Ok(())
    }

    /// `host:port` of the rendezvous server.
    pub fn master_endpoint(&self) -> String {
        if self.master_addr.contains(':') && !self.master_addr.starts_with('[') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }

    /// True for the rank that logs and writes checkpoints.
    pub fn is_main(&self) -> bool {
        self.rank == 0
    }
}

/// Which launcher's variables [`Topology::from_vars`] uses.
fn source_of(vars: &HashMap<String, String>) -> Source {
    if get(vars, "RANK").is_some() || get(vars, "WORLD_SIZE").is_some() {
        Source::Torchrun
    } else if get(vars, "SLURM_PROCID").is_some() {
        Source::Slurm
    } else {
        Source::Single
    }
}

/// The rendezvous port of Slurm job `job_id`, step `step_id`: `20000 + (job_id + 6181 * step_id)
/// mod 10000`. Step 0 keeps `20000 + job id mod 10000`; steps of one job differ (6181 is prime
/// to 10000), and the golden-ratio stride keeps neighbouring steps of neighbouring jobs (array
/// tasks) apart.
pub fn slurm_port(job_id: usize, step_id: usize) -> u16 {
    20000 + ((job_id % 10000 + (step_id % 10000) * 6181) % 10000) as u16
}

/// This process's job identity, the same on every rank of one job and different between jobs
/// where the launcher says so: `FLAMIA_RUN_ID` when set (`launch/local.sh` sets one per launch);
/// else under Slurm (the variables [`Topology::from_vars`] uses) `slurm:<SLURM_JOB_ID>.<SLURM_STEP_ID>`;
/// else under torchrun `torchrun:<TORCHELASTIC_RUN_ID>`; else `None` (unknown). Slurm's ids are
/// not used for torchrun-style variables: separate `srun` steps may start one job's nodes.
pub fn job_id_from_vars(vars: &HashMap<String, String>) -> Option<String> {
    if let Some(id) = get(vars, "FLAMIA_RUN_ID") {
        return Some(id.to_string());
    }
    match source_of(vars) {
        Source::Slurm => get(vars, "SLURM_JOB_ID").map(|job| match get(vars, "SLURM_STEP_ID") {
            Some(step) => format!("slurm:{job}.{step}"),
            None => format!("slurm:{job}"),
        }),
        Source::Torchrun => get(vars, "TORCHELASTIC_RUN_ID").map(|id| format!("torchrun:{id}")),
        Source::Single => None,
    }
}

/// [`job_id_from_vars`] of the process environment.
pub fn job_id_from_env() -> Option<String> {
    job_id_from_vars(&std::env::vars().collect())
}

fn get<'a>(vars: &'a HashMap<String, String>, k: &str) -> Option<&'a str> {
    vars.get(k).map(|s| s.trim()).filter(|s| !s.is_empty())
}

fn is_loopback(addr: &str) -> bool {
    addr == "localhost"
        || addr
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn missing(var: &'static str, other: &str) -> DistError {
    DistError::BadEnv {
        var,
        value: String::new(),
        reason: format!("unset, but {other} is set; set both"),
    }
}

fn parse_usize(vars: &HashMap<String, String>, var: &'static str) -> Result<Option<usize>> {
    match vars.get(var).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| DistError::BadEnv {
            var,
            value: v.to_string(),
            reason: "must be a non-negative integer".into(),
        }),
    }
}

fn parse_port(vars: &HashMap<String, String>, var: &'static str) -> Result<Option<u16>> {
    match vars.get(var).map(|s| s.trim()).filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(v) => match v.parse::<u16>() {
            Ok(p) if p > 0 => Ok(Some(p)),
            _ => Err(DistError::BadEnv {
                var,
                value: v.to_string(),
                reason: "must be a port in 1..=65535".into(),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn empty_env_is_single_process() {
        assert_eq!(Topology::from_vars(&vars(&[])).unwrap(), Topology::single());
    }

    #[test]
    fn torchrun_variables() {
        let t = Topology::from_vars(&vars(&[
            ("RANK", "5"),
            ("WORLD_SIZE", "16"),
            ("LOCAL_RANK", "5"),
            ("LOCAL_WORLD_SIZE", "8"),
            ("MASTER_ADDR", "n01"),
            ("MASTER_PORT", "29400"),
            ("SLURM_PROCID", "9"),
        ]))
        .unwrap();
        assert_eq!(
            (t.rank, t.world_size, t.local_rank, t.source),
            (5, 16, 5, Source::Torchrun)
        );
        assert_eq!(t.master_endpoint(), "n01:29400");
        let under_torchrun = [
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "29400"),
            ("TORCHELASTIC_RUN_ID", "x"),
        ];
        assert_eq!(
            Topology::from_vars(&vars(&under_torchrun)).unwrap().master_port,
            29401
        );
        let overridden = [
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "29400"),
            ("FLAMIA_DIST_PORT", "31000"),
        ];
        assert_eq!(
            Topology::from_vars(&vars(&overridden)).unwrap().master_port,
            31000
        );
    }

    #[test]
    fn slurm_variables() {
        let t = Topology::from_vars(&vars(&[
            ("SLURM_PROCID", "11"),
            ("SLURM_NTASKS", "16"),
            ("SLURM_LOCALID", "3"),
            ("SLURM_NTASKS_PER_NODE", "8(x2)"),
            ("SLURM_JOB_NODELIST", "gpu[07-08]"),
            ("SLURM_JOB_ID", "123456"),
        ]))
        .unwrap();
        assert_eq!(
            (t.rank, t.world_size, t.local_rank, t.local_world_size),
            (11, 16, 3, Some(8))
        );
        assert_eq!(
            (t.master_addr.as_str(), t.master_port, t.source),
            ("gpu07", 23456, Source::Slurm)
        );
        let overridden = Topology::from_vars(&vars(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "gpu[07-08]"),
            ("FLAMIA_DIST_ADDR", "gpu07-ib"),
            ("FLAMIA_DIST_PORT", "31000"),
        ]))
        .unwrap();
        assert_eq!(overridden.master_endpoint(), "gpu07-ib:31000");
    }

    #[test]
    fn slurm_master_is_the_first_node_of_the_step() {
        let base = [
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_JOB_NODELIST", "gpu[01-04]"),
        ];
        let with = |extra: &[(&str, &str)]| {
            let mut v = vars(&base);
            v.extend(vars(extra));
            Topology::from_vars(&v).unwrap().master_addr
        };
        assert_eq!(with(&[]), "gpu01");
        assert_eq!(with(&[("SLURM_NODELIST", "gpu[02-04]")]), "gpu02");
        assert_eq!(
            with(&[
                ("SLURM_NODELIST", "gpu[02-04]"),
                ("SLURM_STEP_NODELIST", "gpu[03-04]")
            ]),
            "gpu03"
        );
        assert_eq!(
            with(&[("SLURM_STEP_NODELIST", "gpu[03-04]"), ("MASTER_ADDR", "gpu09")]),
            "gpu09"
        );
    }

    #[test]
    fn slurm_port_mixes_in_the_step() {
        let port = |job: &str, step: Option<&str>| {
            let mut v = vars(&[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_JOB_NODELIST", "gpu01"),
                ("SLURM_JOB_ID", job),
            ]);
            if let Some(s) = step {
                v.insert("SLURM_STEP_ID".into(), s.into());
            }
            Topology::from_vars(&v).unwrap().master_port
        };
        assert_eq!(port("123456", None), 23456);
        assert_eq!(port("123456", Some("0")), 23456, "step 0 keeps the job's port");
        assert_ne!(port("123456", Some("1")), 23456);
        assert_eq!(port("123456", Some("1")), slurm_port(123456, 1));
        // Concurrent steps of one allocation never share a port (up to 10000 steps).
        let steps: std::collections::HashSet<u16> = (0..10000).map(|s| slurm_port(123456, s)).collect();
        assert_eq!(steps.len(), 10000);
        assert!(steps.iter().all(|p| (20000..30000).contains(p)));
        // Nor do the first steps of neighbouring jobs (array tasks).
        for j in 0..16 {
            for s in 0..8 {
                for (j2, s2) in [(j + 1, s), (j, s + 1), (j + 1, s + 1)] {
                    assert_ne!(
                        slurm_port(5000 + j, s),
                        slurm_port(5000 + j2, s2),
                        "job {j} step {s} vs job {j2} step {s2}"
                    );
                }
            }
        }
        let e = Topology::from_vars(&vars(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "gpu01"),
            ("SLURM_JOB_ID", "7"),
            ("SLURM_STEP_ID", "x"),
        ]))
        .unwrap_err();
        assert!(
            matches!(
                e,
                DistError::BadEnv {
                    var: "SLURM_STEP_ID",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn job_identity() {
        let id = |pairs: &[(&str, &str)]| job_id_from_vars(&vars(pairs));
        assert_eq!(id(&[]), None);
        let slurm = [
            ("SLURM_PROCID", "3"),
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_STEP_ID", "1"),
        ];
        assert_eq!(id(&slurm).as_deref(), Some("slurm:4242.1"));
        assert_eq!(
            id(&[("SLURM_PROCID", "3"), ("SLURM_JOB_ID", "4242")]).as_deref(),
            Some("slurm:4242")
        );
        let mut run = slurm.to_vec();
        run.push(("FLAMIA_RUN_ID", "local-n01-77"));
        assert_eq!(id(&run).as_deref(), Some("local-n01-77"), "FLAMIA_RUN_ID wins");
        // torchrun-style variables inside an allocation: Slurm's step may differ per node.
        let torchrun_in_slurm = [
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("SLURM_PROCID", "0"),
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_STEP_ID", "1"),
        ];
        assert_eq!(id(&torchrun_in_slurm), None);
        let mut elastic = torchrun_in_slurm.to_vec();
        elastic.push(("TORCHELASTIC_RUN_ID", "abc"));
        assert_eq!(id(&elastic).as_deref(), Some("torchrun:abc"));
    }

    #[test]
    fn local_rank_without_local_rank() {
        let topo = |pairs: &[(&str, &str)]| Topology::from_vars(&vars(pairs));
        let t = topo(&[
            ("RANK", "11"),
            ("WORLD_SIZE", "16"),
            ("LOCAL_WORLD_SIZE", "8"),
            ("MASTER_ADDR", "n01"),
        ])
        .unwrap();
        assert_eq!((t.local_rank, t.device), (3, 3), "second node's GPU 3");
        // Every rank on loopback: one node, the rank is the GPU index.
        let t = topo(&[("RANK", "3"), ("WORLD_SIZE", "4"), ("MASTER_ADDR", "127.0.0.1")]).unwrap();
        assert_eq!(t.local_rank, 3);
        assert_eq!(topo(&[("RANK", "3"), ("WORLD_SIZE", "4")]).unwrap().local_rank, 3);
        let e = topo(&[("RANK", "11"), ("WORLD_SIZE", "16"), ("MASTER_ADDR", "n01")]).unwrap_err();
        assert!(
            matches!(
                e,
                DistError::BadEnv {
                    var: "LOCAL_RANK",
                    ..
                }
            ) && e.to_string().contains("LOCAL_WORLD_SIZE"),
            "{e}"
        );
        let e = topo(&[
            ("RANK", "11"),
            ("WORLD_SIZE", "15"),
            ("LOCAL_WORLD_SIZE", "8"),
            ("MASTER_ADDR", "n01"),
        ])
        .unwrap_err();
        assert!(
            matches!(
                e,
                DistError::BadEnv {
                    var: "LOCAL_RANK",
                    ..
                }
            ),
            "{e}"
        );
        let t = topo(&[
            ("RANK", "11"),
            ("WORLD_SIZE", "16"),
            ("LOCAL_RANK", "5"),
            ("LOCAL_WORLD_SIZE", "8"),
            ("MASTER_ADDR", "n01"),
        ])
        .unwrap();
        assert_eq!(t.local_rank, 5, "LOCAL_RANK when given");
    }

    #[test]
    fn bad_values_are_typed_errors() {
        let e = Topology::from_vars(&vars(&[("RANK", "4"), ("WORLD_SIZE", "4")])).unwrap_err();
        assert!(
            matches!(
                e,
                DistError::RankOutOfRange {
                    rank: 4,
                    world_size: 4
                }
            ),
            "{e}"
        );
        let e = Topology::from_vars(&vars(&[("RANK", "x"), ("WORLD_SIZE", "4")])).unwrap_err();
        assert!(matches!(e, DistError::BadEnv { var: "RANK", .. }), "{e}");
        let e = Topology::from_vars(&vars(&[("RANK", "0")])).unwrap_err();
        assert!(
            matches!(
                e,
                DistError::BadEnv {
                    var: "WORLD_SIZE",
                    ..
                }
            ),
            "{e}"
        );
        let e = Topology::from_vars(&vars(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "70000"),
        ]))
        .unwrap_err();
        assert!(
            matches!(
                e,
                DistError::BadEnv {
                    var: "MASTER_PORT",
                    ..
                }
            ),
            "{e}"
        );
        let e = Topology::from_vars(&vars(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")])).unwrap_err();
        assert!(
            matches!(
                e,
                DistError::BadEnv {
                    var: "SLURM_NODELIST",
                    ..
                }
            ),
            "{e}"
        );
    }
}
