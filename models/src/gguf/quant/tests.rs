//! Decoding against the PyPI `gguf` package (fixtures from
//! `scripts/make_gguf_quant_fixtures.py`), the repacking against decoding, and type names.

use super::*;

fn f16_bytes(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

#[test]
fn q4_1_decodes_low_then_high_nibbles() {
    let mut block = Vec::new();
    block.extend_from_slice(&f16_bytes(0.5));
    block.extend_from_slice(&f16_bytes(-1.0));
    block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let out = dequantize(GgmlType::Q4_1, &block).unwrap();
    assert_eq!(out.len(), 32);
    assert_eq!(out[0], -1.0);
    assert_eq!(out[3], 0.5);
    assert_eq!(out[16], 15.0 * 0.5 - 1.0);
    assert_eq!(out[31], -1.0);
}

#[test]
fn q4_0_is_centered_on_eight_and_q8_0_is_signed() {
    let mut block = f16_bytes(2.0).to_vec();
    block.extend(std::iter::repeat_n(0x8F, 16));
    let out = dequantize(GgmlType::Q4_0, &block).unwrap();
    assert_eq!((out[0], out[16]), (14.0, 0.0));

    let mut block = f16_bytes(0.25).to_vec();
    block.extend((0..32).map(|i: i32| (i - 16) as i8 as u8));
    let out = dequantize(GgmlType::Q8_0, &block).unwrap();
    assert_eq!((out[0], out[31]), (-4.0, 15.0 * 0.25));
}

#[test]
fn sizes_need_whole_blocks() {
    assert_eq!(GgmlType::Q4_1.byte_size(64), Some(40));
    assert_eq!(GgmlType::Q8_0.byte_size(33), None);
    assert_eq!(GgmlType::F16.byte_size(3), Some(6));
}

/// Every quantized type with its fixture: blocks written (or, for the K-quants, decoded) by the
/// `gguf` package, and the package's `gguf.quants.dequantize` of them.
fn fixtures() -> Vec<(GgmlType, Vec<u8>, Vec<f32>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gguf-quants");
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];
    types
        .into_iter()
        .map(|kind| {
            let read = |ext: &str| std::fs::read(dir.join(format!("{kind}.{ext}"))).unwrap();
            let expected = read("f32").chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            (kind, read("blocks"), expected)
        })
        .collect()
}

/// Bit-identical to `gguf.quants.dequantize`, for every quantized type (compared as bits, so a
/// sign of zero or a NaN pattern counts too).
#[test]
fn dequantize_matches_the_gguf_package_bit_for_bit() {
    for (kind, blocks, expected) in fixtures() {
        let out = dequantize(kind, &blocks).unwrap();
        assert_eq!(out.len(), expected.len(), "{kind}");
        for (i, (a, b)) in out.iter().zip(&expected).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{kind} value {i}: {a} vs gguf's {b}");
        }
    }
}

/// Decoding the repacked codes as `q · scale + min` gives exactly what `dequantize` gives (as
/// `f32` values: a `−0` may come back `+0`), with each type's documented bits and group.
#[test]
fn repacked_blocks_decode_like_ggml() {
    for (kind, blocks, expected) in fixtures() {
        let r = repack_blocks(kind, &blocks).unwrap();
        let layout = kind.layout().unwrap();
        assert_eq!((r.bits, r.group), (layout.bits, layout.group), "{kind}");
        let per = 32 / r.bits as usize;
        let mask = (1u32 << r.bits) - 1;
        assert_eq!((r.codes.len() * per, r.scale.len() * r.group), (expected.len(), expected.len()), "{kind}");
        for (e, want) in expected.iter().enumerate() {
            let q = (r.codes[e / per] >> ((e % per) as u32 * r.bits)) & mask;
            let got = q as f32 * r.scale[e / r.group] + r.min[e / r.group];
            assert_eq!(got, *want, "{kind} value {e}");
        }
    }
    assert!(repack_blocks(GgmlType::F16, &[0, 0]).is_none());
}

#[test]
fn types_are_named_like_ggml() {
    assert_eq!(GgmlType::from_id(12).to_string(), "Q4_K");
    assert_eq!(GgmlType::from_id(23).to_string(), "IQ4_XS");
    assert_eq!(GgmlType::from_id(99).to_string(), "type 99");
    for kind in GgmlType::SUPPORTED {
        assert!(!matches!(kind, GgmlType::Other(_)));
        assert!(GgmlType::supported_names().contains(&kind.name()));
    }
    assert_eq!(GgmlType::Q6_K.byte_size(512), Some(420));
    assert_eq!(GgmlType::Q4_K.byte_size(32), None);
}
