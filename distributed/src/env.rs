//! Who am I in the job: rank, world size, local rank and the master's address, read from the
//! launcher's environment. Precedence: torchrun variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`) when `RANK` or `WORLD_SIZE` is set; else
//! Slurm's (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_NTASKS_PER_NODE`, first host of
//! `SLURM_JOB_NODELIST`/`SLURM_NODELIST`, port from `MASTER_PORT` or derived from the job id) when
//! `SLURM_PROCID` is set inside a step; else a single process (rank 0 of 1).
//! `MASTER_ADDR`/`MASTER_PORT` override the Slurm-derived values when set.
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
        let get = |k: &str| vars.get(k).map(|s| s.trim()).filter(|s| !s.is_empty());
        let topo = if get("RANK").is_some() || get("WORLD_SIZE").is_some() {
            let world_size = parse_usize(vars, "WORLD_SIZE")?.ok_or_else(|| missing("WORLD_SIZE", "RANK"))?;
            let rank = parse_usize(vars, "RANK")?.ok_or_else(|| missing("RANK", "WORLD_SIZE"))?;
            Topology {
                rank,
                world_size,
                local_rank: parse_usize(vars, "LOCAL_RANK")?.unwrap_or(rank),
                local_world_size: parse_usize(vars, "LOCAL_WORLD_SIZE")?,
                master_addr: get("MASTER_ADDR").unwrap_or("127.0.0.1").to_string(),
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
        } else if get("SLURM_PROCID").is_some() {
            let rank = parse_usize(vars, "SLURM_PROCID")?.unwrap_or(0);
            let world_size =
                parse_usize(vars, "SLURM_NTASKS")?.ok_or_else(|| missing("SLURM_NTASKS", "SLURM_PROCID"))?;
            let nodelist_var = ["SLURM_JOB_NODELIST", "SLURM_STEP_NODELIST", "SLURM_NODELIST"]
                .into_iter()
                .find(|k| get(k).is_some());
            let master_addr = match (get("MASTER_ADDR"), nodelist_var) {
                (Some(a), _) => a.to_string(),
                (None, Some(var)) => hostlist::first_host(get(var).unwrap_or_default())?,
                (None, None) => {
                    return Err(DistError::BadEnv {
                        var: "SLURM_NODELIST",
                        value: String::new(),
                        reason: "unset: needed (or MASTER_ADDR) to find rank 0's host under Slurm".into(),
                    })
                }
            };
            let master_port = match parse_port(vars, "MASTER_PORT")? {
                Some(p) => p,
                // Distinct jobs sharing a node get distinct ports: 20000 + last 4 digits of the id.
                None => match parse_usize(vars, "SLURM_JOB_ID")? {
                    Some(id) => 20000 + (id % 10000) as u16,
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
