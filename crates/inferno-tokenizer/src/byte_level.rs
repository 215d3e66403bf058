//! The GPT-2 byte-to-unicode table used by byte-level BPE vocabularies.
//!
//! Byte-level BPE stores every token as a string of "printable" stand-in
//! characters, one per raw byte. This module owns the mapping in both
//! directions and the conversion of a vocabulary string back to its bytes.

/// Largest code point the table produces (256 + 67 remapped bytes).
const MAX_MAPPED: usize = 0x143;

/// Byte value → stand-in character.
#[cfg(any(test, feature = "test-vocab"))]
const BYTE_TO_CHAR: [char; 256] = build_byte_to_char();

/// Stand-in code point → byte value, `u16::MAX` where the code point is not a stand-in.
const CHAR_TO_BYTE: [u16; MAX_MAPPED + 1] = build_char_to_byte();

/// Bytes that GPT-2 keeps as their own character: the visible Latin-1 range
/// minus the soft hyphen. All other bytes are shifted above U+00FF in order.
const fn is_kept(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

const fn build_byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut shifted = 0u32;
    let mut b = 0usize;
    while b < 256 {
        let cp = if is_kept(b as u8) {
            b as u32
        } else {
            let cp = 256 + shifted;
            shifted += 1;
            cp
        };
        // Every value is below 0x144, far from the surrogate range.
        table[b] = match char::from_u32(cp) {
            Some(c) => c,
            None => '\0',
        };
        b += 1;
    }
    table
}

const fn build_char_to_byte() -> [u16; MAX_MAPPED + 1] {
    let mut table = [u16::MAX; MAX_MAPPED + 1];
    let forward = build_byte_to_char();
    let mut b = 0usize;
    while b < 256 {
        table[forward[b] as usize] = b as u16;
        b += 1;
    }
    table
}

/// The stand-in character for a raw byte.
#[cfg(any(test, feature = "test-vocab"))]
pub(crate) fn byte_to_char(b: u8) -> char {
    BYTE_TO_CHAR[b as usize]
}

/// The raw byte a stand-in character represents, if it is one.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    match CHAR_TO_BYTE.get(c as usize) {
        Some(&b) if b != u16::MAX => Some(b as u8),
        _ => None,
    }
}

/// Appends the bytes a vocabulary string stands for to `out`.
///
/// Mirrors the Hugging Face byte-level decoder: when every character is a
/// stand-in the token is mapped byte by byte, otherwise (added tokens such as
/// text with real spaces or CJK) its UTF-8 text is used as is.
pub(crate) fn token_bytes_into(token: &str, out: &mut Vec<u8>) {
    let start = out.len();
    for c in token.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                out.truncate(start);
                out.extend_from_slice(token.as_bytes());
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_a_bijection() {
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c), "duplicate stand-in {c:?}");
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(seen.len(), 256);
    }

    #[test]
    fn well_known_stand_ins() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0xAD), 'Ń');
        assert_eq!(char_to_byte(' '), None);
        assert_eq!(char_to_byte('中'), None);
    }

    #[test]
    fn token_bytes_fall_back_to_raw_text() {
        let mut out = Vec::new();
        token_bytes_into("ĠhelloĊ", &mut out);
        assert_eq!(out, b" hello\n");
        out.clear();
        token_bytes_into("<think>", &mut out);
        assert_eq!(out, b"<think>");
        out.clear();
        token_bytes_into("a b", &mut out);
        assert_eq!(out, b"a b");
        out.clear();
        token_bytes_into("Ġ中", &mut out);
        assert_eq!(out, "Ġ中".as_bytes());
    }
}
