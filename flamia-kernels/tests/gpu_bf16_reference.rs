//! The bar for `flamia check numerics --device cuda`: the GPU upload rounds Q, K, V and dO to BF16,
//! so its cosines against exact attention (computed from the f32 inputs) carry the BF16 rounding
//! of the inputs. This runs the same check with the CPU reference on the BF16-rounded inputs and
//! prints the report (JSON), the figures the GPU must match (docs/kernels.md). CPU only; about
//! 15 s in release: `cargo test --release -p flamia-kernels --test gpu_bf16_reference -- --ignored
//! --nocapture`.

use flamia_kernels::leakage::reference_attn;
use flamia_kernels::numerics::{run_check, CheckConfig};
use flamia_kernels::AttnCall;

#[test]
#[ignore = "slow outside release builds: run with --release -- --ignored --nocapture"]
fn cpu_reference_on_bf16_inputs() {
    let cfg = CheckConfig {
        leakage: false,
        ..CheckConfig::default()
    };
    let rounded = |call: &AttnCall| reference_attn(&call.bf16_rounded());
    let on_bf16 = run_check(&cfg, &rounded, "cpu (BF16-rounded inputs)").unwrap();
    let on_f32 = run_check(&cfg, &reference_attn, "cpu").unwrap();
    println!("{}", serde_json::to_string_pretty(&on_bf16.paths).unwrap());
    for (path, r) in &on_bf16.paths {
        let f = &on_f32.paths[path];
        for (a, b) in [
            (r.cosine.o, f.cosine.o),
            (r.cosine.dq, f.cosine.dq),
            (r.cosine.dk, f.cosine.dk),
            (r.cosine.dv, f.cosine.dv),
        ] {
            // BF16 input rounding (2^-9 relative) moves the cosines by ~1e-5, never by 1e-3.
            assert!(
                (a - b).abs() < 1e-3,
                "{path}: cosine {a} on BF16 inputs vs {b} on f32 inputs"
            );
        }
    }
}
