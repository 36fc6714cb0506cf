//! The offloaded cache: a disk layer attends only with its slots in (an error otherwise, not a
//! panic), and a layer's slots survive the round trip through the disk tier's parts.

use burn::tensor::{Device, Tensor, TensorData};
use burn_llm_kernels::QuantSpec;
use burn_llm_models::cache::{KV_QUANT_AXIS, LayerSlots};
use burn_llm_models::{KvCache, KvLayout};

use super::parts::{from_slot_data, part_shapes, slot_data};
use super::{KvPlacement, OffloadKvCache};

const LAYOUT: KvLayout =
    KvLayout { num_layers: 2, num_kv_heads: 1, head_dim: 8, dtype: burn_llm_models::Precision::F32 };

fn values(t: Tensor<4>) -> Vec<f32> {
    t.try_into_vec_as::<f32>().unwrap()
}

#[test]
fn a_disk_layer_attends_only_with_its_slots_in() {
    let device = Device::flex();
    let home = |on_disk| KvPlacement { device: device.clone(), attend_there: true, on_disk };
    let mut cache = OffloadKvCache::new(LAYOUT, 1, 4, &device, None, vec![home(false), home(true)]).unwrap();
    cache.begin_step(&[&[1, 2]]).unwrap();
    let x = Tensor::<4>::ones([1, 1, 2, 8], &device);
    assert_eq!(values(cache.attend(0, x.clone(), x.clone(), x.clone(), 1.0, None).unwrap()), vec![1.0; 16]);

    assert!(cache.take_layer(1).is_none(), "a disk layer holds no slots between steps");
    let err = cache.attend(1, x.clone(), x.clone(), x.clone(), 1.0, None).unwrap_err();
    assert!(err.to_string().contains("layer 1"), "{err}");

    cache.put_layer(1, LayerSlots::zeros(LAYOUT, 1, 4, None, &device)).unwrap();
    assert_eq!(values(cache.attend(1, x.clone(), x.clone(), x, 1.0, None).unwrap()), vec![1.0; 16]);
    assert!(cache.take_layer(1).is_some());
    assert!(cache.put_layer(2, LayerSlots::zeros(LAYOUT, 1, 4, None, &device)).is_err());
}

#[test]
fn slots_round_trip_through_their_parts() {
    let device = Device::flex();
    let (batch, capacity) = (2, 3);
    for quant in [None, Some(QuantSpec::new(4, LAYOUT.head_dim, KV_QUANT_AXIS).unwrap())] {
        let new = |offset: f32| {
            let v: Vec<f32> = (0..batch * 2 * 8).map(|i| (i as f32 * 0.37 + offset).sin()).collect();
            Tensor::<4>::from_data(TensorData::new(v, [batch, 1, 2, 8]), &device)
        };
        let (slots, _, _) = LayerSlots::zeros(LAYOUT, batch, capacity, quant, &device).store(new(0.0), new(1.0), 0..2);
        let parts = slot_data(&slots, 0..capacity);
        let shapes = part_shapes(LAYOUT, quant);
        assert_eq!(parts.len(), shapes.len());
        for (part, (width, dtype)) in parts.iter().zip(&shapes) {
            assert_eq!(part.shape().to_vec(), vec![batch, 1, capacity, *width]);
            assert_eq!(part.dtype(), *dtype);
        }
        let back = from_slot_data(parts.clone(), quant, &device).unwrap();
        for (a, b) in slot_data(&back, 0..capacity).iter().zip(&parts) {
            assert_eq!(a.as_bytes(), b.as_bytes());
        }
        assert!(from_slot_data(parts[1..].to_vec(), quant, &device).is_err());
    }
}
