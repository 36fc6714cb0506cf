//! Pure-Rust twins of [`GroupQuantOps`] for Burn's Flex CPU backend, parallel over rows.

use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::backend::Flex;
use burn::tensor::TensorData;
use rayon::prelude::*;

use crate::ops::GroupQuantOps;

/// Host copies of a float tensor's values and of its 2-D shape.
fn host_f32(t: FloatTensor<Flex>) -> (Vec<f32>, [usize; 2]) {
    let data = t.into_data();
    let shape = data.shape().dims::<2>();
    let values = data
        .try_into_vec_as::<f32>()
        .expect("group quantization runs on f32 tensors");
    (values, shape)
}

impl GroupQuantOps for Flex {
    /// Row-parallel; per input `k` and group, `out += (x·scale)·q + x·min`, decoding each packed word
    /// once, so the weight is never expanded to `f32` in memory.
    fn fused_qmatmul(
        x: FloatTensor<Self>,
        codes: IntTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
    ) -> FloatTensor<Self> {
        let (x, [m, k_len]) = host_f32(x);
        let data = codes.into_data();
        let words = data.shape().dims::<2>()[1];
        let codes = data.try_into_vec_as::<u32>().expect("codes are u32");
        let (scale, _) = host_f32(scale);
        let (min, _) = host_f32(min);
        let per = 32 / bits as usize;
        let mask = (1u32 << bits) - 1;
        let n = words * per;
        let groups = n / group;
        let words_per_group = group / per;
        let mut out = vec![0f32; m * n];
        out.par_chunks_mut(n.max(1)).enumerate().for_each(|(i, row)| {
            let xs = &x[i * k_len..(i + 1) * k_len];
            for (k, &xk) in xs.iter().enumerate() {
                if xk == 0.0 {
                    continue;
                }
                let code_row = &codes[k * words..(k + 1) * words];
                for g in 0..groups {
                    let a = xk * scale[k * groups + g];
                    let b = xk * min[k * groups + g];
                    let cols = &mut row[g * group..(g + 1) * group];
                    let packed = &code_row[g * words_per_group..(g + 1) * words_per_group];
                    for (w, &word) in packed.iter().enumerate() {
                        for (t, out) in cols[w * per..(w + 1) * per].iter_mut().enumerate() {
                            let q = (word >> (t as u32 * bits)) & mask;
                            *out += a * q as f32 + b;
                        }
                    }
                }
            }
        });
        burn::backend::flex::FlexTensor::from_data(TensorData::new(out, [m, n]))
    }

    fn pack_groups(
        x: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
    ) -> IntTensor<Self> {
        let (x, [rows, cols]) = host_f32(x);
        let (scale, _) = host_f32(scale);
        let (min, _) = host_f32(min);
        let per = 32 / bits as usize;
        let top = ((1u32 << bits) - 1) as f32;
        let groups = cols / group;
        let mut codes = vec![0u32; rows * cols / per];
        codes
            .par_chunks_mut((cols / per).max(1))
            .zip(x.par_chunks(cols.max(1)))
            .enumerate()
            .for_each(|(row, (out, values))| {
                for (w, word) in out.iter_mut().enumerate() {
                    let mut packed = 0u32;
                    for i in 0..per {
                        let col = w * per + i;
                        let g = row * groups + col / group;
                        let (s, m) = (scale[g], min[g]);
                        let q = if s > 0.0 { ((values[col] - m) / s).round().clamp(0.0, top) } else { 0.0 };
                        packed |= (q as u32) << (i as u32 * bits);
                    }
                    *word = packed;
                }
            });
        burn::backend::flex::FlexTensor::from_data(TensorData::new(codes, [rows, cols / per]))
    }

    fn unpack_groups(
        codes: IntTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
    ) -> FloatTensor<Self> {
        let data = codes.into_data();
        let [rows, words] = data.shape().dims::<2>();
        let codes = data.try_into_vec_as::<u32>().expect("codes are u32");
        let (scale, _) = host_f32(scale);
        let (min, _) = host_f32(min);
        let per = 32 / bits as usize;
        let mask = (1u32 << bits) - 1;
        let cols = words * per;
        let groups = cols / group;
        let mut out = vec![0f32; rows * cols];
        out.par_chunks_mut(cols.max(1)).enumerate().for_each(|(row, values)| {
            for (col, v) in values.iter_mut().enumerate() {
                let q = (codes[row * words + col / per] >> ((col % per) as u32 * bits)) & mask;
                let g = row * groups + col / group;
                *v = q as f32 * scale[g] + min[g];
            }
        });
        burn::backend::flex::FlexTensor::from_data(TensorData::new(out, [rows, cols]))
    }
}
