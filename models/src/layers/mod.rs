//! Building blocks of the shared decoder, each loadable from an HF checkpoint.

pub mod attention;
pub mod embedding;
pub mod fuse;
pub mod linear;
pub mod mlp;
pub mod norm;
pub mod projection;
pub mod rope;
