//! Incremental detokenization: turns generated ids into text as they arrive
//! without ever splitting a multi-byte UTF-8 character between outputs.

use super::{Tokenizer, TokenizerError};

/// Incremental detokenizer: feeds ids one by one, returns only complete,
/// valid UTF-8 text; never splits a multi-byte character across outputs.
///
/// The concatenation of everything returned by [`push`](Self::push) and
/// [`finish`](Self::finish) equals [`Tokenizer::decode`] of all pushed ids
/// (with the same `skip_special` setting), including its U+FFFD replacements
/// for invalid bytes. Each push costs time proportional to the token's length
/// only: at most three bytes of an unfinished character are carried over.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    /// Bytes received but not yet returned: at most an incomplete character
    /// between calls, so this buffer never grows past a token's length.
    pending: Vec<u8>,
    skip_special: bool,
    /// Whether the next bytes are the first of the text (SentencePiece drops their
    /// leading space, as the full decode does).
    at_start: bool,
}

impl<'a> StreamDecoder<'a> {
    pub(crate) fn new(tokenizer: &'a Tokenizer) -> Self {
        Self {
            tokenizer,
            pending: Vec::with_capacity(64),
            skip_special: false,
            at_start: true,
        }
    }

    /// Makes control tokens produce no text, like `decode(ids, true)`.
    #[must_use]
    pub fn with_skip_special(mut self, skip_special: bool) -> Self {
        self.skip_special = skip_special;
        self
    }

    /// Adds one token and returns the text it completes (possibly empty).
    ///
    /// An id outside the vocabulary produces no text; use
    /// [`try_push`](Self::try_push) to have it reported instead.
    pub fn push(&mut self, id: u32) -> String {
        let mut out = String::new();
        let _ = self.push_into(id, &mut out);
        out
    }

    /// Like [`push`](Self::push), but an id outside the vocabulary is an error
    /// (and leaves the decoder unchanged).
    pub fn try_push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let mut out = String::new();
        self.push_into(id, &mut out)?;
        Ok(out)
    }

    /// Like [`try_push`](Self::try_push), but appends the completed text to
    /// `out`. With a reused `out` this allocates nothing once the buffers
    /// have grown to the longest token.
    pub fn push_into(&mut self, id: u32, out: &mut String) -> Result<(), TokenizerError> {
        let piece = self
            .tokenizer
            .token_bytes(id)
            .ok_or(TokenizerError::TokenOutOfRange {
                id,
                vocab_size: self.tokenizer.vocab_size(),
            })?;
        if self.skip_special && self.tokenizer.is_control(id) {
            return Ok(());
        }
        let mut piece = piece;
        if self.at_start && !piece.is_empty() {
            self.at_start = false;
            if self.tokenizer.strip_leading_space && piece[0] == b' ' {
                piece = &piece[1..];
            }
        }
        if self.pending.is_empty() {
            // Fast path: a token that is whole characters needs no buffering.
            if let Ok(s) = std::str::from_utf8(piece) {
                out.push_str(s);
                return Ok(());
            }
        }
        self.pending.extend_from_slice(piece);
        self.drain_complete(out);
        Ok(())
    }

    /// Returns whatever is still buffered, replacing an unfinished character
    /// with U+FFFD, and resets the decoder for reuse.
    pub fn finish(&mut self) -> String {
        let mut out = String::new();
        self.finish_into(&mut out);
        out
    }

    /// Like [`finish`](Self::finish), but appends to `out`.
    pub fn finish_into(&mut self, out: &mut String) {
        out.push_str(&String::from_utf8_lossy(&self.pending));
        self.pending.clear();
        self.at_start = true;
    }

    /// Whether bytes of an unfinished character are buffered.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Moves every complete character out of `pending` into `out`, replacing
    /// invalid sequences the way `String::from_utf8_lossy` does, and keeps
    /// only a trailing sequence that later bytes could still complete.
    fn drain_complete(&mut self, out: &mut String) {
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid` was just checked by `from_utf8`.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // Invalid no matter what follows: same verdict as a
                        // full decode would reach, so replace it now.
                        Some(len) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[len..];
                        }
                        // Truncated character at the end: wait for more.
                        None => {
                            rest = after;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let consumed = self.pending.len() - keep;
        self.pending.drain(..consumed);
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_vocab::VocabBuilder;
    use super::*;

    /// Decodes `ids` one at a time, checking the per-push invariants, and
    /// returns the pieces (with the final flush last).
    fn stream_pieces(tok: &Tokenizer, ids: &[u32]) -> Vec<String> {
        let mut dec = tok.stream_decoder();
        let mut pieces = Vec::new();
        for &id in ids {
            pieces.push(dec.push(id));
            // Only an unfinished character (at most 3 bytes) is ever held.
            assert!(dec.pending.len() <= 3, "pending {:?}", dec.pending);
        }
        pieces.push(dec.finish());
        assert!(!dec.has_pending());
        pieces
    }

    /// Splits `text`'s bytes into tokens at the given cut points and returns
    /// the tokenizer plus the id sequence.
    fn tokens_for(text: &str, cuts: &[usize]) -> (Tokenizer, Vec<u32>) {
        let bytes = text.as_bytes();
        let mut v = VocabBuilder::new();
        let mut bounds = vec![0];
        bounds.extend(cuts.iter().copied().filter(|&c| c > 0 && c < bytes.len()));
        bounds.push(bytes.len());
        bounds.sort_unstable();
        bounds.dedup();
        let ids: Vec<u32> = bounds
            .windows(2)
            .map(|w| v.bytes_token(&bytes[w[0]..w[1]]))
            .collect();
        (v.build(), ids)
    }

    #[test]
    fn emoji_split_byte_by_byte() {
        let text = "😀";
        let (tok, ids) = tokens_for(text, &[1, 2, 3]);
        assert_eq!(ids.len(), 4);
        let pieces = stream_pieces(&tok, &ids);
        assert_eq!(pieces, vec!["", "", "", "😀", ""]);
    }

    #[test]
    fn tokens_straddling_cjk_characters() {
        // "a中文": token 1 = "a" + first byte of 中, token 2 = rest of 中 +
        // first byte of 文, token 3 = rest of 文.
        let text = "a中文";
        let (tok, ids) = tokens_for(text, &[2, 5]);
        let pieces = stream_pieces(&tok, &ids);
        assert_eq!(pieces, vec!["a", "中", "文", ""]);
    }

    #[test]
    fn zwj_sequence_and_combining_marks() {
        let text = "👩\u{200d}👩\u{200d}👧 e\u{301}!";
        let (tok, ids) = tokens_for(text, &[1, 3, 6, 9, 10, 13, 16, 19, 21, 23]);
        let pieces = stream_pieces(&tok, &ids);
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
        assert_eq!(pieces.concat(), text);
        assert_eq!(pieces.concat(), tok.decode(&ids, false).unwrap());
    }

    #[test]
    fn invalid_bytes_match_lossy_full_decode() {
        let mut v = VocabBuilder::new();
        let ids = [
            v.bytes_token(&[0xE4, 0xB8]), // truncated 中 ...
            v.bytes_token(b"a"),          // ... interrupted
            v.bytes_token(&[0xFF]),
            v.bytes_token(&[0xF0, 0x9F]),
            v.bytes_token(&[0x98, 0x80, 0xE4]), // completes 😀, starts a char
        ];
        let tok = v.build();
        let full = tok.decode(&ids, false).unwrap();
        assert_eq!(full, "\u{FFFD}a\u{FFFD}😀\u{FFFD}");
        let pieces = stream_pieces(&tok, &ids);
        assert_eq!(pieces.concat(), full);
        assert_eq!(pieces.last().map(String::as_str), Some("\u{FFFD}"));
    }

    #[test]
    fn random_chunkings_concatenate_to_full_decode() {
        let text =
            "Grüße, 世界! 👨\u{200d}👩\u{200d}👧\u{200d}👦 🇯🇵 ﷽ 𝔘𝔫𝔦 naïve ä\u{308} Ω≈ç√∫ 🙂🙃";
        let len = text.len();
        // Deterministic pseudo-random cut points (64-bit LCG).
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..200 {
            let mut cuts = Vec::new();
            for pos in 1..len {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                if (state >> 33).is_multiple_of(3) {
                    cuts.push(pos);
                }
            }
            let (tok, ids) = tokens_for(text, &cuts);
            let pieces = stream_pieces(&tok, &ids);
            assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
            assert_eq!(pieces.concat(), text);
        }
    }

    #[test]
    fn skip_special_and_reuse_after_finish() {
        let mut v = VocabBuilder::new();
        let end = v.token("<|im_end|>", super::super::test_vocab::CONTROL);
        let hi = v.bytes_token(b"hi");
        let tok = v.build();
        let mut dec = tok.stream_decoder();
        assert_eq!(dec.push(hi), "hi");
        assert_eq!(dec.push(end), "<|im_end|>");
        assert_eq!(dec.push(0xE4), "");
        assert_eq!(dec.finish(), "\u{FFFD}");
        assert_eq!(dec.push(hi), "hi");
        let mut dec = tok.stream_decoder().with_skip_special(true);
        assert_eq!(dec.push(end), "");
        assert_eq!(dec.push(hi), "hi");
    }

    #[test]
    fn push_into_appends_and_reuses_buffers() {
        let text = "日本語 ok 😀";
        let (tok, ids) = tokens_for(text, &[1, 2, 4, 7, 9, 12, 14]);
        let mut dec = tok.stream_decoder();
        let mut out = String::with_capacity(64);
        let pending_capacity = dec.pending.capacity();
        for &id in &ids {
            dec.push_into(id, &mut out).unwrap();
        }
        dec.finish_into(&mut out);
        assert_eq!(out, text);
        assert_eq!(dec.pending.capacity(), pending_capacity);
        assert!(dec.push_into(u32::MAX, &mut out).is_err());
        assert_eq!(out, text);
    }
}
