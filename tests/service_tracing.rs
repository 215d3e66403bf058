//! The engine thread's tracing: each request is a `request` span (request id, prompt
//! tokens) holding a `prefill` span per prompt chunk and a `decode_step` span (step,
//! position) per decoded token. The forward passes are batched over requests, so each is an
//! `engine_step` span (batch size, decode rows, prefill rows) holding the backend's kernel
//! spans.
//!
//! The engine runs on its own thread, so the capturing subscriber is the global default:
//! this file holds one test.

use inferno::engine::loader::{synthetic_assets, LoadOptions};
use inferno::engine::{Engine, EngineConfig, Event, NoObserver};
use inferno::engine::{GenerateOptions, Job};
use inferno::sampling::SamplingParams;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Clone, Debug)]
struct SpanRecord {
    name: String,
    parent: Option<String>,
    fields: HashMap<String, String>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<SpanRecord>>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("new span is registered");
        let parent = span.parent().map(|p| p.name().to_string());
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().push(SpanRecord {
            name: span.name().to_string(),
            parent,
            fields,
        });
    }
}

#[test]
fn request_span_holds_prefill_and_decode_steps_and_engine_steps_hold_kernels() {
    let capture = Capture::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(capture.clone()))
        .expect("no other global subscriber in this test binary");

    let engine = Engine::start(
        EngineConfig::default(),
        || synthetic_assets("demo", &LoadOptions::default()),
        Arc::new(NoObserver),
    )
    .unwrap();
    while matches!(engine.state(), inferno::engine::EngineState::Loading) {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let opts = GenerateOptions {
        max_tokens: 3,
        sampling: SamplingParams::greedy(),
        stop: vec![],
        ignore_eos: true,
        time_limit: None,
        grammar: None,
        speculate: true,
        ..GenerateOptions::default()
    };
    engine
        .submit(Job::new(
            "trace-me".into(),
            vec![72, 101, 108, 108, 111],
            opts,
            tx,
        ))
        .unwrap();
    let mut tokens = 0;
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            Event::Token(_) => tokens += 1,
            Event::Done(d) => assert!(d.finish_reason.is_some()),
            Event::Failed(e) => panic!("{e}"),
        }
    }
    assert_eq!(tokens, 3);
    engine.join();

    let spans = capture.0.lock().unwrap().clone();
    let requests: Vec<&SpanRecord> = spans.iter().filter(|s| s.name == "request").collect();
    assert_eq!(requests.len(), 1, "{spans:?}");
    assert_eq!(requests[0].fields["request_id"], "trace-me");
    assert_eq!(requests[0].fields["prompt_tokens"], "5");

    let prefill: Vec<&SpanRecord> = spans.iter().filter(|s| s.name == "prefill").collect();
    assert_eq!(prefill.len(), 1);
    assert_eq!(prefill[0].parent.as_deref(), Some("request"));
    assert_eq!(prefill[0].fields["tokens"], "5");
    assert_eq!(prefill[0].fields["position"], "0");

    // Three tokens: the first comes from the prefill, two more from decode steps.
    let steps: Vec<(String, String, Option<String>)> = spans
        .iter()
        .filter(|s| s.name == "decode_step")
        .map(|s| {
            (
                s.fields["step"].clone(),
                s.fields["position"].clone(),
                s.parent.clone(),
            )
        })
        .collect();
    let want = |step: &str, pos: &str| (step.to_string(), pos.to_string(), Some("request".into()));
    assert_eq!(steps, vec![want("1", "5"), want("2", "6")]);

    // One engine step per forward pass: the prompt, then two single-token decode steps.
    let engine_steps: Vec<(String, String, String)> = spans
        .iter()
        .filter(|s| s.name == "engine_step")
        .map(|s| {
            (
                s.fields["batch_size"].clone(),
                s.fields["decode_rows"].clone(),
                s.fields["prefill_rows"].clone(),
            )
        })
        .collect();
    let row = |b: &str, d: &str, p: &str| (b.to_string(), d.to_string(), p.to_string());
    assert_eq!(
        engine_steps,
        vec![row("1", "0", "5"), row("1", "1", "0"), row("1", "1", "0")]
    );

    // The backend's kernels nest inside the engine steps.
    let matmul_parents: Vec<&str> = spans
        .iter()
        .filter(|s| s.name == "matmul")
        .filter_map(|s| s.parent.as_deref())
        .collect();
    assert!(!matmul_parents.is_empty());
    assert!(
        matmul_parents.iter().all(|p| *p == "engine_step"),
        "{matmul_parents:?}"
    );
}
