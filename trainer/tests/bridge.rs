//! The attention bridge on CPU: outputs and gradients through libtorch autograd match an exact
//! f64 attention and libtorch's own attention with a block-diagonal causal mask, on packed
//! documents of awkward lengths with GQA.

use flamia_kernels::{AttnOptions, AttnPath};
use flamia_trainer::attention::{attention, release_unsaved_inputs, Packing};
use tch::{Device, Kind, Tensor};

const LENS: [usize; 5] = [37, 64, 1, 5, 93];

fn cu(lens: &[usize]) -> Vec<usize> {
    let mut cu = vec![0];
    for l in lens {
        cu.push(cu.last().unwrap() + l);
    }
    cu
}

/// Boolean (tokens, tokens) mask: true where query i may see key j (same document, j <= i).
fn block_causal_mask(lens: &[usize]) -> Tensor {
    let cu = cu(lens);
    let t = *cu.last().unwrap();
    let mut doc = vec![0i64; t];
    for (d, w) in cu.windows(2).enumerate() {
        doc[w[0]..w[1]].iter_mut().for_each(|x| *x = d as i64);
    }
    let doc = Tensor::from_slice(&doc);
    let same = doc.unsqueeze(1).eq_tensor(&doc.unsqueeze(0));
    let causal = Tensor::ones([t as i64, t as i64], (Kind::Bool, Device::Cpu)).tril(0);
    same.logical_and(&causal)
}

/// Exact attention in f64 with libtorch ops: (tokens, heads, d) in and out.
fn exact_f64(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, group: i64) -> Tensor {
    let d = q.size()[2] as f64;
    let q = q.permute([1, 0, 2]);
    let k = k
        .repeat_interleave_self_int(group, Some(1), None)
        .permute([1, 0, 2]);
    let v = v
        .repeat_interleave_self_int(group, Some(1), None)
        .permute([1, 0, 2]);
    let s = q.matmul(&k.transpose(1, 2)) / d.sqrt();
    let s = s.masked_fill(&mask.logical_not(), f64::NEG_INFINITY);
    s.softmax(-1, Kind::Double).matmul(&v).permute([1, 0, 2])
}

fn grads_of(out: &Tensor, w: &Tensor, inputs: &[&Tensor]) -> Vec<Tensor> {
    let loss = (out.to_kind(Kind::Double) * w).sum(Kind::Double);
    Tensor::run_backward(&[loss], inputs, false, false)
}

fn max_rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let a = a.to_kind(Kind::Double);
    let b = b.to_kind(Kind::Double);
    let diff = (&a - &b).abs().max().double_value(&[]);
    diff / b.abs().max().double_value(&[]).max(1e-30)
}

fn inputs(hq: i64, hkv: i64, d: i64, seed: i64) -> (Tensor, Tensor, Tensor, Tensor) {
    tch::manual_seed(seed);
    let t = cu(&LENS).last().copied().unwrap() as i64;
    let q = Tensor::randn([t, hq, d], (Kind::Float, Device::Cpu)) * 1.5;
    let k = Tensor::randn([t, hkv, d], (Kind::Float, Device::Cpu)) * 1.5;
    let v = Tensor::randn([t, hkv, d], (Kind::Float, Device::Cpu));
    let w = Tensor::randn([t, hq, d], (Kind::Double, Device::Cpu));
    (q, k, v, w)
}

#[test]
fn bridge_matches_exact_f64_forward_and_gradients() {
    for (hq, hkv, d) in [(4, 2, 64), (2, 2, 128), (6, 1, 64)] {
        let (q, k, v, w) = inputs(hq, hkv, d, 7 + hq);
        let (q, k, v) = (
            q.set_requires_grad(true),
            k.set_requires_grad(true),
            v.set_requires_grad(true),
        );
        let packing = Packing::new(&cu(&LENS), Device::Cpu).unwrap();
        let o = attention(&q, &k, &v, &packing, &AttnOptions::new(AttnPath::Exact)).unwrap();
        assert_eq!(o.size(), q.size());
        let g = grads_of(&o, &w, &[&q, &k, &v]);

        let (q64, k64, v64) = (
            q.detach().to_kind(Kind::Double).set_requires_grad(true),
            k.detach().to_kind(Kind::Double).set_requires_grad(true),
            v.detach().to_kind(Kind::Double).set_requires_grad(true),
        );
        let o64 = exact_f64(&q64, &k64, &v64, &block_causal_mask(&LENS), hq / hkv);
        let g64 = grads_of(&o64, &w, &[&q64, &k64, &v64]);
        // The bridge accumulates in f64 and rounds once to f32: errors are at f32 rounding level.
        assert!(
            max_rel_err(&o, &o64) < 1e-6,
            "o {hq}/{hkv}/{d}: {}",
            max_rel_err(&o, &o64)
        );
        for (name, (a, b)) in ["dq", "dk", "dv"].iter().zip(g.iter().zip(&g64)) {
            let e = max_rel_err(a, b);
            assert!(
                e < 1e-5,
                "{name} ({hq} q heads, {hkv} kv heads, d {d}): rel err {e}"
            );
        }
    }
}

#[test]
fn bridge_matches_libtorch_masked_attention() {
    let (hq, hkv, d) = (4i64, 2i64, 64i64);
    let (q, k, v, w) = inputs(hq, hkv, d, 11);
    let (q, k, v) = (
        q.set_requires_grad(true),
        k.set_requires_grad(true),
        v.set_requires_grad(true),
    );
    let packing = Packing::new(&cu(&LENS), Device::Cpu).unwrap();
    let o = attention(&q, &k, &v, &packing, &AttnOptions::new(AttnPath::Exact)).unwrap();
    let g = grads_of(&o, &w, &[&q, &k, &v]);

    // libtorch's own attention (f32) over (heads, tokens, d) with the block-diagonal causal mask.
    let (q2, k2, v2) = (
        q.detach().set_requires_grad(true),
        k.detach().set_requires_grad(true),
        v.detach().set_requires_grad(true),
    );
    let kk = k2
        .repeat_interleave_self_int(hq / hkv, Some(1), None)
        .permute([1, 0, 2]);
    let vv = v2
        .repeat_interleave_self_int(hq / hkv, Some(1), None)
        .permute([1, 0, 2]);
    let mask = block_causal_mask(&LENS);
    let o2 = Tensor::scaled_dot_product_attention(
        &q2.permute([1, 0, 2]).unsqueeze(0),
        &kk.unsqueeze(0),
        &vv.unsqueeze(0),
        Some(mask),
        0.0,
        false,
        None::<f64>,
        false,
    )
    .squeeze_dim(0)
    .permute([1, 0, 2]);
    let g2 = grads_of(&o2, &w, &[&q2, &k2, &v2]);
    assert!(max_rel_err(&o, &o2) < 1e-5, "o: {}", max_rel_err(&o, &o2));
    for (name, (a, b)) in ["dq", "dk", "dv"].iter().zip(g.iter().zip(&g2)) {
        let e = max_rel_err(a, b);
        assert!(e < 1e-4, "{name} vs libtorch sdpa: rel err {e}");
    }
}

#[test]
fn bridge_rejects_bad_shapes_with_a_clear_error() {
    let (q, k, v, _) = inputs(4, 2, 64, 3);
    let wrong = Packing::new(&[0, 10, 20], Device::Cpu).unwrap();
    let err = attention(&q, &k, &v, &wrong, &AttnOptions::new(AttnPath::Exact)).unwrap_err();
    assert!(err.to_string().contains("(tokens, heads, head_dim)"), "{err}");
    assert!(Packing::new(&[0, 5, 5], Device::Cpu).is_err());
}

/// The bridge's CPU paths against `flamia_kernels::reference` called directly: the exact control
/// matches the reference's `exact` path, and FLAMIA `mxfp8` gives exactly the reference's numbers
/// (it runs it) and stays close to exact attention.
#[test]
fn bridge_cpu_paths_match_the_kernels_reference() {
    use flamia_kernels::{reference, AttnCall, VarlenShape};
    let (hq, hkv, d) = (4i64, 2i64, 64i64);
    let (q, k, v, w) = inputs(hq, hkv, d, 5);
    let shape = VarlenShape::new(cu(&LENS), hq as usize, hkv as usize, d as usize).unwrap();
    let flat = |t: &Tensor| -> Vec<f32> { t.reshape([-1]).try_into().unwrap() };
    let dout = w.to_kind(Kind::Float);
    let mut exact_o = None;
    for path in [AttnPath::Exact, AttnPath::Mxfp8] {
        let opts = AttnOptions::new(path);
        let (q1, k1, v1) = (
            q.detach().set_requires_grad(true),
            k.detach().set_requires_grad(true),
            v.detach().set_requires_grad(true),
        );
        let packing = Packing::new(&cu(&LENS), Device::Cpu).unwrap();
        let o = attention(&q1, &k1, &v1, &packing, &opts).unwrap();
        let g = Tensor::run_backward(&[(&o * &dout).sum(Kind::Float)], &[&q1, &k1, &v1], false, false);
        let call = AttnCall::new(flat(&q), flat(&k), flat(&v), flat(&dout), shape.clone(), opts).unwrap();
        let (f, r) = reference::forward_backward(&call).unwrap();
        let ro = Tensor::from_slice(&f.o).reshape(q.size());
        let (rdq, rdk) = (
            Tensor::from_slice(&r.dq).reshape(q.size()),
            Tensor::from_slice(&r.dk).reshape(k.size()),
        );
        let tol = if path == AttnPath::Exact { 1e-5 } else { 0.0 };
        assert!(
            max_rel_err(&o, &ro) <= tol,
            "{path} o vs reference: {}",
            max_rel_err(&o, &ro)
        );
        assert!(
            max_rel_err(&g[0], &rdq) <= tol.max(1e-6),
            "{path} dq vs reference: {}",
            max_rel_err(&g[0], &rdq)
        );
        assert!(
            max_rel_err(&g[1], &rdk) <= tol.max(1e-6),
            "{path} dk vs reference: {}",
            max_rel_err(&g[1], &rdk)
        );
        match &exact_o {
            None => exact_o = Some(o.detach()),
            Some(e) => {
                // Relative L2 error, as `flamia check numerics` reports it: one element's error
                // relative to the largest |O| is not a stable measure of FP8 quantisation.
                let (o64, e64) = (o.to_kind(Kind::Double), e.to_kind(Kind::Double));
                let err = (&o64 - &e64).norm().double_value(&[]) / e64.norm().double_value(&[]);
                assert!(
                    err > 0.0 && err < 0.1,
                    "mxfp8 is quantised but close to exact (relative L2): {err}"
                );
            }
        }
    }
}

#[test]
fn cpu_attention_keeps_its_inputs_when_asked_to_release_them() {
    // Every CPU path saves q, k, v (or float copies that are q, k, v themselves) for its
    // backward, so the release frees nothing there and the backward is the one without it.
    let (hq, hkv, d) = (4i64, 2i64, 64i64);
    let (q, k, v, w) = inputs(hq, hkv, d, 21);
    let packing = Packing::new(&cu(&LENS), Device::Cpu).unwrap();
    for path in AttnPath::ALL {
        let opts = AttnOptions::new(path);
        let run = |release: bool| {
            let (q, k, v) = (
                q.copy().set_requires_grad(true),
                k.copy().set_requires_grad(true),
                v.copy().set_requires_grad(true),
            );
            let o = attention(&q, &k, &v, &packing, &opts).unwrap();
            if release {
                assert_eq!(
                    release_unsaved_inputs(&q, &k, &v, &opts).unwrap(),
                    0,
                    "{path}: the CPU path keeps q, k, v"
                );
            }
            let mut out = vec![o.detach()];
            out.extend(grads_of(&o, &w, &[&q, &k, &v]));
            out
        };
        let (plain, released) = (run(false), run(true));
        for (name, (a, b)) in ["o", "dq", "dk", "dv"].iter().zip(plain.iter().zip(&released)) {
            assert!(a.equal(b), "{path} {name}: differs after the release call");
        }
    }
}

#[test]
fn uploads_on_the_cpu_keep_values_and_convert_kinds() {
    use flamia_trainer::attention::upload;
    let vals: Vec<i64> = vec![0, 1, -7, 1 << 40, i64::MAX];
    let t = Tensor::from_slice(&vals);
    let same = upload(&t, Kind::Int64, Device::Cpu).unwrap();
    assert_eq!(Vec::<i64>::try_from(&same).unwrap(), vals);
    assert_eq!(
        same.data_ptr(),
        t.data_ptr(),
        "same kind on the CPU: the tensor itself, no copy"
    );
    let small: Vec<i64> = vec![0, 5, 4096, 65_536];
    let as_int = upload(&Tensor::from_slice(&small), Kind::Int, Device::Cpu).unwrap();
    assert_eq!(as_int.kind(), Kind::Int);
    assert_eq!(Vec::<i32>::try_from(&as_int).unwrap(), vec![0, 5, 4096, 65_536]);
}
