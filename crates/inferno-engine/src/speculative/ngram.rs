//! Prompt lookup: drafts are the tokens that followed the latest earlier occurrence of the
//! sequence's last few tokens in its own prompt and output. An edit that returns most of its
//! input, a summary quoting its source, code repeating an identifier: the continuation is
//! already in the context. Nothing is kept between calls, so nothing of one sequence
//! reaches another; a lookup scans the context once, allocating nothing.

use super::Proposer;

/// The shortest suffix looked up: a single token matches far too often to predict anything.
pub const MIN_MATCH: usize = 2;
/// The longest suffix compared: a longer match is the better predictor, and among equally
/// long ones the latest.
pub const MAX_MATCH: usize = 8;

/// Writes to `out` the tokens that followed the best earlier occurrence of a suffix of
/// `tokens` (the longest, up to [`MAX_MATCH`] tokens and at least [`MIN_MATCH`]; the
/// latest of equally long ones) and returns how many (0 when no suffix recurs). The
/// continuation may run into the suffix itself (a repeating pattern continues).
pub fn lookup(tokens: &[u32], out: &mut [u32]) -> usize {
    let n = tokens.len();
    if n <= MIN_MATCH || out.is_empty() {
        return 0;
    }
    let last = tokens[n - 1];
    // (end of the match, its length)
    let mut best: Option<(usize, usize)> = None;
    for j in (0..n - 1).rev() {
        if tokens[j] != last {
            continue;
        }
        // Suffix length shared by the positions ending at j and at n - 1.
        let mut len = 1;
        while len < MAX_MATCH && len <= j && tokens[j - len] == tokens[n - 1 - len] {
            len += 1;
        }
        if len >= MIN_MATCH && best.is_none_or(|(_, l)| len > l) {
            best = Some((j, len));
            if len == MAX_MATCH {
                break;
            }
        }
    }
    let Some((j, _)) = best else { return 0 };
    let follow = &tokens[j + 1..];
    let k = follow.len().min(out.len());
    out[..k].copy_from_slice(&follow[..k]);
    k
}

/// The [`lookup`] proposer.
#[derive(Clone, Copy, Debug, Default)]
pub struct NgramProposer;

impl Proposer for NgramProposer {
    fn propose(&mut self, tokens: &[u32], out: &mut [u32]) -> usize {
        lookup(tokens, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn propose(tokens: &[u32], k: usize) -> Vec<u32> {
        let mut out = vec![0; k];
        let n = lookup(tokens, &mut out);
        out.truncate(n);
        out
    }

    #[test]
    fn the_longest_latest_match_is_continued() {
        // "1 2 3 4 5 ... 1 2 3" → 4 5 ...
        assert_eq!(propose(&[1, 2, 3, 4, 5, 6, 9, 1, 2, 3], 3), vec![4, 5, 6]);
        // Two occurrences of "2 3": the later one wins at equal length...
        assert_eq!(propose(&[2, 3, 7, 8, 2, 3, 5, 6, 2, 3], 2), vec![5, 6]);
        // ...but a longer match wins over a later one.
        assert_eq!(
            propose(&[1, 2, 3, 7, 8, 9, 2, 3, 5, 6, 1, 2, 3], 2),
            vec![7, 8]
        );
        // A single recurring token is not enough; nothing recurs in a short context.
        assert!(propose(&[4, 1, 5, 6, 1], 4).is_empty());
        assert!(propose(&[1, 2], 4).is_empty());
        // The continuation may run into the suffix (a repeating pattern), and is capped by
        // both the room in `out` and the context.
        assert_eq!(propose(&[7, 8, 7, 8, 7, 8], 10), vec![7, 8]);
        assert_eq!(propose(&[1, 2, 3, 4, 1, 2], 1), vec![3]);
    }
}
