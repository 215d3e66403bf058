//! Helpers of the speculative-decoding tests: a generation run on its own with or without
//! speculation (what it emitted, bit for bit), and drafts from a known output that are
//! always right or always wrong.

use inferno::engine::speculative::draft::DraftModel;
use inferno::engine::speculative::{Proposer, Solo, Speculation};
use inferno::engine::{generate_speculative, FinishReason, Flow, GenerateOptions};
use inferno::model::Model;
use inferno::tokenizer::Tokenizer;
use std::sync::Arc;

/// What a generation emitted: each token with its logits' bits (hashed) and its chosen
/// logit, the finish reason and the speculation counts.
#[derive(Clone, Debug, PartialEq)]
pub struct Emitted {
    pub tokens: Vec<(u32, u64, u32)>,
    pub text: String,
    pub finish: FinishReason,
}

#[derive(Debug)]
pub struct Counts {
    pub drafted: usize,
    pub accepted: usize,
}

pub fn hash_bits(row: &[f32]) -> u64 {
    // FNV-1a over the bits: equal rows hash equal, a one-bit change moves it.
    row.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ u64::from(x.to_bits())).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Drafts from a known output: the reference continuation of each prompt it knows (right),
/// or a different token at every place (wrong); `n` tokens a step.
#[derive(Clone)]
pub struct Oracle {
    outputs: Arc<Vec<(Vec<u32>, Vec<u32>)>>,
    n: usize,
    wrong: bool,
    vocab: u32,
}

impl Proposer for Oracle {
    fn propose(&mut self, tokens: &[u32], out: &mut [u32]) -> usize {
        let Some((prompt, output)) = self.outputs.iter().find(|(p, _)| tokens.starts_with(p))
        else {
            return 0;
        };
        let done = tokens.len() - prompt.len();
        let next = output.get(done..).unwrap_or_default();
        let k = next.len().min(self.n).min(out.len());
        for (o, &t) in out.iter_mut().zip(&next[..k]) {
            *o = if self.wrong { (t + 1) % self.vocab } else { t };
        }
        k
    }
}

pub fn oracle(
    outputs: Vec<(Vec<u32>, Vec<u32>)>,
    n: usize,
    wrong: bool,
    vocab: usize,
) -> Speculation {
    let o = Oracle {
        outputs: Arc::new(outputs),
        n,
        wrong,
        vocab: vocab as u32,
    };
    Speculation::custom(Arc::new(move || Box::new(o.clone())), n)
}

/// One generation on its own, speculating as `spec` says (off when `None`).
pub fn solo(
    model: &Model,
    tok: &Tokenizer,
    draft: Option<&DraftModel>,
    spec: Option<&Speculation>,
    prompt: &[u32],
    opts: &GenerateOptions,
) -> (Emitted, Counts) {
    let cap = prompt.len() + opts.max_tokens + 1;
    let mut st = model.new_state(cap, 64);
    let mut sp = spec.map(|s| Solo::new(s, draft, cap).unwrap().expect("speculation on"));
    let mut tokens = Vec::new();
    let g = generate_speculative(model, tok, &mut st, prompt, opts, sp.as_mut(), |ev| {
        if let Some(id) = ev.id {
            tokens.push((id, hash_bits(ev.logits), ev.logits[id as usize].to_bits()));
        }
        Flow::Continue
    })
    .unwrap();
    let counts = Counts {
        drafted: g.metrics.drafted_tokens,
        accepted: g.metrics.accepted_tokens,
    };
    (
        Emitted {
            tokens,
            text: g.text,
            finish: g.finish_reason,
        },
        counts,
    )
}
