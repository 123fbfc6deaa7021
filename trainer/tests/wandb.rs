//! The W&B uploader against a local HTTP server that checks every request's shape: GraphQL
//! `upsertBucket` with the config, `file_stream` history lines with increasing offsets, the
//! summary, heartbeats, and the final `complete` with the exit code; failures are retried.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use flamia_trainer::config::WandbConfig;
use flamia_trainer::metrics::wandb::Wandb;
use flamia_trainer::metrics::StepMetrics;
use serde_json::Value;

#[derive(Debug, Clone)]
struct Req {
    path: String,
    auth: String,
    body: Value,
}

/// Serves until dropped; answers 500 to the first `fail_first` file_stream posts.
fn server(fail_first: usize) -> (String, Arc<Mutex<Vec<Req>>>) {
    let (addr, log, _) = server_failing(fail_first, "500 Internal Server Error");
    (addr, log)
}

/// [`server`] answering `status` to the first `fail_first` file_stream posts (`usize::MAX`: all
/// of them); the count of every request received, failed ones included.
fn server_failing(
    fail_first: usize,
    status: &'static str,
) -> (String, Arc<Mutex<Vec<Req>>>, Arc<std::sync::atomic::AtomicUsize>) {
    let seen = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen2 = seen.clone();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let log = Arc::new(Mutex::new(Vec::new()));
    let log2 = log.clone();
    std::thread::spawn(move || {
        let mut failed = 0;
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let mut parts = line.split_whitespace();
            let (method, path) = (
                parts.next().unwrap_or("").to_string(),
                parts.next().unwrap_or("").to_string(),
            );
            let (mut len, mut auth) = (0usize, String::new());
            loop {
                let mut h = String::new();
                reader.read_line(&mut h).unwrap();
                let h = h.trim_end();
                if h.is_empty() {
                    break;
                }
                let (k, v) = h.split_once(':').unwrap();
                match k.to_ascii_lowercase().as_str() {
                    "content-length" => len = v.trim().parse().unwrap(),
                    "authorization" => auth = v.trim().to_string(),
                    _ => {}
                }
            }
            let mut body = vec![0u8; len];
            reader.read_exact(&mut body).unwrap();
            assert_eq!(method, "POST", "every W&B call is a POST");
            let body: Value = serde_json::from_slice(&body).expect("JSON body");
            let is_stream = path.ends_with("/file_stream");
            seen2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let (status, reply) = if is_stream && failed < fail_first {
                failed += 1;
                (status, "{}".to_string())
            } else if is_stream {
                log2.lock().unwrap().push(Req { path, auth, body });
                ("200 OK", "{\"exitcode\":null}".to_string())
            } else {
                log2.lock().unwrap().push(Req { path, auth, body });
                ("200 OK", r#"{"data":{"upsertBucket":{"bucket":{"id":"b1","name":"r","displayName":"t","project":{"id":"p","name":"proj","entity":{"id":"e","name":"ent"}}},"inserted":true}}}"#.to_string())
            };
            let _ = write!(stream, "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{reply}", reply.len());
        }
    });
    (addr, log, seen)
}

fn metrics(step: usize) -> StepMetrics {
    StepMetrics {
        step,
        loss: 5.0 - step as f64 * 0.1,
        lr: 1e-3,
        grad_norm: 1.0,
        skipped: false,
        tokens: 100 * step as u64,
        tps: 1000.0,
        mfu_pct: None,
        step_time_s: 0.1,
        attn_time_s: 0.01,
        memory_gib: 0.5,
        kernel_build_s: None,
        // Step 2 is a validation step.
        val_loss: (step == 2).then_some(4.9),
        val_tokens: (step == 2).then_some(4096),
        val_loss_exact: (step == 2).then_some(4.95),
    }
}

#[test]
fn wandb_protocol_shapes_offsets_retries_and_finish() {
    let (base, log) = server(2);
    std::env::set_var("WANDB_API_KEY", "test-key-123");
    let cfg = WandbConfig {
        enabled: true,
        project: "proj".into(),
        entity: "ent".into(),
        base_url: base,
        heartbeat_secs: 1,
    };
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wandb::start(&cfg, "tiny", "[training]\nsteps = 3\n", dir.path(), None);
    let t0 = std::time::Instant::now();
    for s in 1..=3 {
        w.log(&metrics(s));
    }
    assert!(
        t0.elapsed().as_millis() < 50,
        "logging never waits on the network"
    );
    // (the two 500s back the uploader off 1 s, then 2 s: the lines go out at ~3 s, then a
    // heartbeat at the next 1 s tick)
    std::thread::sleep(std::time::Duration::from_millis(4500));
    w.finish(0, &serde_json::json!({"final_loss": 4.7}));

    let reqs = log.lock().unwrap().clone();
    // Basic auth "api:<key>".
    assert!(
        reqs.iter().all(|r| r.auth == "Basic YXBpOnRlc3Qta2V5LTEyMw=="),
        "{reqs:?}"
    );
    let gql = &reqs[0];
    assert_eq!(gql.path, "/graphql");
    assert!(gql.body["query"].as_str().unwrap().contains("upsertBucket"));
    let vars = &gql.body["variables"];
    assert_eq!(vars["project"], "proj");
    assert_eq!(vars["entity"], "ent");
    let config: Value = serde_json::from_str(vars["config"].as_str().unwrap()).unwrap();
    assert_eq!(config["training"]["value"]["steps"], 3);
    let run = vars["name"].as_str().unwrap().to_string();

    let streams: Vec<&Req> = reqs.iter().filter(|r| r.path.ends_with("/file_stream")).collect();
    assert!(streams
        .iter()
        .all(|r| r.path == format!("/files/ent/proj/{run}/file_stream")));
    // History: lines in order, offsets counting the lines already accepted (none lost by the 500s).
    let mut next = 0;
    let mut steps = Vec::new();
    for r in &streams {
        if let Some(h) = r.body["files"].get("wandb-history.jsonl") {
            assert_eq!(h["offset"].as_u64().unwrap() as usize, next);
            for line in h["content"].as_array().unwrap() {
                let v: Value = serde_json::from_str(line.as_str().unwrap()).unwrap();
                assert!(
                    v["_step"].is_u64()
                        && v["_runtime"].is_f64()
                        && v["_timestamp"].is_f64()
                        && v["loss"].is_f64()
                );
                // The validation loss rides in its step's history line, like the train loss.
                let val = v["_step"] == 2;
                assert_eq!(v["val_loss"].is_f64(), val, "{v}");
                assert_eq!(v.get("val_tokens").is_some(), val, "{v}");
                assert_eq!(v["val_loss_exact"].is_f64(), val, "{v}");
                steps.push(v["_step"].as_u64().unwrap());
                next += 1;
            }
        }
    }
    assert_eq!(steps, vec![1, 2, 3]);
    let heartbeats = streams
        .iter()
        .filter(|r| r.body.get("files").is_none() && r.body["complete"] == false)
        .count();
    assert!(
        heartbeats >= 1,
        "a heartbeat within 4.5 s at 1 s interval (after the backoff)"
    );
    let summary = streams
        .iter()
        .find_map(|r| r.body["files"].get("wandb-summary.json"))
        .expect("summary");
    assert!(summary["content"][0].as_str().unwrap().contains("final_loss"));
    let last = streams.last().unwrap();
    assert_eq!(last.body["complete"], true);
    assert_eq!(last.body["exitcode"], 0);
}

#[test]
fn unreachable_server_never_blocks_training() {
    std::env::set_var("WANDB_API_KEY", "k");
    // A port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = WandbConfig {
        enabled: true,
        base_url: format!("http://127.0.0.1:{port}"),
        heartbeat_secs: 1,
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wandb::start(&cfg, "x", "", dir.path(), None);
    let t0 = std::time::Instant::now();
    for s in 1..=100 {
        w.log(&metrics(s));
    }
    assert!(t0.elapsed().as_millis() < 100);
    w.finish(1, &serde_json::json!({}));
}

fn config(base: String) -> WandbConfig {
    WandbConfig {
        enabled: true,
        project: "proj".into(),
        entity: "ent".into(),
        base_url: base,
        heartbeat_secs: 1,
    }
}

/// A server that keeps failing is retried with backoff (not once per logged step), and a
/// rejected key turns W&B off after one try; training never waits either way.
#[test]
fn failures_back_off_and_a_rejected_key_stops_the_uploads() {
    std::env::set_var("WANDB_API_KEY", "k");
    for (status, most) in [("503 Service Unavailable", 6), ("401 Unauthorized", 1)] {
        let (base, _, seen) = server_failing(usize::MAX, status);
        let dir = tempfile::tempdir().unwrap();
        let mut w = Wandb::start(&config(base), "x", "", dir.path(), None);
        let t0 = std::time::Instant::now();
        // 40 steps over ~2 s: without backoff, a post per step
        for s in 1..=40 {
            w.log(&metrics(s));
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(t0.elapsed().as_secs_f64() < 3.0, "logging never waits");
        let posts = seen.load(std::sync::atomic::Ordering::SeqCst) - 1; // (the GraphQL call)
        assert!(posts <= most, "{status}: {posts} file_stream posts in 2 s");
        w.finish_within(0, &serde_json::json!({}), std::time::Duration::from_secs(5));
    }
}

/// A resumed run logs to its own W&B run (the original's history offsets are not known here).
#[test]
fn a_resumed_run_gets_its_own_wandb_run() {
    std::env::set_var("WANDB_API_KEY", "k");
    let dir = tempfile::tempdir().unwrap();
    let mut names = Vec::new();
    for resumed in [None, Some(1000)] {
        let (base, log) = server(0);
        let mut w = Wandb::start(&config(base), "tiny", "", dir.path(), resumed);
        w.log(&metrics(1));
        w.finish(0, &serde_json::json!({}));
        let reqs = log.lock().unwrap().clone();
        let vars = reqs[0].body["variables"].clone();
        names.push((
            vars["name"].as_str().unwrap().to_string(),
            vars["displayName"].as_str().unwrap().to_string(),
        ));
    }
    assert_eq!(names[1].0, format!("{}-r1000", names[0].0));
    assert_eq!(names[0].1, "tiny");
    assert_eq!(names[1].1, "tiny (resumed at step 1000)");
}

/// A backlog (lines kept through an outage) goes out in posts of at most 1000 lines, in order,
/// with the offsets continuing, each line stamped when it was logged.
#[test]
fn a_backlog_goes_out_in_parts() {
    std::env::set_var("WANDB_API_KEY", "k");
    let (base, log) = server(1);
    let dir = tempfile::tempdir().unwrap();
    let mut w = Wandb::start(&config(base), "x", "", dir.path(), None);
    for s in 1..=2500 {
        w.log(&metrics(s));
    }
    let logged = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    std::thread::sleep(std::time::Duration::from_millis(1500)); // (the backoff after the 500)
    w.finish(0, &serde_json::json!({}));
    let reqs = log.lock().unwrap().clone();
    let (mut next, mut steps) = (0usize, Vec::new());
    for r in reqs.iter().filter(|r| r.path.ends_with("/file_stream")) {
        if let Some(h) = r.body["files"].get("wandb-history.jsonl") {
            let content = h["content"].as_array().unwrap();
            assert!(content.len() <= 1000, "a post of {} lines", content.len());
            assert_eq!(h["offset"].as_u64().unwrap() as usize, next);
            next += content.len();
            for line in content {
                let v: Value = serde_json::from_str(line.as_str().unwrap()).unwrap();
                assert!(
                    v["_timestamp"].as_f64().unwrap() <= logged + 0.5,
                    "stamped when logged: {v}"
                );
                steps.push(v["_step"].as_u64().unwrap());
            }
        }
    }
    assert_eq!(steps, (1..=2500).collect::<Vec<u64>>());
}
