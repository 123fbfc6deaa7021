//! GPU attention forward/backward against the CPU reference on the same BF16 inputs: the relative
//! L2 distance `||GPU - CPU|| / ||CPU||` of O, LSE, dQ, dK, dV within a stated bound, the error
//! versus exact attention within twice the CPU reference's own error plus a small atol (FA3's
//! rule), poisoned outputs fully overwritten, no NaN, repeated runs bitwise identical; and the
//! causal-safety properties of the reference through the same leakage harness
//! (`flamia_kernels::leakage` with `gpu::host::attn_fn`): document isolation, default MXFP8 bitwise
//! before the perturbed block, the precision options bitwise causal (also on the quiet-prefix
//! input), and the negative controls (each option off, leaky-fp8) leaking. Fixed seeds
//! (`gpu_common::SEEDS`; `FLAMIA_TEST_SEED=N` replays one, a failure prints its seed). Run on the
//! device: `--ignored`.

mod gpu_common;

use flamia_kernels::gpu::host::attn_fn;
use flamia_kernels::leakage::{causal_leakage, default_probe, doc_isolation, quiet_prefix, CausalLeak};
use flamia_kernels::numerics::rel_l2;
use flamia_kernels::reference::{self, Forward, Grads};
use flamia_kernels::{AttnCall, AttnOptions, AttnPath, Precision, VarlenShape};
use gpu_common::*;
use rand_chacha::ChaCha8Rng;

const LENS: [usize; 7] = [1, 31, 33, 64, 127, 129, 257];
/// Absolute slack of the error bound against exact (relative Frobenius error units).
const ATOL: f64 = 2e-3;
/// Bound on `||GPU - CPU|| / ||CPU||` per output `[O, LSE, dQ, dK, dV]` on the same BF16 inputs.
/// Measured on the H200 (device call 10 of 2026-12-01, every case of this file, 2 seeds, v4
/// forward and backward; NVFP4 and the causally safe options on v3.1): largest gaps O 4.9e-3,
/// LSE 1.6e-5, dQ 7.5e-3, dK 7.3e-3, dV 5.3e-3 (single E4M3 roundings of P or dS going the other
/// way). Bounds at about twice those. The bound has caught real bugs: dV summed over GQA heads in
/// different units (gap 0.06-0.25, call 1) and a broken dK (gap 0.15-0.56, calls 4-8).
const GPU_CPU_REL: [f64; 5] = [0.01, 5e-5, 0.015, 0.015, 0.012];
/// [`GPU_CPU_REL`] on spread block scales ([`spread_blocks_and_zero_values`]), where the LSE gap
/// is set by the scores, not the sums: Q and K blocks at up to 2^+-2 make the scores up to 16x
/// larger, the softmax nearly one-hot and LSE about the row's largest score, which the FP8
/// wgmma's truncating accumulator (13 fraction bits, docs/numerics.md) computes ~1.3e-4 relative
/// away from the reference's f64 dot product. Measured on the H200 (session 43, seed 1, d = 128,
/// FLAMIA_FWD_EV_RUN=1, against the reference's earlier whole-prefix V fold): LSE 1.100e-4, the others within [`GPU_CPU_REL`] (O 3.4e-3, dQ 5.8e-3,
/// dK 1.26e-2, dV 7.6e-3); the reference's LSE with its scores from the accumulator's bit-exact
/// model (`cargo run --release -p flamia-kernels --example lse_accumulator`) is 1.101e-4 from the
/// reference's own (seed 2: 1.118e-4, where the H200 gave 1.118e-4; d = 64: 6.6e-5; Gaussian inputs: 1.47e-5, where the GPU's
/// largest was 1.6e-5). LSE's bound at about 2.7 times that. dK: 1.570e-2 and 1.590e-2 (seed 2,
/// default and causally safe, session 43's fourth call; seed 1 1.26e-2), with the GPU's error
/// against exact 0.327 where the reference's is 0.324. Not fully modelled: the reference's backward
/// given the accumulator model's LSE alone moves dK by ~8e-3 on these inputs and 2-3e-3 on
/// Gaussian ones (`examples/lse_accumulator.rs`): spread inputs turn the same small differences
/// into 3-4 times more E4M3 flips of dS and P. Its bound at about twice the GPU's gap.
const SPREAD_GPU_CPU_REL: [f64; 5] = [0.01, 3e-4, 0.015, 0.03, 0.012];

const NAMES: [&str; 5] = ["O", "LSE", "dQ", "dK", "dV"];

fn outputs(r: &(Forward, Grads)) -> [&[f32]; 5] {
    [&r.0.o, &r.0.lse, &r.1.dq, &r.1.dk, &r.1.dv]
}

fn check_accuracy(tag: &str, shape: &VarlenShape, opts: AttnOptions) {
    check_accuracy_with(tag, shape, opts, GPU_CPU_REL, |_, call| call);
}

/// [`check_accuracy`] on Gaussian inputs changed by `shape_inputs` (given the seed's RNG), with
/// the GPU-CPU gap bounds `bounds` (as [`GPU_CPU_REL`]).
fn check_accuracy_with(
    tag: &str,
    shape: &VarlenShape,
    opts: AttnOptions,
    bounds: [f64; 5],
    shape_inputs: impl Fn(&mut ChaCha8Rng, AttnCall) -> AttnCall,
) {
    let gpu = gpu();
    with_seeds(tag, |mut rng| {
        let call = gauss_call(&mut rng, shape, opts);
        let call = shape_inputs(&mut rng, call);
        let exact = reference::forward_backward(&call.with_path(AttnPath::Exact)).unwrap();
        let cpu = reference::forward_backward(&call).unwrap();
        let got = gpu_attn(&gpu, &call);
        for (name, x) in NAMES.iter().zip(outputs(&got)) {
            assert_eq!(
                count_nan(x),
                0,
                "{tag}: {name} has non-finite (unwritten) elements"
            );
        }
        let (g, c, e) = (outputs(&got), outputs(&cpu), outputs(&exact));
        let mut bad = Vec::new();
        for (i, name) in NAMES.iter().enumerate() {
            let (e_gpu, e_cpu, gap) = (rel_l2(g[i], e[i]), rel_l2(c[i], e[i]), rel_l2(g[i], c[i]));
            eprintln!(
                "{tag}: {name:<3} rel L2 vs exact: gpu {e_gpu:.3e}  cpu reference {e_cpu:.3e}  \
                 |gpu - cpu| / |cpu| {gap:.3e} (bound {:.1e})",
                bounds[i]
            );
            if e_gpu > 2.0 * e_cpu + ATOL {
                bad.push(format!(
                    "{name} error {e_gpu:.3e} exceeds 2 x CPU reference error {e_cpu:.3e} + {ATOL}"
                ));
            }
            if gap > bounds[i] {
                bad.push(format!(
                    "{name} |gpu - cpu| / |cpu| = {gap:.3e} exceeds {:.1e}",
                    bounds[i]
                ));
            }
        }
        assert!(bad.is_empty(), "{tag}:\n{}", bad.join("\n"));
    });
}

/// The spread tests' document lengths: 1,100 tokens (nine key tiles, the all-zero V tile at keys
/// 256..383 among them), 517 (its first block's V zero) and 64.
const SPREAD_LENS: [usize; 3] = [1100, 517, 64];

/// [`spread_blocks_and_zero_values`] at head dim `hd`: the default options and the causally safe
/// ones (per-token scales: the producer's running maximum of V's fold reference) against the
/// reference within [`SPREAD_GPU_CPU_REL`]. One test per head dim, so a failure at one does not
/// hide the other.
fn check_spread_scales(hd: usize) {
    let shape = VarlenShape::from_lens(&SPREAD_LENS, 4, 2, hd).unwrap();
    let spread = |rng: &mut ChaCha8Rng, call| spread_blocks_and_zero_values(rng, call, &SPREAD_LENS);
    let safe = AttnOptions {
        precision: Precision::causally_safe(true),
        ..AttnOptions::new(AttnPath::Mxfp8)
    };
    for (what, opts) in [("", AttnOptions::new(AttnPath::Mxfp8)), (", causally safe", safe)] {
        check_accuracy_with(
            &format!("mxfp8 spread scales{what}, d = {hd}"),
            &shape,
            opts,
            SPREAD_GPU_CPU_REL,
            spread,
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn spread_block_scales_and_zero_value_tiles_are_as_accurate_as_the_reference() {
    check_spread_scales(128);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn head_dim_64_spread_block_scales_and_zero_value_tiles_are_as_accurate_as_the_reference() {
    check_spread_scales(64);
}

/// V's fold reference as the running maximum of eV (FWD_EV_RUN, the default since session 43;
/// FLAMIA_FWD_EV_RUN=0 takes each key tile's own maximum, which overflowed O after an all-zero V
/// tile on the H200) gives the per-tile rule's bits wherever every V block has one exponent (each
/// token's first V element exactly 4, the rest within +-3.9: every block's maximum is 4), with
/// token-block scales and with the causally safe options' per-token scales (whose interior tiles
/// take the running maximum from the producer), at both head dims. (Its accuracy where the
/// exponents spread: the spread tests above, on the default.)
#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn forward_ev_running_max_keeps_uniform_exponents_bitwise() {
    let gpu = gpu();
    let safe = AttnOptions {
        precision: Precision::causally_safe(true),
        ..AttnOptions::new(AttnPath::Mxfp8)
    };
    for hd in [128, 64] {
        let shape = VarlenShape::from_lens(&SPREAD_LENS, 4, 2, hd).unwrap();
        for (what, opts) in [("", AttnOptions::new(AttnPath::Mxfp8)), (", causally safe", safe)] {
            with_seeds(&format!("ev run, one V exponent{what}, d = {hd}"), |mut rng| {
                let mut call = gauss_call(&mut rng, &shape, opts);
                for (i, v) in call.v.iter_mut().enumerate() {
                    *v = if i % hd == 0 { 4.0 } else { v.clamp(-3.9, 3.9) };
                }
                same_bits_whatever(&gpu, &call, "FLAMIA_FWD_EV_RUN", &["0", "1"]);
            });
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn mxfp8_causal_gqa_is_as_accurate_as_the_reference() {
    let shape = VarlenShape::from_lens(&LENS, 4, 2, 128).unwrap();
    check_accuracy("mxfp8 causal gqa", &shape, AttnOptions::new(AttnPath::Mxfp8));
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn mxfp8_non_causal_mha_is_as_accurate_as_the_reference() {
    let shape = VarlenShape::from_lens(&LENS, 2, 2, 128).unwrap();
    check_accuracy(
        "mxfp8 non-causal",
        &shape,
        AttnOptions {
            causal: false,
            ..AttnOptions::new(AttnPath::Mxfp8)
        },
    );
}

/// Documents of many 128-key tiles: the v4 backward's ordered dQ reduction over key tiles (a query
/// tile gets partials from up to 9 key tiles), its GQA dK/dV sums and the walk from the document
/// end down to the diagonal, causal and not.
#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn long_documents_gqa_are_as_accurate_as_the_reference() {
    let shape = VarlenShape::from_lens(&[1100, 517, 64], 4, 2, 128).unwrap();
    check_accuracy("mxfp8 long causal gqa", &shape, AttnOptions::new(AttnPath::Mxfp8));
    let shape = VarlenShape::from_lens(&[700, 300], 4, 1, 128).unwrap();
    check_accuracy(
        "mxfp8 long non-causal gqa 4:1",
        &shape,
        AttnOptions {
            causal: false,
            ..AttnOptions::new(AttnPath::Mxfp8)
        },
    );
}

/// Per-token scales with dS exponents per 32x32 block: the case where the one dS fold rule
/// (`dS * 2^(eQ_i + eK_j)` before quantising, reference/bwd.rs) differs from the unfolded dS, run
/// by the v4 backward and held to the same GPU-vs-CPU bound.
#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn per_token_scales_with_block_ds_follow_the_reference_fold() {
    let shape = VarlenShape::from_lens(&LENS, 4, 2, 128).unwrap();
    let mut opts = AttnOptions::new(AttnPath::Mxfp8);
    opts.precision.per_token_scales = true;
    check_accuracy("mxfp8 per-token scales, block dS", &shape, opts);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn precision_options_and_no_hadamard_are_as_accurate_as_the_reference() {
    let shape = VarlenShape::from_lens(&LENS, 2, 1, 128).unwrap();
    let opts = AttnOptions {
        precision: Precision::causally_safe(true),
        ..AttnOptions::new(AttnPath::Mxfp8)
    };
    check_accuracy("mxfp8 causally safe", &shape, opts);
    let mut plain = AttnOptions::new(AttnPath::Mxfp8);
    plain.precision.hadamard = false;
    check_accuracy("mxfp8 no hadamard", &shape, plain);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn leaky_fp8_runs_and_is_as_accurate_as_the_reference() {
    let shape = VarlenShape::from_lens(&LENS, 2, 2, 128).unwrap();
    check_accuracy("leaky-fp8", &shape, AttnOptions::new(AttnPath::LeakyFp8));
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn nvfp4_is_as_accurate_as_the_reference() {
    let shape = VarlenShape::from_lens(&LENS, 4, 2, 128).unwrap();
    check_accuracy("nvfp4 causal gqa", &shape, AttnOptions::new(AttnPath::Nvfp4));
    let safe = AttnOptions {
        precision: Precision::causally_safe(true),
        ..AttnOptions::new(AttnPath::Nvfp4)
    };
    check_accuracy("nvfp4 causally safe", &shape, safe);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn repeated_runs_are_bitwise_identical() {
    let gpu = gpu();
    // the 8192-token document: 64 key tiles add into every query tile's FP32 dQ at once, so an
    // unordered reduce shows up here (the small shapes alone did not catch one, issue 14); both
    // walks (FLAMIA_BWD_UP_TILES: 0 every document walks down, where the 64 key tiles all start
    // on the last query tile and race for it; the default, where documents this short walk up)
    for up in walks() {
        let _walk = EnvGuard::set("FLAMIA_BWD_UP_TILES", &up);
        for lens in [&[300, 1, 65][..], &[1100, 517][..], &[8192][..]] {
            let shape = VarlenShape::from_lens(lens, 4, 1, 128).unwrap();
            repeat_bitwise(&gpu, &shape);
        }
    }
}

/// `FLAMIA_BWD_UP_TILES` values the ordering tests run under: every document walking down, then
/// the default threshold (sched.rs `BWD_UP_TILES`, documents up to 16,384 tokens walking up). The
/// two walks sum a query tile's dQ partials in opposite orders, so their bits differ from each
/// other; each must be repeatable and independent of arrival order on its own.
fn walks() -> [String; 2] {
    ["0".into(), flamia_kernels::gpu::sched::BWD_UP_TILES.to_string()]
}

fn repeat_bitwise(gpu: &std::sync::Arc<flamia_kernels::gpu::Gpu>, shape: &VarlenShape) {
    let gpu = gpu.clone();
    with_seeds("repeat", |mut rng| {
        let call = spread_key_tiles(gauss_call(&mut rng, shape, AttnOptions::new(AttnPath::Mxfp8)));
        for path in [AttnPath::Mxfp8, AttnPath::Nvfp4] {
            let one = call.with_path(path);
            let (a, b) = (gpu_attn(&gpu, &one), gpu_attn(&gpu, &one));
            assert_same_bits(&a, &b, &format!("{path}, between runs"));
        }
    });
}

/// Every output of `a` and `b` bit for bit equal (`what` names the comparison on failure).
fn assert_same_bits(a: &(Forward, Grads), b: &(Forward, Grads), what: &str) {
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    for (name, (x, y)) in NAMES.iter().zip(outputs(a).into_iter().zip(outputs(b))) {
        assert_eq!(bits(x), bits(y), "{name} differs: {what}");
    }
}

/// `call` with the environment variable `var` unset, then with each of `values`: every output
/// bitwise the same. (The variable is process-wide: a test running beside this one sees it too;
/// most callers' knobs only slow down or chunk, but FLAMIA_FWD_EV_RUN changes bits where V's
/// exponents vary, so the device runs these tests with --test-threads=1.)
fn same_bits_whatever(
    gpu: &std::sync::Arc<flamia_kernels::gpu::Gpu>,
    call: &AttnCall,
    var: &str,
    values: &[&str],
) {
    // (the variable's value for the whole run, e.g. a device script's, comes back afterwards)
    let before = std::env::var(var).ok();
    std::env::remove_var(var);
    let base = gpu_attn(gpu, call);
    for v in values {
        std::env::set_var(var, v);
        let other = gpu_attn(gpu, call);
        std::env::remove_var(var);
        assert_same_bits(&base, &other, &format!("unset vs {var}={v}"));
    }
    if let Some(b) = before {
        std::env::set_var(var, b);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn dq_is_bitwise_the_same_whatever_order_the_reduces_arrive_in() {
    // FLAMIA_BWD_JITTER=s delays every dQ reduce by a seed-dependent few microseconds, so the
    // 64 key tiles of the 8,192-token document reach each query tile's FP32 accumulator in
    // different orders unless the semaphores order them (two repeats alone did not catch an
    // unordered reduce, docs/numerics.md); it also builds the stress kernel (BWD_STRESS), whose
    // consumer warps sleep before storing each dQ partial, so a partial released to the
    // reducer before its stores is read early (bench/gpu_mutations.sh: bwd4-dq-after-release).
    // Both walks (walks()): session 12 saw the unordered-reduce mutation pass when the 8,192-token
    // document walked up (its key tiles run two steps apart, so they arrive in order anyway);
    // walking down, all 64 start on the last query tile and only the semaphores order them.
    // The item's end by bulk tensor stores (BWD_BULK_ST, whose next item waits for dV's boxes to
    // be read: mutation bwd4-bulk-no-start-wait) is the default at d = 128 only where tiles walk
    // up, so the downward walk also runs with it forced, keeping it under the stress build in
    // both walks.
    let gpu = gpu();
    let shape = VarlenShape::from_lens(&[8192, 300], 4, 1, 128).unwrap();
    for up in walks() {
        let _walk = EnvGuard::set("FLAMIA_BWD_UP_TILES", &up);
        let bulks: &[Option<&str>] = if up == "0" { &[None, Some("1")] } else { &[None] };
        for &bulk in bulks {
            let _bulk = bulk.map(|v| EnvGuard::set("FLAMIA_BWD_BULK_ST", v));
            with_seeds(
                &format!(
                    "jitter, FLAMIA_BWD_UP_TILES={up}, FLAMIA_BWD_BULK_ST={}",
                    bulk.unwrap_or("default")
                ),
                |mut rng| {
                    // (keys spread over the tiles' magnitudes: the partials' sum rounds, spread_key_tiles)
                    let call =
                        spread_key_tiles(gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8)));
                    same_bits_whatever(&gpu, &call, "FLAMIA_BWD_JITTER", &["1", "2"]);
                },
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn forward_consumer_copies_give_bitwise_the_same() {
    // FLAMIA_FWD_CW=1 builds the v4 forward with its consumer body inlined once per warpgroup
    // (FWD_CW_CONST, the default where the items are long: fwd_cw_const), =0 with one body for
    // both; every output bitwise the same, at both head dims, causal and not, block and per-token
    // scales (LeakyFp8).
    knob_keeps_every_bit("FLAMIA_FWD_CW", &["0", "1"], &FORWARD_KNOB_CASES);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn forward_o_by_tma_gives_bitwise_the_same() {
    // FLAMIA_FWD_O_TMA=1 (forced on wherever it fits; by default d = 128 short items only):
    // a consumer warpgroup whose 64 rows all lie in the document writes O through shared
    // memory (stmatrix) and bulk tensor stores; =0 the 16-byte stores from registers: every
    // output bitwise the same, and the rows of partial tiles (65 tokens: one warpgroup full,
    // the other one row; 300: a 44-row tail) stay theirs.
    knob_keeps_every_bit("FLAMIA_FWD_O_TMA", &["0", "1"], &FORWARD_KNOB_CASES);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn forward_half_tiles_give_bitwise_the_same() {
    // FLAMIA_FWD_HALF=all (every build; =1 only the short items' one) runs a masked key tile
    // that no row of a consumer warpgroup sees past its key 63 over those 64 keys only (the
    // first warpgroup's diagonal tiles, documents ending in a tile's first half: 300 and 1
    // tokens, not 65); the skipped keys' P are exact zeros, so every output bitwise the same,
    // causal and not, block and per-token scales, both head dims.
    knob_keeps_every_bit("FLAMIA_FWD_HALF", &["0", "all"], &FORWARD_KNOB_CASES);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn forward_vperm_gives_bitwise_the_same() {
    // FLAMIA_FWD_VPERM=1 packs P' into PV's A fragments by four-code conversions without the
    // quad shuffles, the quantiser writing V's dim-major copy in the matching key order in each
    // 32-key block (Attention::v_dim_order) and the v4 backward's in-place V transpose
    // (BWD_VT_XPOSE) putting the keys back (BWD_VT_VPERM); =0 the exact column order and the
    // plain copy. The same pairs in every k32 slice: every output of the training call (O, LSE,
    // dQ, dK, dV) bitwise the same both ways and as with the variable unset (the default), with
    // the backward's V from the quantiser's token-major copy and from its transpose, the forward
    // with its consumer copies and without, the cases of the other forward knobs and the
    // causally safe options (per-token scales: the other producer and softmax).
    const VALUES: [&str; 2] = ["0", "1"];
    for vt in ["0", "1"] {
        let _vt = EnvGuard::set("FLAMIA_BWD_VT_XPOSE", vt);
        knob_keeps_every_bit("FLAMIA_FWD_VPERM", &VALUES, &FORWARD_KNOB_CASES);
        causally_safe_knob_keeps_every_bit("FLAMIA_FWD_VPERM", &VALUES, &format!("V transposed {vt}"));
    }
    let _cw = EnvGuard::set("FLAMIA_FWD_CW", "1");
    knob_keeps_every_bit("FLAMIA_FWD_VPERM", &VALUES, &FORWARD_KNOB_CASES[..1]);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn forward_slice_descriptors_by_add_give_bitwise_the_same() {
    // FLAMIA_FWD_DESC_ADD=1 builds each K slice's wgmma descriptor as the tile's plus 2 kk in
    // its start-address field (FWD_DESC_ADD) instead of from the slice's address: the same
    // descriptors, so every output bitwise the same; the forward knobs' cases, with P packed
    // both ways (FLAMIA_FWD_VPERM) and with the consumer copies (both tiles' loops).
    for vperm in ["0", "1"] {
        let _p = EnvGuard::set("FLAMIA_FWD_VPERM", vperm);
        knob_keeps_every_bit("FLAMIA_FWD_DESC_ADD", &["0", "1"], &FORWARD_KNOB_CASES);
    }
    let _cw = EnvGuard::set("FLAMIA_FWD_CW", "1");
    knob_keeps_every_bit("FLAMIA_FWD_DESC_ADD", &["0", "1"], &FORWARD_KNOB_CASES[..1]);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn forward_tile_trims_give_bitwise_the_same() {
    // FLAMIA_FWD_TILE_TRIM=1 (FWD_TILE_TRIM): the interior key tile's running maximum without
    // its -inf test (max(m, -FLT_MAX) instead), and each 32-key group's 2^eK and eV written by
    // the token-block producer into four compact entries that the consumers read by one 16-byte
    // load each: the same values, so every output bitwise the same. The forward knobs' cases
    // (block and tensor-wide scales, both head dims) with the head dim's default cuts (d = 128:
    // all, d = 64: none) and with VPERM and DESC_ADD forced on; a row
    // whose scaled scores all overflow to -inf on its first (interior) key tile (the maximum's
    // only case: a first version gave NaN there); the causally safe options (per-token scales:
    // only the maximum's change); the consumer copies.
    const VALUES: [&str; 2] = ["0", "1"];
    knob_keeps_every_bit("FLAMIA_FWD_TILE_TRIM", &VALUES, &FORWARD_KNOB_CASES);
    let _p = EnvGuard::set("FLAMIA_FWD_VPERM", "1");
    let _d = EnvGuard::set("FLAMIA_FWD_DESC_ADD", "1");
    knob_keeps_every_bit("FLAMIA_FWD_TILE_TRIM", &VALUES, &FORWARD_KNOB_CASES);
    let gpu = gpu();
    for hd in [128, 64] {
        let shape = VarlenShape::from_lens(&[4096, 300, 1, 65], 4, 2, hd).unwrap();
        with_seeds(
            &format!("FLAMIA_FWD_TILE_TRIM, overflowing row, d = {hd}"),
            |mut rng| {
                let call = overflowing_row(gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8)));
                same_bits_whatever(&gpu, &call, "FLAMIA_FWD_TILE_TRIM", &VALUES);
            },
        );
    }
    causally_safe_knob_keeps_every_bit("FLAMIA_FWD_TILE_TRIM", &VALUES, "");
    let _cw = EnvGuard::set("FLAMIA_FWD_CW", "1");
    knob_keeps_every_bit("FLAMIA_FWD_TILE_TRIM", &VALUES, &FORWARD_KNOB_CASES[..1]);
}

/// [`same_bits_whatever`] for `var` on the causally safe options (per-token scales: the
/// forward's other producer and softmax), a 4,096-token document beside short and one-token
/// ones, both head dims (`tag` names the caller's case on failure).
fn causally_safe_knob_keeps_every_bit(var: &str, values: &[&str], tag: &str) {
    let gpu = gpu();
    for hd in [128, 64] {
        let shape = VarlenShape::from_lens(&[4096, 300, 1, 65], 4, 2, hd).unwrap();
        with_seeds(&format!("{var}, causally safe, d = {hd} {tag}"), |mut rng| {
            let opts = AttnOptions {
                precision: Precision::causally_safe(true),
                ..AttnOptions::new(AttnPath::Mxfp8)
            };
            let call = gauss_call(&mut rng, &shape, opts);
            same_bits_whatever(&gpu, &call, var, values);
        });
    }
}

/// `call` with query head 0's token 200 set to 5e19 u (u its own Gaussian row) and KV head 0's
/// first 128 keys to -5e19 u: the row's block exponents reach ~59 each, so its scaled scores on
/// key tile 0 (an interior tile for query tile 1, the first of its item) all overflow to -inf in
/// FP32, and only the diagonal tile gives it finite ones.
fn overflowing_row(mut call: AttnCall) -> AttnCall {
    let (hq, hkv, d) = (call.shape.heads_q, call.shape.heads_kv, call.shape.head_dim);
    let q0 = 200 * hq * d;
    let u: Vec<f32> = call.q[q0..q0 + d].to_vec();
    call.q[q0..q0 + d]
        .iter_mut()
        .zip(&u)
        .for_each(|(x, &a)| *x = 5e19 * a);
    for t in 0..128 {
        let k0 = t * hkv * d;
        call.k[k0..k0 + d]
            .iter_mut()
            .zip(&u)
            .for_each(|(x, &a)| *x = -5e19 * a);
    }
    call
}

/// The cases of the forward's build knobs: a 4,096-token document (many interior key tiles)
/// beside short and one-token ones, both head dims, causal and not, block and tensor-wide scales.
const FORWARD_KNOB_CASES: [(usize, &[usize], bool, AttnPath); 4] = [
    (128, &[4096, 300, 1, 65], true, AttnPath::Mxfp8),
    (128, &[4096, 300, 1, 65], false, AttnPath::Mxfp8),
    (128, &[4096, 300, 1, 65], true, AttnPath::LeakyFp8),
    (64, &[4096, 300, 1, 65], true, AttnPath::Mxfp8),
];

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn backward_qperm_gives_bitwise_the_same() {
    // FLAMIA_BWD_QPERM=1 packs P~^T and dS~^T into the dV and dK products' A fragments without
    // shuffles and has the quantisers write Q's and dO's dim-major copies with the matching query
    // order: the same pairs in every k32 step, so bitwise the same outputs; block and row dS
    // exponents, both head dims, causal and not.
    let lens: &[usize] = &[300, 1, 65, 1100];
    backward_knob_keeps_every_bit(
        "FLAMIA_BWD_QPERM",
        &[
            (128, lens, true, false),
            (128, lens, false, false),
            (128, lens, true, true),
            (64, lens, true, false),
        ],
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn backward_four_code_conversions_give_bitwise_the_same() {
    // FLAMIA_BWD_CVT4=1 converts P~ and dS~ into their A fragments four codes per register
    // (cvt_e4m3x4) instead of code pairs re-packed by PRMT, and shifts the dS tile's bytes out of
    // those registers: the same codes in the same places, so bitwise the same gradients; block
    // and row dS exponents, both head dims, causal and not, documents ending mid-tile.
    backward_knob_keeps_every_bit("FLAMIA_BWD_CVT4", &CODE_KNOB_CASES);
}

/// The cases of the backward's code-path knobs (CVT4, REDUX, COLS_TMA, EARLY_FACTORS): documents ending mid-tile and a
/// one-token one, block and row dS exponents, both head dims, causal and not.
const CODE_KNOB_CASES: [(usize, &[usize], bool, bool); 6] = [
    (128, &[300, 1, 65, 1100], true, false),
    (128, &[300, 1, 65, 1100], false, false),
    (128, &[300, 1, 65, 1100], true, true),
    (64, &[300, 1, 65, 1100], true, false),
    (64, &[300, 1, 65, 1100], false, false),
    (64, &[300, 1, 65, 1100], false, true),
];

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn step_constants_by_bulk_copy_give_bitwise_the_same() {
    // FLAMIA_BWD_COLS_TMA=1 (the default) has bwd_cols write every step's per-query constants
    // into a table the producer bulk-copies per stage, instead of computing them in the producer:
    // the same expressions on the same inputs, padding rows included, so bitwise the same
    // gradients (at d = 64 with block scales the producer folds them and the knob changes nothing).
    backward_knob_keeps_every_bit("FLAMIA_BWD_COLS_TMA", &CODE_KNOB_CASES);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn key_factors_by_bulk_copy_give_bitwise_the_same() {
    // FLAMIA_BWD_KEYS_TMA=1 (the default with the step constants' table) has bwd_cols also write
    // each item's per-key factors (2^eK, 2^eV, 2^-c, scale 2^-eK, 2^c; 0 past the document) into
    // a record the producer bulk-copies with K and V, instead of loading the exponents and
    // computing them per item: the same expressions (key_factors) on the same inputs, so bitwise
    // the same gradients. The code-path cases (GQA: 4 query heads on 2 KV heads, documents
    // ending mid-tile, a one-token one, both head dims, causal and not, row dS) in both walks,
    // then the same on three CTAs (each CTA's tails and item slots turn over many times; on a
    // full grid these shapes give each CTA one item), then the operand-tile cases (per-token
    // scales at d = 128). At d = 64 with block scales the producer folds the factors and the
    // knob changes nothing.
    for up in walks() {
        let _walk = EnvGuard::set("FLAMIA_BWD_UP_TILES", &up);
        backward_knob_keeps_every_bit("FLAMIA_BWD_KEYS_TMA", &CODE_KNOB_CASES);
    }
    item_turnover_knob_keeps_every_bit("FLAMIA_BWD_KEYS_TMA");
    operand_tile_knob_keeps_every_bit("FLAMIA_BWD_KEYS_TMA", &["0", "1"]);
    // Spread block scales (K's and V's exponents differ between blocks and KV heads, so a record
    // with another KV head's or block's factors changes bits: with Gaussian inputs nearly every
    // block has the same exponents), on three CTAs; d = 64 with per-token scales (with block
    // scales the producer folds the factors there).
    let gpu = gpu();
    let _ctas = EnvGuard::set("FLAMIA_BWD_CTAS", "3");
    let lens = [1100usize, 517, 300, 65, 1];
    for hd in [128, 64] {
        let shape = VarlenShape::from_lens(&lens, 4, 2, hd).unwrap();
        with_seeds(
            &format!("FLAMIA_BWD_KEYS_TMA, spread scales, d = {hd}"),
            |mut rng| {
                let mut opts = AttnOptions::new(AttnPath::Mxfp8);
                opts.precision.per_token_scales = hd == 64;
                let call = gauss_call(&mut rng, &shape, opts);
                let call = spread_blocks_and_zero_values(&mut rng, call, &lens);
                same_bits_whatever(&gpu, &call, "FLAMIA_BWD_KEYS_TMA", &["0", "1"]);
            },
        );
    }
}

/// [`backward_knob_keeps_every_bit`] of `var` on the code-path cases in both walks, on three CTAs:
/// on a full grid these shapes give each CTA one item, so what an item leaves for the next (its
/// shared-memory slots, tiles and barriers) would never be tested.
fn item_turnover_knob_keeps_every_bit(var: &str) {
    let _ctas = EnvGuard::set("FLAMIA_BWD_CTAS", "3");
    for up in walks() {
        let _walk = EnvGuard::set("FLAMIA_BWD_UP_TILES", &up);
        backward_knob_keeps_every_bit(var, &CODE_KNOB_CASES);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn dk_dv_by_bulk_copies_give_bitwise_the_same() {
    // FLAMIA_BWD_BULK_ST=1 (the default at head dim 128 where tiles walk up) has a consumer warpgroup whose 64 keys
    // all lie in the document stage its BF16 dK, then dV, in the dS tiles and send them by bulk
    // tensor stores of 64-key boxes, instead of storing from the fragments (which a warpgroup with
    // keys past the document still does): the same bytes in the same places, so bitwise the same
    // gradients. The code-path cases (GQA 4 on 2: the group's last head stores, into its KV
    // head's box; documents ending mid-tile, so both paths run, a one-token one, both head dims,
    // causal and not, row dS) on three CTAs (the tiles serve the next item's dS codes right
    // after) in both walks, then the operand-tile cases.
    item_turnover_knob_keeps_every_bit("FLAMIA_BWD_BULK_ST");
    operand_tile_knob_keeps_every_bit("FLAMIA_BWD_BULK_ST", &["0", "1"]);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn dim_major_k_transposed_in_shared_memory_gives_bitwise_the_same() {
    // FLAMIA_BWD_KD_XPOSE=2 (unset: the default for short and mid-length documents, all of
    // these) has the v4 backward's consumer warpgroups transpose each item's token-major K tile
    // at the item's start into the dQ products' dim-major operand in shared memory, each its own
    // half of the dims (keys past the document zero), so the quantiser writes no dim-major K and
    // the saved operands have none (their k.dim is 0: a kernel reading it would fault); =0, the kernel
    // TMA-loads the quantiser's dim-major copy. The same codes in the same places: bitwise the
    // same gradients. The code-path cases (documents ending mid-tile, a one-token one, both head
    // dims, causal and not, row dS), tensor-wide and per-token scales, then on three CTAs, so
    // each CTA runs many items and the K/V slot, the dim-major tile and their barriers turn over
    // many times.
    backward_knob_values_keep_every_bit("FLAMIA_BWD_KD_XPOSE", &["0", "2"], &CODE_KNOB_CASES);
    operand_tile_knob_keeps_every_bit("FLAMIA_BWD_KD_XPOSE", &["0", "2"]);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn ds_tile_by_stmatrix_gives_bitwise_the_same() {
    // FLAMIA_BWD_DS_STSM=1 (unset: the default) has the v4 backward write its dS
    // tile for dQ by one PRMT per 8-query block and one stmatrix.trans per 32-query slice, each
    // 16-key group in the key order 0, 8, 1, 9, ..., and K's dim-major operand in the same
    // order: the consumers' transpose (FLAMIA_BWD_KD_XPOSE=2) or the quantiser's copy (=0,
    // DimOrder::KeyIleave). The same keys inside each k32 slice of the dQ products: bitwise the
    // same gradients; =0, the byte stores and the plain order. With K's operand both ways: the
    // code-path cases (row dS's dQ copy included), then on three CTAs so that the dS
    // buffers and K's tile turn over many times.
    with_k_operand_both_ways(|| {
        backward_knob_values_keep_every_bit("FLAMIA_BWD_DS_STSM", &["0", "1"], &CODE_KNOB_CASES);
        operand_tile_knob_keeps_every_bit("FLAMIA_BWD_DS_STSM", &["0", "1"]);
    });
}

/// Runs `f` with K's dim-major operand from the quantiser (`FLAMIA_BWD_KD_XPOSE=0`), then from the
/// consumers' transpose (`=2`).
fn with_k_operand_both_ways(f: impl Fn()) {
    for kd in ["0", "2"] {
        let _kd = EnvGuard::set("FLAMIA_BWD_KD_XPOSE", kd);
        f();
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn dq_partials_by_stmatrix_give_bitwise_the_same() {
    // BWD_DQ_STSM (the default; FLAMIA_BWD_DQ_STSM=0 turns it off) has the v4 backward's
    // consumers store each step's FP32 dQ partial by stmatrix, each 8-dim block's dims in the
    // order 0, 2, 4, 6, 1, 3, 5, 7 in the partial and in the accumulator, and bwd_dq_convert
    // (built with the same value: session 26's host built it without, caught here) undo it
    // with the Hadamard's butterflies in the same order: the same sums in the same order, so
    // bitwise the same dQ (and dK, dV untouched). The code-path cases (row dS, both head dims, causal and not), with and without the Hadamard,
    // then on three CTAs and with the first partials added to a zeroed accumulator instead of
    // stored (FLAMIA_BWD_DQ_STORE=0), so the partial buffers and both reduce paths turn over.
    backward_knob_values_keep_every_bit("FLAMIA_BWD_DQ_STSM", &["0"], &CODE_KNOB_CASES);
    let gpu = gpu();
    let shape = VarlenShape::from_lens(&[1100, 2048, 517, 64, 1], 4, 2, 128).unwrap();
    with_seeds("FLAMIA_BWD_DQ_STSM without the Hadamard", |mut rng| {
        let mut opts = AttnOptions::new(AttnPath::Mxfp8);
        opts.precision.hadamard = false;
        let call = gauss_call(&mut rng, &shape, opts);
        same_bits_whatever(&gpu, &call, "FLAMIA_BWD_DQ_STSM", &["0"]);
    });
    operand_tile_knob_keeps_every_bit("FLAMIA_BWD_DQ_STSM", &["0"]);
    let _zeroed = EnvGuard::set("FLAMIA_BWD_DQ_STORE", "0");
    for hd in [128, 64] {
        let shape = VarlenShape::from_lens(&[1100, 2048, 517, 64, 1], 4, 2, hd).unwrap();
        with_seeds(
            &format!("FLAMIA_BWD_DQ_STSM, zeroed accumulator, d = {hd}"),
            |mut rng| {
                let call = gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8));
                same_bits_whatever(&gpu, &call, "FLAMIA_BWD_DQ_STSM", &["0"]);
            },
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn head_groups_of_the_work_lists_give_bitwise_the_same() {
    // The work lists' head groups (FLAMIA_FWD_HEAD_GROUP / FLAMIA_BWD_HEAD_GROUP; unset: two
    // heads, or larger where a long document would wait, src/gpu/sched.rs) only reorder the
    // items: the forward's are independent, and the backward adds each query tile's dQ partials
    // in its semaphore's key order and a GQA group's dK/dV partials in head order, whatever order
    // the items run in. So bitwise the same output and gradients with one head per group, two,
    // and every head at once: both walks, GQA and not, both head dims, and on three CTAs.
    let gpu = gpu();
    let lens: &[usize] = &[1100, 2048, 517, 64, 1];
    for (up, ctas) in [("0", None), ("9", None), ("0", Some("3"))] {
        let _up = EnvGuard::set("FLAMIA_BWD_UP_TILES", up);
        let _ctas = ctas.map(|c| EnvGuard::set("FLAMIA_BWD_CTAS", c));
        for (hq, hkv, hd) in [(4, 2, 128), (4, 4, 64), (8, 2, 128)] {
            let shape = VarlenShape::from_lens(lens, hq, hkv, hd).unwrap();
            with_seeds(
                &format!("head groups, up to {up} tiles up, {hq}/{hkv} heads, d = {hd}, CTAs {ctas:?}"),
                |mut rng| {
                    let call = gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8));
                    for var in ["FLAMIA_FWD_HEAD_GROUP", "FLAMIA_BWD_HEAD_GROUP"] {
                        same_bits_whatever(&gpu, &call, var, &["1", "2", "64"]);
                    }
                },
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn v_token_major_made_by_the_consumers_gives_bitwise_the_same() {
    // FLAMIA_BWD_VT_XPOSE=1 (unset: the default for short and mid-length documents, all of
    // these) has the v4 backward TMA-load V's dim-major copy (the forward's operand) into its
    // K/V slot and its consumer warpgroups transpose it in place into the token-major tile of
    // their dP products at each item's start, so the quantiser writes no token-major V and the
    // saved operands have none (v.tok 0: a kernel reading it would fault); =0, the kernel
    // TMA-loads the quantiser's token-major copy. The same codes for every key inside the
    // document: bitwise the same gradients (keys past it hold other bytes in the two tiles, and
    // only ever meet masked scores). With K's transpose both ways (FLAMIA_BWD_KD_XPOSE 0 / 2):
    // the code-path cases (documents ending mid-tile, a one-token one, both head dims, causal
    // and not, row dS), tensor-wide and per-token scales, then on three CTAs so that each CTA's
    // K/V slot turns over many times.
    with_k_operand_both_ways(|| {
        backward_knob_values_keep_every_bit("FLAMIA_BWD_VT_XPOSE", &["0", "1"], &CODE_KNOB_CASES);
    });
    operand_tile_knob_keeps_every_bit("FLAMIA_BWD_VT_XPOSE", &["0", "1"]);
}

/// The rest of a backward operand-tile knob's bitwise test (the K and V transposes): tensor-wide
/// scales on documents ending mid-tile with a one-token one, both head dims, then on three CTAs
/// (`FLAMIA_BWD_CTAS`, per-token scales at d = 128), so that each CTA runs many items and its K/V
/// slot and shared tiles turn over many times.
fn operand_tile_knob_keeps_every_bit(var: &str, values: &[&str]) {
    let lens: &[usize] = &[300, 1, 65, 1100];
    knob_keeps_every_bit(
        var,
        values,
        &[
            (128, lens, true, AttnPath::LeakyFp8),
            (64, lens, true, AttnPath::LeakyFp8),
        ],
    );
    let gpu = gpu();
    let _ctas = EnvGuard::set("FLAMIA_BWD_CTAS", "3");
    for hd in [128, 64] {
        let shape = VarlenShape::from_lens(&[1100, 2048, 517, 64, 1], 4, 2, hd).unwrap();
        with_seeds(&format!("{var} on three CTAs, d = {hd}"), |mut rng| {
            let mut opts = AttnOptions::new(AttnPath::Mxfp8);
            opts.precision.per_token_scales = hd == 128;
            let call = gauss_call(&mut rng, &shape, opts);
            same_bits_whatever(&gpu, &call, var, values);
        });
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn q_dim_major_copy_written_by_the_forward_gives_bitwise_the_same() {
    // FLAMIA_FWD_QD unset (the default: at d = 64 for short and mid-length documents, these
    // shapes' d = 64 cases) against =0 (never) and =1 (every plan): the v4 forward writes Q's
    // dim-major copy (the backward's dK operand) from the Q tiles it loads, instead of the
    // quantiser: the same bytes (gpu_quant's
    // quantize_inputs_fills_a_caller_owned_buffer_part_by_part checks them against the CPU
    // reference), so bitwise the same outputs. The forward's knob cases (both head dims, causal
    // and not, tensor-wide scales), per-token scales, the plain order (FLAMIA_BWD_QPERM=0), and
    // more items than SMs (each CTA's Q slots and staging tiles turn over).
    knob_keeps_every_bit("FLAMIA_FWD_QD", &["0", "1"], &FORWARD_KNOB_CASES);
    let gpu = gpu();
    for hd in [128, 64] {
        let shape = VarlenShape::from_lens(&[8192, 4000, 300, 65, 1], 4, 2, hd).unwrap();
        for plain in [false, true] {
            let _order = plain.then(|| EnvGuard::set("FLAMIA_BWD_QPERM", "0"));
            with_seeds(
                &format!("FLAMIA_FWD_QD, d = {hd}, plain order {plain}"),
                |mut rng| {
                    let mut opts = AttnOptions::new(AttnPath::Mxfp8);
                    opts.precision.per_token_scales = plain;
                    let call = gauss_call(&mut rng, &shape, opts);
                    same_bits_whatever(&gpu, &call, "FLAMIA_FWD_QD", &["0", "1"]);
                },
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn one_plan_and_workspace_serve_call_after_call() {
    // No memset runs between the chained launches: the v4 kernels' work counter resets itself
    // at the end of each launch (sched_done) and bwd_dv_fold zeroes the backward's semaphores.
    // Fresh plans and workspaces start zeroed, so only reuse shows a missing reset: one Plan and
    // one gradient workspace for three calls, as the trainer and the benchmark use them, each
    // call's outputs poisoned first and bitwise those of a fresh plan. More items than SMs
    // (8,192 tokens x 4 heads: 256 forward items, 256 backward items), so a counter left at its
    // last value hands out no items past each CTA's first; the forward is checked before the
    // backward runs (a backward on stale semaphores could wait forever). Both head dims, causal
    // walking down and up, and not causal; then with FLAMIA_PDL=1 (chained launches, off by
    // default since session 32) and FLAMIA_LAUNCH_MEMSETS=1 (the host's memsets) bitwise the same.
    use flamia_kernels::gpu::{Attention, Plan};
    let gpu = gpu();
    let s = stream();
    for (hd, causal, up) in [
        (128, true, "0"),
        (128, true, "64"),
        (64, true, "64"),
        (128, false, "0"),
    ] {
        let _walk = EnvGuard::set("FLAMIA_BWD_UP_TILES", up);
        let shape = VarlenShape::from_lens(&[8192, 300, 1, 65], 4, 2, hd).unwrap();
        let (t, hq, hkv) = (shape.tokens(), shape.heads_q, shape.heads_kv);
        let mut opts = AttnOptions::new(AttnPath::Mxfp8);
        opts.causal = causal;
        let mut rng = rng("one plan");
        let call = spread_key_tiles(gauss_call(&mut rng, &shape, opts));
        let tag = format!("d = {hd}, causal {causal}, up {up}");
        let fresh = gpu_attn(&gpu, &call);
        let attn = Attention::new(gpu.clone(), opts).unwrap();
        let plan = Plan::new(&gpu, &shape, causal).unwrap();
        let ws = attn.alloc_grad(&plan).unwrap();
        let [q, k, v, d_o] = upload_call(&gpu, &call);
        let bf = |b: &flamia_kernels::gpu::DeviceBuf<u16>| from_bits(&b.to_host().unwrap());
        let knobs = [
            None,
            None,
            None,
            Some(("FLAMIA_PDL", "1")),
            Some(("FLAMIA_LAUNCH_MEMSETS", "1")),
        ];
        for (run, knob) in knobs.into_iter().enumerate() {
            let _knob = knob.map(|(var, val)| EnvGuard::set(var, val));
            let what = format!("{tag}, call {} on one plan ({knob:?})", run + 1);
            let (o, lse) = (poisoned_bf16(&gpu, t * hq * hd), poisoned_f32(&gpu, t * hq));
            let saved = attn
                .forward(s, &plan, q.ptr(), k.ptr(), v.ptr(), o.ptr(), lse.ptr())
                .unwrap();
            let fwd = Forward {
                o: bf(&o),
                lse: lse.to_host().unwrap(),
            };
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
            assert_eq!(bits(&fwd.o), bits(&fresh.0.o), "O differs: {what}");
            assert_eq!(bits(&fwd.lse), bits(&fresh.0.lse), "LSE differs: {what}");
            let (dq, dk, dv) = (
                poisoned_bf16(&gpu, t * hq * hd),
                poisoned_bf16(&gpu, t * hkv * hd),
                poisoned_bf16(&gpu, t * hkv * hd),
            );
            attn.quantize_grad(s, &plan, d_o.ptr(), o.ptr(), &ws).unwrap();
            attn.backward_quantized(s, &plan, &saved, &ws, lse.ptr(), dq.ptr(), dk.ptr(), dv.ptr())
                .unwrap();
            let grads = Grads {
                dq: bf(&dq),
                dk: bf(&dk),
                dv: bf(&dv),
                ds_zero_fraction: f64::NAN,
            };
            assert_same_bits(&(fwd, grads), &fresh, &what);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn dq_conversion_alone_rewrites_bitwise_the_backwards_dq() {
    // BwdKernel::DqConvert (the benchmark's timing of `bwd_dq_convert` alone, session 50) on the
    // accumulator a Fused backward left: with one head chunk it holds the whole call's sums, so
    // the dQ it writes into poisoned memory is bitwise the backward's. Both head dims, causal
    // walking down and up, documents ending mid-tile; a workspace of the v3.1 backward is refused.
    // The conversion alone runs with 1, 2, 4 and 8 rows per thread (FLAMIA_DQ_CONVERT_ROWS,
    // session 51) and on 3 and 5 CTAs whose warps stride over the rows (FLAMIA_DQ_CONVERT_CTAS):
    // the same bits whatever the backward's own conversion used, also over token rows
    // (FLAMIA_BWD_DQ_STORE=0), whose 9,656 rows end inside a warp's 16 at d = 64 and 8 rows.
    use flamia_kernels::gpu::{Attention, BwdKernel, BwdOutputs, Plan};
    let gpu = gpu();
    let s = stream();
    for (hd, up, zeroed) in [
        (128, "0", false),
        (128, "64", false),
        (64, "64", false),
        (64, "64", true),
    ] {
        let _walk = EnvGuard::set("FLAMIA_BWD_UP_TILES", up);
        let _zeroed = zeroed.then(|| EnvGuard::set("FLAMIA_BWD_DQ_STORE", "0"));
        let shape = VarlenShape::from_lens(&[2048, 300, 1, 65], 4, 2, hd).unwrap();
        let (t, hq, hkv) = (shape.tokens(), shape.heads_q, shape.heads_kv);
        let opts = AttnOptions::new(AttnPath::Mxfp8);
        let mut rng = rng("dq conversion alone");
        let call = gauss_call(&mut rng, &shape, opts);
        let attn = Attention::new(gpu.clone(), opts).unwrap();
        let plan = Plan::new(&gpu, &shape, true).unwrap();
        let ws = attn.alloc_grad(&plan).unwrap();
        let [q, k, v, d_o] = upload_call(&gpu, &call);
        let (o, lse) = (poisoned_bf16(&gpu, t * hq * hd), poisoned_f32(&gpu, t * hq));
        let saved = attn
            .forward(s, &plan, q.ptr(), k.ptr(), v.ptr(), o.ptr(), lse.ptr())
            .unwrap();
        let (dq, dk, dv) = (
            poisoned_bf16(&gpu, t * hq * hd),
            poisoned_bf16(&gpu, t * hkv * hd),
            poisoned_bf16(&gpu, t * hkv * hd),
        );
        let out = BwdOutputs {
            lse: lse.ptr(),
            dq: dq.ptr(),
            dk: dk.ptr(),
            dv: dv.ptr(),
        };
        attn.quantize_grad(s, &plan, d_o.ptr(), o.ptr(), &ws).unwrap();
        attn.backward_kernel(BwdKernel::Fused, s, &plan, &saved, &ws, out)
            .unwrap();
        let want = dq.to_host().unwrap();
        for (rows, ctas) in [
            ("1", None),
            ("2", None),
            ("4", None),
            ("8", None),
            ("2", Some("3")),
            ("8", Some("5")),
        ] {
            let _rows = EnvGuard::set("FLAMIA_DQ_CONVERT_ROWS", rows);
            let _ctas = ctas.map(|n| EnvGuard::set("FLAMIA_DQ_CONVERT_CTAS", n));
            let again = poisoned_bf16(&gpu, t * hq * hd);
            attn.backward_kernel(
                BwdKernel::DqConvert,
                s,
                &plan,
                &saved,
                &ws,
                BwdOutputs {
                    dq: again.ptr(),
                    ..out
                },
            )
            .unwrap();
            let got = again.to_host().unwrap();
            let bad = want.iter().zip(&got).filter(|(a, b)| a != b).count();
            assert_eq!(
                bad,
                0,
                "d = {hd}, up {up}, zeroed {zeroed}, {rows} rows a thread, CTAs {ctas:?}: {bad} of {} dQ values differ",
                want.len()
            );
        }
    }
    let v3 = Attention::new(gpu.clone(), AttnOptions::new(AttnPath::Nvfp4)).unwrap();
    let shape = VarlenShape::from_lens(&[256], 2, 2, 128).unwrap();
    let plan = Plan::new(&gpu, &shape, true).unwrap();
    let ws = v3.alloc_grad(&plan).unwrap();
    let saved = v3.alloc_saved(&plan).unwrap();
    let out = BwdOutputs {
        lse: 0,
        dq: 0,
        dk: 0,
        dv: 0,
    };
    let err = v3
        .backward_kernel(BwdKernel::DqConvert, s, &plan, &saved, &ws, out)
        .unwrap_err();
    assert!(err.to_string().contains("v4 backward"), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn launch_chain_knobs_keep_every_bit() {
    // The chained launches (programmatic dependent launch, FLAMIA_PDL=1), the host's memsets
    // instead of the kernels' own resets (FLAMIA_LAUNCH_MEMSETS=1) and the dV fold exponents by
    // one CTA per document instead of one warp (FLAMIA_BWD_FOLD_WARP=0; the default for these
    // documents of at most 1,100 tokens): the same gradients bit for bit.
    backward_knob_values_keep_every_bit("FLAMIA_PDL", &["1"], &CODE_KNOB_CASES);
    backward_knob_values_keep_every_bit("FLAMIA_LAUNCH_MEMSETS", &["1"], &CODE_KNOB_CASES);
    backward_knob_values_keep_every_bit("FLAMIA_BWD_FOLD_WARP", &["0"], &CODE_KNOB_CASES);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn key_factors_loaded_early_give_bitwise_the_same() {
    // FLAMIA_BWD_EARLY_FACTORS=1 (the default) has the producer load an item's per-key factors
    // into a third item tail and a staging copy before the previous item's K/V slot frees: the
    // same values, so bitwise the same gradients (row dS at d = 128 keeps the late loads both ways).
    backward_knob_keeps_every_bit("FLAMIA_BWD_EARLY_FACTORS", &CODE_KNOB_CASES);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn backward_redux_maxima_give_bitwise_the_same() {
    // FLAMIA_BWD_REDUX=1 (the default) reduces the dS block maxima by redux.sync on the bits of
    // non-negative floats and a tree over the thread's values: the same maximum, so the same
    // exponents and codes; block and row dS exponents (the knob leaves the row path alone), both
    // head dims, causal and not, documents ending mid-tile.
    backward_knob_keeps_every_bit("FLAMIA_BWD_REDUX", &CODE_KNOB_CASES);
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn first_dq_partials_stored_give_bitwise_the_zeroed_accumulator() {
    // The default (session 13): the FP32 dQ accumulator by padded position and each (query tile,
    // head)'s first partial stored, against FLAMIA_BWD_DQ_STORE=0's zeroed token-major
    // accumulator that every partial adds to. The 1-, 65-, 300- and
    // 1,100-token documents end inside a 64-query tile (in the token layout that tile's rows reach
    // into the next document); causal walking down and up, not causal, GQA, both head dims, head
    // chunks (FLAMIA_BWD_SCRATCH_MIB=0). The same values bit for bit; only a zero may carry the
    // other sign (a first partial of -0 stays -0 where +0 + -0 gave +0), which the comparison
    // allows and counts.
    let gpu = gpu();
    for (hd, causal, up, chunks) in [
        (128, true, "0", false),
        (128, true, "64", false),
        (128, false, "0", false),
        (128, true, "64", true),
        (64, true, "64", false),
        (64, false, "0", true),
    ] {
        let _walk = EnvGuard::set("FLAMIA_BWD_UP_TILES", up);
        let _chunks = chunks.then(|| EnvGuard::set("FLAMIA_BWD_SCRATCH_MIB", "0"));
        let shape = VarlenShape::from_lens(&[300, 1, 65, 1100, 2048], 4, 2, hd).unwrap();
        let tag = format!("dq store, d = {hd}, causal {causal}, up {up}, chunks {chunks}");
        with_seeds(&tag, |mut rng| {
            let mut opts = AttnOptions::new(AttnPath::Mxfp8);
            opts.causal = causal;
            let call = gauss_call(&mut rng, &shape, opts);
            let base = {
                let _zeroed = EnvGuard::set("FLAMIA_BWD_DQ_STORE", "0");
                gpu_attn(&gpu, &call)
            };
            std::env::remove_var("FLAMIA_BWD_DQ_STORE");
            let stored = gpu_attn(&gpu, &call);
            let mut signed_zeros = 0usize;
            for (name, (x, y)) in NAMES.iter().zip(outputs(&base).into_iter().zip(outputs(&stored))) {
                for (i, (a, b)) in x.iter().zip(y).enumerate() {
                    if a.to_bits() != b.to_bits() {
                        assert!(
                            *a == 0.0 && *b == 0.0,
                            "{tag}: {name}[{i}] {a:e} (zeroed accumulator) vs {b:e} (first partial stored)"
                        );
                        signed_zeros += 1;
                    }
                }
            }
            if signed_zeros > 0 {
                eprintln!("{tag}: {signed_zeros} zeros of the other sign");
            }
        });
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn head_chunked_backward_is_bitwise_the_one_launch_backward() {
    // FLAMIA_BWD_SCRATCH_MIB=0: no scratch fits, so the v4 backward runs one launch per KV head
    // (2 query heads each here) with one chunk's dQ accumulator and dK/dV partials; every head's
    // work and reduction order is unchanged, so the gradients must match bit for bit.
    let gpu = gpu();
    let shape = VarlenShape::from_lens(&[1100, 517, 2048], 8, 4, 128).unwrap();
    with_seeds("chunks", |mut rng| {
        let call = gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8));
        same_bits_whatever(&gpu, &call, "FLAMIA_BWD_SCRATCH_MIB", &["0"]);
    });
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn dq_converted_beside_the_fused_kernel_gives_bitwise_the_same() {
    // FLAMIA_BWD_FOLLOWERS=n (session 51, off by default): where every tile walks up, the fused
    // kernel's grid leaves n SMs to bwd_dq_follow, which converts each (query head, query tile)
    // once its semaphore says the last partial has landed, instead of bwd_dq_convert afterwards:
    // the same sums, the same row code, so bitwise the same dQ (and dK, dV). Documents of 1 and
    // 64 tokens and ending mid-tile, both head dims, GQA and not, head chunks (a follower counter
    // each), the fused grid on 4 CTAs beside the followers, no Hadamard; and a plan with tiles
    // walking down, where the knob does nothing.
    let gpu = gpu();
    let lens: &[usize] = &[1100, 2048, 517, 64, 1, 300];
    for (hq, hkv, hd, hadamard, up, knob) in [
        (4, 2, 128, true, "64", None),
        (4, 4, 64, true, "64", None),
        (4, 2, 128, false, "64", None),
        (8, 2, 128, true, "64", Some(("FLAMIA_BWD_SCRATCH_MIB", "0"))),
        (4, 2, 128, true, "64", Some(("FLAMIA_BWD_CTAS", "4"))),
        (4, 2, 64, true, "64", Some(("FLAMIA_BWD_CTAS", "4"))),
        (4, 2, 128, true, "5", None),
    ] {
        let _up = EnvGuard::set("FLAMIA_BWD_UP_TILES", up);
        let _knob = knob.map(|(k, v)| EnvGuard::set(k, v));
        let shape = VarlenShape::from_lens(lens, hq, hkv, hd).unwrap();
        let tag = format!(
            "followers, {hq}/{hkv} heads, d = {hd}, Hadamard {hadamard}, up to {up} tiles up, {knob:?}"
        );
        with_seeds(&tag, |mut rng| {
            let mut opts = AttnOptions::new(AttnPath::Mxfp8);
            opts.precision.hadamard = hadamard;
            let call = gauss_call(&mut rng, &shape, opts);
            same_bits_whatever(&gpu, &call, "FLAMIA_BWD_FOLLOWERS", &["8", "66"]);
        });
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn dead_steps_skipped_give_bitwise_the_full_backward() {
    // A step whose warpgroup keys see none of its queries (causal: the second warpgroup at a
    // tile's first query tile; any mask: a tile's second half past the document, e.g. the
    // 1-token and 65-token documents) adds nothing to dK and dV and has zero dS codes:
    // FLAMIA_BWD_SKIP_DEAD=1 skips its products, =0 runs it as a masked step. Bit for bit the
    // same, causal and not, row dS exponents, GQA, both head dims.
    backward_knob_keeps_every_bit(
        "FLAMIA_BWD_SKIP_DEAD",
        &[
            (128, &[300, 1, 65, 1100], true, false),
            (128, &[300, 1, 65, 1100], false, false),
            (128, &[517, 64, 129, 2048], true, true),
            (64, &[300, 1, 65, 1100], true, false),
            (64, &[517, 64, 129, 2048], false, true),
        ],
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn cta_pairs_give_bitwise_the_unpaired_backward() {
    // FLAMIA_BWD_PAIR=1: adjacent key tiles in clusters of two CTAs whose producers multicast the
    // Q / dO tiles both walk; each CTA computes and reduces its own tile as an unpaired CTA does,
    // so every bit must be the same. Both walks (walks(): every document walking down, then the
    // default, where these documents walk up: the upper tile passes the lower one's first two
    // stages on instead of its last two); documents of odd key-tile counts (their last tile
    // alone: the partner CTA passes every stage on) and of 1 token, causal and not, row dS
    // exponents, GQA, both head dims; then, paired, one cluster alone (FLAMIA_BWD_CTAS=2: the
    // pairs strictly in list order; the device scripts run this test under a timeout, as a hang
    // is the failure there), three clusters, reduces in jittered order and head chunks.
    for up in walks() {
        let _walk = EnvGuard::set("FLAMIA_BWD_UP_TILES", &up);
        // (0 and 1 both against the default, which pairs at d = 64 where every document walks down)
        backward_knob_values_keep_every_bit(
            "FLAMIA_BWD_PAIR",
            &["0", "1"],
            &[
                (128, &[300, 1, 65, 1100, 2048], true, false),
                (128, &[300, 1, 65, 1100], false, false),
                (128, &[517, 64, 129, 2048], true, true),
                (64, &[300, 1, 65, 1100, 2048], true, false),
                (64, &[517, 64, 129, 2048], false, true),
                // (causal row dS at d = 64: paired by default where every document walks down)
                (64, &[517, 64, 129, 2048], true, true),
            ],
        );
        let gpu = gpu();
        let _pair = EnvGuard::set("FLAMIA_BWD_PAIR", "1");
        for hd in [128, 64] {
            let shape = VarlenShape::from_lens(&[1100, 2048, 517, 64], 4, 2, hd).unwrap();
            with_seeds(
                &format!("pairs, d = {hd}, up to {up} tiles walking up"),
                |mut rng| {
                    let call = gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8));
                    same_bits_whatever(&gpu, &call, "FLAMIA_BWD_CTAS", &["2", "6"]);
                    same_bits_whatever(&gpu, &call, "FLAMIA_BWD_JITTER", &["1"]);
                    same_bits_whatever(&gpu, &call, "FLAMIA_BWD_SCRATCH_MIB", &["0"]);
                    // dead steps skipped, paired: the 1,100-token document's last tile (76 keys,
                    // causal) is alone in its pair, so the partner CTA has no step, dead or not
                    // (session 37's review: it took one, a stage more than its partner)
                    same_bits_whatever(&gpu, &call, "FLAMIA_BWD_SKIP_DEAD", &["1"]);
                },
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn cta_pair_sums_are_accurate_repeatable_isolated_and_ordered() {
    // FLAMIA_BWD_PAIR=2: the pair's dQ partials added up before one reduce-add per query tile
    // both tiles see, both walks (walks(): every document walking down, then the default, where
    // these walk up and a pair's sum takes its upper tile's turn). dQ's bits differ from the unpaired
    // backward's (two partials enter the FP32 accumulator as one sum), so it is held to the
    // reference's bounds (causal GQA, not causal, row dS exponents, both head dims), to bitwise
    // repeatability whatever the reduces' arrival order, the cluster count (one cluster: the
    // pairs strictly in list order) and the head chunks, to documents isolated bitwise and
    // default MXFP8's bitwise zero leakage before the perturbed block; O, LSE, dK and dV must
    // stay bitwise the unpaired backward's (only dQ's sums change).
    let gpu = gpu();
    for (up, hd) in walks().into_iter().flat_map(|up| [(up.clone(), 128), (up, 64)]) {
        let _walk = EnvGuard::set("FLAMIA_BWD_UP_TILES", &up);
        let shape = VarlenShape::from_lens(&[1100, 517, 64, 2048], 4, 2, hd).unwrap();
        let pair = EnvGuard::set("FLAMIA_BWD_PAIR", "0");
        let unpaired = with_seeds_collect(&shape, |call| gpu_attn(&gpu, call));
        drop(pair);
        let _pair = EnvGuard::set("FLAMIA_BWD_PAIR", "2");
        let paired = with_seeds_collect(&shape, |call| gpu_attn(&gpu, call));
        for (a, b) in unpaired.iter().zip(&paired) {
            for (i, name) in NAMES.iter().enumerate() {
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
                let same = bits(outputs(a)[i]) == bits(outputs(b)[i]);
                if *name == "dQ" {
                    eprintln!(
                        "pair sums, d = {hd}, up to {up} tiles up: dQ bitwise the unpaired one's: {same}"
                    );
                } else {
                    assert!(
                        same,
                        "pair sums, d = {hd}, up to {up} tiles up: {name} differs from the unpaired backward's"
                    );
                }
            }
        }
        check_accuracy(
            &format!("pair sums, d = {hd}, up to {up} tiles up"),
            &shape,
            AttnOptions::new(AttnPath::Mxfp8),
        );
        let mut rows = AttnOptions::new(AttnPath::Mxfp8);
        rows.precision.row_ds_exponents = true;
        check_accuracy(
            &format!("pair sums, row dS, d = {hd}, up to {up} tiles up"),
            &shape,
            rows,
        );
        let shape = VarlenShape::from_lens(&[700, 300], 4, 1, hd).unwrap();
        let opts = AttnOptions {
            causal: false,
            ..AttnOptions::new(AttnPath::Mxfp8)
        };
        check_accuracy(
            &format!("pair sums, not causal, d = {hd}, up to {up} tiles up"),
            &shape,
            opts,
        );
        let shape = VarlenShape::from_lens(&[1100, 2048, 517, 64], 4, 2, hd).unwrap();
        with_seeds(
            &format!("pair sums, repeat and order, d = {hd}, up to {up} tiles up"),
            |mut rng| {
                let call = gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8));
                let (a, b) = (gpu_attn(&gpu, &call), gpu_attn(&gpu, &call));
                assert_same_bits(&a, &b, "pair sums, between runs");
                same_bits_whatever(&gpu, &call, "FLAMIA_BWD_CTAS", &["2", "6"]);
                same_bits_whatever(&gpu, &call, "FLAMIA_BWD_JITTER", &["1", "2"]);
                same_bits_whatever(&gpu, &call, "FLAMIA_BWD_SCRATCH_MIB", &["0"]);
                same_bits_whatever(&gpu, &call, "FLAMIA_BWD_SKIP_DEAD", &["1"]);
            },
        );
    }
    let _walk = EnvGuard::set("FLAMIA_BWD_UP_TILES", "0");
    let _pair = EnvGuard::set("FLAMIA_BWD_PAIR", "2");
    let attn = attn_fn(&gpu);
    let shape = VarlenShape::from_lens(&[300, 129, 600], 2, 2, 128).unwrap();
    with_seeds("pair sums, isolation", |mut rng| {
        let call = gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8));
        assert_documents_isolated(&attn, &call, "pair sums");
    });
    let shape = VarlenShape::from_lens(&[300, 90], 4, 2, 128).unwrap();
    with_seeds("pair sums, leakage", |mut rng| {
        let call = gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8));
        for t in [default_probe(&shape), 190, 330] {
            let d = causal_leakage(&attn, &call, t, 1e3).unwrap();
            assert!(
                d.before_own_block.bitwise_zero(),
                "pair sums, t {t}: leaked before the perturbed block: {d:?}"
            );
            let safe = call.with_opts(safe_with(AttnPath::Mxfp8, |_| {}));
            let l = causal_leakage(&attn, &safe, t, 1e3).unwrap();
            assert!(
                l.bitwise_causal(),
                "pair sums, t {t}: the precision options must give bitwise zero leakage: {l:?}"
            );
        }
    });
}

/// Scaling any one document of `call` by 1e4 changes no element of the others, bit for bit
/// (`tag` names the case on failure).
fn assert_documents_isolated(attn: &flamia_kernels::leakage::AttnFn, call: &AttnCall, tag: &str) {
    for doc in 0..call.shape.docs() {
        let c = doc_isolation(attn, call, doc, 1e4).unwrap();
        assert!(
            c.bitwise_zero(),
            "{tag}: scaling document {doc} changed {} elements of the others: {c:?}",
            c.changed
        );
    }
}

/// The GPU's outputs of a Gaussian mxfp8 call of `shape` for every seed ([`with_seeds`]), by `run`.
fn with_seeds_collect(
    shape: &VarlenShape,
    run: impl Fn(&AttnCall) -> (Forward, Grads),
) -> Vec<(Forward, Grads)> {
    let mut out = Vec::new();
    with_seeds("collect", |mut rng| {
        let call = gauss_call(&mut rng, shape, AttnOptions::new(AttnPath::Mxfp8));
        out.push(run(&call));
    });
    out
}

/// [`same_bits_whatever`] for a backward knob `var` (0 / 1) on Gaussian mxfp8 calls of each case
/// (head dim, document lengths, causal, row dS exponents; 4 query heads over 2 KV heads), every seed.
fn backward_knob_keeps_every_bit(var: &str, cases: &[(usize, &[usize], bool, bool)]) {
    backward_knob_values_keep_every_bit(var, &["0", "1"], cases);
}

/// [`backward_knob_keeps_every_bit`] with the knob's `values` (each against the knob unset).
fn backward_knob_values_keep_every_bit(var: &str, values: &[&str], cases: &[(usize, &[usize], bool, bool)]) {
    let gpu = gpu();
    for &(hd, lens, causal, row_ds) in cases {
        let shape = VarlenShape::from_lens(lens, 4, 2, hd).unwrap();
        with_seeds(
            &format!("{var}, d = {hd}, causal {causal}, row dS {row_ds}"),
            |mut rng| {
                let mut opts = AttnOptions::new(AttnPath::Mxfp8);
                opts.causal = causal;
                opts.precision.row_ds_exponents = row_ds;
                let call = gauss_call(&mut rng, &shape, opts);
                same_bits_whatever(&gpu, &call, var, values);
            },
        );
    }
}

/// `FLAMIA_AB_CUDA_DIR=DIR`: every output of the kernels compiled from DIR's sources (through
/// `FLAMIA_CUDA_DIR`, e.g. an older commit's `flamia-kernels/cuda`) bit for bit those of the
/// embedded sources, for a kernel change that must not move a bit (session 37: the backward's dS
/// exponents in three instructions, row dS's dQ codes without their re-packing, the forward's fe
/// as an int and its per-token factors by 8-byte loads): forward and backward, both head dims,
/// causal and not, block and row dS exponents, the causally safe options, both walks. Unset:
/// says it skipped.
#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn kernel_sources_of_another_directory_give_bitwise_the_same() {
    // (the GPU first: without one this fails like every GPU test instead of passing as skipped)
    let gpu = gpu();
    let Ok(dir) = std::env::var("FLAMIA_AB_CUDA_DIR") else {
        eprintln!("SKIPPED: set FLAMIA_AB_CUDA_DIR to a kernel source directory to compare with the embedded sources");
        return;
    };
    assert!(
        std::path::Path::new(&dir).join("attn_bwd_v4.cu").is_file(),
        "FLAMIA_AB_CUDA_DIR={dir} holds no attn_bwd_v4.cu"
    );
    for up in walks() {
        let _walk = EnvGuard::set("FLAMIA_BWD_UP_TILES", &up);
        backward_knob_values_keep_every_bit("FLAMIA_CUDA_DIR", &[&dir], &CODE_KNOB_CASES);
        for hd in [128, 64] {
            let shape = VarlenShape::from_lens(&[300, 1, 65, 1100], 4, 2, hd).unwrap();
            with_seeds(&format!("{dir}, causally safe, d = {hd}, up {up}"), |mut rng| {
                let safe = gauss_call(&mut rng, &shape, safe_with(AttnPath::Mxfp8, |_| {}));
                same_bits_whatever(&gpu, &safe, "FLAMIA_CUDA_DIR", &[&dir]);
            });
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn walking_up_is_accurate_repeatable_and_ordered() {
    // FLAMIA_BWD_UP_TILES=9: causal documents of at most 9 key tiles (here 1100, 517 and 64
    // tokens) walk their query tiles up from the diagonal, each query tile taking their dQ
    // partials highest key tile first; the 2,048-token document walks down in the same launch.
    // Held to the reference's bounds, bitwise repeatable, bitwise the same whatever order the
    // reduces arrive in (FLAMIA_BWD_JITTER, as for the downward walk) and on one or three CTAs
    // (FLAMIA_BWD_CTAS: one CTA takes the items strictly in list order, so a query tile's turn
    // that waits for a key tile listed later hangs it; the device scripts run this test under a
    // timeout), GQA, both head dims, and with row dS exponents.
    let _up = EnvGuard::set("FLAMIA_BWD_UP_TILES", "9");
    let gpu = gpu();
    for hd in [128, 64] {
        let shape = VarlenShape::from_lens(&[1100, 2048, 517, 64], 4, 2, hd).unwrap();
        check_accuracy(
            &format!("walk up, d = {hd}"),
            &shape,
            AttnOptions::new(AttnPath::Mxfp8),
        );
        let mut rows = AttnOptions::new(AttnPath::Mxfp8);
        rows.precision.row_ds_exponents = true;
        check_accuracy(&format!("walk up, row dS, d = {hd}"), &shape, rows);
        with_seeds("walk up, repeat and jitter", |mut rng| {
            let call = gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8));
            let (a, b) = (gpu_attn(&gpu, &call), gpu_attn(&gpu, &call));
            assert_same_bits(&a, &b, "walking up, between runs");
            same_bits_whatever(&gpu, &call, "FLAMIA_BWD_JITTER", &["1", "2"]);
            same_bits_whatever(&gpu, &call, "FLAMIA_BWD_CTAS", &["1", "3"]);
        });
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn documents_at_the_walk_threshold_walking_up_agree_with_walking_down() {
    // A document of exactly BWD_UP_TILES key tiles (16,384 tokens since session 32) walks up by
    // default; walking down (FLAMIA_BWD_UP_TILES=0) must give the same forward bit for bit and
    // the same gradients up to the FP32 order of the dQ and dK/dV sums (the dS codes and their
    // exponents do not depend on the walk), and each walk must repeat its own bits. Too long for
    // the CPU reference; the shorter documents' walks are held to it by
    // walking_up_is_accurate_repeatable_and_ordered. GQA, both head dims.
    let tiles = flamia_kernels::gpu::sched::BWD_UP_TILES;
    let gpu = gpu();
    for hd in [128, 64] {
        let shape = VarlenShape::from_lens(&[128 * tiles, 300], 2, 1, hd).unwrap();
        with_seeds(&format!("walk threshold, d = {hd}"), |mut rng| {
            let call = spread_key_tiles(gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8)));
            let up = {
                let _walk = EnvGuard::set("FLAMIA_BWD_UP_TILES", &tiles.to_string());
                let (a, b) = (gpu_attn(&gpu, &call), gpu_attn(&gpu, &call));
                assert_same_bits(&a, &b, "walking up, between runs");
                a
            };
            let down = {
                let _walk = EnvGuard::set("FLAMIA_BWD_UP_TILES", "0");
                gpu_attn(&gpu, &call)
            };
            for (i, (name, (x, y))) in NAMES
                .iter()
                .zip(outputs(&up).into_iter().zip(outputs(&down)))
                .enumerate()
            {
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
                if i < 2 {
                    assert_eq!(
                        bits(x),
                        bits(y),
                        "d = {hd}: {name} depends on the backward's walk"
                    );
                    continue;
                }
                // spread_key_tiles puts a query tile's dQ partials up to 2^15 apart, so the FP32
                // order alone moves dQ by ~1e-5 (1.4e-5 at d = 128, session 32); a step with the
                // wrong query tile (mutation bwd4-up-stage) by ~1 (0.96)
                let r = rel_l2(x, y);
                assert!(r < 1e-3, "d = {hd}: {name} walking up vs down, relative L2 {r:e} (only the FP32 sum order differs)");
            }
        });
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn folded_key_factors_give_bitwise_the_per_row_backward() {
    // With token-block (and tensor-wide) scales the v4 backward folds 2^eK, 2^eV and 2^-c of a
    // thread's 32-key block into its column constants once per step; FLAMIA_BWD_KEY_BLOCKS=0
    // multiplies them per score instead. Powers of two: the two must agree bit for bit, keys
    // past a document's end included (masked in the folded form; their factors are 0 in the
    // other), causal and not, GQA, both head dims.
    knob_keeps_every_bit(
        "FLAMIA_BWD_KEY_BLOCKS",
        &["0"],
        &[
            (128, &[300, 1, 65, 1100][..], true, AttnPath::Mxfp8),
            (128, &[300, 1, 65, 1100][..], false, AttnPath::Mxfp8),
            (128, &[517, 2048][..], true, AttnPath::LeakyFp8),
            (64, &[300, 1, 65, 1100][..], true, AttnPath::Mxfp8),
            (64, &[517, 2048][..], false, AttnPath::Mxfp8),
        ],
    );
}

/// [`same_bits_whatever`] for `var` and `values` on Gaussian calls of each case (head dim,
/// document lengths, causal, path; 4 query heads over 2 KV heads), every seed.
fn knob_keeps_every_bit(var: &str, values: &[&str], cases: &[(usize, &[usize], bool, AttnPath)]) {
    let gpu = gpu();
    for &(hd, lens, causal, path) in cases {
        let shape = VarlenShape::from_lens(lens, 4, 2, hd).unwrap();
        with_seeds(&format!("{var}, d = {hd}, causal {causal}, {path}"), |mut rng| {
            let mut opts = AttnOptions::new(path);
            opts.causal = causal;
            let call = gauss_call(&mut rng, &shape, opts);
            same_bits_whatever(&gpu, &call, var, values);
        });
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn documents_are_isolated_bitwise() {
    let gpu = gpu();
    let attn = attn_fn(&gpu);
    // (GQA too: the backward's sum of dK/dV over a group's query heads is where a cross-document
    // index would show, and only with more query heads than KV heads)
    for (hq, hkv) in [(2, 2), (4, 2), (4, 1)] {
        let shape = VarlenShape::from_lens(&[70, 33, 129], hq, hkv, 128).unwrap();
        with_seeds(&format!("isolation {hq}:{hkv}"), |mut rng| {
            let call = gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8));
            for path in [AttnPath::Mxfp8, AttnPath::Nvfp4] {
                assert_documents_isolated(&attn, &call.with_path(path), &format!("{path} {hq}:{hkv}"));
            }
            let c = doc_isolation(&attn, &call.with_path(AttnPath::LeakyFp8), 1, 1e4).unwrap();
            assert!(
                c.max() > 1e-3,
                "leaky-fp8 must leak across documents ({hq}:{hkv}): {c:?}"
            );
        });
    }
}

/// The causally safe options with one switched off by `off`.
fn safe_with(path: AttnPath, off: impl Fn(&mut Precision)) -> AttnOptions {
    let mut precision = Precision::causally_safe(true);
    off(&mut precision);
    AttnOptions {
        precision,
        ..AttnOptions::new(path)
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn causal_leakage_has_the_reference_properties() {
    let gpu = gpu();
    let attn = attn_fn(&gpu);
    // Two documents, GQA 4:2; probes in the middle of the first and inside the second.
    let shape = VarlenShape::from_lens(&[150, 90], 4, 2, 128).unwrap();
    let probes = [default_probe(&shape), 190];
    with_seeds("leakage", |mut rng| {
        let call = gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8));
        let leak = |c: &AttnCall, t: usize| -> CausalLeak {
            let l = causal_leakage(&attn, c, t, 1e3).unwrap();
            eprintln!("{} {:?} t {t}: {l:?}", c.opts.path, c.opts.precision);
            l
        };
        for t in probes {
            let d = leak(&call, t);
            assert!(
                d.before_own_block.bitwise_zero(),
                "default MXFP8 leaked before the perturbed block: {d:?}"
            );
            assert!(
                d.in_own_block.o > 0.0,
                "default MXFP8 in-block leak not seen: {d:?}"
            );
            for path in [AttnPath::Mxfp8, AttnPath::Nvfp4] {
                let safe = call.with_opts(safe_with(path, |_| {}));
                for (input, what) in [(safe.clone(), "normal"), (quiet_prefix(&safe, t), "quiet prefix")] {
                    let l = leak(&input, t);
                    assert!(
                        l.bitwise_causal(),
                        "{path} {what}: the precision options must give bitwise zero leakage: {l:?}"
                    );
                }
                let l = leak(
                    &call.with_opts(safe_with(path, |p| p.per_token_scales = false)),
                    t,
                );
                assert!(
                    l.up_to_t.o > 0.0 && l.up_to_t.dq > 0.0,
                    "{path} without per-token scales must leak: {l:?}"
                );
                let l = leak(
                    &call.with_opts(safe_with(path, |p| p.row_ds_exponents = false)),
                    t,
                );
                let u = l.up_to_t;
                assert!(
                    u.o == 0.0 && u.lse == 0.0 && u.dq > 0.0,
                    "{path} without row dS exponents: dQ must leak, O and LSE not: {l:?}"
                );
                // The GPU accumulates dQ in FP32 registers with no prescale (docs/kernels.md), so
                // `causal_dq_scaling` off need not leak there: printed, not asserted.
                let no_dq = call.with_opts(safe_with(path, |p| p.causal_dq_scaling = false));
                leak(&quiet_prefix(&no_dq, t), t);
            }
            let l = leak(&call.with_path(AttnPath::LeakyFp8), t);
            assert!(
                l.up_to_t.max() > 0.0 && l.before_own_block.max() > 0.0,
                "the leaky control must show its leak: {l:?}"
            );
        }
    });
}

// ---- head dim 64 (the v4 kernels; Llama-3.2-1B's and most small models' head dim) -------------

/// The accuracy cases of head dim 128 at 64: causal GQA, non-causal MHA, long documents (the
/// ordered dQ reduction over many key tiles, GQA dK/dV sums), per-token scales, no Hadamard
/// rotation, and the leaky-fp8 control.
#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn head_dim_64_is_as_accurate_as_the_reference() {
    let mxfp8 = AttnOptions::new(AttnPath::Mxfp8);
    let non_causal = AttnOptions {
        causal: false,
        ..mxfp8
    };
    let mut per_token = mxfp8;
    per_token.precision.per_token_scales = true;
    let mut no_hadamard = mxfp8;
    no_hadamard.precision.hadamard = false;
    let cases: [(&str, &[usize], usize, usize, AttnOptions); 7] = [
        ("d64 mxfp8 causal gqa", &LENS, 4, 2, mxfp8),
        ("d64 mxfp8 non-causal", &LENS, 2, 2, non_causal),
        ("d64 mxfp8 long causal gqa", &[1100, 517, 64], 4, 2, mxfp8),
        ("d64 mxfp8 long non-causal gqa 4:1", &[700, 300], 4, 1, non_causal),
        ("d64 mxfp8 per-token scales", &LENS, 4, 2, per_token),
        ("d64 mxfp8 no hadamard", &LENS, 2, 1, no_hadamard),
        ("d64 leaky-fp8", &LENS, 2, 2, AttnOptions::new(AttnPath::LeakyFp8)),
    ];
    for (tag, lens, hq, hkv, opts) in cases {
        let shape = VarlenShape::from_lens(lens, hq, hkv, 64).unwrap();
        check_accuracy(tag, &shape, opts);
    }
}

/// Bitwise repeatability at head dim 64: two runs, the dQ reduces jittered, and the head-chunked
/// backward, each against the plain run.
#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn head_dim_64_is_bitwise_repeatable_whatever_the_reduce_order_and_chunking() {
    let gpu = gpu();
    let shape = VarlenShape::from_lens(&[8192, 300], 4, 1, 64).unwrap();
    with_seeds("d64 repeat", |mut rng| {
        // (spread key tiles: with Gaussian keys alone an unordered reduce summed exactly in any
        // order at d = 128, session 13; the same holds here)
        let call = spread_key_tiles(gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8)));
        let (a, b) = (gpu_attn(&gpu, &call), gpu_attn(&gpu, &call));
        assert_same_bits(&a, &b, "d64, between runs");
        same_bits_whatever(&gpu, &call, "FLAMIA_BWD_JITTER", &["1", "2"]);
    });
    let shape = VarlenShape::from_lens(&[1100, 517, 2048], 8, 4, 64).unwrap();
    with_seeds("d64 chunks", |mut rng| {
        let call = gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8));
        same_bits_whatever(&gpu, &call, "FLAMIA_BWD_SCRATCH_MIB", &["0"]);
    });
}

/// Document isolation and the default MXFP8 causal property (bitwise zero before the perturbed
/// token's own 32-token block) at head dim 64; the leaky control leaks. (The causally safe
/// options need `row_ds_exponents`, a v3.1 kernel: head dim 128 only.)
#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn head_dim_64_documents_are_isolated_and_default_mxfp8_is_causal_before_the_block() {
    let gpu = gpu();
    let attn = attn_fn(&gpu);
    for (hq, hkv) in [(2, 2), (4, 2)] {
        let shape = VarlenShape::from_lens(&[70, 33, 129], hq, hkv, 64).unwrap();
        with_seeds(&format!("d64 isolation {hq}:{hkv}"), |mut rng| {
            let call = gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8));
            assert_documents_isolated(&attn, &call, &format!("d64 mxfp8 {hq}:{hkv}"));
            let c = doc_isolation(&attn, &call.with_path(AttnPath::LeakyFp8), 1, 1e4).unwrap();
            assert!(c.max() > 1e-3, "d64 leaky-fp8 must leak across documents: {c:?}");
        });
    }
    let shape = VarlenShape::from_lens(&[150, 90], 4, 2, 64).unwrap();
    with_seeds("d64 leakage", |mut rng| {
        let call = gauss_call(&mut rng, &shape, AttnOptions::new(AttnPath::Mxfp8));
        for t in [default_probe(&shape), 190] {
            let d = causal_leakage(&attn, &call, t, 1e3).unwrap();
            assert!(
                d.before_own_block.bitwise_zero(),
                "d64 default MXFP8 leaked before the perturbed block: {d:?}"
            );
            assert!(
                d.in_own_block.o > 0.0,
                "d64 default MXFP8 in-block leak not seen: {d:?}"
            );
            let l = causal_leakage(&attn, &call.with_path(AttnPath::LeakyFp8), t, 1e3).unwrap();
            assert!(
                l.before_own_block.max() > 0.0,
                "d64 leaky control must leak: {l:?}"
            );
        }
    });
}

/// What runs a v3.1 kernel (NVFP4 scores) refuses head dim 64 with an error naming what works,
/// before any launch.
#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn head_dim_64_is_refused_where_a_v3_kernel_would_run() {
    let gpu = gpu();
    let shape = VarlenShape::from_lens(&[33, 64], 2, 2, 64).unwrap();
    let call = gauss_call(&mut rng("d64 refused"), &shape, AttnOptions::new(AttnPath::Nvfp4));
    let err = flamia_kernels::gpu::host::forward_backward(&gpu, &call)
        .expect_err("nvfp4 at head_dim 64 ran")
        .to_string();
    assert!(err.contains("head_dim 64") && err.contains("`mxfp8`"), "{err}");
}

/// The causally safe options at head dim 64 (row dS exponents on the v4 backward): as accurate as
/// the reference and bitwise causal (precision options on, normal and quiet-prefix inputs).
#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn head_dim_64_precision_options_are_accurate_and_bitwise_causal() {
    let gpu = gpu();
    let attn = attn_fn(&gpu);
    let safe = safe_with(AttnPath::Mxfp8, |_| {});
    let shape = VarlenShape::from_lens(&LENS, 2, 1, 64).unwrap();
    check_accuracy("d64 causally safe", &shape, safe);
    let shape = VarlenShape::from_lens(&[150, 90], 4, 2, 64).unwrap();
    with_seeds("d64 safe leakage", |mut rng| {
        let call = gauss_call(&mut rng, &shape, safe);
        for t in [default_probe(&shape), 190] {
            for (input, what) in [(call.clone(), "normal"), (quiet_prefix(&call, t), "quiet prefix")] {
                let l = causal_leakage(&attn, &input, t, 1e3).unwrap();
                assert!(
                    l.bitwise_causal(),
                    "d64 {what}: the options must give bitwise zero leakage: {l:?}"
                );
            }
        }
    });
}
