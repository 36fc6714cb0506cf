//! A SentencePiece BPE vocabulary (GGUF `tokenizer.ggml.model = "llama"`) rebuilt as a
//! `tokenizers::Tokenizer`, the way HF transformers' `LlamaConverter` (`convert_slow_tokenizer.py`)
//! turns LLaMA's `tokenizer.model` into its fast tokenizer: a byte-fallback BPE whose merges are
//! generated from the pieces and their scores, a normalizer that writes spaces as `▁` (and
//! prepends one), and a decoder that undoes both.

use tokenizers::AddedToken;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};

use crate::error::{ModelError, Result};

/// SentencePiece piece types (`ModelProto.SentencePiece.Type`), which GGUF's
/// `tokenizer.ggml.token_type` uses for every tokenizer model. The others are 2 (unknown), 5
/// (unused) and 6 (byte, `<0xNN>`), which the BPE handles by their text.
pub(crate) mod piece_type {
    /// Ordinary text.
    pub const NORMAL: u32 = 1;
    /// A control token (BOS, EOS, chat markers): never produced from text by SentencePiece.
    pub const CONTROL: u32 = 3;
    /// A user-defined piece: always one token when it occurs in the text.
    pub const USER_DEFINED: u32 = 4;
}

/// SentencePiece's meta symbol for a space.
const SPACE: &str = "\u{2581}";

/// A SentencePiece vocabulary as a GGUF file stores it (`tokenizer.ggml.*`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SpmVocab<'a> {
    /// Pieces, by id (`tokenizer.ggml.tokens`).
    pub tokens: &'a [String],
    /// Piece scores, by id (`tokenizer.ggml.scores`): the higher, the earlier a BPE merge.
    pub scores: &'a [f32],
    /// Piece types, by id (`tokenizer.ggml.token_type`; see [`piece_type`]).
    pub types: &'a [u32],
    /// Beginning-of-sequence id.
    pub bos: Option<u32>,
    /// End-of-sequence id.
    pub eos: Option<u32>,
    /// Unknown-token id, what a character becomes when even its bytes are not in the vocabulary.
    pub unk: Option<u32>,
    /// Whether a space is prepended to the text (`tokenizer.ggml.add_space_prefix`,
    /// SentencePiece's `add_dummy_prefix`) and removed again when decoding.
    pub add_space_prefix: bool,
}

/// Builds the `tokenizers` equivalent of a SentencePiece BPE model: a `BPE` with byte fallback,
/// `fuse_unk` and merges from [`generate_merges`]; normalizer `Prepend("▁")` (when
/// `add_space_prefix`) then `Replace(" ", "▁")`; no pre-tokenizer; decoder `Replace("▁", " ")`,
/// `ByteFallback`, `Fuse`, then `Strip(" ", 1, 0)` (when `add_space_prefix`). Control pieces (and
/// the BOS, EOS and unknown ids) become special added tokens, user-defined pieces added tokens that
/// are not special (so decoding keeps their text), both matched in the raw text, as HF's converter
/// does.
///
/// Scores or types whose length differs from the tokens', and ids outside the vocabulary, are
/// errors.
pub(crate) fn spm_tokenizer(spm: &SpmVocab<'_>) -> Result<tokenizers::Tokenizer> {
    let fail = |m: String| ModelError::Tokenizer(format!("SentencePiece vocabulary: {m}"));
    let n = spm.tokens.len();
    if n == 0 {
        return Err(fail("no tokens".into()));
    }
    if u32::try_from(n).is_err() {
        return Err(fail(format!("{n} tokens do not fit u32 ids")));
    }
    if spm.scores.len() != n {
        return Err(fail(format!("{} scores for {n} tokens", spm.scores.len())));
    }
    if spm.types.len() != n {
        return Err(fail(format!("{} token types for {n} tokens", spm.types.len())));
    }
    let token = |what: &str, id: Option<u32>| -> Result<Option<&str>> {
        match id {
            None => Ok(None),
            Some(i) => spm
                .tokens
                .get(i as usize)
                .map(|t| Some(t.as_str()))
                .ok_or_else(|| fail(format!("{what} id {i} is outside the vocabulary of {n} tokens"))),
        }
    };
    token("BOS", spm.bos)?;
    token("EOS", spm.eos)?;
    let unk = token("unknown-token", spm.unk)?;

    // A piece listed twice keeps its last id, as in HF's `{piece: id}` dict.
    let vocab: Vocab = spm.tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let merges = generate_merges(spm.tokens, spm.scores, &vocab);
    let mut bpe = BPE::builder().vocab_and_merges(vocab, merges).fuse_unk(true).byte_fallback(true);
    if let Some(unk) = unk {
        bpe = bpe.unk_token(unk.to_string());
    }
    let bpe = bpe.build().map_err(|e| fail(format!("cannot build the BPE model: {e}")))?;

    let replace = |from: &str, to: &str| {
        Replace::new(from, to).map_err(|e| fail(format!("cannot build a `{from}` → `{to}` replacement: {e}")))
    };
    let mut normalizers = Vec::new();
    let mut decoders = vec![replace(SPACE, " ")?.into(), ByteFallback::new().into(), Fuse::new().into()];
    if spm.add_space_prefix {
        normalizers.push(Prepend::new(SPACE.to_string()).into());
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    normalizers.push(replace(" ", SPACE)?.into());

    let mut tokenizer = tokenizers::Tokenizer::new(bpe);
    tokenizer
        .with_normalizer(Some(NormalizerSequence::new(normalizers)))
        .with_decoder(Some(DecoderSequence::new(decoders)));
    let added: Vec<AddedToken> = spm
        .tokens
        .iter()
        .zip(spm.types)
        .enumerate()
        .filter_map(|(i, (t, &kind))| {
            let i = Some(i as u32);
            let special = kind == piece_type::CONTROL || [spm.bos, spm.eos, spm.unk].contains(&i);
            (special || kind == piece_type::USER_DEFINED)
                .then(|| AddedToken::from(t.as_str(), special).normalized(false))
        })
        .collect();
    tokenizer.add_tokens(&added);
    Ok(tokenizer)
}

/// HF's `generate_merges(vocab, vocab_scores)` (transformers 4.x `SentencePieceExtractor.extract`
/// with scores, as `LlamaConverter` calls it): for every piece, each split into a left and a right
/// piece that are both in the vocabulary is a merge, the splits of one piece ordered by (left id,
/// right id); all merges are then ordered by the merged piece's score, descending, then by the
/// left part's length in characters, descending, then the right part's, descending, ties keeping
/// vocabulary order (Python's stable `sorted(..., reverse=True)`). A BPE applying the highest-ranked
/// merge first then merges the pair whose result SentencePiece scores highest, as SentencePiece's
/// own BPE encoder does.
fn generate_merges(tokens: &[String], scores: &[f32], vocab: &Vocab) -> Vec<(String, String)> {
    struct Merge<'a> {
        score: f32,
        left_chars: usize,
        right_chars: usize,
        left: &'a str,
        right: &'a str,
    }
    // Python compares -0.0 == 0.0; NaN (which Python cannot order either) goes last.
    let key = |s: f32| if s.is_nan() { f32::NEG_INFINITY } else { s + 0.0 };
    let mut merges = Vec::new();
    let mut local = Vec::new();
    for (i, piece) in tokens.iter().enumerate() {
        if vocab.get(piece.as_str()) != Some(&(i as u32)) {
            continue; // a duplicate: its merges come with the id the vocabulary keeps
        }
        let chars = piece.chars().count();
        local.clear();
        for (k, (at, _)) in piece.char_indices().enumerate().skip(1) {
            let (left, right) = piece.split_at(at);
            if let (Some(&l), Some(&r)) = (vocab.get(left), vocab.get(right)) {
                local.push((l, r, k, left, right));
            }
        }
        local.sort_by_key(|&(l, r, ..)| (l, r));
        merges.extend(local.iter().map(|&(_, _, k, left, right)| Merge {
            score: key(scores[i]),
            left_chars: k,
            right_chars: chars - k,
            left,
            right,
        }));
    }
    merges.sort_by(|a, b| {
        b.score.total_cmp(&a.score).then(b.left_chars.cmp(&a.left_chars)).then(b.right_chars.cmp(&a.right_chars))
    });
    merges.into_iter().map(|m| (m.left.to_string(), m.right.to_string())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tests/fixtures/spm/spm.json`, written by `scripts/make_spm_fixture.py` with the real
    /// `sentencepiece` library.
    struct Fixture {
        tokens: Vec<String>,
        scores: Vec<f32>,
        types: Vec<u32>,
        bos: u32,
        eos: u32,
        unk: u32,
        json: serde_json::Value,
    }

    fn fixture() -> Fixture {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/spm/spm.json");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let array = |key: &str| json[key].as_array().unwrap_or_else(|| panic!("no {key}")).clone();
        let id = |key: &str| json[key].as_u64().unwrap() as u32;
        Fixture {
            tokens: array("tokens").iter().map(|t| t.as_str().unwrap().to_string()).collect(),
            scores: array("scores").iter().map(|s| s.as_f64().unwrap() as f32).collect(),
            types: array("token_types").iter().map(|t| t.as_u64().unwrap() as u32).collect(),
            bos: id("bos_token_id"),
            eos: id("eos_token_id"),
            unk: id("unknown_token_id"),
            json,
        }
    }

    impl Fixture {
        fn vocab(&self) -> SpmVocab<'_> {
            SpmVocab {
                tokens: &self.tokens,
                scores: &self.scores,
                types: &self.types,
                bos: Some(self.bos),
                eos: Some(self.eos),
                unk: Some(self.unk),
                add_space_prefix: self.json["add_space_prefix"].as_bool().unwrap(),
            }
        }
    }

    #[test]
    fn matches_sentencepiece() {
        let f = fixture();
        let tokenizer = spm_tokenizer(&f.vocab()).unwrap();
        let cases = f.json["cases"].as_array().unwrap();
        assert!(cases.len() >= 30, "{} cases", cases.len());
        let mut failures = Vec::new();
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let want: Vec<u32> = case["ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as u32).collect();
            let got = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
            if got != want {
                failures.push(format!("encode {text:?}: got {got:?}, sentencepiece {want:?}"));
            }
            let decoded = tokenizer.decode(&want, true).unwrap();
            if decoded != case["decoded"].as_str().unwrap() {
                failures.push(format!("decode {text:?}: got {decoded:?}, sentencepiece {:?}", case["decoded"]));
            }
        }
        assert!(failures.is_empty(), "{} of {} cases differ:\n{}", failures.len(), cases.len(), failures.join("\n"));
    }

    #[test]
    fn special_tokens_are_special() {
        let f = fixture();
        let tokenizer = spm_tokenizer(&f.vocab()).unwrap();
        let bos = &f.tokens[f.bos as usize];
        let ids = tokenizer.encode(format!("{bos}hi"), false).unwrap().get_ids().to_vec();
        assert_eq!(ids[0], f.bos);
        assert_eq!(tokenizer.decode(&ids, true).unwrap(), tokenizer.decode(&ids[1..], true).unwrap());
    }

    #[test]
    fn without_space_prefix() {
        let f = fixture();
        let tokenizer = spm_tokenizer(&SpmVocab { add_space_prefix: false, ..f.vocab() }).unwrap();
        let ids = tokenizer.encode(" a b", false).unwrap().get_ids().to_vec();
        let with_prefix = spm_tokenizer(&f.vocab()).unwrap().encode("a b", false).unwrap().get_ids().to_vec();
        assert_eq!(ids, with_prefix);
        assert_eq!(tokenizer.decode(&ids, true).unwrap(), " a b");
    }

    #[test]
    fn bad_metadata_is_an_error() {
        let f = fixture();
        let short_scores = &f.scores[..f.scores.len() - 1];
        let err = spm_tokenizer(&SpmVocab { scores: short_scores, ..f.vocab() }).unwrap_err();
        assert!(err.to_string().contains("scores"), "{err}");
        let err = spm_tokenizer(&SpmVocab { scores: &[], ..f.vocab() }).unwrap_err();
        assert!(err.to_string().contains("scores"), "{err}");
        let err = spm_tokenizer(&SpmVocab { types: &f.types[1..], ..f.vocab() }).unwrap_err();
        assert!(err.to_string().contains("types"), "{err}");
        let out = f.tokens.len() as u32;
        let err = spm_tokenizer(&SpmVocab { unk: Some(out), ..f.vocab() }).unwrap_err();
        assert!(err.to_string().contains("outside"), "{err}");
        let err = spm_tokenizer(&SpmVocab { eos: Some(u32::MAX), ..f.vocab() }).unwrap_err();
        assert!(err.to_string().contains("outside"), "{err}");
        let err = spm_tokenizer(&SpmVocab { tokens: &[], scores: &[], types: &[], ..f.vocab() }).unwrap_err();
        assert!(err.to_string().contains("no tokens"), "{err}");
    }

    #[test]
    fn nan_scores_and_duplicates_do_not_panic() {
        let f = fixture();
        let mut tokens = f.tokens.clone();
        let mut scores = f.scores.clone();
        scores[300] = f32::NAN;
        tokens[301] = tokens[300].clone();
        let tokenizer = spm_tokenizer(&SpmVocab { tokens: &tokens, scores: &scores, ..f.vocab() }).unwrap();
        tokenizer.encode("the quick brown fox", false).unwrap();
    }
}
