//! The engine thread's loop allocates, per step, only for what it streams: once every
//! sequence decodes, a step allocates each token's decoded piece and sent text and the
//! channels' occasional blocks, nothing that grows with the step count.
//! Counted on the engine thread between consecutive steps (the observer's `step` call), so
//! admission, planning, the forward pass, sampling and streaming are all inside.

mod alloc_counter;

use inferno::engine::loader::{synthetic_assets, LoadOptions};
use inferno::engine::{Engine, EngineConfig, Event, GenerateOptions, Job, Observer};
use inferno::sampling::SamplingParams;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[global_allocator]
static GLOBAL: alloc_counter::Counting = alloc_counter::Counting;

const STEPS: usize = 64;
const SEQS: usize = 4;

/// Allocations between one step and the next, per step, in fixed storage (recording must
/// not allocate on the thread it counts), and each step's decode rows.
struct StepAllocs<const N: usize> {
    steps: AtomicUsize,
    allocs: [AtomicUsize; N],
    decode_rows: [AtomicUsize; N],
}

impl<const N: usize> StepAllocs<N> {
    fn new() -> Self {
        Self {
            steps: AtomicUsize::new(0),
            allocs: std::array::from_fn(|_| AtomicUsize::new(0)),
            decode_rows: std::array::from_fn(|_| AtomicUsize::new(0)),
        }
    }

    /// The observer's `step`: closes the previous step's count.
    fn step(&self, decode_rows: usize) {
        let i = self.steps.fetch_add(1, Ordering::SeqCst);
        if i == 0 {
            alloc_counter::start();
        } else if i <= self.allocs.len() {
            self.allocs[i - 1].store(alloc_counter::take(), Ordering::SeqCst);
        }
        if i < self.decode_rows.len() {
            self.decode_rows[i].store(decode_rows, Ordering::SeqCst);
        }
    }
}

type PerStep = StepAllocs<{ STEPS + 8 }>;

impl Observer for PerStep {
    fn step(&self, _batch_size: usize, decode_rows: usize, _prefill_rows: usize) {
        StepAllocs::step(self, decode_rows);
    }
}

#[test]
fn a_decoding_step_allocates_only_what_it_streams() {
    let obs = Arc::new(PerStep::new());
    let config = EngineConfig {
        max_seqs: SEQS,
        ..EngineConfig::default()
    };
    let opts = LoadOptions {
        backend: "simd".into(),
        ..LoadOptions::default()
    };
    let engine = Engine::start(
        config,
        move || synthetic_assets("demo", &opts),
        Arc::clone(&obs) as Arc<dyn Observer>,
    )
    .unwrap();
    while matches!(engine.state(), inferno::engine::EngineState::Loading) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut rxs = Vec::new();
    for s in 0..SEQS as u32 {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        // Half the sequences sample with a logit bias and penalties (their adjusted row is
        // a buffer sized once, at admission).
        let sampling = if s % 2 == 0 {
            SamplingParams::greedy()
        } else {
            SamplingParams {
                repeat_penalty: 1.1,
                frequency_penalty: 0.2,
                logit_bias: vec![(101, 1.5), (32, -100.0)],
                seed: Some(u64::from(s)),
                ..SamplingParams::default()
            }
        };
        let opts = GenerateOptions {
            max_tokens: STEPS,
            sampling,
            stop: vec![],
            ignore_eos: true,
            time_limit: None,
            grammar: None,
            // Whether a step drafts is chosen from measured costs, so it would depend on
            // the machine's timing which steps decode one row a sequence (those counted
            // here); speculating steps are the next test's, at fixed costs.
            speculate: false,
            ..GenerateOptions::default()
        };
        let prompt = vec![72 + s, 101, 108, 108, 111];
        engine
            .submit(Job::new(format!("seq-{s}"), prompt, opts, tx))
            .unwrap();
        rxs.push(rx);
    }
    // What each step streamed: tokens with text (each a `String`).
    let mut texts = vec![0usize; STEPS + 1];
    for rx in &mut rxs {
        while let Some(ev) = rx.blocking_recv() {
            match ev {
                Event::Token(t) if !t.text.is_empty() => texts[t.index] += 1,
                Event::Token(_) => {}
                Event::Done(d) => assert!(d.finish_reason.is_some()),
                Event::Failed(e) => panic!("{e}"),
            }
        }
    }
    engine.join();
    let steps = obs.steps.load(Ordering::SeqCst);
    assert!(steps >= STEPS, "{steps} steps");
    // Steps where every sequence decodes, away from the start (admission, prefill) and the
    // end (finishing sequences allocate their results).
    let steady: Vec<usize> = (0..steps.min(obs.allocs.len()))
        .filter(|&i| i > 4 && i + 4 < STEPS)
        .filter(|&i| obs.decode_rows[i].load(Ordering::SeqCst) == SEQS)
        .collect();
    assert!(steady.len() > STEPS / 2, "{steady:?}");
    let allocs: Vec<usize> = steady
        .iter()
        .map(|&i| obs.allocs[i].load(Ordering::SeqCst))
        .collect();
    let total: usize = allocs.iter().sum();
    // Per token: its decoded piece and the text sent (a `String` each), and each channel
    // allocates a block every 32 messages.
    let per_step = 2 * SEQS;
    let blocks = SEQS * (STEPS / 32 + 1);
    eprintln!("allocations per steady step: {allocs:?}");
    assert!(
        total <= per_step * allocs.len() + blocks,
        "{total} allocations in {} steady steps: {allocs:?}",
        allocs.len()
    );
    assert!(allocs.iter().all(|&n| n <= per_step + SEQS), "{allocs:?}");
    // The tokens really carried text (so the bound above counts real strings).
    assert!(texts.iter().sum::<usize>() > SEQS * STEPS / 2, "{texts:?}");
}

/// Allocations, tokens streamed and sequences ended between one step and the next, per step.
struct PerSpecStep {
    counts: StepAllocs<{ 4 * STEPS }>,
    tokens: [AtomicUsize; 4 * STEPS],
    ended: [AtomicUsize; 4 * STEPS],
}

impl PerSpecStep {
    fn now(&self) -> Option<usize> {
        let i = self.counts.steps.load(Ordering::SeqCst);
        (i > 0 && i <= self.tokens.len()).then(|| i - 1)
    }
}

impl Observer for PerSpecStep {
    fn step(&self, _batch_size: usize, decode_rows: usize, _prefill_rows: usize) {
        self.counts.step(decode_rows);
    }
    fn time_to_first_token(&self, _ttft: std::time::Duration) {
        if let Some(i) = self.now() {
            self.tokens[i].fetch_add(1, Ordering::SeqCst);
        }
    }
    fn decode_step(&self, _step: std::time::Duration) {
        self.time_to_first_token(std::time::Duration::ZERO);
    }
    fn ended(&self) {
        if let Some(i) = self.now() {
            self.ended[i].fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// With speculation on (lookups, and a draft model drafting in batched passes), a step
/// still allocates only for the tokens it streams, however many each step yields: the
/// drafts, their rows, the draft passes and the verification use buffers sized when each
/// sequence starts.
#[test]
fn a_speculating_step_allocates_only_what_it_streams() {
    use inferno::engine::speculative::draft::DraftModel;
    use inferno::engine::speculative::{Method, Speculation};
    for method in [Method::Ngram, Method::Draft] {
        let obs = Arc::new(PerSpecStep {
            counts: StepAllocs::new(),
            tokens: std::array::from_fn(|_| AtomicUsize::new(0)),
            ended: std::array::from_fn(|_| AtomicUsize::new(0)),
        });
        let config = EngineConfig {
            max_seqs: SEQS,
            // Fixed costs: every sequence drafts whatever the machine's load.
            speculation: Speculation::new(method, Some(4)).with_costs(0.05, 0.05),
            ..EngineConfig::default()
        };
        let opts = LoadOptions {
            backend: "simd".into(),
            ..LoadOptions::default()
        };
        let engine = Engine::start(
            config,
            move || {
                let mut a = synthetic_assets("demo", &opts)?;
                if method == Method::Draft {
                    // The model as its own draft: every draft is accepted.
                    let spec = inferno::model::synth::SynthSpec::preset(
                        "demo",
                        inferno::tensor::GgmlType::Q8_0,
                    )
                    .unwrap();
                    let g = inferno::gguf::GgufFile::from_bytes(
                        inferno::model::synth::build(&spec).unwrap().to_bytes(),
                    )
                    .unwrap();
                    let m = inferno::model::Model::load(&g, a.model.device().clone()).unwrap();
                    let tok = inferno::tokenizer::Tokenizer::from_gguf(&g).unwrap();
                    a.draft = Some(DraftModel::new(
                        m,
                        "demo".into(),
                        &tok,
                        &a.tokenizer,
                        a.model.config.vocab,
                    )?);
                }
                Ok(a)
            },
            Arc::clone(&obs) as Arc<dyn Observer>,
        )
        .unwrap();
        while matches!(engine.state(), inferno::engine::EngineState::Loading) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mut rxs = Vec::new();
        for s in 0..SEQS as u32 {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            let opts = GenerateOptions {
                max_tokens: 3 * STEPS,
                sampling: SamplingParams::greedy(),
                ignore_eos: true,
                ..GenerateOptions::default()
            };
            // Repetitive prompts: lookups find continuations.
            let prompt = vec![97 + s, 32, 98, 32, 97 + s, 32, 98, 32, 97 + s];
            engine
                .submit(Job::new(format!("seq-{s}"), prompt, opts, tx))
                .unwrap();
            rxs.push(rx);
        }
        let mut drafted = 0;
        for rx in &mut rxs {
            while let Some(ev) = rx.blocking_recv() {
                match ev {
                    Event::Done(d) => drafted += d.drafted_tokens,
                    Event::Failed(e) => panic!("{e}"),
                    Event::Token(_) => {}
                }
            }
        }
        engine.join();
        assert!(drafted > SEQS * STEPS / 2, "{method:?}: {drafted} drafted");
        let steps = obs
            .counts
            .steps
            .load(Ordering::SeqCst)
            .min(obs.tokens.len());
        // Steps where every sequence decodes and none ends (an ending allocates its
        // result), away from the start (admission, prefill).
        let load = |a: &[AtomicUsize], i: usize| a[i].load(Ordering::SeqCst);
        let steady: Vec<usize> = (5..steps.saturating_sub(1))
            .filter(|&i| load(&obs.counts.decode_rows, i) == SEQS)
            .filter(|&i| load(&obs.ended, i) == 0 && load(&obs.ended, i + 1) == 0)
            .collect();
        assert!(steady.len() > 8, "{method:?}: {steady:?}");
        let (mut allocs, mut tokens) = (0, 0);
        for &i in &steady {
            let (a, t) = (load(&obs.counts.allocs, i), load(&obs.tokens, i));
            // Per token: its decoded piece and the text sent; a channel block per stream, and
            // as much again for a stream's buffers growing once (the total below holds the
            // steps to their tokens).
            assert!(
                a <= 2 * t + 2 * SEQS,
                "{method:?} step {i}: {a} allocations, {t} tokens"
            );
            allocs += a;
            tokens += t;
        }
        // More than a token a step per sequence: accepted drafts streamed too.
        assert!(
            tokens > SEQS * steady.len(),
            "{method:?}: {tokens} tokens in {} steps",
            steady.len()
        );
        let blocks = SEQS * (3 * STEPS / 32 + 1);
        assert!(
            allocs <= 2 * tokens + blocks,
            "{method:?}: {allocs} allocations for {tokens} tokens"
        );
    }
}
