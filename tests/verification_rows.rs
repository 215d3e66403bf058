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

use inferno::backend::simd::{Isa, SimdBackend};
use inferno::backend::{
    create_backend, Backend, BackendOptions, Device, KvType, ParallelBackend, PoolBackend,
    ScalarBackend,
};
use inferno::gguf::{GgufFile, GgufWriter, Value};
use inferno::model::synth::{self, SynthSpec};
use inferno::model::{Logits, Model, SeqStep};
use inferno::tensor::{self, mixture, GgmlType};
use std::sync::Arc;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

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

/// `g`'s matrices rewritten as `scheme` says (`inferno quantize`'s plan and conversion).
fn requantize(g: &GgufFile, scheme: &str) -> GgufFile {
    let scheme = mixture::Scheme::from_name(scheme).expect("scheme");
    let mut w = GgufWriter::new();
    for (k, v) in g.metadata() {
        if k != "general.alignment" {
            w.add(k.clone(), v.clone());
        }
    }
    let list: Vec<(&str, &[u64])> = g
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.dims.as_slice()))
        .collect();
    let layers = g.get_u64("qwen3.block_count").expect("block count") as usize;
    for (t, target) in g.tensors().iter().zip(mixture::plan(scheme, &list, layers)) {
        let data = g.tensor_data(&t.name).expect("data");
        let (dt, bytes) = match target.filter(|&dt| dt != t.dtype) {
            Some(dt) => {
                let cols = t.dims[0] as usize;
                let row = t.dtype.row_size(cols as u64).unwrap() as usize;
                let mut out = Vec::new();
                let mut vals = vec![0f32; cols];
                for r in data.as_slice().chunks(row) {
                    tensor::dequantize_row(t.dtype, r, &mut vals).unwrap();
                    out.extend(tensor::encode(&vals, dt).unwrap());
                }
                (dt, out)
            }
            None => (t.dtype, data.as_slice().to_vec()),
        };
        w.add_tensor(t.name.clone(), &t.dims, dt, bytes).unwrap();
    }
    w.add(
        "general.file_type",
        Value::U32(scheme.file_type().unwrap_or(0)),
    );
    GgufFile::from_bytes(w.to_bytes()).expect("requantized gguf")
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
        out.push((format!("synth-256-{scheme}"), requantize(&base, scheme)));
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
    if model.config.head_dim % 32 == 0 {
        t.push((KvType::Q8_0, KvType::F16));
        t.push((KvType::Q8_0, KvType::Q8_0));
    }
    t
}

fn tokens(vocab: usize, n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 97 + seed * 31 + 11) % vocab as u32)
        .collect()
}

/// Logits of each one-row decode step of `drafts` after `prompt`.
fn one_by_one(model: &Model, prompt: &[u32], drafts: &[u32]) -> Vec<Vec<f32>> {
    let vocab = model.config.vocab;
    let mut st = model.new_state(prompt.len() + drafts.len() + 1, 64);
    model.forward(&mut st, prompt, Logits::None).unwrap();
    drafts
        .iter()
        .map(|&t| {
            let mut l = vec![0.0; vocab];
            model.forward(&mut st, &[t], Logits::Last(&mut l)).unwrap();
            l
        })
        .collect()
}

/// Checks that the rows of one multi-row step (alone in its step, then batched with a
/// decoding sequence and a prefilling one) give `want`'s logits bit for bit.
fn check_rows(name: &str, model: &Model, prompt: &[u32], drafts: &[u32], want: &[Vec<f32>]) {
    let vocab = model.config.vocab;
    let k = drafts.len();
    // Alone: the single-sequence path (its logits straight into the caller's buffer).
    let mut st = model.new_state(prompt.len() + k + 1, 64);
    model.forward(&mut st, prompt, Logits::None).unwrap();
    let mut all = vec![0.0; k * vocab];
    model
        .forward(&mut st, drafts, Logits::All(&mut all))
        .unwrap();
    for (i, w) in want.iter().enumerate() {
        assert!(
            bits(&all[i * vocab..(i + 1) * vocab]) == bits(w),
            "{name}: row {i} of {k} alone differs from its one-row step"
        );
    }
    // Batched, as the engine runs it: another sequence decoding one token before it and a
    // prompt chunk after it, the logits of several sequences gathered into products.
    let other = tokens(vocab, 5, 3);
    let chunk = tokens(vocab, 6, 4);
    let mut kv = model.new_kv_cache(prompt.len() + k + 1);
    let mut kv_other = model.new_kv_cache(16);
    let mut kv_chunk = model.new_kv_cache(16);
    // Room for 3 rows of logits at a time: the gathered blocks split the sequences' rows.
    let mut scratch = model.new_scratch(prompt.len() + other.len() + 64, 3);
    {
        let mut prefill = [
            SeqStep {
                kv: &mut kv,
                tokens: prompt,
                logits: Logits::None,
            },
            SeqStep {
                kv: &mut kv_other,
                tokens: &other,
                logits: Logits::None,
            },
        ];
        model.forward_batch(&mut prefill, &mut scratch).unwrap();
    }
    let (mut l_other, mut l_chunk) = (vec![0.0; vocab], vec![0.0; vocab]);
    let mut all = vec![0.0; k * vocab];
    let mut step = [
        SeqStep {
            kv: &mut kv_other,
            tokens: &other[..1],
            logits: Logits::Last(&mut l_other),
        },
        SeqStep {
            kv: &mut kv,
            tokens: drafts,
            logits: Logits::All(&mut all),
        },
        SeqStep {
            kv: &mut kv_chunk,
            tokens: &chunk,
            logits: Logits::Last(&mut l_chunk),
        },
    ];
    model.forward_batch(&mut step, &mut scratch).unwrap();
    for (i, w) in want.iter().enumerate() {
        assert!(
            bits(&all[i * vocab..(i + 1) * vocab]) == bits(w),
            "{name}: row {i} of {k} batched differs from its one-row step"
        );
    }
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
                let prompt = tokens(vocab, 7, 1);
                // 3 and 9 rows: token tiles of several sizes and a remainder.
                for k in [3, 9] {
                    let drafts = tokens(vocab, k, 2);
                    let want = one_by_one(&model, &prompt, &drafts);
                    let name = format!("{model_name} on {be_name}, KV {}/{}", types.0, types.1);
                    check_rows(&name, &model, &prompt, &drafts, &want);
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
            let prompt = tokens(vocab, 1019, 5);
            let drafts = tokens(vocab, 9, 6);
            let want = one_by_one(&model, &prompt, &drafts);
            check_rows(
                &format!("{name} pool/{threads}"),
                &model,
                &prompt,
                &drafts,
                &want,
            );
        }
    }
}
