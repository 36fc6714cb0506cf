//! Bad arguments to the paged kernels are errors, never panics.

use super::*;

/// Bad arguments are errors, never panics; `_mut` forms leave the cache untouched on error.
#[test]
fn bad_arguments_are_errors() {
    let device = Device::flex();
    let cache = Tensor::<4>::zeros([4, 2, 4, 8], &device);
    let new = Tensor::<3>::ones([2, 2, 8], &device);
    let c = || cache.clone();
    assert!(matches!(reshape_and_cache(c(), new.clone(), &[1]), Err(PagedKernelError::Length { .. })));
    assert!(matches!(reshape_and_cache(c(), new.clone(), &[1, 16]), Err(PagedKernelError::Slot { slot: 16, .. })));
    assert!(matches!(reshape_and_cache(c(), new.clone(), &[3, 3]), Err(PagedKernelError::Duplicate { index: 3, .. })));
    let wrong_heads = Tensor::<3>::ones([2, 1, 8], &device);
    assert!(matches!(reshape_and_cache(c(), wrong_heads, &[1, 2]), Err(PagedKernelError::Shape { .. })));
    let half = Tensor::<3>::ones([2, 2, 8], (&device, burn::tensor::DType::F16));
    assert!(matches!(reshape_and_cache(c(), half, &[1, 2]), Err(PagedKernelError::DType(_))));
    let empty = Tensor::<4>::zeros([4, 0, 4, 8], &device);
    assert!(matches!(reshape_and_cache(empty, new.clone(), &[1, 2]), Err(PagedKernelError::CacheShape(_))));

    let mut kept = Tensor::<4>::ones([4, 2, 4, 8], &device);
    assert!(reshape_and_cache_mut(&mut kept, new.clone(), &[0, 99]).is_err());
    assert!(copy_blocks_mut(&mut kept, &[(0, 4)]).is_err());
    assert!(write_blocks_mut(&mut kept, &[9], Tensor::zeros([1, 2, 4, 8], &device)).is_err());
    assert!(values(kept).iter().all(|&x| x == 1.0), "a failed write touched the cache");

    assert!(matches!(copy_blocks(c(), &[(0, 4)]), Err(PagedKernelError::Block { block: 4, .. })));
    assert!(matches!(copy_blocks(c(), &[(0, 1), (2, 1)]), Err(PagedKernelError::Duplicate { index: 1, .. })));
    assert!(matches!(copy_blocks(c(), &[(0, 1), (1, 2)]), Err(PagedKernelError::CopyOverlap(1))));
    let blocks = Tensor::<4>::zeros([2, 2, 4, 8], &device);
    assert!(matches!(write_blocks(c(), &[0], blocks.clone()), Err(PagedKernelError::Length { .. })));
    assert!(matches!(write_blocks(c(), &[0, 0], blocks.clone()), Err(PagedKernelError::Duplicate { .. })));
    assert!(matches!(write_blocks(c(), &[0, 5], blocks), Err(PagedKernelError::Block { block: 5, .. })));
    assert!(matches!(
        write_blocks(c(), &[0], Tensor::zeros([1, 2, 2, 8], &device)),
        Err(PagedKernelError::Shape { .. })
    ));
    assert!(matches!(read_blocks(&cache, &[4]), Err(PagedKernelError::Block { block: 4, .. })));

    let q = Tensor::<3>::ones([2, 4, 8], &device);
    let attend = |q: Tensor<3>, tables: &[u32], max_blocks: usize, seq: &[u32], lens: &[u32]| {
        paged_attention(q, &cache, &cache, tables, max_blocks, seq, lens, 1.0)
    };
    assert!(attend(q.clone(), &[0, 1, 2, 3], 2, &[0, 1], &[8, 3]).is_ok());
    assert!(matches!(attend(q.clone(), &[0, 1, 2], 2, &[0, 1], &[8, 3]), Err(PagedKernelError::BlockTable { .. })));
    assert!(matches!(attend(q.clone(), &[0, 1, 2, 3], 0, &[0, 1], &[8, 3]), Err(PagedKernelError::BlockTable { .. })));
    assert!(matches!(attend(q.clone(), &[0, 1, 2, 3], 2, &[0], &[8, 3]), Err(PagedKernelError::Length { .. })));
    assert!(matches!(attend(q.clone(), &[0, 1, 2, 3], 2, &[0, 1], &[8]), Err(PagedKernelError::Length { .. })));
    assert!(matches!(
        attend(q.clone(), &[0, 1, 2, 3], 2, &[0, 2], &[8, 3]),
        Err(PagedKernelError::Sequence { row: 2, .. })
    ));
    assert!(matches!(
        attend(q.clone(), &[0, 1, 2, 3], 2, &[0, 1], &[9, 3]),
        Err(PagedKernelError::Context { len: 9, .. })
    ));
    assert!(matches!(
        attend(q.clone(), &[0, 7, 2, 3], 2, &[0, 1], &[8, 3]),
        Err(PagedKernelError::Block { block: 7, .. })
    ));
    // An out-of-range entry past the context is never read, so it is fine.
    assert!(attend(q.clone(), &[0, 7, 2, 3], 2, &[0, 1], &[4, 3]).is_ok());
    assert!(matches!(
        attend(Tensor::ones([2, 3, 8], &device), &[0, 1, 2, 3], 2, &[0, 1], &[8, 3]),
        Err(PagedKernelError::Heads { .. })
    ));
    assert!(matches!(
        attend(Tensor::ones([2, 4, 4], &device), &[0, 1, 2, 3], 2, &[0, 1], &[8, 3]),
        Err(PagedKernelError::Shape { .. })
    ));
    let v = Tensor::<4>::zeros([4, 2, 4, 4], &device);
    assert!(matches!(
        paged_attention(q.clone(), &cache, &v, &[0], 1, &[0, 0], &[1, 1], 1.0),
        Err(PagedKernelError::Shape { .. })
    ));
    // No queries: an empty result, whatever the table.
    let none = paged_attention(Tensor::zeros([0, 4, 8], &device), &cache, &cache, &[], 0, &[], &[], 1.0).unwrap();
    assert_eq!(none.dims(), [0, 4, 8]);
}

/// Mixed devices are an error, not a panic.
#[cfg(any(feature = "wgpu", feature = "vulkan"))]
#[test]
fn mixed_devices_are_errors() {
    let Some(gpu) = gpu_device() else { return };
    let cache = Tensor::<4>::zeros([4, 2, 4, 8], &gpu);
    let new = Tensor::<3>::ones([1, 2, 8], &Device::flex());
    assert_eq!(reshape_and_cache(cache.clone(), new, &[0]).unwrap_err(), PagedKernelError::Device);
    let q = Tensor::<3>::ones([1, 2, 8], &Device::flex());
    assert_eq!(paged_attention(q, &cache, &cache, &[0], 1, &[0], &[1], 1.0).unwrap_err(), PagedKernelError::Device);
}
