//! What lossless speculative decoding rests on: a sequence's last token and its draft tokens
//! run as the rows of one step give, row for row, exactly the logits the one-row decode steps
//! give at those positions, bit for bit, on every CPU backend and thread count, alone and
//! batched with other sequences, with every KV cache type. Each row's products, norms,
//! activations and its attention over the sequence's own new rows (stored in the same step)
//! must depend on nothing but its own inputs.
//!
//! The models are small synthetic ones of every weight type the kernels read (the legacy
//! and K-quant types by requantizing an F32 model, as `inferno quantize` does), one with an
//! FFN width that is not a multiple of the vector width, and the mixture-of-experts fixture.

mod common;

use inferno::backend::cpu::simd::{Isa, SimdBackend};
use inferno::backend::{
    create_backend, Backend, BackendOptions, Device, KvType, ParallelBackend, PoolBackend,
    ScalarBackend,
};
use inferno::gguf::GgufFile;
use inferno::model::synth::{self, SynthSpec};
use inferno::model::Model;
use inferno::tensor::GgmlType;
use std::sync::Arc;

/// A small random Qwen3 model.
fn synth_model(
    dtype: GgmlType,
    hidden: usize,
    heads: (usize, usize, usize),
    ffn: usize,
) -> GgufFile {
    let mut spec = SynthSpec::preset("demo", dtype).expect("preset");
    spec.tied = true;
    spec.readable = false;
    spec.n_layers = 2;
    spec.hidden = hidden;
    (spec.n_heads, spec.n_kv_heads, spec.head_dim) = heads;
    spec.ffn = ffn;
    spec.context_length = 2048;
    spec.seed = 7 + hidden as u64 + ffn as u64;
    GgufFile::from_bytes(synth::build(&spec).expect("synth").to_bytes()).expect("gguf")
}

/// The models: every weight type, GQA of several group sizes, head sizes that are and are
/// not multiples of 8, and FFN widths that are and are not multiples of 8.
fn models() -> Vec<(String, GgufFile)> {
    let mut out = common::synth_models();
    // An F32 model whose FFN rows (100) end off the 8-lane vectors: every row of a
    // multi-row step starts at another lane than the one-row step's.
    out.push((
        "synth-f32-ffn100".into(),
        synth_model(GgmlType::F32, 64, (4, 2, 16), 100),
    ));
    let base = synth_model(GgmlType::F32, 256, (4, 2, 64), 512);
    for scheme in ["q4_k_m", "q5_k_s", "q6_k", "q4_0", "q5_0", "q8_0"] {
        out.push((
            format!("synth-256-{scheme}"),
            common::requantize(&base, scheme),
        ));
    }
    let moe = common::fixtures().join("qwen3moe/tiny-qwen3moe.q8_0.gguf");
    out.push((
        "tiny-qwen3moe.q8_0".into(),
        GgufFile::open(&moe).expect("moe fixture"),
    ));
    out
}

/// Every CPU backend stack at several thread counts, on each instruction set this CPU has.
fn backends() -> Vec<(String, Device)> {
    let mut out: Vec<(String, Device)> = vec![(
        "scalar".into(),
        Device::host(Arc::new(ScalarBackend::new()) as Arc<dyn Backend>),
    )];
    for isa in Isa::available() {
        let simd = || SimdBackend::with_isa(ScalarBackend::new(), isa);
        out.push((
            format!("simd/{isa:?}"),
            Device::host(Arc::new(simd()) as Arc<dyn Backend>),
        ));
        for t in [1, 2, 3] {
            let be = PoolBackend::new(simd(), t);
            out.push((
                format!("pool/{isa:?}/{t}"),
                Device::host(Arc::new(be) as Arc<dyn Backend>),
            ));
        }
        let be = ParallelBackend::new(simd(), 2);
        out.push((
            format!("parallel/{isa:?}/2"),
            Device::host(Arc::new(be) as Arc<dyn Backend>),
        ));
    }
    out
}

/// The KV cache types this model's head size allows.
fn kv_types(model: &Model) -> Vec<(KvType, KvType)> {
    let mut t = vec![(KvType::F32, KvType::F32), (KvType::F16, KvType::F16)];
    if model.config.head_dim.is_multiple_of(32) {
        t.push((KvType::Q8_0, KvType::F16));
        t.push((KvType::Q8_0, KvType::Q8_0));
    }
    t
}

#[test]
fn a_multi_row_step_gives_each_row_the_one_row_steps_logits_bit_for_bit() {
    let backends = backends();
    let best = format!("{:?}", Isa::best());
    for (model_name, g) in models() {
        // The requantized models are the larger ones: their kernels are checked on the
        // best instruction set (each product's bits on every set are scalar's, as
        // tests/quant_kernels.rs shows), every KV type on one of them.
        let large = model_name.starts_with("synth-256");
        for (be_name, device) in &backends {
            if large && !be_name.contains(&best) {
                continue;
            }
            let mut model = Model::load(&g, device.clone()).expect("model loads");
            let mut types = kv_types(&model);
            if large && !model_name.ends_with("q8_0") {
                types.truncate(1);
            }
            for types in types {
                model.set_kv_types(types).unwrap();
                let vocab = model.config.vocab;
                let prompt = common::tokens(vocab, 7, 1);
                // 3 and 9 rows: token tiles of several sizes and a remainder.
                for k in [3, 9] {
                    let drafts = common::tokens(vocab, k, 2);
                    let want = common::one_by_one(&model, &prompt, &drafts);
                    let name = format!("{model_name} on {be_name}, KV {}/{}", types.0, types.1);
                    common::check_rows(&name, &model, &prompt, &drafts, &want);
                }
            }
        }
    }
}

/// Past 1024 cached positions the softmax runs in partitions, and the pool splits a one-row
/// step's partitions across its threads (too few KV heads to share out otherwise) while a
/// multi-row step's rows are not split: the rows that cross the boundary still get the
/// one-row bits.
#[test]
fn rows_across_the_attention_partition_boundary_keep_the_one_row_bits() {
    for (name, g) in [
        ("kv1", synth_model(GgmlType::Q8_0, 128, (4, 1, 32), 256)),
        ("kv2", synth_model(GgmlType::F16, 128, (8, 2, 16), 256)),
    ] {
        for threads in [2, 3] {
            let device = create_backend(
                "pool",
                &BackendOptions {
                    threads,
                    tracing: false,
                },
            )
            .unwrap();
            let model = Model::load(&g, device).unwrap();
            let vocab = model.config.vocab;
            let prompt = common::tokens(vocab, 1019, 5);
            let drafts = common::tokens(vocab, 9, 6);
            let want = common::one_by_one(&model, &prompt, &drafts);
            common::check_rows(
                &format!("{name} pool/{threads}"),
                &model,
                &prompt,
                &drafts,
                &want,
            );
        }
    }
}
