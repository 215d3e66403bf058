//! Pre-tokenizer selection: maps a GGUF `tokenizer.ggml.pre` name to the
//! normalizer and pre-tokenizer the original Hugging Face tokenizer used.

use tokenizers::normalizers::unicode::NFC;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

use super::TokenizerError;

/// Qwen2/Qwen3 split pattern: single digits, letters with one leading
/// non-letter, punctuation runs that swallow trailing newlines.
const QWEN2_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3 split pattern: like Qwen2 but digits are grouped by up to three.
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer families this crate reproduces exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PreTokenizerKind {
    /// Qwen2 family: NFC, then the Qwen2 split, then byte-level mapping.
    Qwen2,
    /// Llama 3 family: the Llama 3 split, then byte-level mapping; a pre-token that is a
    /// whole vocabulary entry is taken as it is (`ignore_merges`).
    Llama3,
    /// Smaug: Llama 3's split, but the BPE merges always apply.
    Smaug,
    /// Original GPT-2: the byte-level pre-tokenizer's own regex.
    Gpt2,
    /// SmolLM / SmolLM2: every digit split off, then the
    /// GPT-2 byte-level regex (`Sequence[Digits(individual), ByteLevel(use_regex)]`).
    SmolLm,
}

impl PreTokenizerKind {
    /// Resolves a `tokenizer.ggml.pre` value.
    ///
    /// A missing value, or `"default"`, means the converter did not recognise
    /// the tokenizer; for a `gpt2` vocabulary the GPT-2 regex is the closest
    /// Hugging Face equivalent, so that is the fallback. Any other unknown
    /// name is refused rather than silently tokenized differently.
    pub(crate) fn from_name(name: Option<&str>) -> Result<Self, TokenizerError> {
        match name {
            None => Ok(Self::Gpt2),
            Some("qwen2" | "deepseek-r1-qwen") => Ok(Self::Qwen2),
            Some("llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral") => Ok(Self::Llama3),
            Some("smaug-bpe") => Ok(Self::Smaug),
            Some("default" | "gpt2" | "gpt-2" | "phi-2") => Ok(Self::Gpt2),
            Some("smollm") => Ok(Self::SmolLm),
            Some(other) => Err(TokenizerError::UnsupportedPreTokenizer(other.to_owned())),
        }
    }

    /// Whether the BPE model takes a pre-token found whole in the vocabulary without merging
    /// it (Hugging Face's `ignore_merges`, llama.cpp's per-family flag): Llama 3's
    /// tokenizer.json sets it, the others here do not.
    pub(crate) fn ignore_merges(self) -> bool {
        self == Self::Llama3
    }

    /// Builds the normalizer (if any) and the pre-tokenizer for this family.
    pub(crate) fn build(
        self,
    ) -> Result<(Option<NormalizerWrapper>, PreTokenizerWrapper), TokenizerError> {
        let split = |pattern: &str| {
            Split::new(
                SplitPattern::Regex(pattern.to_owned()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| TokenizerError::Build(format!("split regex: {e}")))
        };
        // The split already isolated words, so byte-level only remaps bytes.
        let byte_level = || ByteLevel::new(false, false, false);
        Ok(match self {
            Self::Qwen2 => (
                Some(NFC.into()),
                Sequence::new(vec![split(QWEN2_PATTERN)?.into(), byte_level().into()]).into(),
            ),
            Self::Llama3 | Self::Smaug => (
                None,
                Sequence::new(vec![split(LLAMA3_PATTERN)?.into(), byte_level().into()]).into(),
            ),
            Self::Gpt2 => (None, ByteLevel::new(false, false, true).into()),
            Self::SmolLm => (
                None,
                Sequence::new(vec![
                    Digits::new(true).into(),
                    ByteLevel::new(false, false, true).into(),
                ])
                .into(),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve() {
        assert_eq!(
            PreTokenizerKind::from_name(Some("qwen2")).unwrap(),
            PreTokenizerKind::Qwen2
        );
        assert_eq!(
            PreTokenizerKind::from_name(Some("llama-bpe")).unwrap(),
            PreTokenizerKind::Llama3
        );
        assert_eq!(
            PreTokenizerKind::from_name(Some("default")).unwrap(),
            PreTokenizerKind::Gpt2
        );
        assert_eq!(
            PreTokenizerKind::from_name(None).unwrap(),
            PreTokenizerKind::Gpt2
        );
        assert_eq!(
            PreTokenizerKind::from_name(Some("smollm")).unwrap(),
            PreTokenizerKind::SmolLm
        );
        let err = PreTokenizerKind::from_name(Some("chatglm-bpe")).unwrap_err();
        assert!(err.to_string().contains("chatglm-bpe"), "{err}");
    }

    #[test]
    fn every_family_builds() {
        for kind in [
            PreTokenizerKind::Qwen2,
            PreTokenizerKind::Llama3,
            PreTokenizerKind::Smaug,
            PreTokenizerKind::Gpt2,
            PreTokenizerKind::SmolLm,
        ] {
            kind.build().unwrap();
        }
    }
}
