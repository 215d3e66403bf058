//! YaRN RoPE scaling (`{arch}.rope.scaling.type = "yarn"`, how Qwen3 runs past 32k
//! positions) against transformers' float32 logits: a tiny random-weight Qwen3 model whose
//! config carries YaRN with an original context of 64, over 200 positions
//! (`tests/fixtures/yarn`, made by `gen_yarn.py`), on every CPU backend and the GPU. The
//! manifest records how far the logits move without the scaling, so ignoring it fails.

use inferno::backend::gpu::GpuBackend;
use inferno::backend::{create_backend, BackendOptions, Device};
use inferno::model::config::RopeScaling;
use inferno::model::{Logits, Model};
use std::sync::Arc;

mod common;

use common::arch::Fixture;

const FIXTURE: Fixture = Fixture {
    sub: "yarn",
    generator: "gen_yarn.py",
};

fn reference() -> Vec<f32> {
    FIXTURE.read_f32("tiny-yarn.seq0.hf.f32")
}

fn devices() -> Vec<(String, Device)> {
    let mut out: Vec<(String, Device)> = ["scalar", "simd", "pool"]
        .into_iter()
        .map(|n| {
            let opts = BackendOptions {
                threads: 2,
                tracing: false,
            };
            (n.to_string(), create_backend(n, &opts).expect(n))
        })
        .collect();
    if std::env::var("INFERNO_TEST_GPU").is_ok_and(|v| v == "0") {
        eprintln!("SKIPPED gpu: INFERNO_TEST_GPU=0 declares that this machine has no GPU adapter");
    } else {
        let gpu = GpuBackend::new().unwrap_or_else(|e| {
            panic!(
                "{e}\n(scripts/test installs Mesa's lavapipe; INFERNO_TEST_GPU=0 only without one)"
            )
        });
        out.push(("gpu".into(), Device::gpu(Arc::new(gpu))));
    }
    out
}

#[test]
fn yarn_metadata_is_read_as_transformers_configures_it() {
    let g = FIXTURE.open("tiny-yarn.f32.gguf");
    let model = Model::load(
        &g,
        create_backend("scalar", &BackendOptions::default()).unwrap(),
    )
    .expect("load");
    match model.config.rope_scaling {
        RopeScaling::Yarn {
            factor,
            original_context,
            beta_fast,
            beta_slow,
            attn_factor,
        } => {
            assert_eq!((factor, original_context), (4.0, 64.0));
            assert_eq!((beta_fast, beta_slow), (32.0, 1.0));
            assert!((attn_factor - (0.1 * 4f32.ln() + 1.0)).abs() < 1e-6);
        }
        other => panic!("read as {other:?}"),
    }
}

#[test]
fn yarn_logits_match_transformers_at_every_position_on_every_backend() {
    let m = FIXTURE.manifest();
    let ids: Vec<u32> = m["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let want = reference();
    let vocab = m["vocab_size"].as_u64().unwrap() as usize;
    let scale = m["logit_scale"].as_f64().unwrap() as f32;
    let without = m["max_abs_diff_without_yarn"].as_f64().unwrap() as f32;
    // The scaling matters far more than the tolerance: ignoring it could not pass.
    assert!(without > 1e-2 * scale, "{without} vs scale {scale}");
    let g = FIXTURE.open("tiny-yarn.f32.gguf");
    for (name, dev) in devices() {
        let model = Model::load(&g, dev).expect("load");
        let mut got = vec![0.0f32; ids.len() * vocab];
        let mut st = model.new_state(ids.len(), 64);
        model
            .forward(&mut st, &ids, Logits::All(&mut got))
            .expect("forward");
        let err = got
            .iter()
            .zip(&want)
            .fold(0.0f32, |e, (a, b)| e.max((a - b).abs()));
        // The F32 fixtures' bound (the GPU's f32 arithmetic is as close).
        assert!(
            err <= 1e-4 * scale,
            "{name}: max |Δ| {err} (logit scale {scale})"
        );
    }
}
