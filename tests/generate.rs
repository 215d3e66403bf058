//! Generation semantics on the synthetic demo model: streaming text, stop conditions,
//! seeds, limits.

use inferno::backend::{create_backend, BackendOptions};
use inferno::engine::{generate, FinishReason, Flow, GenerateError, GenerateOptions};
use inferno::gguf::GgufFile;
use inferno::model::synth::{self, SynthSpec};
use inferno::model::Model;
use inferno::sampling::SamplingParams;
use inferno::tensor::GgmlType;
use inferno::tokenizer::Tokenizer;

fn demo() -> (Model, Tokenizer) {
    let spec = SynthSpec::preset("demo", GgmlType::Q8_0).unwrap();
    let gguf = GgufFile::from_bytes(synth::build(&spec).unwrap().to_bytes()).unwrap();
    let be = create_backend("scalar", &BackendOptions::default()).unwrap();
    (
        Model::load(&gguf, be).unwrap(),
        Tokenizer::from_gguf(&gguf).unwrap(),
    )
}

fn opts(max_tokens: usize, sampling: SamplingParams) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling,
        ignore_eos: true,
        ..GenerateOptions::default()
    }
}

#[test]
fn streamed_pieces_concatenate_to_the_text_and_stop_strings_cut_it() {
    let (model, tok) = demo();
    let prompt = tok.encode("The sea", false).unwrap();
    let mut st = model.new_state(256, 64);
    let mut pieces = Vec::new();
    let g = generate(
        &model,
        &tok,
        &mut st,
        &prompt,
        &opts(40, SamplingParams::greedy()),
        |ev| {
            pieces.push(ev.text.to_string());
            Flow::Continue
        },
    )
    .unwrap();
    assert_eq!(g.finish_reason, FinishReason::Length);
    assert_eq!(g.tokens.len(), 40);
    assert_eq!(pieces.concat(), g.text);
    assert_eq!(g.text, tok.decode(&g.tokens, false).unwrap());

    // Stop on a string taken from the middle of that text: the output ends right before it.
    let chars: Vec<char> = g.text.chars().collect();
    let stop: String = chars[10..12].iter().collect();
    let cut = g.text.find(&stop).unwrap();
    let mut o = opts(40, SamplingParams::greedy());
    o.stop = vec![stop.clone()];
    let mut streamed = String::new();
    let s = generate(&model, &tok, &mut st, &prompt, &o, |ev| {
        streamed.push_str(ev.text);
        Flow::Continue
    })
    .unwrap();
    assert_eq!(s.finish_reason, FinishReason::StopSequence);
    assert_eq!(s.text, g.text[..cut]);
    assert_eq!(streamed, s.text);
}

#[test]
fn seeds_reproduce_and_cancellation_stops() {
    let (model, tok) = demo();
    let prompt = tok.encode("abc", false).unwrap();
    let mut st = model.new_state(128, 64);
    let sampling = SamplingParams {
        temperature: 1.0,
        seed: Some(1234),
        ..SamplingParams::default()
    };
    let run = |st: &mut _| {
        generate(
            &model,
            &tok,
            st,
            &prompt,
            &opts(24, sampling.clone()),
            |_| Flow::Continue,
        )
        .unwrap()
    };
    let a = run(&mut st);
    let b = run(&mut st);
    assert_eq!(a.tokens, b.tokens);
    assert_eq!(a.seed, 1234);

    let mut n = 0;
    let c = generate(&model, &tok, &mut st, &prompt, &opts(24, sampling), |_| {
        n += 1;
        if n == 3 {
            Flow::Stop
        } else {
            Flow::Continue
        }
    })
    .unwrap();
    assert_eq!(c.finish_reason, FinishReason::Cancelled);
    assert_eq!(c.tokens.len(), 3);
}

#[test]
fn limits_are_errors_or_length() {
    let (model, tok) = demo();
    let mut st = model.new_state(16, 8);
    let long: Vec<u32> = (0..16).collect();
    let err = generate(
        &model,
        &tok,
        &mut st,
        &long,
        &opts(4, SamplingParams::greedy()),
        |_| Flow::Continue,
    )
    .unwrap_err();
    assert!(matches!(
        err,
        GenerateError::PromptTooLong {
            prompt: 16,
            context: 16
        }
    ));
    // A full context ends the generation with LENGTH rather than an error.
    let g = generate(
        &model,
        &tok,
        &mut st,
        &long[..10],
        &opts(100, SamplingParams::greedy()),
        |_| Flow::Continue,
    )
    .unwrap();
    assert_eq!(g.finish_reason, FinishReason::Length);
    assert_eq!(g.tokens.len(), 7);
    let err = generate(
        &model,
        &tok,
        &mut st,
        &[],
        &opts(4, SamplingParams::greedy()),
        |_| Flow::Continue,
    );
    assert!(matches!(err, Err(GenerateError::EmptyPrompt)));
}

/// The demo model's text looks like a model's: varied printable characters, not one
/// repeated; sampling changes it, and it does not end itself at once (its end token is all
/// but impossible, so streams run to max_tokens).
#[test]
fn the_demo_model_writes_varied_text_and_sampling_changes_it() {
    let (model, tok) = demo();
    let prompt = tok.encode("Once upon a time", false).unwrap();
    let run = |sampling: SamplingParams| {
        let mut st = model.new_state(256, 64);
        let o = GenerateOptions {
            max_tokens: 48,
            sampling,
            ..GenerateOptions::default()
        };
        generate(&model, &tok, &mut st, &prompt, &o, |_| Flow::Continue).unwrap()
    };
    let greedy = run(SamplingParams::greedy());
    let sampled = run(SamplingParams {
        temperature: 1.0,
        seed: Some(7),
        ..SamplingParams::default()
    });
    for g in [&greedy, &sampled] {
        assert_eq!(g.finish_reason, FinishReason::Length, "{:?}", g.text);
        let distinct: std::collections::BTreeSet<u32> = g.tokens.iter().copied().collect();
        assert!(
            distinct.len() > 3,
            "{} distinct tokens: {:?}",
            distinct.len(),
            g.text
        );
        assert!(
            g.text
                .chars()
                .all(|c| c.is_ascii_graphic() || c == ' ' || c == '\n'),
            "{:?}",
            g.text
        );
        assert!(g.text.contains(' '), "no words: {:?}", g.text);
    }
    assert_ne!(greedy.tokens, sampled.tokens);
    // Two seeds, two texts.
    let other = run(SamplingParams {
        temperature: 1.0,
        seed: Some(8),
        ..SamplingParams::default()
    });
    assert_ne!(other.tokens, sampled.tokens);
}
