//! The contiguous cache's step layout and storage, against attention computed directly.

use burn::tensor::{Device, Tensor, TensorData};

use super::{ContiguousKvCache, KvCache, KvLayout, StepSlots, attention, causal_bias};
use crate::error::ModelError;

fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.try_into_vec_as::<f32>().unwrap()
}

fn ids<const D: usize>(t: Tensor<D, burn::tensor::Int>) -> Vec<i64> {
    t.try_into_vec_as::<i64>().unwrap()
}

#[test]
fn steps_left_pad_and_let_sequences_sit_out() {
    let device = Device::flex();
    let mut steps = StepSlots::new(2, 8, &device);
    let first = steps.begin_step(&[&[1, 2, 3], &[4]]).unwrap();
    assert_eq!(ids(first.tokens), vec![1, 2, 3, 0, 0, 4]);
    assert_eq!(ids(first.positions), vec![0, 1, 2, 0, 0, 0]);
    assert_eq!((first.max_position, first.last), (2, vec![Some(2), Some(2)]));
    assert_eq!((steps.range(), steps.len(0), steps.len(1)), (0..3, 3, 1));
    // Row 0 is causal.
    let bias = values(steps.bias());
    let masked: Vec<bool> = bias.iter().map(|&b| b < -1.0).collect();
    // Row 1's padding queries see nothing; its token sees only its own slot.
    let rows = [
        [false, true, true],
        [false, false, true],
        [false, false, false],
        [true, true, true],
        [true, true, true],
        [true, true, false],
    ];
    assert_eq!(masked, rows.concat());

    let second = steps.begin_step(&[&[5], &[]]).unwrap();
    assert_eq!(ids(second.positions), vec![3, 0]);
    assert_eq!(second.last, vec![Some(0), None]);
    assert_eq!((steps.range(), steps.used()), (3..4, 4));
    let masked: Vec<bool> = values(steps.bias()).iter().map(|&b| b < -1.0).collect();
    assert_eq!(masked, vec![false, false, false, false, true, true, false, true]);
}

#[test]
fn steps_refuse_bad_layouts() {
    let mut steps = StepSlots::new(2, 3, &Device::flex());
    assert!(matches!(steps.begin_step(&[&[1]]), Err(ModelError::BatchMismatch(_))));
    assert!(matches!(steps.begin_step(&[&[], &[]]), Err(ModelError::BatchMismatch(_))));
    assert!(matches!(
        steps.begin_step(&[&[1, 2], &[3, 4, 5, 6]]),
        Err(ModelError::CacheFull { needed: 4, capacity: 3 })
    ));
    assert_eq!(steps.used(), 0, "a refused step changes nothing");
}

/// Each layer keeps its own keys and values across steps: the decode step of every layer attends
/// over that layer's prompt keys and values.
#[test]
fn layers_keep_their_own_slots_across_steps() {
    let device = Device::flex();
    let layout = KvLayout { num_layers: 3, num_kv_heads: 1, head_dim: 2, dtype: Default::default() };
    let mut cache = ContiguousKvCache::new(layout, 1, 4, &device);
    let tensor = |v: Vec<f32>, s: usize| Tensor::<4>::from_data(TensorData::new(v, [1, 1, s, 2]), &device);
    let kv = |layer: usize, s: usize, offset: usize| {
        let v: Vec<f32> = (0..2 * s).map(|i| ((layer * 7 + offset + i) % 5) as f32 - 2.0).collect();
        tensor(v, s)
    };
    cache.begin_step(&[&[1, 2]]).unwrap();
    for layer in 0..3 {
        cache.attend(layer, kv(layer, 2, 0), kv(layer, 2, 0), kv(layer, 2, 1), 0.5, None).unwrap();
    }
    cache.begin_step(&[&[3]]).unwrap();
    for layer in [0, 1, 2] {
        let q = kv(layer, 1, 3);
        let got = values(cache.attend(layer, q.clone(), kv(layer, 1, 4), kv(layer, 1, 5), 0.5, None).unwrap());
        let k = Tensor::cat(vec![kv(layer, 2, 0), kv(layer, 1, 4)], 2);
        let v = Tensor::cat(vec![kv(layer, 2, 1), kv(layer, 1, 5)], 2);
        let expected = values(attention(q, k, v, causal_bias(2, 1, 3, &device), 0.5));
        for (g, e) in got.iter().zip(&expected) {
            assert!((g - e).abs() < 1e-5, "layer {layer}: {got:?} vs {expected:?}");
        }
    }
    assert_eq!(cache.steps().len(0), 3);
}

/// A local layer's mask hides keys `window` or more positions back, counting real tokens only
/// (padding slots shift slots, not positions), on top of the padding and causal mask.
#[test]
fn window_bias_hides_keys_outside_the_window() {
    let device = Device::flex();
    let mut steps = StepSlots::new(2, 8, &device);
    steps.begin_step(&[&[1, 2, 3, 4], &[5, 6]]).unwrap();
    let masked: Vec<bool> = values(steps.window_bias(2)).iter().map(|&b| b < -1.0).collect();
    let rows = [
        // Sequence 0, positions 0..4: each sees itself and the one before.
        [false, true, true, true],
        [false, false, true, true],
        [true, false, false, true],
        [true, true, false, false],
        // Sequence 1, two padding slots then positions 0 and 1.
        [true, true, true, true],
        [true, true, true, true],
        [true, true, false, true],
        [true, true, false, false],
    ];
    // Padding query rows keep the plain mask (they see nothing real either way).
    let plain: Vec<bool> = values(steps.bias()).iter().map(|&b| b < -1.0).collect();
    assert_eq!(masked[16..24], plain[16..24]);
    assert_eq!(masked[..16], rows[..4].concat()[..]);
    assert_eq!(masked[24..], rows[6..].concat()[..]);
    // A decode step: position 4 of sequence 0 sees positions 3 and 4 only.
    steps.begin_step(&[&[7], &[8]]).unwrap();
    let masked: Vec<bool> = values(steps.window_bias(2)).iter().map(|&b| b < -1.0).collect();
    assert_eq!(masked[..5], [true, true, true, false, false]);
    assert_eq!(masked[5..], [true, true, true, false, false]);
}
