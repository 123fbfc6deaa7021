//! `flamia train` configuration: presets, `FLAMIA__SECTION__KEY` environment, `--set`, unknown
//! keys rejected with the valid ones listed.

mod support;
use support::{flamia, repo};

const PRESETS: [&str; 4] = ["tiny-cpu", "h200-125m", "h200x8-1b", "multinode-1b"];

fn print_config(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut c = flamia();
    c.current_dir(repo()).args(["train", "--print-config"]).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run flamia");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_preset_takes_steps_and_run_dir_overrides() {
    for p in PRESETS {
        let path = format!("configs/{p}.toml");
        let text = std::fs::read_to_string(repo().join(&path)).unwrap();
        assert!(
            text.starts_with("# Hardware:"),
            "{path} is headed by its hardware"
        );
        let (ok, out, err) = print_config(
            &[
                "--config",
                &path,
                "--set",
                "training.steps=7",
                "--set",
                "run.dir=/tmp/x-run",
            ],
            &[],
        );
        assert!(ok, "{path}: {err}");
        assert!(out.contains("steps = 7"), "{path}:\n{out}");
        assert!(out.contains("dir = \"/tmp/x-run\""), "{path}:\n{out}");
    }
}

#[test]
fn environment_overrides_preset_and_set_overrides_environment() {
    let env = [
        ("FLAMIA__TRAINING__STEPS", "33"),
        ("FLAMIA__MODEL__SIZE", "debug"),
    ];
    let (ok, out, err) = print_config(&["--config", "configs/tiny-cpu.toml"], &env);
    assert!(ok, "{err}");
    assert!(
        out.contains("steps = 33") && out.contains("size = \"debug\""),
        "{out}"
    );
    let (ok, out, err) = print_config(
        &["--config", "configs/tiny-cpu.toml", "--set", "training.steps=44"],
        &env,
    );
    assert!(ok, "{err}");
    assert!(out.contains("steps = 44"), "{out}");
}

#[test]
fn unknown_keys_and_bad_values_are_rejected_with_what_is_allowed() {
    let (ok, _, err) = print_config(
        &["--config", "configs/tiny-cpu.toml", "--set", "training.stepz=5"],
        &[],
    );
    assert!(!ok);
    assert!(
        err.contains("stepz") && err.contains("steps") && err.contains("grad_accum"),
        "{err}"
    );
    let (ok, _, err) = print_config(&["--set", "trainin.steps=5"], &[]);
    assert!(!ok);
    assert!(err.contains("trainin") && err.contains("training"), "{err}");
    let (ok, _, err) = print_config(&["--set", "attention.path=fp4"], &[]);
    assert!(!ok);
    assert!(err.contains("bf16, mxfp8, nvfp4, leaky-fp8"), "{err}");
    let (ok, _, err) = print_config(&["--set", "model.size=7b"], &[]);
    assert!(!ok);
    assert!(err.contains("tiny, debug, 125m, 350m, 1b"), "{err}");
    let (ok, _, err) = print_config(&["--set", "run.deterministic=maybe"], &[]);
    assert!(!ok);
    assert!(err.contains("auto, true or false"), "{err}");
}

#[test]
fn run_deterministic_is_auto_in_the_presets_and_takes_booleans_from_env_and_set() {
    for p in PRESETS {
        let (ok, out, err) = print_config(&["--config", &format!("configs/{p}.toml")], &[]);
        assert!(ok, "{p}: {err}");
        assert!(out.contains("deterministic = \"auto\""), "{p}:\n{out}");
    }
    let tiny = ["--config", "configs/tiny-cpu.toml"];
    let (ok, out, err) = print_config(&tiny, &[("FLAMIA__RUN__DETERMINISTIC", "false")]);
    assert!(ok && out.contains("deterministic = false"), "{err}\n{out}");
    let set = [
        "--config",
        "configs/tiny-cpu.toml",
        "--set",
        "run.deterministic=true",
    ];
    let (ok, out, err) = print_config(&set, &[("FLAMIA__RUN__DETERMINISTIC", "false")]);
    assert!(ok && out.contains("deterministic = true"), "{err}\n{out}");
}
