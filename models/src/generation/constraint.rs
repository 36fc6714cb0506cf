//! Structured outputs: a request's [`Constraint`] (a JSON schema, any JSON object, a regex, a
//! choice among strings, or a Lark grammar) compiled by [llguidance] into a per-sequence
//! [`ConstraintState`] that gives, at every step, the set of tokens that keep the output valid.
//!
//! llguidance is the grammar engine behind vLLM's default structured-output backend and
//! llama.cpp's: an Earley parser over a lexer of derivative-based regexes, walking the
//! tokenizer's token trie once per step, so a mask costs tens of microseconds for a 50k
//! vocabulary and needs no per-schema precompilation (schemas compile lazily, as tokens arrive).
//! It supports JSON schemas (nested objects, arrays, enums, bounds, `anyOf`, local `$ref`),
//! regexes and Lark grammars with one API. outlines-core precompiles an automaton per schema
//! (seconds for large schemas) and has no context-free grammars.
//!
//! The token trie is built from the model's own `tokenizer.json` (byte-level BPE or
//! SentencePiece byte fallback) without `toktrie_hf_tokenizers`, which pins an older
//! `tokenizers` than this workspace's.
//!
//! JSON is generated compact by default (no free whitespace between tokens, vLLM's
//! `disable-any-whitespace`): a model may otherwise emit whitespace until `max_tokens`. A schema
//! may override that with llguidance's own `"x-guidance": {"whitespace_flexible": true}`.

use std::sync::{Arc, Mutex};

use llguidance::api::TopLevelGrammar;
pub use llguidance::toktrie::SimpleVob;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{ModelError, Result};

/// What a request's output must match.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Constraint {
    /// Any JSON object (OpenAI's `response_format: {"type": "json_object"}`).
    JsonObject,
    /// A JSON value valid against this JSON schema.
    JsonSchema(Value),
    /// Text matching this regex (whole output).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text of this Lark grammar (vLLM's `guided_grammar`; llguidance's Lark dialect).
    Grammar(String),
}

impl Constraint {
    /// The constraint's kind, as error messages name it.
    pub fn kind(&self) -> &'static str {
        match self {
            Constraint::JsonObject => "json_object",
            Constraint::JsonSchema(_) => "json_schema",
            Constraint::Regex(_) => "regex",
            Constraint::Choice(_) => "choice",
            Constraint::Grammar(_) => "grammar",
        }
    }

    fn grammar(&self) -> Result<TopLevelGrammar> {
        let invalid = |message: String| ModelError::InvalidConstraint { kind: self.kind(), message };
        Ok(match self {
            Constraint::JsonObject => TopLevelGrammar::from_json_schema(compact(json!({"type": "object"}))),
            Constraint::JsonSchema(schema) => {
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(invalid(format!("a JSON schema is an object or a boolean, got {schema}")));
                }
                TopLevelGrammar::from_json_schema(compact(schema.clone()))
            }
            Constraint::Regex(regex) => TopLevelGrammar::from_regex(regex),
            Constraint::Choice(choices) => {
                if choices.is_empty() {
                    return Err(invalid("give at least one choice".into()));
                }
                let alternatives: Vec<String> = choices.iter().map(|c| escape_regex(c)).collect();
                TopLevelGrammar::from_regex(&format!("({})", alternatives.join("|")))
            }
            Constraint::Grammar(lark) => TopLevelGrammar::from_lark(lark.clone()),
        })
    }
}

/// `schema` with compact JSON unless it sets llguidance's own options.
fn compact(mut schema: Value) -> Value {
    if let Some(object) = schema.as_object_mut()
        && !object.contains_key("x-guidance")
    {
        object.insert("x-guidance".into(), json!({"whitespace_flexible": false}));
    }
    schema
}

/// `text` as a regex that matches it literally.
fn escape_regex(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if "\\.+*?()|[]{}^$#&-~\"/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The tokenizer as llguidance sees it: every token's bytes in a trie, and the tokenizer itself
/// for the few strings the grammar compiler tokenizes.
struct ModelTokEnv {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TokenizerEnv for ModelTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        match std::str::from_utf8(s).ok().and_then(|text| self.tokenizer.encode(text, false).ok()) {
            Some(encoding) => encoding.get_ids().to_vec(),
            None => self.trie.greedy_tokenize(s),
        }
    }
}

/// Compiles constraints for one model: its token trie (built once; a 50k vocabulary takes tens
/// of milliseconds) and llguidance's parser factory.
pub struct ConstraintCompiler {
    factory: ParserFactory,
    vocab_size: usize,
    eos_token_ids: Vec<u32>,
}

impl std::fmt::Debug for ConstraintCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintCompiler")
            .field("vocab_size", &self.vocab_size)
            .field("eos_token_ids", &self.eos_token_ids)
            .finish()
    }
}

impl ConstraintCompiler {
    /// The compiler for a model whose logits have `vocab_size` entries and whose generation ends
    /// at `eos_token_ids` (the tokens a finished grammar allows); the tokenizer's bytes per token
    /// come from its `tokenizer.json` form.
    pub fn new(tokenizer: &tokenizers::Tokenizer, vocab_size: usize, eos_token_ids: &[u32]) -> Result<Self> {
        let unsupported = |message: String| ModelError::Tokenizer(format!("structured outputs: {message}"));
        let serialized: Value =
            serde_json::from_str(&tokenizer.to_string(false).map_err(|e| unsupported(e.to_string()))?)
                .map_err(|e| unsupported(e.to_string()))?;
        let mut words =
            llguidance::token_bytes_from_tokenizer_json(&serialized).map_err(|e| unsupported(e.to_string()))?;
        if words.len() > vocab_size {
            return Err(unsupported(format!(
                "the tokenizer has {} tokens but the model's vocabulary only {vocab_size}",
                words.len()
            )));
        }
        words.resize(vocab_size, Vec::new());
        let ends: Vec<u32> = eos_token_ids.iter().copied().filter(|&t| (t as usize) < vocab_size).collect();
        let first_eos = ends.first().copied().ok_or_else(|| {
            unsupported("the model has no end-of-sequence token, so a constrained output could never end".into())
        })?;
        let info = TokRxInfo::new(vocab_size as u32, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&ends);
        let env: TokEnv = Arc::new(ModelTokEnv { trie, tokenizer: tokenizer.clone() });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| unsupported(e.to_string()))?;
        factory.quiet();
        Ok(Self { factory, vocab_size, eos_token_ids: eos_token_ids.to_vec() })
    }

    /// Compiles `constraint` into a fresh state; a malformed schema, regex or grammar is
    /// [`ModelError::InvalidConstraint`] with the compiler's message.
    pub fn compile(&self, constraint: &Constraint) -> Result<ConstraintState> {
        let grammar = constraint.grammar()?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| ModelError::InvalidConstraint { kind: constraint.kind(), message: e.to_string() })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(message) = matcher.get_error() {
            return Err(ModelError::InvalidConstraint { kind: constraint.kind(), message });
        }
        let ends = self.factory.tok_env().tok_trie().eos_token_set();
        Ok(ConstraintState { matcher, ends, vocab_size: self.vocab_size, next: None })
    }
}

/// Compilers shared by the clones of one [`Tokenizer`](crate::Tokenizer), one per (vocabulary,
/// end tokens) they were asked for.
#[derive(Debug, Clone, Default)]
pub(crate) struct CompilerCache(Arc<Mutex<Vec<Arc<ConstraintCompiler>>>>);

impl CompilerCache {
    pub(crate) fn get(
        &self,
        tokenizer: &tokenizers::Tokenizer,
        vocab_size: usize,
        eos_token_ids: &[u32],
    ) -> Result<Arc<ConstraintCompiler>> {
        let mut cache =
            self.0.lock().map_err(|_| ModelError::Tokenizer("constraint compiler cache poisoned".into()))?;
        if let Some(found) = cache.iter().find(|c| c.vocab_size == vocab_size && c.eos_token_ids == eos_token_ids) {
            return Ok(found.clone());
        }
        let compiler = Arc::new(ConstraintCompiler::new(tokenizer, vocab_size, eos_token_ids)?);
        cache.push(compiler.clone());
        Ok(compiler)
    }
}

/// One sequence's position in its constraint: which tokens may come next, advanced by each token
/// sampled.
///
/// A parser failure mid-output (llguidance's resource limits on a pathological grammar) ends
/// that sequence (only its end tokens are allowed from then on) instead of failing the step, so
/// that the other sequences of the batch go on.
#[derive(Clone)]
pub struct ConstraintState {
    matcher: Matcher,
    ends: SimpleVob,
    vocab_size: usize,
    /// The mask of the current position once computed (until the next commit), so that an engine
    /// can compute it ahead, beside the model's forward pass.
    next: Option<SimpleVob>,
}

impl std::fmt::Debug for ConstraintState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConstraintState").field("stopped", &self.matcher.is_stopped()).finish()
    }
}

impl ConstraintState {
    /// The tokens allowed next (only the end tokens once the output is complete), computed once per
    /// position.
    pub fn allowed(&mut self) -> Result<SimpleVob> {
        if let Some(mask) = &self.next {
            return Ok(mask.clone());
        }
        let mask = match self.matcher.compute_mask_or_eos() {
            Ok(mask) if mask.len() == self.vocab_size && !mask.is_zero() => mask,
            Ok(_) => self.ends.clone(),
            Err(e) => {
                tracing::warn!("structured output stopped: {e}");
                self.ends.clone()
            }
        };
        Ok(self.next.insert(mask).clone())
    }

    /// Advances past a sampled token (a token the parser refuses leaves it stopped, see
    /// [`ConstraintState`]).
    pub fn commit(&mut self, token: u32) -> Result<()> {
        self.next = None;
        if !self.matcher.is_stopped()
            && let Err(e) = self.matcher.consume_token(token)
        {
            tracing::warn!("structured output stopped at token {token}: {e}");
        }
        Ok(())
    }

    /// Whether the output is complete: nothing but an end token may follow.
    pub fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }
}
