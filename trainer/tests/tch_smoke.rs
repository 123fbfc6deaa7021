//! libtorch is linked and computes: a matmul and a gradient through tch.

use tch::{Kind, Tensor};

#[test]
fn tch_matmul_and_grad() {
    let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0])
        .reshape([2, 2])
        .set_requires_grad(true);
    let b = a.matmul(&a).sum(Kind::Float);
    b.backward();
    let g: Vec<f32> = a.grad().reshape([-1]).try_into().unwrap();
    // d/dA sum(A A) = 1 1^T A^T + A^T 1 1^T
    assert_eq!(g, vec![7.0, 11.0, 9.0, 13.0]);
    assert_eq!(f64::try_from(b).unwrap(), 54.0);
}
