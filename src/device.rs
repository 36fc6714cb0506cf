//! Choosing the Burn device to run on: by name, among the backends compiled in
//! ([`DeviceChoice`]), or on another process or machine by the address of a worker serving it
//! ([`remote_device`], `ws://HOST:PORT[#INDEX]`; [`WatchedEngine`] bounds the waits on it).

mod remote;
mod watch;

pub use remote::{CONNECT_TIMEOUT, RemoteDeviceError, WORKER_TOKEN_ENV, WorkerAddress, remote_device};
pub(crate) use watch::panic_message;
pub use watch::{WatchedEngine, WorkerError};

use burn::tensor::Device;

/// A device backend a user can ask for (`--device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// Burn's pure-Rust CPU backend (multi-threaded, SIMD).
    Flex,
    /// CubeCL on wgpu (Vulkan, Metal, DX12 or GL, whichever the system has).
    Wgpu,
    /// CubeCL on Vulkan with the SPIR-V compiler.
    Vulkan,
    /// CubeCL on CUDA.
    Cuda,
    /// CubeCL on Metal.
    Metal,
}

/// The requested backend is not part of this build.
#[derive(Debug, thiserror::Error)]
#[error("device `{0}` is not compiled into this build: rebuild with `--features {0}`")]
pub struct NotCompiled(pub &'static str);

impl DeviceChoice {
    /// Lower-case name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Flex => "flex",
            Self::Wgpu => "wgpu",
            Self::Vulkan => "vulkan",
            Self::Cuda => "cuda",
            Self::Metal => "metal",
        }
    }

    /// The best backend of this build: a native GPU runtime (CUDA, then Metal, then Vulkan) when
    /// compiled in, else Flex. Plain `wgpu` is only used when asked for, because on a machine
    /// without a GPU it runs on a software rasterizer that is slower than Flex.
    pub fn best_available() -> Self {
        if cfg!(feature = "cuda") {
            Self::Cuda
        } else if cfg!(feature = "metal") {
            Self::Metal
        } else if cfg!(feature = "vulkan") {
            Self::Vulkan
        } else if cfg!(feature = "flex") {
            Self::Flex
        } else {
            Self::Wgpu
        }
    }

    /// The precision `--dtype` defaults to: f16 on GPU runtimes (half the weight and KV bytes,
    /// tensor-core matmuls), f32 on the Flex CPU backend (whose matmuls are fastest in f32).
    pub fn default_precision(self) -> burn_llm_models::Precision {
        match self {
            Self::Flex => burn_llm_models::Precision::F32,
            Self::Wgpu | Self::Vulkan | Self::Cuda | Self::Metal => burn_llm_models::Precision::F16,
        }
    }

    /// The precision to run in on `device` (of this kind): `asked` when given (an error when the
    /// device cannot compute in it), otherwise [`Self::default_precision`], falling back to f32
    /// on a GPU without f16 support. The second value is the note to show on that fallback.
    pub fn precision(
        self,
        asked: Option<burn_llm_models::Precision>,
        device: &Device,
    ) -> Result<(burn_llm_models::Precision, Option<String>), burn_llm_models::ModelError> {
        use burn_llm_models::{CausalLm, Precision};
        if let Some(precision) = asked {
            CausalLm::check_precision(precision, device)?;
            return Ok((precision, None));
        }
        let default = self.default_precision();
        if CausalLm::check_precision(default, device).is_ok() {
            return Ok((default, None));
        }
        let note = format!("note: {} has no {default} support here; running in f32 (choose with --dtype)", self.name());
        Ok((Precision::F32, Some(note)))
    }

    /// The device, or an error naming the feature to enable.
    pub fn device(self) -> Result<Device, NotCompiled> {
        match self {
            #[cfg(feature = "flex")]
            Self::Flex => Ok(Device::flex()),
            #[cfg(feature = "wgpu")]
            Self::Wgpu => Ok(Device::wgpu(burn::tensor::DeviceKind::DefaultDevice)),
            #[cfg(feature = "vulkan")]
            Self::Vulkan => Ok(Device::vulkan(burn::tensor::DeviceKind::DefaultDevice)),
            #[cfg(feature = "cuda")]
            Self::Cuda => Ok(Device::cuda(0usize)),
            #[cfg(feature = "metal")]
            Self::Metal => Ok(Device::metal(burn::tensor::DeviceKind::DefaultDevice)),
            #[allow(unreachable_patterns)]
            other => Err(NotCompiled(other.name())),
        }
    }

    /// Every backend compiled into this build.
    pub fn compiled() -> Vec<Self> {
        [Self::Flex, Self::Wgpu, Self::Vulkan, Self::Cuda, Self::Metal]
            .into_iter()
            .filter(|d| d.device().is_ok())
            .collect()
    }
}
