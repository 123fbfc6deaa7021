//! The attention bridge on CUDA (run on the device: `--ignored`): the FLAMIA GPU paths through
//! libtorch autograd stay close to exact attention; the bridge's per-stream workspace (plan and
//! dO buffers reused while the packing stays the same, rebuilt when it changes, no stream
//! synchronisation per call) gives every call the same bits as a fresh one; and each backward
//! reads its own forward's quantised Q, K, V (kept per call), never q, k, v themselves, so their
//! memory may go right after the forward (`release_unsaved_inputs`); host uploads go through
//! pinned memory without libtorch's deprecated device argument.

use flamia_kernels::{AttnOptions, AttnPath};
use flamia_trainer::attention::{attention, release_unsaved_inputs, Packing};
use tch::{Device, Kind, Tensor};

fn cu(lens: &[usize]) -> Vec<usize> {
    let mut cu = vec![0];
    for l in lens {
        cu.push(cu.last().unwrap() + l);
    }
    cu
}

/// O, dQ, dK, dV (f32, on the host) of one bridge call on `dev` with `(q, k, v, w)` given in f32.
fn run(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    w: &Tensor,
    lens: &[usize],
    path: AttnPath,
    dev: Device,
) -> Vec<Tensor> {
    let kind = if dev == Device::Cpu {
        Kind::Float
    } else {
        Kind::BFloat16
    };
    let leaf = |t: &Tensor| t.to_device(dev).to_kind(kind).set_requires_grad(true);
    let (q, k, v) = (leaf(q), leaf(k), leaf(v));
    let packing = Packing::new(&cu(lens), dev).unwrap();
    let o = attention(&q, &k, &v, &packing, &AttnOptions::new(path)).unwrap();
    backward(&o, w, [&q, &k, &v])
}

/// O and the gradients of `sum(o * w)` with respect to `x` (f32, on the host).
fn backward(o: &Tensor, w: &Tensor, x: [&Tensor; 3]) -> Vec<Tensor> {
    let loss = (o.to_kind(Kind::Float) * w.to_device(o.device())).sum(Kind::Float);
    let g = Tensor::run_backward(&[loss], &x, false, false);
    std::iter::once(o.detach())
        .chain(g)
        .map(|t| t.to_kind(Kind::Float).to_device(Device::Cpu))
        .collect()
}

fn rel_l2(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_kind(Kind::Double), b.to_kind(Kind::Double));
    (&a - &b).norm().double_value(&[]) / b.norm().double_value(&[]).max(1e-30)
}

fn inputs(lens: &[usize], hq: i64, hkv: i64, seed: i64) -> [Tensor; 4] {
    tch::manual_seed(seed);
    let t = lens.iter().sum::<usize>() as i64;
    let f = (Kind::Float, Device::Cpu);
    [
        Tensor::randn([t, hq, 128], f),
        Tensor::randn([t, hkv, 128], f),
        Tensor::randn([t, hkv, 128], f),
        Tensor::randn([t, hq, 128], f),
    ]
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn cuda_flamia_paths_are_close_to_exact_and_calls_are_independent_of_the_workspace() {
    assert!(
        tch::Cuda::is_available(),
        "this test needs a CUDA GPU; it must not pass without one"
    );
    let dev = Device::Cuda(0);
    let (a_lens, b_lens) = ([300usize, 1, 65, 700], [129usize, 64, 1000]);
    let a = inputs(&a_lens, 4, 2, 1);
    let b = inputs(&b_lens, 4, 2, 2);
    for path in [AttnPath::Mxfp8, AttnPath::Nvfp4, AttnPath::LeakyFp8] {
        // A, then B (a new packing: the workspace is rebuilt), then A again (rebuilt again).
        let first = run(&a[0], &a[1], &a[2], &a[3], &a_lens, path, dev);
        let other = run(&b[0], &b[1], &b[2], &b[3], &b_lens, path, dev);
        let again = run(&a[0], &a[1], &a[2], &a[3], &a_lens, path, dev);
        // Two calls in a row on one packing: the second reuses the workspace the first filled.
        let twice = run(&a[0], &a[1], &a[2], &a[3], &a_lens, path, dev);
        for (name, ((x, y), z)) in ["o", "dq", "dk", "dv"]
            .iter()
            .zip(first.iter().zip(&again).zip(&twice))
        {
            assert!(x.equal(y), "{path} {name}: call after another packing differs");
            assert!(x.equal(z), "{path} {name}: call on a reused workspace differs");
        }
        // Accuracy against the exact control on the CPU (f64 accumulation), inputs rounded to
        // BF16 first as the GPU sees them. Bounds: mxfp8 cosines of about 0.998 mean relative
        // L2 errors of about 0.06 (docs/numerics.md); NVFP4 and the leaky control are coarser.
        let bound = if path == AttnPath::Mxfp8 { 0.1 } else { 0.2 };
        for (inp, lens, got) in [(&a, &a_lens[..], &first), (&b, &b_lens[..], &other)] {
            let r = |t: &Tensor| t.to_kind(Kind::BFloat16).to_kind(Kind::Float);
            let exact = run(
                &r(&inp[0]),
                &r(&inp[1]),
                &r(&inp[2]),
                &inp[3],
                lens,
                AttnPath::Exact,
                Device::Cpu,
            );
            for (name, (g, e)) in ["o", "dq", "dk", "dv"].iter().zip(got.iter().zip(&exact)) {
                let err = rel_l2(g, e);
                println!("{path} lens {lens:?} {name}: relative L2 vs exact {err:.4}");
                assert!(
                    err > 0.0 && err < bound,
                    "{path} {name} on {lens:?}: relative L2 {err} vs exact (bound {bound})"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn cuda_backward_reads_its_own_forwards_codes_not_q_k_v() {
    assert!(
        tch::Cuda::is_available(),
        "this test needs a CUDA GPU; it must not pass without one"
    );
    let dev = Device::Cuda(0);
    let lens = [300usize, 1, 65, 700];
    let a = inputs(&lens, 4, 2, 3);
    let b = inputs(&lens, 4, 2, 4);
    let packing = Packing::new(&cu(&lens), dev).unwrap();
    let leaf = |t: &Tensor| t.to_device(dev).to_kind(Kind::BFloat16).set_requires_grad(true);
    for path in [AttnPath::Mxfp8, AttnPath::Nvfp4, AttnPath::LeakyFp8] {
        let want_a = run(&a[0], &a[1], &a[2], &a[3], &lens, path, dev);
        let want_b = run(&b[0], &b[1], &b[2], &b[3], &lens, path, dev);
        let opts = AttnOptions::new(path);
        // Two forwards on one packing (one workspace), then A's q, k, v overwritten with B's
        // values, then the backwards in the other order: each must see its own forward's codes.
        let (qa, ka, va) = (leaf(&a[0]), leaf(&a[1]), leaf(&a[2]));
        let (qb, kb, vb) = (leaf(&b[0]), leaf(&b[1]), leaf(&b[2]));
        let oa = attention(&qa, &ka, &va, &packing, &opts).unwrap();
        let ob = attention(&qb, &kb, &vb, &packing, &opts).unwrap();
        tch::no_grad(|| {
            for (dst, src) in [(&qa, &qb), (&ka, &kb), (&va, &vb)] {
                dst.shallow_clone().copy_(src);
            }
        });
        let got_b = backward(&ob, &b[3], [&qb, &kb, &vb]);
        let got_a = backward(&oa, &a[3], [&qa, &ka, &va]);
        for (name, i) in [("o", 0), ("dq", 1), ("dk", 2), ("dv", 3)] {
            assert!(
                got_a[i].equal(&want_a[i]),
                "{path} {name}: call A's backward did not use A's codes"
            );
            assert!(
                got_b[i].equal(&want_b[i]),
                "{path} {name}: call B differs from a call alone"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn cuda_flamia_paths_free_q_k_v_after_the_forward_and_backward_the_same() {
    // Selective activation checkpointing frees the BF16 q, k, v of every layer after its
    // attention forward (the FLAMIA backward reads its own codes): the gradients must be bitwise
    // those of a call that kept them, the bytes freed those of the three tensors, and exact
    // attention (libtorch's flash kernel saves q, k, v) must keep them.
    assert!(
        tch::Cuda::is_available(),
        "this test needs a CUDA GPU; it must not pass without one"
    );
    let dev = Device::Cuda(0);
    let lens = [300usize, 1, 65, 700];
    let a = inputs(&lens, 4, 2, 5);
    let packing = Packing::new(&cu(&lens), dev).unwrap();
    let leaf = |t: &Tensor| t.to_device(dev).to_kind(Kind::BFloat16).set_requires_grad(true);
    for path in AttnPath::ALL {
        let want = run(&a[0], &a[1], &a[2], &a[3], &lens, path, dev);
        let opts = AttnOptions::new(path);
        let (q, k, v) = (leaf(&a[0]), leaf(&a[1]), leaf(&a[2]));
        let bytes: i64 = [&q, &k, &v].iter().map(|t| t.numel() as i64 * 2).sum();
        let o = attention(&q, &k, &v, &packing, &opts).unwrap();
        let freed = release_unsaved_inputs(&q, &k, &v, &opts).unwrap();
        if path == AttnPath::Exact {
            assert_eq!(freed, 0, "exact attention saves q, k, v: nothing may be freed");
        } else {
            assert_eq!(freed as i64, bytes, "{path}: the bytes of q, k and v");
            assert_eq!(q.size(), a[0].size(), "{path}: q keeps its sizes");
        }
        let got = backward(&o, &a[3], [&q, &k, &v]);
        for (name, i) in [("o", 0), ("dq", 1), ("dk", 2), ("dv", 3)] {
            if path == AttnPath::Exact && i > 0 {
                // libtorch's flash backward adds dQ up with float atomics: not bitwise run to
                // run (measured on the H200), so exact attention gets a rounding-sized bound
                let err = rel_l2(&got[i], &want[i]);
                assert!(err < 1e-2, "{path} {name}: relative L2 {err} after the release");
            } else {
                assert!(got[i].equal(&want[i]), "{path} {name}: differs after the release");
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run on the device with --ignored"]
fn cuda_uploads_go_through_pinned_memory_and_keep_every_value() {
    use flamia_trainer::attention::{is_pinned, pinned_copy, upload};
    assert!(tch::Cuda::is_available(), "this test needs a CUDA device");
    let vals: Vec<i64> = vec![0, 1, -7, 1 << 40, i64::MAX, i64::MIN];
    let t = Tensor::from_slice(&vals);
    assert!(!is_pinned(&t).unwrap(), "a fresh host tensor is pageable");
    let p = pinned_copy(&t).unwrap();
    assert!(is_pinned(&p).unwrap(), "pinned_copy gave pageable memory");
    assert_eq!(Vec::<i64>::try_from(&p).unwrap(), vals);
    let dev = Device::Cuda(0);
    let u = upload(&t, Kind::Int64, dev).unwrap();
    assert_eq!(u.device(), dev);
    assert_eq!(Vec::<i64>::try_from(&u.to_device(Device::Cpu)).unwrap(), vals);
    let cu: Vec<i32> = vec![0, 37, 101, 65_536];
    let c = upload(&Tensor::from_slice(&cu), Kind::Int, dev).unwrap();
    assert_eq!((c.device(), c.kind()), (dev, Kind::Int));
    assert_eq!(Vec::<i32>::try_from(&c.to_device(Device::Cpu)).unwrap(), cu);
    // a converting upload (i64 on the host, int32 on the device)
    let c64 = upload(&Tensor::from_slice(&[3i64, -9, 70_000]), Kind::Int, dev).unwrap();
    assert_eq!(
        Vec::<i32>::try_from(&c64.to_device(Device::Cpu)).unwrap(),
        vec![3, -9, 70_000]
    );
    // many uploads queued without a synchronisation, each host tensor dropped right away: the
    // pinned blocks must not be reused before their copies have run
    let ups: Vec<Tensor> = (0..256i64)
        .map(|i| {
            let host: Vec<i64> = (0..1000).map(|j| i * 1_000_003 + j).collect();
            upload(&Tensor::from_slice(&host), Kind::Int64, dev).unwrap()
        })
        .collect();
    for (i, u) in ups.iter().enumerate() {
        let want: Vec<i64> = (0..1000).map(|j| i as i64 * 1_000_003 + j).collect();
        assert_eq!(
            Vec::<i64>::try_from(&u.to_device(Device::Cpu)).unwrap(),
            want,
            "upload {i}"
        );
    }
    let err = pinned_copy(&u).unwrap_err().to_string();
    assert!(
        err.contains("not the CPU"),
        "a device tensor must be refused: {err}"
    );
}
