//! CubeCL kernels of [`GroupQuantOps`] for every GPU runtime (wgpu, Vulkan, CUDA, Metal).

use burn::backend::TensorMetadata;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::{FloatTensor, IntTensor};
use burn::tensor::{DType, Shape};
use burn_cubecl::CubeBackend;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_dtype;
use cubecl::{calculate_cube_count_elemwise, prelude::*};

use super::ops::GroupQuantOps;

/// One thread per output word: quantizes its `32 / bits` values and packs them.
#[cube(launch)]
fn pack_kernel<F: Float>(
    x: &Tensor<F>,
    scale: &Tensor<F>,
    min: &Tensor<F>,
    codes: &mut Tensor<u32>,
    cols: usize,
    group: usize,
    bits: u32,
    #[define(F)] _dtype: ElemType,
) {
    let word = ABSOLUTE_POS;
    if word >= codes.len() {
        terminate!();
    }
    let per = 32 / bits as usize;
    let words_per_row = cols / per;
    let row = word / words_per_row;
    let first_col = (word % words_per_row) * per;
    let g = row * (cols / group) + first_col / group;
    let s = scale[g];
    let m = min[g];
    let top = F::cast_from((1u32 << bits) - 1u32);
    let mut packed = 0u32;
    for i in 0..per {
        let v = x[row * cols + first_col + i];
        let mut q = F::new(0.0);
        if s > F::new(0.0) {
            q = F::clamp(F::round((v - m) / s), F::new(0.0), top);
        }
        packed |= u32::cast_from(q) << (u32::cast_from(i) * bits);
    }
    codes[word] = packed;
}

/// One thread per output value.
#[cube(launch)]
fn unpack_kernel<F: Float>(
    codes: &Tensor<u32>,
    scale: &Tensor<F>,
    min: &Tensor<F>,
    out: &mut Tensor<F>,
    cols: usize,
    group: usize,
    bits: u32,
    #[define(F)] _dtype: ElemType,
) {
    let idx = ABSOLUTE_POS;
    if idx >= out.len() {
        terminate!();
    }
    let per = 32 / bits as usize;
    let row = idx / cols;
    let col = idx % cols;
    let word = codes[row * (cols / per) + col / per];
    let mask = (1u32 << bits) - 1u32;
    let q = (word >> (u32::cast_from(col % per) * bits)) & mask;
    let g = row * (cols / group) + col / group;
    out[idx] = F::cast_from(q) * scale[g] + min[g];
}

/// One thread per output value `out[i, j]`, walking the shared dimension (for `m` above
/// `MATVEC_MAX_ROWS`; below, `crate::matvec`'s kernels read each weight once). The weight is `[k, n]`
/// grouped along `n` (FlexGen), or with `transposed` `[n, k]` grouped along `k` (GGUF), chosen at
/// compile time.
#[cube(launch)]
fn qmatmul_kernel<F: Float>(
    x: &Tensor<F>,
    codes: &Tensor<u32>,
    scale: &Tensor<F>,
    min: &Tensor<F>,
    out: &mut Tensor<F>,
    k_len: usize,
    n: usize,
    group: usize,
    bits: u32,
    #[comptime] transposed: bool,
    #[define(F)] _dtype: ElemType,
) {
    let idx = ABSOLUTE_POS;
    if idx >= out.len() {
        terminate!();
    }
    let per = 32 / bits as usize;
    let i = idx / n;
    let j = idx % n;
    let mask = (1u32 << bits) - 1u32;
    // Accumulated in `f32` whatever `F` is: a half-precision sum over thousands of products
    // would lose most of its mantissa.
    let mut acc = f32::new(0.0);
    for k in 0..k_len {
        // (word index, code index within the word, group index) of W's element for (k, j).
        let (word, code, g) = if transposed {
            (j * (k_len / per) + k / per, k % per, j * (k_len / group) + k / group)
        } else {
            (k * (n / per) + j / per, j % per, k * (n / group) + j / group)
        };
        let q = (codes[word] >> (u32::cast_from(code) * bits)) & mask;
        acc += f32::cast_from(x[i * k_len + k]) * f32::cast_from(F::cast_from(q) * scale[g] + min[g]);
    }
    out[idx] = F::cast_from(acc);
}

impl GroupQuantOps for CubeBackend {
    fn fused_qmatmul(
        x: FloatTensor<Self>,
        codes: IntTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
    ) -> FloatTensor<Self> {
        let n = codes.shape().dims::<2>()[1] * 32 / bits as usize;
        launch_qmatmul(x, codes, scale, min, n, bits, group, false)
    }

    fn fused_qmatmul_nt(
        x: FloatTensor<Self>,
        codes: IntTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
        _int8_rows: u32,
        _symmetric_offset: u32,
    ) -> FloatTensor<Self> {
        let n = codes.shape().dims::<2>()[0];
        launch_qmatmul(x, codes, scale, min, n, bits, group, true)
    }

    fn pack_groups(
        x: FloatTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
    ) -> IntTensor<Self> {
        let (x, scale, min) = (into_contiguous(x), into_contiguous(scale), into_contiguous(min));
        let [rows, cols] = x.shape().dims::<2>();
        let words = rows * cols * bits as usize / 32;
        let client = x.client.clone();
        let codes = empty_device_dtype(
            client.clone(),
            x.device.clone(),
            Shape::new([rows, cols * bits as usize / 32]),
            DType::U32,
        );
        let cube_dim = CubeDim::new(&client, words);
        let cube_count = calculate_cube_count_elemwise(&client, words, cube_dim);
        let dtype = dtype_to_storage_type(x.dtype);
        pack_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            x.into_tensor_arg(),
            scale.into_tensor_arg(),
            min.into_tensor_arg(),
            codes.clone().into_tensor_arg(),
            cols,
            group,
            bits,
            dtype,
        );
        codes
    }

    fn unpack_groups(
        codes: IntTensor<Self>,
        scale: FloatTensor<Self>,
        min: FloatTensor<Self>,
        bits: u32,
        group: usize,
    ) -> FloatTensor<Self> {
        let (codes, scale, min) = (into_contiguous(codes), into_contiguous(scale), into_contiguous(min));
        let [rows, words] = codes.shape().dims::<2>();
        let cols = words * 32 / bits as usize;
        let client = scale.client.clone();
        let out = empty_device_dtype(client.clone(), scale.device.clone(), Shape::new([rows, cols]), scale.dtype);
        let n = rows * cols;
        let cube_dim = CubeDim::new(&client, n);
        let cube_count = calculate_cube_count_elemwise(&client, n, cube_dim);
        let dtype = dtype_to_storage_type(scale.dtype);
        unpack_kernel::launch(
            &client,
            cube_count,
            cube_dim,
            codes.into_tensor_arg(),
            scale.into_tensor_arg(),
            min.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            cols,
            group,
            bits,
            dtype,
        );
        out
    }
}

/// Launches one of the fused matmul kernels (`transposed`: weight `[n, k]` grouped along `k`):
/// the matrix-vector kernels for decode-sized `m` (`crate::matvec`), otherwise one thread per
/// output value.
#[allow(clippy::too_many_arguments)]
fn launch_qmatmul(
    x: FloatTensor<CubeBackend>,
    codes: IntTensor<CubeBackend>,
    scale: FloatTensor<CubeBackend>,
    min: FloatTensor<CubeBackend>,
    n: usize,
    bits: u32,
    group: usize,
    transposed: bool,
) -> FloatTensor<CubeBackend> {
    let (x, codes) = (into_contiguous(x), into_contiguous(codes));
    let (scale, min) = (into_contiguous(scale), into_contiguous(min));
    let [m, k_len] = x.shape().dims::<2>();
    if crate::matvec::quantized_applies(m) {
        return crate::matvec::cube_quant::launch_qmatvec(x, codes, scale, min, n, bits, group, transposed);
    }
    let client = x.client.clone();
    let out = empty_device_dtype(client.clone(), x.device.clone(), Shape::new([m, n]), x.dtype);
    let cube_dim = CubeDim::new(&client, m * n);
    let cube_count = calculate_cube_count_elemwise(&client, m * n, cube_dim);
    let dtype = dtype_to_storage_type(x.dtype);
    qmatmul_kernel::launch(
        &client,
        cube_count,
        cube_dim,
        x.into_tensor_arg(),
        codes.into_tensor_arg(),
        scale.into_tensor_arg(),
        min.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        k_len,
        n,
        group,
        bits,
        transposed,
        dtype,
    );
    out
}
