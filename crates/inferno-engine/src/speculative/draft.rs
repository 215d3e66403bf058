//! Drafting with a second, smaller model of the same vocabulary ([`DraftModel`]), e.g. a
//! smaller quantization of the served model. It runs on the served model's device (the same
//! engine thread and thread pool), each sequence with a KV cache of its own ([`DraftCache`])
//! taken from the same budget, and drafts greedily: one batched forward pass of the draft
//! model per draft token, over every sequence drafting in the step ([`draft_step`]).
//!
//! A sequence's draft cache follows its tokens lazily: the first pass of a step runs
//! whatever the cache lacks (the prompt, the tokens accepted since), in slices when that is
//! long, and only a sequence that is caught up drafts. After verification the cache keeps
//! the drafts that were accepted and drops the rest.

use inferno_backend::exec::recycle;
use inferno_model::{KvCache, Logits, Model, ModelError, Scratch, SeqStep};
use inferno_tokenizer::Tokenizer;

/// A draft model, loaded on the served model's device.
pub struct DraftModel {
    pub model: Model,
    /// Its file name, for logs and model info.
    pub name: String,
    /// Token ids a draft may take: those both models' output rows cover.
    vocab: usize,
}

impl DraftModel {
    /// `model` as the draft model of a model whose tokenizer is `main` and whose logits have
    /// `main_vocab` entries; refused (with the first difference) unless the two vocabularies
    /// are the same token for token.
    pub fn new(
        model: Model,
        name: String,
        draft: &Tokenizer,
        main: &Tokenizer,
        main_vocab: usize,
    ) -> Result<Self, String> {
        same_vocabulary(main, draft)
            .map_err(|e| format!("the draft model {name} cannot draft for this model: {e}"))?;
        let vocab = model.config.vocab.min(main_vocab);
        Ok(Self { model, name, vocab })
    }

    /// A cache for one sequence of up to `capacity` positions.
    pub fn new_cache(&self, capacity: usize) -> DraftCache {
        DraftCache {
            kv: self.model.new_kv_cache(capacity),
            synced: 0,
            drafted: 0,
            logits: vec![0.0; self.model.config.vocab],
            broken: false,
        }
    }

    /// Buffers for draft passes of up to `rows` rows.
    pub fn new_scratch(&self, rows: usize, logit_rows: usize) -> Scratch {
        self.model.new_scratch(rows, logit_rows)
    }
}

/// Whether two tokenizers have the same tokens under the same ids.
pub fn same_vocabulary(main: &Tokenizer, draft: &Tokenizer) -> Result<(), String> {
    if main.vocab_size() != draft.vocab_size() {
        return Err(format!(
            "its vocabulary has {} tokens, the model's {}",
            draft.vocab_size(),
            main.vocab_size()
        ));
    }
    for id in 0..main.vocab_size() as u32 {
        let (a, b) = (main.token_text(id), draft.token_text(id));
        if a != b || main.token_type(id) != draft.token_type(id) {
            return Err(format!(
                "token {id} is {:?} in the model's vocabulary and {:?} in the draft's",
                a.unwrap_or_default(),
                b.unwrap_or_default()
            ));
        }
    }
    Ok(())
}

/// One sequence's draft-model KV cache.
pub struct DraftCache {
    kv: KvCache,
    /// Leading tokens of the sequence whose keys and values the cache holds.
    synced: usize,
    /// Drafts of the last step (their keys and values, but the last one's, follow
    /// `synced` in the cache until [`DraftCache::settle`]).
    drafted: usize,
    logits: Vec<f32>,
    /// A draft pass failed: the cache cannot be trusted, the sequence drafts no more.
    broken: bool,
}

impl DraftCache {
    /// Tokens of a sequence of `len` tokens the cache still has to run before it can draft.
    pub fn behind(&self, len: usize) -> usize {
        len.saturating_sub(self.synced)
    }

    /// Most drafts the cache has room for after catching up with `len` tokens.
    pub fn room(&self, len: usize) -> usize {
        if self.broken {
            return 0;
        }
        // Catching up fills `len` positions; each draft but the last adds one.
        (self.kv.capacity() + 1).saturating_sub(len.max(self.synced))
    }

    /// Drafts of the last draft passes (awaiting [`DraftCache::settle`]).
    pub fn drafted(&self) -> usize {
        self.drafted
    }

    pub fn is_broken(&self) -> bool {
        self.broken
    }

    /// Marks the cache unusable (a draft pass failed or panicked).
    pub fn break_off(&mut self) {
        self.broken = true;
    }

    /// After verification of the last step's drafts, of which the first `accepted` equalled
    /// the picks: keeps their keys and values (those the cache holds) and drops the rest.
    pub fn settle(&mut self, accepted: usize) {
        if self.drafted == 0 {
            return;
        }
        self.synced += accepted.min(self.drafted - 1);
        self.kv.truncate(self.synced);
        self.drafted = 0;
    }
}

/// One sequence's part in a step's drafting.
pub struct DraftJob<'a> {
    pub cache: &'a mut DraftCache,
    /// The sequence's tokens (prompt and output so far).
    pub tokens: &'a [u32],
    /// Run the cache up to this many tokens (all of them when drafting).
    pub upto: usize,
    /// Drafts wanted (0: only catch up); `out` holds at least this many.
    pub want: usize,
    pub out: &'a mut [u32],
}

/// The draft passes of one step: first every job's missing tokens (up to its `upto`), then
/// one token at a time for the jobs that draft, each pass batched over all of them. Each
/// draft is the draft model's most likely next token. `steps` is an empty list whose
/// allocation is reused; it comes back empty. On an error the jobs' caches are broken off
/// (the sequences go on without drafts).
pub fn draft_step(
    draft: &DraftModel,
    scratch: &mut Scratch,
    mut steps: Vec<SeqStep<'static>>,
    jobs: &mut [DraftJob<'_>],
) -> (Vec<SeqStep<'static>>, Result<(), ModelError>) {
    let vocab = draft.vocab;
    let rounds = jobs.iter().map(|j| j.want).max().unwrap_or(0);
    let mut result = Ok(());
    for round in 0..rounds.max(1) {
        let mut batch = recycle(steps);
        for j in jobs.iter_mut() {
            let DraftJob {
                cache,
                tokens,
                upto,
                want,
                out,
            } = j;
            if cache.broken {
                continue;
            }
            let (rows, logits) = if round == 0 {
                let rows = &tokens[cache.synced.min(*upto)..*upto];
                cache.drafted = 0;
                cache.synced = (*upto).max(cache.synced);
                let logits = if *want > 0 {
                    Logits::Last(&mut cache.logits[..])
                } else {
                    Logits::None
                };
                (rows, logits)
            } else if round < *want {
                (&out[round - 1..round], Logits::Last(&mut cache.logits[..]))
            } else {
                continue;
            };
            if rows.is_empty() {
                // Nothing to run: nothing to draft from either.
                *want = 0;
                continue;
            }
            batch.push(SeqStep {
                kv: &mut cache.kv,
                tokens: rows,
                logits,
            });
        }
        let ran = if batch.is_empty() {
            Ok(())
        } else {
            draft.model.forward_batch(&mut batch, scratch)
        };
        steps = recycle(batch);
        if let Err(e) = ran {
            result = Err(e);
            break;
        }
        for j in jobs.iter_mut() {
            if round < j.want && !j.cache.broken {
                j.out[round] = inferno_sampling::argmax(&j.cache.logits[..vocab]);
                j.cache.drafted = round + 1;
            }
        }
    }
    if result.is_err() {
        for j in jobs.iter_mut() {
            j.cache.broken = true;
        }
    }
    (steps, result)
}

/// Empties a list of draft jobs and gives its allocation back for jobs of another lifetime
/// (as [`recycle`] does for steps).
// The `filter_map` changes the item type (its lifetime), which `filter` cannot.
#[allow(clippy::unnecessary_filter_map)]
pub fn recycle_jobs<'b>(mut v: Vec<DraftJob<'_>>) -> Vec<DraftJob<'b>> {
    v.clear();
    v.into_iter().filter_map(|_| None).collect()
}
