//! A minimal GGUF v3 writer for tests: files converted in Rust, and parsed files rewritten with
//! their metadata or tensors changed.

use burn_llm::models::gguf::{GgmlType, GgufHeader, GgufValue};

/// Metadata values the writer knows.
pub enum Meta {
    U32(u32),
    F32(f32),
    Bool(bool),
    Str(String),
    Strs(Vec<String>),
    I32s(Vec<i32>),
    /// Any parsed value, written with 64-bit numbers (readers widen every integer and float).
    Value(GgufValue),
}

/// A minimal GGUF v3 writer (little-endian, alignment 32).
#[derive(Default)]
pub struct Writer {
    pub meta: Vec<(String, Meta)>,
    /// name, PyTorch shape, GGML type id, raw bytes
    pub tensors: Vec<(String, Vec<usize>, u32, Vec<u8>)>,
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Writer {
    pub fn meta(&mut self, key: &str, value: Meta) {
        self.meta.push((key.into(), value));
    }

    pub fn f32_tensor(&mut self, name: &str, shape: Vec<usize>, values: &[f32]) {
        self.tensors.push((name.into(), shape, 0, values.iter().flat_map(|v| v.to_le_bytes()).collect()));
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(0x4655_4747u32.to_le_bytes());
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.meta.len() as u64).to_le_bytes());
        for (key, value) in &self.meta {
            put_str(&mut out, key);
            match value {
                Meta::U32(v) => {
                    out.extend(4u32.to_le_bytes());
                    out.extend(v.to_le_bytes());
                }
                Meta::F32(v) => {
                    out.extend(6u32.to_le_bytes());
                    out.extend(v.to_le_bytes());
                }
                Meta::Bool(v) => {
                    out.extend(7u32.to_le_bytes());
                    out.push(*v as u8);
                }
                Meta::Str(s) => {
                    out.extend(8u32.to_le_bytes());
                    put_str(&mut out, s);
                }
                Meta::Strs(items) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(8u32.to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    items.iter().for_each(|s| put_str(&mut out, s));
                }
                Meta::I32s(items) => {
                    out.extend(9u32.to_le_bytes());
                    out.extend(5u32.to_le_bytes());
                    out.extend((items.len() as u64).to_le_bytes());
                    items.iter().for_each(|v| out.extend(v.to_le_bytes()));
                }
                Meta::Value(value) => {
                    out.extend(value_type(value).to_le_bytes());
                    put_value(&mut out, value);
                }
            }
        }
        let mut offset = 0u64;
        let mut offsets = Vec::new();
        for (name, shape, kind, data) in &self.tensors {
            put_str(&mut out, name);
            out.extend((shape.len() as u32).to_le_bytes());
            for d in shape.iter().rev() {
                out.extend((*d as u64).to_le_bytes());
            }
            out.extend(kind.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offsets.push(offset);
            offset = (offset + data.len() as u64).div_ceil(32) * 32;
        }
        out.resize(out.len().div_ceil(32) * 32, 0);
        let start = out.len();
        for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
            out.resize(start + off as usize, 0);
            out.extend(data);
        }
        out
    }
}

/// GGUF's type id of a metadata value as [`put_value`] writes it.
fn value_type(value: &GgufValue) -> u32 {
    match value {
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
    }
}

fn put_value(out: &mut Vec<u8>, value: &GgufValue) {
    match value {
        GgufValue::U64(v) => out.extend(v.to_le_bytes()),
        GgufValue::I64(v) => out.extend(v.to_le_bytes()),
        GgufValue::F64(v) => out.extend(v.to_le_bytes()),
        GgufValue::Bool(v) => out.push(*v as u8),
        GgufValue::String(s) => put_str(out, s),
        GgufValue::Array(items) => {
            out.extend(items.first().map_or(4, value_type).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            items.iter().for_each(|v| put_value(out, v));
        }
    }
}

/// GGML's id of a tensor type (the inverse of [`GgmlType::from_id`]).
fn type_id(kind: GgmlType) -> u32 {
    (0..256).find(|&id| GgmlType::from_id(id) == kind).expect("a GGML type id below 256")
}

impl Writer {
    /// The file `bytes` as a writer holding its metadata and tensors, to be changed and written
    /// again.
    pub fn from_file(bytes: &[u8]) -> Self {
        let header = GgufHeader::parse(bytes).unwrap();
        let meta = header.metadata.into_iter().map(|(k, v)| (k, Meta::Value(v))).collect();
        let tensors = header
            .tensors
            .iter()
            .map(|t| (t.name.clone(), t.shape(), type_id(t.kind), bytes[t.range.clone()].to_vec()))
            .collect();
        Self { meta, tensors }
    }

    /// Replaces (or adds) metadata `key`.
    pub fn set(&mut self, key: &str, value: Meta) {
        self.meta.retain(|(k, _)| k != key);
        self.meta.push((key.into(), value));
    }

    /// Drops tensor `name`.
    pub fn drop_tensor(&mut self, name: &str) {
        let before = self.tensors.len();
        self.tensors.retain(|(n, ..)| n != name);
        assert_eq!(self.tensors.len() + 1, before, "no tensor `{name}` to drop");
    }
}
