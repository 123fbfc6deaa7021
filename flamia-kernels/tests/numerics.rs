//! The numerics check as a library: report contents on a small shape, and (ignored, for
//! measuring) the default shape of `flamia check numerics` with its wall time.

use flamia_kernels::leakage::reference_attn;
use flamia_kernels::numerics::{run_check, CheckConfig};

#[test]
fn small_check_reports_every_path_and_leak() {
    let cfg = CheckConfig {
        lens: vec![90, 50],
        heads: 2,
        kv_heads: 1,
        ..CheckConfig::default()
    };
    let r = run_check(&cfg, &reference_attn, "cpu").unwrap();
    assert_eq!(
        r.paths.keys().collect::<Vec<_>>(),
        ["leaky-fp8", "mxfp8", "nvfp4"]
    );
    let m = &r.paths["mxfp8"];
    assert!(
        m.cosine.o >= 0.997 && m.cosine.dq >= 0.995 && m.cosine.dk >= 0.995 && m.cosine.dv >= 0.995,
        "{m:?}"
    );
    assert!(m.rel_l2.o > 0.0 && m.rel_l2.o < 0.1);
    let l = r.leakage.as_ref().unwrap();
    assert!(l.mxfp8.before_own_block_bitwise_zero && l.mxfp8.before_own_block == 0.0);
    assert!(l.mxfp8_precision.bitwise_zero);
    assert!(l.leaky_fp8.max > 1e-3);
    assert!(l.doc_isolation.as_ref().unwrap().bitwise_zero);
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["leakage"]["mxfp8+precision"]["max"].is_number());
    assert!(json["paths"]["leaky-fp8"]["cosine"]["dv"].is_number());
}

#[test]
#[ignore = "measurement: the default check (700/300/1024 x 4 heads x d 128); run with --ignored --nocapture"]
fn default_check_wall_time() {
    for seed in 0..5 {
        let cfg = CheckConfig {
            seed,
            ..CheckConfig::default()
        };
        let r = run_check(&cfg, &reference_attn, "cpu").unwrap();
        println!("{}", serde_json::to_string(&r).unwrap());
    }
}
