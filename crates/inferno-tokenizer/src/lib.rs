//! Text ↔ token conversion for GGUF models: the byte-level BPE tokenizer
//! (`gpt2` vocabularies) and the SentencePiece BPE tokenizer (`llama`
//! vocabularies: Llama 2, Mistral) rebuilt from GGUF metadata, the incremental
//! (streaming) detokenizer, the chat template renderer, and the tool calls found
//! in generated text.
//!
//! Encoding runs the Hugging Face `tokenizers` pipeline pieces (added-token
//! extraction, normalizer, pre-tokenizer, BPE model), configured to be
//! identical to the model's original `tokenizer.json`. Decoding is done here
//! from per-token byte strings precomputed at load, which is both exact and
//! cheap enough to run once per generated token.

mod byte_level;
pub mod chat;
mod pre;
pub mod reasoning;
mod stream;
mod tojson;
pub mod tool_calls;

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, AddedVocabulary, Model, OffsetReferential, OffsetType, PreTokenizer};

use inferno_gguf::{GgufFile, Value};

pub use chat::{ChatEnding, ChatMessage, ChatTemplate, TemplateArgs};
pub use stream::StreamDecoder;

use pre::PreTokenizerKind;

/// Errors raised while loading a tokenizer, encoding, decoding or rendering a
/// chat template.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A required GGUF metadata key is absent.
    #[error("GGUF metadata key `{0}` is missing")]
    MissingKey(&'static str),
    /// A GGUF metadata key has the wrong type or an impossible value.
    #[error("GGUF metadata key `{key}` is invalid: {reason}")]
    InvalidMetadata {
        /// The offending key.
        key: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// `tokenizer.ggml.model` names a tokenizer family this crate cannot run.
    #[error(
        "unsupported tokenizer model `{0}`: supported are `gpt2` (byte-level BPE) and `llama` \
         (SentencePiece BPE)"
    )]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate cannot reproduce.
    #[error(
        "unsupported pre-tokenizer `{0}`: supported are qwen2, deepseek-r1-qwen, llama3, \
         llama-bpe, smaug-bpe, falcon3, pixtral, smollm, gpt-2, phi-2 and default"
    )]
    UnsupportedPreTokenizer(String),
    /// The vocabulary or merges could not be assembled into a tokenizer.
    #[error("failed to build the tokenizer: {0}")]
    Build(String),
    /// Encoding failed inside the tokenizer pipeline.
    #[error("failed to encode text: {0}")]
    Encode(String),
    /// A token id outside the vocabulary was given.
    #[error("token id {id} is out of range for a vocabulary of {vocab_size} tokens")]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// Number of tokens in the vocabulary.
        vocab_size: usize,
    },
    /// The chat template failed to parse or render.
    #[error("chat template error: {0}")]
    Template(String),
    /// Messages or tools given to a chat template are malformed.
    #[error("invalid chat input: {0}")]
    ChatInput(String),
}

/// GGUF token type (`tokenizer.ggml.token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TokenType {
    /// Type 0 or any value this crate does not know.
    Undefined,
    /// Ordinary vocabulary piece produced by BPE merges.
    Normal,
    /// The unknown-token placeholder.
    Unknown,
    /// Special token (`<|im_start|>`, `<|endoftext|>`, …).
    Control,
    /// Added token matched atomically in text but not special (`<think>`).
    UserDefined,
    /// Reserved slot.
    Unused,
    /// Raw byte piece (`<0x0A>`), used by SentencePiece byte fallback.
    Byte,
}

impl TokenType {
    fn from_gguf(v: i64) -> Self {
        match v {
            1 => Self::Normal,
            2 => Self::Unknown,
            3 => Self::Control,
            4 => Self::UserDefined,
            5 => Self::Unused,
            6 => Self::Byte,
            _ => Self::Undefined,
        }
    }
}

/// Names of tokens that end a generation when they are special tokens of the
/// vocabulary, whatever the metadata ids say; chat models emit these as the
/// end of a turn.
const EOG_NAMES: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|return|>",
    "<|call|>",
    "<EOT>",
    "<|end▁of▁sentence|>",
    "<end_of_utterance>",
];

/// Strings stored back to back, addressed by index.
#[derive(Debug, Default)]
struct Packed {
    data: Vec<u8>,
    /// `offsets[i]..offsets[i + 1]` is entry `i`.
    offsets: Vec<usize>,
}

impl Packed {
    fn with_capacity(entries: usize, bytes: usize) -> Self {
        let mut offsets = Vec::with_capacity(entries + 1);
        offsets.push(0);
        Self {
            data: Vec::with_capacity(bytes),
            offsets,
        }
    }

    /// Closes the entry whose bytes were appended to `data` since the last call.
    fn seal(&mut self) {
        self.offsets.push(self.data.len());
    }

    fn get(&self, i: usize) -> Option<&[u8]> {
        let start = *self.offsets.get(i)?;
        let end = *self.offsets.get(i + 1)?;
        self.data.get(start..end)
    }
}

/// A byte-level BPE tokenizer loaded from GGUF metadata.
///
/// Encoding matches the Hugging Face tokenizer the GGUF was converted from;
/// decoding maps every token to its exact bytes.
pub struct Tokenizer {
    model: BPE,
    normalizer: Option<NormalizerWrapper>,
    /// None for SentencePiece vocabularies: their normalizer does all the splitting there is.
    pre_tokenizer: Option<PreTokenizerWrapper>,
    /// Matches control and user-defined tokens atomically in the input.
    added: AddedVocabulary,
    /// The same tokens, but control-token text is left to the BPE as
    /// ordinary text (user-defined tokens are still matched).
    added_plain: AddedVocabulary,
    /// Raw vocabulary strings (always valid UTF-8).
    texts: Packed,
    /// The bytes each token decodes to.
    bytes: Packed,
    types: Vec<TokenType>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    /// Sorted, deduplicated end-of-generation ids.
    eog: Vec<u32>,
    /// SentencePiece with a space prefix: decoding drops the one leading space the
    /// encoder's prefix became (Hugging Face's `Strip` decoder, llama.cpp's first token).
    strip_leading_space: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("eog", &self.eog)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` keys.
    ///
    /// Only `gpt2` (byte-level BPE) vocabularies are supported. Control
    /// tokens become special added tokens and user-defined tokens become
    /// ordinary added tokens, both matched verbatim before normalization, as
    /// the original Hugging Face tokenizer does. A missing or `default`
    /// `tokenizer.ggml.pre` falls back to the GPT-2 split regex; unknown
    /// pre-tokenizer names are refused.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, TokenizerError> {
        let model = required_str(gguf, "tokenizer.ggml.model")?;
        let spm = match model {
            "gpt2" => false,
            "llama" => true,
            _ => return Err(TokenizerError::UnsupportedModel(model.to_owned())),
        };
        // SentencePiece files name a pre-tokenizer too (`default`), which they do not use.
        let pre_kind = match spm {
            true => None,
            false => Some(PreTokenizerKind::from_name(optional_str(
                gguf,
                "tokenizer.ggml.pre",
            )?)?),
        };
        let add_space_prefix = match gguf.get("tokenizer.ggml.add_space_prefix") {
            None => true,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| invalid("tokenizer.ggml.add_space_prefix", "expected a boolean"))?,
        };

        let token_values = required_array(gguf, "tokenizer.ggml.tokens")?;
        let n_vocab = token_values.len();
        if n_vocab == 0 {
            return Err(invalid("tokenizer.ggml.tokens", "the vocabulary is empty"));
        }
        if u32::try_from(n_vocab).is_err() {
            return Err(invalid("tokenizer.ggml.tokens", "too many tokens"));
        }
        let mut tokens: Vec<&str> = Vec::with_capacity(n_vocab);
        for (i, v) in token_values.iter().enumerate() {
            let s = v.as_str().ok_or_else(|| {
                invalid(
                    "tokenizer.ggml.tokens",
                    format!("entry {i} is not a string"),
                )
            })?;
            tokens.push(s);
        }

        let types = match gguf.get("tokenizer.ggml.token_type") {
            None => vec![TokenType::Normal; n_vocab],
            Some(v) => {
                let arr = v.as_array().ok_or_else(|| {
                    invalid("tokenizer.ggml.token_type", "expected an array of integers")
                })?;
                if arr.len() != n_vocab {
                    return Err(invalid(
                        "tokenizer.ggml.token_type",
                        format!("has {} entries for {n_vocab} tokens", arr.len()),
                    ));
                }
                arr.iter()
                    .enumerate()
                    .map(|(i, v)| {
                        v.as_i64().map(TokenType::from_gguf).ok_or_else(|| {
                            invalid(
                                "tokenizer.ggml.token_type",
                                format!("entry {i} is not an integer"),
                            )
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
        };

        // SentencePiece files carry scores instead of merges.
        let merge_source = match spm {
            false => MergeSource::Listed(required_array(gguf, "tokenizer.ggml.merges")?),
            true => MergeSource::Scores(read_scores(gguf, n_vocab)?),
        };
        let unk = match spm {
            false => None,
            true => types
                .iter()
                .position(|t| *t == TokenType::Unknown)
                .map(|i| tokens[i].to_string()),
        };
        // Parsing merges and packing token bytes are independent of building
        // the vocabulary map, so they run on helper threads meanwhile; the
        // BPE build itself is serial.
        let (bpe, texts, bytes) = std::thread::scope(|s| {
            let merges = s.spawn(|| match &merge_source {
                MergeSource::Listed(values) => parse_merges(values),
                MergeSource::Scores(scores) => Ok(spm_merges(&tokens, scores)),
            });
            let packed = s.spawn(|| pack_tokens(&tokens, spm.then_some(&types[..])));
            let vocab = build_vocab(&tokens);
            let merges = join_worker(merges)??;
            let mut builder = BPE::builder()
                .vocab_and_merges(vocab, merges)
                .byte_fallback(spm)
                .ignore_merges(pre_kind.is_some_and(|k| k.ignore_merges()));
            if let Some(unk) = unk {
                builder = builder.unk_token(unk).fuse_unk(true);
            }
            let bpe = builder
                .build()
                .map_err(|e| TokenizerError::Build(e.to_string()))?;
            let (texts, bytes) = join_worker(packed)?;
            Ok::<_, TokenizerError>((bpe, texts, bytes))
        })?;

        let (normalizer, pre_tokenizer) = match pre_kind {
            Some(kind) => {
                let (n, p) = kind.build()?;
                (n, Some(p))
            }
            None => (Some(spm_normalizer(add_space_prefix)?), None),
        };

        let mut specials = Vec::new();
        let mut user_defined = Vec::new();
        for (t, ty) in tokens.iter().zip(&types) {
            match ty {
                // SentencePiece's `<unk>` is matched whole as Hugging Face's converter does.
                TokenType::Unknown if spm => {
                    specials.push(AddedToken::from(*t, true).normalized(false));
                }
                TokenType::Control => {
                    specials.push(AddedToken::from(*t, true).normalized(false));
                }
                TokenType::UserDefined => {
                    user_defined.push(AddedToken::from(*t, false).normalized(false));
                }
                _ => {}
            }
        }
        // Two small added-token tables rather than two tokenizers: the BPE
        // model (the bulk of the memory) is shared by both modes.
        let build_added = || {
            let mut added = AddedVocabulary::new();
            added.add_special_tokens(&specials, &bpe, normalizer.as_ref());
            added.add_tokens(&user_defined, &bpe, normalizer.as_ref());
            added
        };
        let added = build_added();
        let mut added_plain = build_added();
        added_plain.set_encode_special_tokens(true);

        let special_id = |key: &'static str| -> Result<Option<u32>, TokenizerError> {
            match gguf.get(key) {
                None => Ok(None),
                Some(v) => {
                    let id = v
                        .as_u64()
                        .ok_or_else(|| invalid(key, "expected an unsigned integer"))?;
                    if id < n_vocab as u64 {
                        Ok(Some(id as u32))
                    } else if key == "tokenizer.ggml.padding_token_id" {
                        // Converters sometimes write a padding id past the vocabulary
                        // (a row of the embedding matrix); nothing here uses it.
                        tracing::warn!(key, id, n_vocab, "padding token id out of range, ignored");
                        Ok(None)
                    } else {
                        // A BOS the model would be fed, or an end of generation that
                        // could never be produced: the file is broken.
                        Err(invalid(
                            key,
                            format!("token id {id} is outside the vocabulary of {n_vocab} tokens"),
                        ))
                    }
                }
            }
        };
        let bos = special_id("tokenizer.ggml.bos_token_id")?;
        let eos = special_id("tokenizer.ggml.eos_token_id")?;
        let eot = special_id("tokenizer.ggml.eot_token_id")?;
        let eom = special_id("tokenizer.ggml.eom_token_id")?;
        let pad = special_id("tokenizer.ggml.padding_token_id")?;
        let add_bos = match gguf.get("tokenizer.ggml.add_bos_token") {
            // llama.cpp's default: SentencePiece models start with BOS.
            None => spm,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| invalid("tokenizer.ggml.add_bos_token", "expected a boolean"))?,
        };

        let mut eog: Vec<u32> = [eos, eot, eom].into_iter().flatten().collect();
        for (id, (t, ty)) in tokens.iter().zip(&types).enumerate() {
            if matches!(ty, TokenType::Control | TokenType::UserDefined) && EOG_NAMES.contains(t) {
                eog.push(id as u32);
            }
        }
        eog.sort_unstable();
        eog.dedup();

        Ok(Self {
            model: bpe,
            normalizer,
            pre_tokenizer,
            added,
            added_plain,
            texts,
            bytes,
            types,
            bos,
            eos,
            eot,
            eom,
            pad,
            add_bos,
            eog,
            strip_leading_space: spm && add_space_prefix,
        })
    }

    /// Encodes `text` to token ids. Never adds a BOS token; see [`Self::add_bos`].
    ///
    /// With `parse_special`, control tokens written in the text (such as
    /// `<|im_start|>`) become their single id; without it their text is
    /// tokenized like any other text, which is what untrusted user input
    /// needs. User-defined tokens (such as `<think>`) are matched either way.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        let added = if parse_special {
            &self.added
        } else {
            &self.added_plain
        };
        let encode_error = |e: tokenizers::Error| TokenizerError::Encode(e.to_string());
        // The same stages, in the same order, as `tokenizers::Tokenizer::encode`.
        let mut pieces = added.extract_and_normalize(self.normalizer.as_ref(), text);
        if let Some(pre) = &self.pre_tokenizer {
            pre.pre_tokenize(&mut pieces).map_err(encode_error)?;
        }
        pieces
            .tokenize(|piece| self.model.tokenize(piece.get()))
            .map_err(encode_error)?;
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        for (_, _, tokens) in pieces.get_splits(OffsetReferential::Original, OffsetType::None) {
            if let Some(tokens) = tokens {
                ids.extend(tokens.iter().map(|t| t.id));
            }
        }
        Ok(ids)
    }

    /// Decodes ids to text. Byte sequences that are not valid UTF-8 become
    /// U+FFFD. With `skip_special`, control tokens produce no text.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        let mut buf = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            let piece = self
                .token_bytes(id)
                .ok_or(TokenizerError::TokenOutOfRange {
                    id,
                    vocab_size: self.vocab_size(),
                })?;
            if skip_special && self.is_control(id) {
                continue;
            }
            buf.extend_from_slice(piece);
        }
        if self.strip_leading_space && buf.first() == Some(&b' ') {
            buf.remove(0);
        }
        Ok(match String::from_utf8(buf) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    /// Number of tokens in the vocabulary (including special tokens).
    pub fn vocab_size(&self) -> usize {
        self.types.len()
    }

    /// The raw vocabulary string of a token (byte-level stand-in characters
    /// for ordinary tokens).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        let raw = self.texts.get(id as usize)?;
        // Entries are copied from `&str`s and split on their boundaries.
        std::str::from_utf8(raw).ok()
    }

    /// The bytes a token decodes to.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id as usize)
    }

    /// Looks up the id of a raw vocabulary string.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.added.token_to_id(text, &self.model)
    }

    /// The GGUF token type of an id.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// Beginning-of-sequence token, if the model defines one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token, if the model defines one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn token, if the model defines one.
    pub fn eot_id(&self) -> Option<u32> {
        self.eot
    }

    /// End-of-message token, if the model defines one.
    pub fn eom_id(&self) -> Option<u32> {
        self.eom
    }

    /// Padding token, if the model defines one.
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// Whether prompts should start with [`Self::bos_id`] (the caller adds it).
    pub fn add_bos(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// End-of-generation ids: eos, eot, eom, and the special tokens that end
    /// a turn in common chat formats (`<|im_end|>`, `<|endoftext|>`, …).
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Whether generating `id` ends the generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Whether `id` is a control (special) token.
    pub fn is_control(&self, id: u32) -> bool {
        self.token_type(id) == Some(TokenType::Control)
    }

    /// A fresh incremental detokenizer over this vocabulary.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }
}

/// Splits each `"a b"` merge rule into its two halves.
fn parse_merges(values: &[Value]) -> Result<Vec<(String, String)>, TokenizerError> {
    let mut merges = Vec::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        let (a, b) = v.as_str().and_then(|s| s.split_once(' ')).ok_or_else(|| {
            invalid(
                "tokenizer.ggml.merges",
                format!("entry {i} is not a string of two space-separated tokens"),
            )
        })?;
        merges.push((a.to_owned(), b.to_owned()));
    }
    Ok(merges)
}

/// Token string → id. On duplicate strings the first id wins, which keeps
/// lookups stable; the later duplicates stay decodable by id.
fn build_vocab(tokens: &[&str]) -> Vocab {
    let mut vocab = Vocab::with_capacity(tokens.len());
    for (id, t) in tokens.iter().enumerate() {
        vocab.entry((*t).to_owned()).or_insert(id as u32);
    }
    vocab
}

/// Packs every token's raw text and decoded bytes.
/// Each token's text and the bytes it decodes to: byte-level BPE maps characters back to
/// bytes; SentencePiece (`spm_types` given) writes `▁` for a space and `<0xAB>` pieces for
/// raw bytes.
fn pack_tokens(tokens: &[&str], spm_types: Option<&[TokenType]>) -> (Packed, Packed) {
    let total: usize = tokens.iter().map(|t| t.len()).sum();
    let mut texts = Packed::with_capacity(tokens.len(), total);
    let mut bytes = Packed::with_capacity(tokens.len(), total);
    for (i, t) in tokens.iter().enumerate() {
        texts.data.extend_from_slice(t.as_bytes());
        texts.seal();
        match spm_types {
            None => byte_level::token_bytes_into(t, &mut bytes.data),
            Some(types) => match (types[i], spm_byte(t)) {
                (TokenType::Byte, Some(b)) => bytes.data.push(b),
                _ => {
                    let mut buf = [0u8; 4];
                    for c in t.chars() {
                        let c = if c == SPM_SPACE { ' ' } else { c };
                        bytes
                            .data
                            .extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                    }
                }
            },
        }
        bytes.seal();
    }
    (texts, bytes)
}

/// SentencePiece's stand-in for a space.
const SPM_SPACE: char = '\u{2581}';

/// The byte a SentencePiece byte piece (`<0x0A>`) stands for.
fn spm_byte(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// Where a vocabulary's merges come from.
enum MergeSource<'a> {
    /// `tokenizer.ggml.merges`, in rank order.
    Listed(&'a [Value]),
    /// `tokenizer.ggml.scores` of a SentencePiece vocabulary.
    Scores(Vec<f32>),
}

fn read_scores(gguf: &GgufFile, n_vocab: usize) -> Result<Vec<f32>, TokenizerError> {
    const KEY: &str = "tokenizer.ggml.scores";
    let values = required_array(gguf, KEY)?;
    if values.len() != n_vocab {
        return Err(invalid(
            KEY,
            format!("has {} entries for {n_vocab} tokens", values.len()),
        ));
    }
    values
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::F32(f) if f.is_finite() => Ok(*f),
            _ => Err(invalid(KEY, format!("entry {i} is not a finite float"))),
        })
        .collect()
}

/// BPE merges equivalent to SentencePiece's rule (repeatedly join the adjacent pair whose
/// union is the highest-scoring piece, leftmost first): every split of a piece into two
/// pieces is a merge, ranked by the joined piece's score (higher first), then by the ids
/// of its halves; the same order transformers' converter gives a Llama `tokenizer.model`.
fn spm_merges(tokens: &[&str], scores: &[f32]) -> Vec<(String, String)> {
    let ids: std::collections::HashMap<&str, usize> =
        tokens.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    let mut merges: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&li), Some(&ri)) = (ids.get(l), ids.get(r)) {
                merges.push((scores[id], li, ri, id));
            }
        }
    }
    merges.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    merges
        .into_iter()
        .map(|(_, l, r, _)| (tokens[l].to_string(), tokens[r].to_string()))
        .collect()
}

/// SentencePiece's normalization as Hugging Face's Llama converter writes it: a `▁` before
/// each piece of text (when the vocabulary asks for a space prefix), spaces as `▁`.
fn spm_normalizer(add_space_prefix: bool) -> Result<NormalizerWrapper, TokenizerError> {
    use tokenizers::normalizers::{Prepend, Replace, Sequence};
    let replace = Replace::new(" ", SPM_SPACE.to_string())
        .map_err(|e| TokenizerError::Build(format!("space replacement: {e}")))?;
    let mut steps: Vec<NormalizerWrapper> = Vec::new();
    if add_space_prefix {
        steps.push(Prepend::new(SPM_SPACE.to_string()).into());
    }
    steps.push(replace.into());
    Ok(Sequence::new(steps).into())
}

fn join_worker<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> Result<T, TokenizerError> {
    handle
        .join()
        .map_err(|_| TokenizerError::Build("a tokenizer loading thread panicked".into()))
}

fn invalid(key: &'static str, reason: impl Into<String>) -> TokenizerError {
    TokenizerError::InvalidMetadata {
        key,
        reason: reason.into(),
    }
}

fn required_str<'a>(gguf: &'a GgufFile, key: &'static str) -> Result<&'a str, TokenizerError> {
    optional_str(gguf, key)?.ok_or(TokenizerError::MissingKey(key))
}

fn optional_str<'a>(
    gguf: &'a GgufFile,
    key: &'static str,
) -> Result<Option<&'a str>, TokenizerError> {
    match gguf.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_str()
            .map(Some)
            .ok_or_else(|| invalid(key, "expected a string")),
    }
}

fn required_array<'a>(
    gguf: &'a GgufFile,
    key: &'static str,
) -> Result<&'a [Value], TokenizerError> {
    let v = gguf.get(key).ok_or(TokenizerError::MissingKey(key))?;
    v.as_array()
        .ok_or_else(|| invalid(key, "expected an array"))
}

#[cfg(any(test, feature = "test-vocab"))]
#[doc(hidden)]
pub mod test_vocab;

#[cfg(test)]
mod tests;
