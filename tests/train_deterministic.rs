//! Reproducible training, end to end through the `flamia` binary.
//!
//! CPU (always): the default `run.deterministic = "auto"` turns the mode on for the FLAMIA
//! paths and off for the `bf16` control (the log says which, and libtorch's switches follow,
//! with its NaN fill of uninitialised memory off unless `run.fill_uninitialized_memory`); the
//! mode trains (no operation of the step lacks a deterministic libtorch algorithm) with the same
//! bits as without it, a `CUBLAS_WORKSPACE_CONFIG` that would break it is refused, and with a
//! device setting that may be CUDA it sets `CUBLAS_WORKSPACE_CONFIG=:4096:8` before the device
//! is resolved.
//!
//! CUDA (`--ignored`, on the device): two fresh runs of `configs/h200-125m.toml` give bitwise the
//! same losses and final weights and optimizer state, for `mxfp8` with the default settings and
//! for the `bf16` control with `run.deterministic = true`; and N/2 steps, stop, `--resume` N/2
//! equals N steps. (With the mode off neither path is bitwise repeatable on the GPU:
//! docs/training.md "Reproducibility".) A carried test executable finds the carried `flamia`
//! and the checkout through `FLAMIA_TEST_BIN` and `FLAMIA_TEST_REPO` (tests/support).

use std::path::Path;

use flamia_trainer::config::TrainConfig;

mod support;
use support::{flamia, losses, repo, SMALL};

/// Runs `flamia train` with `args` into `dir`; panics with the output when it fails.
fn train(dir: &Path, args: &[&str]) {
    train_env(dir, args, &[]);
}

fn train_env(dir: &Path, args: &[&str], env: &[(&str, &Path)]) {
    let out = flamia()
        .current_dir(repo())
        .envs(env.iter().copied())
        .arg("train")
        .args(["--set", &format!("run.dir={}", dir.display())])
        .args(args)
        .output()
        .expect("run flamia train");
    assert!(
        out.status.success(),
        "flamia train {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Asserts bitwise equal losses (every step logged) and, when `ckpt` names a checkpoint
/// directory, byte-equal model and optimizer files in it.
fn assert_same_run(a: &Path, b: &Path, steps: usize, ckpt: Option<&str>) {
    let (la, lb) = (losses(a), losses(b));
    assert_eq!(la.len(), steps, "{} logs every step", a.display());
    assert_eq!(lb.len(), steps, "{} logs every step", b.display());
    for ((sa, x), (sb, y)) in la.iter().zip(&lb) {
        assert_eq!(sa, sb);
        assert_eq!(
            x.to_bits(),
            y.to_bits(),
            "step {sa}: {x} vs {y} ({} vs {})",
            a.display(),
            b.display()
        );
    }
    if let Some(c) = ckpt {
        for f in ["model.safetensors", "optimizer.safetensors"] {
            let (pa, pb) = (
                a.join("checkpoints").join(c).join(f),
                b.join("checkpoints").join(c).join(f),
            );
            let (ba, bb) = (std::fs::read(&pa).unwrap(), std::fs::read(&pb).unwrap());
            assert!(
                ba == bb,
                "{} and {} differ: the runs did not end with the same bits",
                pa.display(),
                pb.display()
            );
        }
    }
}

const CPU: [&str; 8] = [
    "--config",
    "configs/tiny-cpu.toml",
    "--set",
    "run.device=cpu",
    "--set",
    "run.log_every=1",
    "--set",
    "training.steps=4",
];

#[test]
fn deterministic_mode_trains_on_cpu_with_the_default_bits_and_the_same_trace() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b) = (tmp.path().join("off"), tmp.path().join("deterministic"));
    let (ta, tb) = (tmp.path().join("a.trace"), tmp.path().join("b.trace"));
    let small: Vec<&str> = CPU.iter().chain(SMALL.iter()).copied().collect();
    let off: Vec<&str> = small
        .iter()
        .copied()
        .chain(["--set", "run.deterministic=false"])
        .collect();
    train_env(&a, &off, &[("FLAMIA_TRACE_CHECKSUMS", &ta)]);
    let det: Vec<&str> = small
        .iter()
        .copied()
        .chain(["--set", "run.deterministic=true"])
        .collect();
    train_env(&b, &det, &[("FLAMIA_TRACE_CHECKSUMS", &tb)]);
    assert_same_run(&a, &b, 4, Some("step_00000004"));
    let cfg = std::fs::read_to_string(b.join("config.toml")).unwrap();
    assert!(cfg.contains("deterministic = true"), "{cfg}");

    // The checksum trace: one line per attention call and per step, the same in both runs.
    let (xa, xb) = (
        std::fs::read_to_string(&ta).unwrap(),
        std::fs::read_to_string(&tb).unwrap(),
    );
    assert_eq!(xa, xb, "the traces of two equal runs differ");
    let layers = 2; // tiny
    let count = |p: &str| xa.lines().filter(|l| l.starts_with(p)).count();
    assert_eq!(count("step "), 4, "{xa}");
    assert_eq!(count("attn "), 4 * 2 * layers, "{xa}");
    let first = xa.lines().next().unwrap();
    assert!(
        first.starts_with("attn 0 fwd path=") && first.contains(" lse="),
        "{first}"
    );
    assert!(
        xa.lines().any(|l| l.contains(" bwd ") && l.contains(" dv=")),
        "{xa}"
    );
    assert!(
        xa.contains("step 4 loss=") && xa.contains("tok_embeddings.weight="),
        "{xa}"
    );
}

/// The stderr of a one-step tiny run on `device` with `args` (it must succeed), with
/// `CUBLAS_WORKSPACE_CONFIG` unset.
fn one_step_log(device: &str, args: &[&str]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let out = flamia()
        .current_dir(repo())
        .env_remove("CUBLAS_WORKSPACE_CONFIG")
        .arg("train")
        .args(["--set", &format!("run.dir={}", tmp.path().join("r").display())])
        .args([
            "--config",
            "configs/tiny-cpu.toml",
            "--set",
            &format!("run.device={device}"),
        ])
        .args(["--set", "training.steps=1"])
        .args(SMALL)
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{args:?}: {err}");
    err
}

#[test]
fn the_default_is_deterministic_for_flamia_paths_and_not_for_the_bf16_control() {
    for (args, want) in [
        (
            &["--set", "attention.path=mxfp8"][..],
            "run.deterministic auto: on for attention path mxfp8, NaN fill of uninitialised memory off",
        ),
        (
            &["--set", "attention.path=leaky-fp8"][..],
            "run.deterministic auto: on for attention path leaky-fp8,",
        ),
        (
            &["--set", "attention.path=bf16"][..],
            "run.deterministic auto: off for attention path bf16",
        ),
        (
            &["--set", "attention.path=bf16", "--set", "run.deterministic=true"][..],
            "run.deterministic true: on for attention path bf16, NaN fill of uninitialised memory off",
        ),
        (
            &[
                "--set",
                "attention.path=mxfp8",
                "--set",
                "run.deterministic=false",
            ][..],
            "run.deterministic false: off for attention path mxfp8",
        ),
        (
            &[
                "--set",
                "attention.path=mxfp8",
                "--set",
                "run.fill_uninitialized_memory=true",
            ][..],
            "run.deterministic auto: on for attention path mxfp8, NaN fill of uninitialised memory on",
        ),
    ] {
        let err = one_step_log("cpu", args);
        assert!(err.contains(want), "{args:?}: no {want:?} in\n{err}");
    }
}

#[test]
fn the_mode_sets_libtorch_as_the_config_resolves() {
    // In this test process (the other tests only start `flamia` processes): `apply` for a config
    // leaves libtorch's switches as the log lines above say.
    let load = |sets: &[&str]| {
        let mut o = vec!["run.device=cpu".to_string()];
        o.extend(sets.iter().map(|s| s.to_string()));
        TrainConfig::load(Some(&repo().join("configs/tiny-cpu.toml")), &o).unwrap()
    };
    let mx = load(&["attention.path=mxfp8"]);
    assert_eq!(
        mx.run.deterministic,
        flamia_trainer::config::Deterministic::Auto,
        "the preset's setting"
    );
    flamia_trainer::determinism::apply(&mx).unwrap();
    assert!(flamia_trainer::attention::deterministic());
    assert!(!flamia_trainer::attention::fill_uninitialized());

    flamia_trainer::determinism::apply(&load(&[
        "attention.path=mxfp8",
        "run.fill_uninitialized_memory=true",
    ]))
    .unwrap();
    assert!(flamia_trainer::attention::deterministic());
    assert!(flamia_trainer::attention::fill_uninitialized());
    // The fill is real: a fresh uninitialised tensor is all NaN.
    let e = tch::Tensor::empty([1024], (tch::Kind::Float, tch::Device::Cpu));
    assert_eq!(e.isnan().sum(tch::Kind::Int64).int64_value(&[]), 1024);

    flamia_trainer::determinism::apply(&load(&["attention.path=bf16"])).unwrap();
    assert!(!flamia_trainer::attention::deterministic());
}

#[test]
fn deterministic_mode_refuses_a_nondeterministic_cublas_config() {
    let tmp = tempfile::tempdir().unwrap();
    let out = flamia()
        .current_dir(repo())
        .env("CUBLAS_WORKSPACE_CONFIG", ":0:0")
        .arg("train")
        .args(["--set", &format!("run.dir={}", tmp.path().join("r").display())])
        .args(CPU)
        .args(SMALL)
        .args(["--set", "run.deterministic=true"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a :0:0 cuBLAS workspace was accepted");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("CUBLAS_WORKSPACE_CONFIG") && err.contains(":4096:8"),
        "{err}"
    );
}

#[test]
fn deterministic_mode_sets_the_cublas_workspace_before_the_device_is_resolved() {
    // `run.device = auto` may be CUDA, so the variable is set, and that happens before the
    // device is probed (the line naming the device resolved).
    let err = one_step_log("auto", &["--set", "run.deterministic=true"]);
    let set = err
        .find("CUBLAS_WORKSPACE_CONFIG=:4096:8 set before CUDA starts")
        .unwrap_or_else(|| panic!("the variable was not set:\n{err}"));
    let device = err.find("run.device \"auto\": ").expect("the device line");
    assert!(set < device, "set after the device was resolved:\n{err}");
}

/// The H200 preset, `steps` steps, every loss logged, a checkpoint only at the end.
fn gpu_args<'a>(path: &'a str, steps: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "--config",
        "configs/h200-125m.toml",
        "--set",
        "run.device=cuda",
        "--set",
        "run.log_every=1",
        "--set",
        "run.checkpoint_every=0",
        "--set",
        "run.progress=false",
        "--set",
        path,
        "--set",
        steps,
    ];
    v.extend_from_slice(extra);
    v
}

fn need_cuda() {
    assert!(
        tch::Cuda::is_available(),
        "this test needs a CUDA GPU; it must not pass without one"
    );
}

/// The two configurations that must be reproducible on the GPU: a FLAMIA path with the default
/// settings (`run.deterministic = "auto"`), the `bf16` control with the mode asked for.
const GPU_CASES: [(&str, &[&str]); 2] = [
    ("attention.path=mxfp8", &[]),
    ("attention.path=bf16", &["--set", "run.deterministic=true"]),
];

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn gpu_runs_are_bitwise_repeatable_mxfp8_default_and_bf16_deterministic() {
    need_cuda();
    let tmp = tempfile::tempdir().unwrap();
    for (i, (path, extra)) in GPU_CASES.iter().enumerate() {
        let (a, b) = (tmp.path().join(format!("{i}a")), tmp.path().join(format!("{i}b")));
        let args = gpu_args(path, "training.steps=20", extra);
        train(&a, &args);
        train(&b, &args);
        assert_same_run(&a, &b, 20, Some("step_00000020"));
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn gpu_resume_is_bitwise_mxfp8_default_and_bf16_deterministic() {
    need_cuda();
    let tmp = tempfile::tempdir().unwrap();
    for (i, (path, extra)) in GPU_CASES.iter().enumerate() {
        let (a, b) = (
            tmp.path().join(format!("{i}straight")),
            tmp.path().join(format!("{i}resumed")),
        );
        let args = gpu_args(path, "training.steps=20", extra);
        train(&a, &args);
        let stop: Vec<&str> = args.iter().copied().chain(["--stop-after", "10"]).collect();
        train(&b, &stop);
        assert_eq!(losses(&b).len(), 10, "the stopped run logs 10 steps");
        let resume: Vec<&str> = args.iter().copied().chain(["--resume"]).collect();
        train(&b, &resume);
        assert_same_run(&a, &b, 20, Some("step_00000020"));
    }
}
