//! Weights & Biases over its HTTP API (no Python): GraphQL `upsertBucket` creates the run with
//! its config, `file_stream` posts carry history lines (`wandb-history.jsonl`, with line offsets)
//! and the summary (`wandb-summary.json`), heartbeats keep the run alive, and a final post marks
//! it complete with the exit code.
//!
//! Everything runs on a background thread fed by a channel: the training loop only enqueues. A
//! network failure is logged once per outage and the pending lines are retried with exponential
//! backoff (1 s doubling to 60 s); a rejected key (HTTP 401/403) is reported once and turns W&B
//! off for the run. Nothing here blocks or stops training. The key comes from `WANDB_API_KEY`.
//!
//! A resumed run (`--resume`) logs to its own W&B run, `<id>-r<step>`, named "<name> (resumed at
//! step N)": the file_stream offsets of the original run are not known here, and writing from
//! offset 0 again would overwrite its first history lines.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use serde_json::{json, Value};

use super::StepMetrics;
use crate::config::WandbConfig;

const UPSERT_BUCKET: &str = "mutation UpsertBucket($id: String, $name: String, $project: String, \
$entity: String, $displayName: String, $config: JSONString, $host: String, $program: String, \
$state: String) { upsertBucket(input: {id: $id, name: $name, modelName: $project, entityName: \
$entity, displayName: $displayName, config: $config, host: $host, jobProgram: $program, state: \
$state}) { bucket { id name displayName project { id name entity { id name } } } inserted } }";

const VIEWER: &str = "query Viewer { viewer { id entity } }";

/// Handle held by the training loop.
#[derive(Debug)]
pub struct Wandb {
    tx: Option<Sender<Event>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// When the run started here (`_runtime` of each line, taken when the step is logged).
    started: Instant,
    /// History lines dropped because the queue was full (a long outage).
    dropped: u64,
}

/// History lines the uploader holds at most (queued and pending): about a day of steps at one
/// per second; beyond it new lines are dropped and counted, not kept without bound.
const MAX_QUEUED: usize = 100_000;
/// History lines per file_stream post (a long backlog goes out in parts, not one huge body).
const LINES_PER_POST: usize = 1000;

#[derive(Debug)]
enum Event {
    /// A history line, stamped when the step was logged.
    Log(String),
    Finish {
        exit_code: i32,
        summary: Value,
    },
}

impl Wandb {
    /// Starts the uploader when `cfg.enabled` and `WANDB_API_KEY` is set; otherwise a no-op.
    /// `resumed_at`: the step a `--resume` continues from (its own W&B run, module docs).
    pub fn start(
        cfg: &WandbConfig,
        run_name: &str,
        config_toml: &str,
        run_dir: &Path,
        resumed_at: Option<usize>,
    ) -> Wandb {
        if !cfg.enabled {
            return Wandb::off();
        }
        let Some(key) = std::env::var("WANDB_API_KEY").ok().filter(|k| !k.is_empty()) else {
            tracing::warn!("wandb.enabled but WANDB_API_KEY is not set: not logging to W&B");
            return Wandb::off();
        };
        let config: Value = toml::from_str::<toml::Value>(config_toml)
            .ok()
            .and_then(|v| serde_json::to_value(v).ok())
            .unwrap_or(Value::Null);
        let mut uploader = Uploader {
            client: reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(15))
                .build()
                .expect("a TLS-capable reqwest client"),
            base: cfg.base_url.trim_end_matches('/').to_string(),
            key,
            entity: cfg.entity.clone(),
            project: cfg.project.clone(),
            run_id: match resumed_at {
                Some(step) => format!("{}-r{step}", run_id(run_dir)),
                None => run_id(run_dir),
            },
            display_name: match resumed_at {
                Some(step) => format!("{run_name} (resumed at step {step})"),
                None => run_name.to_string(),
            },
            config,
            created: false,
            history_offset: 0,
            pending: Vec::new(),
            backoff: Duration::ZERO,
            retry_at: None,
            disabled: false,
        };
        let heartbeat = Duration::from_secs(cfg.heartbeat_secs.max(1));
        let (tx, rx) = crossbeam_channel::bounded(MAX_QUEUED);
        let started = Instant::now();
        let thread = std::thread::Builder::new()
            .name("wandb".into())
            .spawn(move || uploader.run(rx, heartbeat))
            .ok();
        Wandb {
            tx: Some(tx),
            thread,
            started,
            dropped: 0,
        }
    }

    fn off() -> Wandb {
        Wandb {
            tx: None,
            thread: None,
            started: Instant::now(),
            dropped: 0,
        }
    }

    /// Enqueues one history line (never blocks on the network; a full queue drops it and counts
    /// it). Its `_runtime` and `_timestamp` are the step's, not the upload's.
    pub fn log(&mut self, m: &StepMetrics) {
        if let Some(tx) = &self.tx {
            let line = history_line(serde_json::to_value(m).unwrap_or(Value::Null), self.started);
            if tx.try_send(Event::Log(line)).is_err() {
                self.dropped += 1;
                if self.dropped == 1 {
                    tracing::warn!(
                        "W&B: {MAX_QUEUED} history lines are waiting to be sent; dropping new ones"
                    );
                }
            }
        }
    }

    /// Sends the summary and marks the run finished with `exit_code`; waits up to 30 s for the
    /// uploader to drain.
    pub fn finish(&mut self, exit_code: i32, summary: &impl serde::Serialize) {
        self.finish_within(exit_code, summary, Duration::from_secs(30));
    }

    /// [`Wandb::finish`] waiting at most `wait`: a preempted run must exit (and be requeued)
    /// within the scheduler's kill grace, whatever the network does.
    pub fn finish_within(&mut self, exit_code: i32, summary: &impl serde::Serialize, wait: Duration) {
        let Some(tx) = self.tx.take() else { return };
        if self.dropped > 0 {
            tracing::warn!(
                "W&B: {} history lines were dropped while it was unreachable",
                self.dropped
            );
        }
        let summary = serde_json::to_value(summary).unwrap_or(Value::Null);
        let _ = tx.send(Event::Finish { exit_code, summary });
        drop(tx);
        if let Some(t) = self.thread.take() {
            let deadline = Instant::now() + wait;
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if t.is_finished() {
                let _ = t.join();
            } else {
                tracing::warn!("W&B uploader still busy after {wait:?}; leaving it behind");
            }
        }
    }
}

impl Drop for Wandb {
    fn drop(&mut self) {
        // A run that ends without `finish` (an error) is reported as failed (not waiting long:
        // the error is what the user needs to see, and under a launcher the failing rank's exit
        // timer, `FLAMIA_DIST_EXIT_GRACE_S` = 10 s by default, is already running: a longer wait
        // could see the process ended with the peer-failure status instead of its own).
        if self.tx.is_some() {
            self.finish_within(1, &json!({}), Duration::from_secs(3));
        }
    }
}

/// A history line: the metrics with W&B's `_step`, `_runtime` (since `started`) and `_timestamp`.
fn history_line(mut v: Value, started: Instant) -> String {
    if let Value::Object(map) = &mut v {
        let step = map.get("step").cloned().unwrap_or(Value::Null);
        map.insert("_step".into(), step);
        map.insert("_runtime".into(), json!(started.elapsed().as_secs_f64()));
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        map.insert("_timestamp".into(), json!(now));
    }
    v.to_string()
}

/// A stable id per run directory (so a resumed run continues the same W&B run).
fn run_id(run_dir: &Path) -> String {
    let abs = std::fs::canonicalize(run_dir).unwrap_or_else(|_| run_dir.to_path_buf());
    let mut h: u64 = 0xcbf29ce484222325;
    for b in abs.to_string_lossy().bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..8)
        .map(|i| alphabet[((h >> (i * 6)) % 36) as usize] as char)
        .collect()
}

struct Uploader {
    client: reqwest::blocking::Client,
    base: String,
    key: String,
    entity: String,
    project: String,
    run_id: String,
    display_name: String,
    config: Value,
    created: bool,
    history_offset: usize,
    pending: Vec<String>,
    /// Exponential backoff after a failed post (zero: none), and when the next try is due.
    backoff: Duration,
    retry_at: Option<Instant>,
    /// The server rejected the key: nothing more is sent.
    disabled: bool,
}

impl Uploader {
    fn run(&mut self, rx: Receiver<Event>, heartbeat: Duration) {
        let mut last_post = Instant::now();
        loop {
            match rx.recv_timeout(heartbeat) {
                Ok(Event::Log(line)) => {
                    self.pending.push(line);
                    self.flush();
                    last_post = Instant::now();
                }
                Ok(Event::Finish { exit_code, summary }) => {
                    self.finish(exit_code, summary);
                    return;
                }
                Err(RecvTimeoutError::Timeout) => {
                    if last_post.elapsed() >= heartbeat {
                        self.flush();
                        if self.pending.is_empty() && self.created && !self.disabled {
                            let _ = self.post_stream(&json!({"complete": false, "failed": false}));
                        }
                        last_post = Instant::now();
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.finish(1, Value::Null);
                    return;
                }
            }
        }
    }

    fn graphql(&self, query: &str, variables: Value) -> Result<Value, String> {
        let resp = self
            .client
            .post(format!("{}/graphql", self.base))
            .basic_auth("api", Some(&self.key))
            .json(&json!({"query": query, "variables": variables}))
            .send()
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        let body: Value = resp.json().map_err(|e| format!("HTTP {status}: {e}"))?;
        if !status.is_success() || body.get("errors").is_some() {
            return Err(format!("HTTP {status}: {body}"));
        }
        Ok(body)
    }

    fn ensure_created(&mut self) -> Result<(), String> {
        if self.created {
            return Ok(());
        }
        if self.entity.is_empty() {
            let v = self.graphql(VIEWER, json!({}))?;
            self.entity = v["data"]["viewer"]["entity"]
                .as_str()
                .unwrap_or_default()
                .to_string();
        }
        let config: serde_json::Map<String, Value> = match &self.config {
            Value::Object(m) => m
                .iter()
                .map(|(k, v)| (k.clone(), json!({"value": v, "desc": null})))
                .collect(),
            _ => Default::default(),
        };
        let host = std::env::var("HOSTNAME").unwrap_or_default();
        let vars = json!({
            "name": self.run_id, "project": self.project, "entity": self.entity,
            "displayName": self.display_name, "config": Value::Object(config).to_string(),
            "host": host, "program": "flamia train", "state": "running",
        });
        let v = self.graphql(UPSERT_BUCKET, vars)?;
        if let Some(e) = v["data"]["upsertBucket"]["bucket"]["project"]["entity"]["name"].as_str() {
            self.entity = e.to_string();
        }
        self.created = true;
        Ok(())
    }

    fn post_stream(&self, body: &Value) -> Result<(), String> {
        let url = format!(
            "{}/files/{}/{}/{}/file_stream",
            self.base, self.entity, self.project, self.run_id
        );
        let resp = self
            .client
            .post(url)
            .basic_auth("api", Some(&self.key))
            .json(body)
            .send()
            .map_err(|e| e.to_string())?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(format!("HTTP {}", resp.status()))
        }
    }

    /// Sends the pending history lines; on failure keeps them for the next try, which waits out
    /// the backoff unless `force` (the run's end).
    fn flush_now(&mut self, force: bool) {
        if self.disabled || (!force && self.retry_at.is_some_and(|t| Instant::now() < t)) {
            return;
        }
        let r = self.ensure_created().and_then(|()| {
            if self.pending.is_empty() {
                return Ok(());
            }
            // (a backlog goes out in parts: no one huge body for the server to refuse)
            while !self.pending.is_empty() {
                let n = self.pending.len().min(LINES_PER_POST);
                let body = json!({"files": {"wandb-history.jsonl": {"offset": self.history_offset, "content": &self.pending[..n]}}});
                self.post_stream(&body)?;
                self.history_offset += n;
                self.pending.drain(..n);
            }
            Ok(())
        });
        match r {
            Ok(()) => {
                if !self.backoff.is_zero() {
                    tracing::info!("W&B: reachable again; the lines kept meanwhile are sent");
                }
                self.backoff = Duration::ZERO;
                self.retry_at = None;
            }
            Err(e) if e.contains("HTTP 401") || e.contains("HTTP 403") => {
                tracing::error!(
                    "W&B rejected the API key ({e}); not logging to W&B for the rest of this run \
                     (check WANDB_API_KEY and wandb.entity / wandb.project)"
                );
                self.disabled = true;
                self.pending.clear();
            }
            Err(e) => {
                if self.backoff.is_zero() {
                    tracing::warn!(
                        "W&B: sending failed ({e}); {} lines kept, retrying with backoff up to 60 s",
                        self.pending.len()
                    );
                }
                self.backoff = (self.backoff * 2).clamp(Duration::from_secs(1), Duration::from_secs(60));
                self.retry_at = Some(Instant::now() + self.backoff);
            }
        }
    }

    fn flush(&mut self) {
        self.flush_now(false);
    }

    fn finish(&mut self, exit_code: i32, summary: Value) {
        if self.disabled {
            return;
        }
        for attempt in 0..3 {
            self.flush_now(true);
            if self.created && self.pending.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200 << attempt));
        }
        if !self.created {
            tracing::warn!("W&B: the run was never created; nothing sent");
            return;
        }
        if !summary.is_null() {
            let body =
                json!({"files": {"wandb-summary.json": {"offset": 0, "content": [summary.to_string()]}}});
            if let Err(e) = self.post_stream(&body) {
                tracing::warn!("W&B: summary post failed ({e})");
            }
        }
        let done = json!({"complete": true, "exitcode": exit_code, "failed": exit_code != 0});
        for attempt in 0..3 {
            match self.post_stream(&done) {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!("W&B: finish post failed ({e}), attempt {}", attempt + 1);
                    std::thread::sleep(Duration::from_millis(200 << attempt));
                }
            }
        }
    }
}
