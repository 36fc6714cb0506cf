//! Text ↔ token ids with HF's `tokenizer.json`, with BOS/EOS handled the way transformers does
//! (post-processor first, `tokenizer_config.json`'s `add_bos_token`/`add_eos_token` on top), and
//! incremental detokenization for streaming.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::chat::{ChatMessage, ChatTemplate};
use crate::error::{ModelError, Result};
use crate::generation::constraint::{CompilerCache, ConstraintCompiler};

/// The chat template of a `tokenizer_config.json`: a string, or a list of named templates of which
/// the `default` one (else the first) is used.
fn template_source(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(named) => {
            let template = |t: &Value| t.get("template").and_then(Value::as_str).map(str::to_string);
            named
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .or_else(|| named.first())
                .and_then(template)
        }
        _ => None,
    }
}

/// A model's tokenizer.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<ChatTemplate>,
    /// Structured-output compilers, built on first use and shared by the clones.
    constraints: CompilerCache,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .finish()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` (and `tokenizer_config.json` when present) from a model directory.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(ModelError::MissingFile { what: "tokenizer (tokenizer.json)", path });
        }
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
        let config_path = dir.join("tokenizer_config.json");
        let config: Value = if config_path.is_file() {
            let text = std::fs::read_to_string(&config_path).map_err(|e| ModelError::io(&config_path, e))?;
            serde_json::from_str(&text).map_err(|e| ModelError::config(&config_path, e.to_string()))?
        } else {
            Value::Null
        };
        Ok(Self::new(inner, &config))
    }

    /// Wraps a `tokenizers::Tokenizer`, reading special tokens from an HF `tokenizer_config.json`
    /// value (`Value::Null` when there is none).
    pub fn new(inner: tokenizers::Tokenizer, config: &Value) -> Self {
        let special = |key: &str| {
            let token = config.get(key)?;
            let content = token.as_str().or_else(|| token.get("content")?.as_str())?;
            inner.token_to_id(content)
        };
        let flag = |key: &str| config.get(key).and_then(Value::as_bool).unwrap_or(false);
        let token_text = |key: &str| {
            let token = config.get(key)?;
            token.as_str().or_else(|| token.get("content")?.as_str()).map(str::to_string)
        };
        let chat_template = template_source(config).map(|source| {
            ChatTemplate::new(
                source,
                token_text("bos_token").unwrap_or_default(),
                token_text("eos_token").unwrap_or_default(),
            )
        });
        Self {
            chat_template,
            bos_id: special("bos_token"),
            eos_id: special("eos_token"),
            add_bos: flag("add_bos_token"),
            add_eos: flag("add_eos_token"),
            constraints: CompilerCache::default(),
            inner,
        }
    }

    /// Tokens in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Beginning-of-sequence id, if the tokenizer declares one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// End-of-sequence id, if the tokenizer declares one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Encodes `text` with the special tokens the model expects (as `tokenizer(text)` in HF).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self.inner.encode(text, true).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        let mut ids = encoding.get_ids().to_vec();
        if let Some(bos) = self.bos_id.filter(|&b| self.add_bos && ids.first() != Some(&b)) {
            ids.insert(0, bos);
        }
        if let Some(eos) = self.eos_id.filter(|&e| self.add_eos && ids.last() != Some(&e)) {
            ids.push(eos);
        }
        Ok(ids)
    }

    /// Decodes ids to text, dropping special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(|e| ModelError::Tokenizer(e.to_string()))
    }

    /// The model's chat template, if it ships one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// A conversation rendered with the chat template, the assistant's turn opened (HF
    /// `apply_chat_template(messages, add_generation_prompt=True, tokenize=False)`).
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String> {
        self.chat_template.as_ref().ok_or(ModelError::NoChatTemplate)?.render(messages, true)
    }

    /// Token ids of a conversation (HF `apply_chat_template(messages, add_generation_prompt=True)`):
    /// the template writes the special tokens itself, so none are added on top.
    pub fn apply_chat_template(&self, messages: &[ChatMessage]) -> Result<Vec<u32>> {
        self.encode_verbatim(&self.render_chat(messages)?)
    }

    /// Encodes `text` without adding any special token (special tokens written in the text are
    /// still recognized).
    pub fn encode_verbatim(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self.inner.encode(text, false).map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The structured-output compiler for a model with `vocab_size` logits whose outputs end at
    /// `eos_token_ids` (built once per pair and shared by this tokenizer's clones).
    pub fn constraint_compiler(&self, vocab_size: usize, eos_token_ids: &[u32]) -> Result<Arc<ConstraintCompiler>> {
        self.constraints.get(&self.inner, vocab_size, eos_token_ids)
    }

    /// The wrapped `tokenizers` object.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Turns a growing list of token ids into text deltas, emitting text only once it is complete
/// (no dangling UTF-8 of a byte-level token), with a little left context so that tokenizers which
/// render a leading space from context (SentencePiece) print it right. This is vLLM's
/// `detokenize_incrementally`.
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

/// Left context kept for decoding, in tokens.
const CONTEXT_TOKENS: usize = 5;

impl IncrementalDecoder {
    /// Starts after `prompt`, whose text is not emitted (only its last few tokens are kept, as
    /// left context).
    pub fn new(prompt: &[u32]) -> Self {
        let context = &prompt[prompt.len().saturating_sub(CONTEXT_TOKENS)..];
        Self { ids: context.to_vec(), prefix_offset: 0, read_offset: context.len() }
    }

    /// Adds `id` and returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String> {
        self.ids.push(id);
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..])?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.is_char_boundary(prefix.len()) {
            let delta = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(delta)
        } else {
            Ok(String::new())
        }
    }

    /// Text still held back (an incomplete character at the end), for when the sequence ends.
    pub fn flush(&mut self, tokenizer: &Tokenizer) -> Result<String> {
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..])?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(full.get(prefix.len()..).unwrap_or_default().to_string())
    }
}
