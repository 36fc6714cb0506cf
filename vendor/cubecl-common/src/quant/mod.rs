/// Presets for quantization schemes.
pub mod presets;
/// Types representing the quantization scheme
pub mod scheme;
