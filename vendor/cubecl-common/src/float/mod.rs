mod comptime_float;
#[cfg(feature = "fp4")]
mod fp4;
mod fp6;
#[cfg(feature = "fp8")]
mod fp8;
mod relaxed;
mod tensor_float;

pub use comptime_float::*;
#[cfg(feature = "fp4")]
pub use fp4::*;
pub use fp6::*;
#[cfg(feature = "fp8")]
pub use fp8::*;
pub use relaxed::*;
pub use tensor_float::*;
