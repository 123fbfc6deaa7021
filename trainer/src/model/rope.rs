//! Rotary position embeddings with Llama-3 frequency scaling, positions restarting at every
//! document of a packed batch.
//!
//! Layout: x `(tokens, heads, head_dim)`; pairs `(2i, 2i+1)` of the head dim rotate by
//! `position * freq_i` (Meta's complex-pair convention).

use std::sync::Mutex;

use tch::{Device, Kind, Tensor};

use super::sizes::RopeScaling;
use crate::error::Result;

/// Inverse frequencies `theta^(-2i/head_dim)`, scaled the Llama-3 way when `scaling` is given.
pub fn inv_freqs(head_dim: usize, theta: f64, scaling: Option<&RopeScaling>) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| {
            let f = theta.powf(-((2 * i) as f64) / head_dim as f64);
            match scaling {
                None => f,
                Some(s) => {
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    let orig = s.original_max_position as f64;
                    let (low_wl, high_wl) = (orig / s.low_freq_factor, orig / s.high_freq_factor);
                    if wavelen < high_wl {
                        f
                    } else if wavelen > low_wl {
                        f / s.factor
                    } else {
                        let smooth =
                            (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                        (1.0 - smooth) * f / s.factor + smooth * f
                    }
                }
            }
        })
        .collect()
}

/// Position of every packed token inside its document.
pub fn positions(cu_seqlens: &[usize]) -> Vec<i64> {
    let mut pos = Vec::with_capacity(cu_seqlens.last().copied().unwrap_or(0));
    for w in cu_seqlens.windows(2) {
        pos.extend(0..(w[1] - w[0]) as i64);
    }
    pos
}

/// cos/sin `(len, 1, head_dim/2)` f32 for positions `0..len`, computed on `device` (angles and
/// trigonometry in f64 like [`tables`], then rounded to f32).
pub fn device_tables(inv_freq: &[f64], len: usize, device: Device) -> Result<(Tensor, Tensor)> {
    let f = Tensor::from_slice(inv_freq).f_to_device(device)?;
    let p = Tensor::f_arange(len as i64, (Kind::Double, device))?;
    let angles = p.f_unsqueeze(1)?.f_mul(&f.f_unsqueeze(0)?)?.f_unsqueeze(1)?;
    Ok((
        angles.f_cos()?.f_to_kind(Kind::Float)?,
        angles.f_sin()?.f_to_kind(Kind::Float)?,
    ))
}

/// The device's cos/sin tables for positions `0..len`, kept between batches and grown (to the
/// next power of two) when a longer document arrives: a batch's tables are then one gather on
/// the device, with nothing computed on the host.
#[derive(Debug, Default)]
pub struct TableCache {
    tables: Mutex<Option<(usize, Device, Tensor, Tensor)>>,
}

impl TableCache {
    /// cos/sin `(tokens, 1, head_dim/2)` f32 for `positions` (int64, on the compute device), whose
    /// largest entry is below `max_len`.
    pub fn gather(&self, inv_freq: &[f64], positions: &Tensor, max_len: usize) -> Result<(Tensor, Tensor)> {
        let device = positions.device();
        let mut guard = self
            .tables
            .lock()
            .map_err(|_| crate::error::TrainError::Invalid("RoPE table cache poisoned".into()))?;
        let fits = matches!(&*guard, Some((len, dev, _, _)) if *len >= max_len && *dev == device);
        if !fits {
            let len = max_len.max(1).next_power_of_two();
            let (c, s) = device_tables(inv_freq, len, device)?;
            *guard = Some((len, device, c, s));
        }
        let (_, _, c, s) = guard.as_ref().expect("filled above");
        Ok((c.f_index_select(0, positions)?, s.f_index_select(0, positions)?))
    }
}

/// cos/sin tables `(tokens, 1, head_dim/2)` in f32 for the given positions, on the host.
pub fn tables(inv_freq: &[f64], positions: &[i64], device: Device) -> (Tensor, Tensor) {
    let n = inv_freq.len();
    let mut cos = Vec::with_capacity(positions.len() * n);
    let mut sin = Vec::with_capacity(positions.len() * n);
    for &p in positions {
        for &f in inv_freq {
            let a = p as f64 * f;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    let shape = [positions.len() as i64, 1, n as i64];
    (
        Tensor::from_slice(&cos).reshape(shape).to_device(device),
        Tensor::from_slice(&sin).reshape(shape).to_device(device),
    )
}

/// Rotates `x` `(tokens, heads, head_dim)`; computed in f32, returned in `x`'s kind.
pub fn apply(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let kind = x.kind();
    let (t, h, d) = x.size3()?;
    let xp = x.f_to_kind(Kind::Float)?.f_reshape([t, h, d / 2, 2])?;
    let x0 = xp.f_select(-1, 0)?;
    let x1 = xp.f_select(-1, 1)?;
    let r0 = x0.f_mul(cos)?.f_sub(&x1.f_mul(sin)?)?;
    let r1 = x0.f_mul(sin)?.f_add(&x1.f_mul(cos)?)?;
    Ok(Tensor::f_stack(&[r0, r1], -1)?
        .f_reshape([t, h, d])?
        .f_to_kind(kind)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let s = RopeScaling::default();
        let plain = inv_freqs(128, 500000.0, None);
        let scaled = inv_freqs(128, 500000.0, Some(&s));
        assert_eq!(plain[0], scaled[0]); // wavelength 2*pi < 2048: unchanged
        let last = plain.len() - 1; // wavelength far above 8192: divided by 32
        assert!((scaled[last] - plain[last] / 32.0).abs() < 1e-18);
        assert!(scaled
            .iter()
            .zip(&plain)
            .all(|(a, b)| a <= b && *a >= b / 32.0 - 1e-18));
    }

    #[test]
    fn positions_restart_per_document_and_rotation_preserves_norm() {
        assert_eq!(positions(&[0, 3, 5]), vec![0, 1, 2, 0, 1]);
        tch::manual_seed(0);
        let x = Tensor::randn([5, 2, 64], (Kind::Float, Device::Cpu));
        let (c, s) = tables(
            &inv_freqs(64, 500000.0, None),
            &positions(&[0, 3, 5]),
            Device::Cpu,
        );
        let y = apply(&x, &c, &s).unwrap();
        let dn = (x.norm() - y.norm()).abs().double_value(&[]);
        assert!(dn < 1e-4, "{dn}");
        // Position 0 is the identity.
        assert_eq!(f64::try_from((y.get(0) - x.get(0)).abs().max()).unwrap(), 0.0);
    }

    #[test]
    fn device_tables_gathered_from_the_cache_equal_the_host_tables() {
        let inv = inv_freqs(64, 500000.0, Some(&RopeScaling::default()));
        let cu = [0usize, 3, 5, 300, 301];
        let (hc, hs) = tables(&inv, &positions(&cu), Device::Cpu);
        let cache = TableCache::default();
        let pos = Tensor::from_slice(&positions(&cu));
        let (dc, ds) = cache.gather(&inv, &pos, 295).unwrap();
        assert_eq!(dc.size(), hc.size());
        for (a, b) in [(&dc, &hc), (&ds, &hs)] {
            let d = f64::try_from((a - b).abs().max()).unwrap();
            assert!(d <= 1e-7, "device vs host tables differ by {d}");
        }
        // A shorter batch reuses the 512-entry table; a longer one grows it.
        let short = Tensor::from_slice(&[0i64, 1, 2]);
        let (c3, _) = cache.gather(&inv, &short, 3).unwrap();
        assert_eq!(f64::try_from((c3 - dc.narrow(0, 0, 3)).abs().max()).unwrap(), 0.0);
        assert_eq!(cache.tables.lock().unwrap().as_ref().unwrap().0, 512);
        let long = Tensor::from_slice(&[600i64]);
        let _ = cache.gather(&inv, &long, 601).unwrap();
        assert_eq!(cache.tables.lock().unwrap().as_ref().unwrap().0, 1024);
    }
}
