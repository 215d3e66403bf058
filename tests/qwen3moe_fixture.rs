//! The Qwen3-MoE architecture against transformers' float32 logits on tiny random-weight
//! `Qwen3MoeForCausalLM` models (8 experts, 2 active) written as llama.cpp's converter writes
//! Qwen3-MoE checkpoints (`tests/fixtures/qwen3moe`, made by `gen_qwen3moe.py`): the router,
//! the stacked expert tensors, renormalised and plain top-k weights; on every CPU backend
//! and on the gpu backend.

use inferno::backend::gpu::GpuBackend;
use inferno::backend::{Device, KvType};
use inferno::gguf::{GgufFile, GgufWriter, Value};
use inferno::model::{Architecture, Ffn, Logits, Model, MoeConfig, SeqStep};
use serde_json::Value as Json;
use std::sync::Arc;

mod common;

use common::arch::{cpu, greedy, logits, Fixture, Score};
use common::ids;

const FIXTURE: Fixture = Fixture {
    sub: "qwen3moe",
    generator: "gen_qwen3moe.py",
};

/// Every (model entry, dtype, file) of the fixture.
fn files(m: &Json) -> Vec<(Json, String, String)> {
    let mut out = Vec::new();
    for e in m["models"].as_array().unwrap() {
        for (dtype, f) in e["gguf"].as_object().unwrap() {
            out.push((e.clone(), dtype.clone(), f.as_str().unwrap().to_string()));
        }
    }
    out
}

/// The tolerance of each weight type against transformers' float32 logits, relative to the
/// logit scale: F32 only reorders sums; F16 rounds weights to 11 bits (and the cache to
/// F16); Q8_0 rounds weights to 8-bit blocks and quantizes activations to blocks too
/// (transformers itself on the dequantized Q8_0 weights is 4.9e-2 away, one position routed
/// differently).
fn tolerance(dtype: &str) -> f32 {
    match dtype {
        "f32" => 1e-4,
        "f16" => 5e-3,
        "q8_0" => 6e-2,
        other => panic!("unexpected dtype {other}"),
    }
}

/// The batched and token-by-token scores of one file within its type's tolerance of
/// transformers, with all argmaxes for F32 and >= 90% for the others.
fn within_tolerance(what: &str, dtype: &str, batched: &Score, stepwise: &Score) {
    let tol = tolerance(dtype);
    for (label, s) in [("batched", batched), ("stepwise", stepwise)] {
        assert!(s.max_rel <= tol, "{what} {label}: {} > {tol}", s.max_rel);
        let need = if dtype == "f32" {
            s.total
        } else {
            (s.total * 9).div_ceil(10)
        };
        assert!(
            s.agree >= need,
            "{what} {label}: argmax {}/{}",
            s.agree,
            s.total
        );
    }
}

#[test]
fn qwen3moe_files_load_with_their_experts_viewed_in_place() {
    let m = FIXTURE.manifest();
    for (e, dtype, file) in files(&m) {
        let g = FIXTURE.open(&file);
        let model = Model::load(&g, cpu("simd")).expect("loads");
        let c = &model.config;
        assert_eq!(c.arch, Architecture::Qwen3Moe, "{file}");
        let norm = e["config"]["norm_topk_prob"].as_bool().unwrap();
        assert_eq!(
            c.moe,
            Some(MoeConfig {
                n_experts: 8,
                n_used: 2,
                expert_ffn: 32,
                normalize: norm,
            }),
            "{file}"
        );
        for (l, lw) in model.weights.layers.iter().enumerate() {
            assert!(lw.q_norm.is_some() && lw.k_norm.is_some());
            let Ffn::Moe(moe) = &lw.ffn else {
                panic!("{file}: layer {l} has no experts")
            };
            assert_eq!((moe.router.rows, moe.router.cols), (8, 32));
            for (stacked, experts, rows, cols) in [
                ("ffn_gate_exps", &moe.gate, 32, 32),
                ("ffn_up_exps", &moe.up, 32, 32),
                ("ffn_down_exps", &moe.down, 32, 32),
            ] {
                let name = format!("blk.{l}.{stacked}.weight");
                let bytes = g.tensor_data(&name).unwrap();
                let whole = bytes.as_slice();
                assert_eq!(experts.len(), 8);
                for (i, x) in experts.iter().enumerate() {
                    assert_eq!(
                        (x.rows, x.cols, x.dtype.to_string()),
                        (rows, cols, dtype.to_uppercase())
                    );
                    // Expert i is the i-th run of the stacked tensor's bytes, in the file.
                    let size = whole.len() / 8;
                    assert_eq!(x.bytes().len(), size);
                    assert_eq!(
                        x.bytes().as_ptr(),
                        whole[i * size..].as_ptr(),
                        "{file}: {name}[{i}] is not a view of the mapped tensor"
                    );
                }
            }
        }
    }
}

/// Every model and weight type on every CPU backend: within the type's tolerance of
/// transformers at every position (batched and token by token), F16 and Q8_0 with >= 90%
/// of the argmaxes (F32: all), and F16/Q8_0 with F32 caches close to transformers run on
/// this file's own (dequantized) weights.
#[test]
fn qwen3moe_logits_match_transformers_on_every_cpu_backend() {
    let m = FIXTURE.manifest();
    let mut report = String::new();
    for backend in ["scalar", "simd", "pool"] {
        for (e, dtype, file) in files(&m) {
            let g = FIXTURE.open(&file);
            let model = Model::load(&g, cpu(backend)).expect("loads");
            let vocab = model.config.vocab;
            let (mut batched, mut stepwise, mut deq) =
                (Score::default(), Score::default(), Score::default());
            for seq in e["sequences"].as_array().unwrap() {
                let ids = ids(&seq["ids"]);
                let hf = FIXTURE.read_f32(seq["hf_logits"].as_str().unwrap());
                batched.add(&logits(&model, &ids, 64), &hf, vocab);
                stepwise.add(&logits(&model, &ids, 1), &hf, vocab);
                if let Some(f) = seq["hf_dequant_logits"][&dtype].as_str() {
                    let mut exact = Model::load(&g, cpu(backend)).unwrap();
                    exact.set_kv_types((KvType::F32, KvType::F32)).unwrap();
                    deq.add(&logits(&exact, &ids, 64), &FIXTURE.read_f32(f), vocab);
                }
            }
            report += &format!(
                "{backend} {file}: vs HF rel {:.2e} (stepwise {:.2e}), argmax {}/{}; \
                 vs HF on these weights {}\n",
                batched.max_rel,
                stepwise.max_rel,
                batched.agree,
                batched.total,
                if deq.total > 0 {
                    format!("{:.2e}, argmax {}/{}", deq.max_rel, deq.agree, deq.total)
                } else {
                    "(the same)".into()
                },
            );
            within_tolerance(&format!("{backend} {file}"), &dtype, &batched, &stepwise);
            if dtype != "f32" {
                assert!(deq.total > 0, "{file}: no dequantized reference");
                // F16 weights are widened to f32, so F16 is exact against these weights;
                // Q8_0 also quantizes activations to 8-bit blocks for its dot products.
                let tol = if dtype == "f16" { 1e-4 } else { 4e-2 };
                assert!(
                    deq.max_rel <= tol,
                    "{backend} {file} vs HF on its own weights: {} > {tol}",
                    deq.max_rel
                );
            }
        }
    }
    println!("{report}");
}

#[test]
fn qwen3moe_f32_greedy_continuation_is_transformers() {
    let m = FIXTURE.manifest();
    for backend in ["scalar", "simd", "pool"] {
        for e in m["models"].as_array().unwrap() {
            let file = e["gguf"]["f32"].as_str().unwrap();
            let model = Model::load(&FIXTURE.open(file), cpu(backend)).unwrap();
            let prompt = ids(&e["greedy"]["prompt"]);
            let want = ids(&e["greedy"]["hf"]);
            assert_eq!(
                greedy(&model, &prompt, want.len()),
                want,
                "{backend} {file}: greedy tokens differ from transformers"
            );
        }
    }
}

/// Two sequences in one forward pass share their experts' products (their rows are grouped
/// by expert together on the host, multiplied in the same dispatches on the gpu) and still
/// get exactly the logits each gets alone.
#[test]
fn batched_sequences_routed_together_get_their_own_logits() {
    let m = FIXTURE.manifest();
    let e = &m["models"][0];
    let mut devices = vec![("scalar", cpu("scalar")), ("pool", cpu("pool"))];
    devices.extend(gpu().map(|g| ("gpu", g)));
    for (backend, device) in devices {
        let model = Model::load(&FIXTURE.open("tiny-qwen3moe.q8_0.gguf"), device).unwrap();
        let vocab = model.config.vocab;
        let seqs: Vec<Vec<u32>> = e["sequences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| ids(&s["ids"])[..12].to_vec())
            .collect();
        let alone: Vec<Vec<f32>> = seqs.iter().map(|s| logits(&model, s, 64)).collect();
        let mut kv: Vec<_> = seqs.iter().map(|s| model.new_kv_cache(s.len())).collect();
        let mut outs: Vec<Vec<f32>> = seqs.iter().map(|s| vec![0.0; s.len() * vocab]).collect();
        let mut scratch = model.new_scratch(24, 0);
        let mut steps: Vec<SeqStep<'_>> = kv
            .iter_mut()
            .zip(outs.iter_mut())
            .zip(&seqs)
            .map(|((kv, out), s)| SeqStep {
                kv,
                tokens: s,
                logits: Logits::All(out),
            })
            .collect();
        model.forward_batch(&mut steps, &mut scratch).unwrap();
        drop(steps);
        for (a, b) in outs.iter().zip(&alone) {
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{backend}: a batched sequence's logits differ");
        }
    }
}

/// The fixture file rewritten: metadata changed by `edit`, tensor `drop` left out.
fn rewritten(file: &str, drop: Option<&str>, edit: impl Fn(&mut Vec<(String, Value)>)) -> GgufFile {
    let src = FIXTURE.open(file);
    let mut meta: Vec<(String, Value)> = src
        .metadata()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    edit(&mut meta);
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.add(k, v);
    }
    for t in src.tensors() {
        if Some(t.name.as_str()) == drop {
            continue;
        }
        let data = src.tensor_data(&t.name).unwrap().as_slice().to_vec();
        w.add_tensor(&t.name, &t.dims, t.dtype, data).unwrap();
    }
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

fn set(meta: &mut Vec<(String, Value)>, key: &str, value: Value) {
    meta.retain(|(k, _)| k != key);
    meta.push((key.to_string(), value));
}

/// Worst relative error of a model loaded from `g` against transformers on model `index`.
fn error_against(g: &GgufFile, index: usize) -> f32 {
    let m = FIXTURE.manifest();
    let e = &m["models"][index];
    let model = Model::load(g, cpu("scalar")).expect("loads");
    let mut s = Score::default();
    for seq in e["sequences"].as_array().unwrap() {
        let ids = ids(&seq["ids"]);
        let hf = FIXTURE.read_f32(seq["hf_logits"].as_str().unwrap());
        s.add(&logits(&model, &ids, 64), &hf, model.config.vocab);
    }
    s.max_rel
}

/// Renormalisation is what makes each model match: with `expert_weights_norm` flipped,
/// both move far outside the tolerance; without the key a file is renormalised (llama.cpp's
/// qwen3moe behaviour).
#[test]
fn the_top_k_renormalisation_follows_expert_weights_norm() {
    let m = FIXTURE.manifest();
    assert_eq!(m["models"][0]["config"]["norm_topk_prob"], true);
    assert_eq!(m["models"][1]["config"]["norm_topk_prob"], false);
    let key = "qwen3moe.expert_weights_norm";
    let unnormalised = rewritten("tiny-qwen3moe.f32.gguf", None, |m| {
        set(m, key, Value::Bool(false))
    });
    let err = error_against(&unnormalised, 0);
    assert!(err > 1e-2, "without renormalising, still within {err}");
    let normalised = rewritten("tiny-qwen3moe-nonorm.f32.gguf", None, |m| {
        m.retain(|(k, _)| k != key)
    });
    let err = error_against(&normalised, 1);
    assert!(err > 1e-2, "renormalised, still within {err}");
    let explicit = rewritten("tiny-qwen3moe.f32.gguf", None, |m| {
        set(m, key, Value::Bool(true))
    });
    let err = error_against(&explicit, 0);
    assert!(err <= 1e-4, "with the key set to true: {err}");
}

fn load_error(g: &GgufFile) -> String {
    match Model::load(g, cpu("scalar")) {
        Ok(_) => panic!("loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_expert_metadata_and_shapes_are_refused() {
    let file = "tiny-qwen3moe.f32.gguf";
    let msg = load_error(&rewritten(file, None, |m| {
        m.retain(|(k, _)| k != "qwen3moe.expert_count")
    }));
    assert!(msg.contains("qwen3moe.expert_count"), "{msg}");
    let msg = load_error(&rewritten(file, None, |m| {
        set(m, "qwen3moe.expert_used_count", Value::U32(9))
    }));
    assert!(msg.contains("expert_used_count = 9"), "{msg}");
    let msg = load_error(&rewritten(file, None, |m| {
        set(
            m,
            "qwen3moe.expert_shared_feed_forward_length",
            Value::U32(64),
        )
    }));
    assert!(msg.contains("shared experts"), "{msg}");
    let msg = load_error(&rewritten(file, None, |m| {
        set(m, "qwen3moe.expert_weights_norm", Value::U32(1))
    }));
    assert!(msg.contains("must be a bool"), "{msg}");
    // Declaring 16 experts where the file stacks 8.
    let msg = load_error(&rewritten(file, None, |m| {
        set(m, "qwen3moe.expert_count", Value::U32(16))
    }));
    assert!(msg.contains("ffn_gate_inp.weight"), "{msg}");
    let msg = load_error(&rewritten(file, Some("blk.1.ffn_up_exps.weight"), |_| {}));
    assert!(msg.contains("blk.1.ffn_up_exps.weight"), "{msg}");
    // Without expert_feed_forward_length the width is feed_forward_length / used (128 / 2
    // = 64 here, not the file's 32), as llama.cpp reads it: the shapes then disagree.
    let msg = load_error(&rewritten(file, None, |m| {
        m.retain(|(k, _)| k != "qwen3moe.expert_feed_forward_length")
    }));
    assert!(msg.contains("ffn_gate_exps.weight"), "{msg}");
}

/// An architecture the engine does not run fails with a message listing those it does,
/// qwen3moe among them.
#[test]
fn unknown_architectures_name_qwen3moe_among_the_supported() {
    let g = rewritten("tiny-qwen3moe.f32.gguf", None, |m| {
        set(m, "general.architecture", Value::String("qwen2moe".into()))
    });
    let msg = load_error(&g);
    assert!(
        msg.contains("\"qwen2moe\"") && msg.contains("qwen3, qwen2, llama, qwen3moe"),
        "{msg}"
    );
}

/// The gpu backend, or `None` (with a note) when this machine is declared to have no GPU.
fn gpu() -> Option<Device> {
    if std::env::var("INFERNO_TEST_GPU").is_ok_and(|v| v == "0") {
        eprintln!("SKIPPED: INFERNO_TEST_GPU=0 declares that this machine has no GPU adapter");
        return None;
    }
    match GpuBackend::new() {
        Ok(b) => Some(Device::gpu(Arc::new(b))),
        Err(e) => panic!(
            "{e}\n(the gpu tests need an adapter: scripts/test installs Mesa's lavapipe; \
             set INFERNO_TEST_GPU=0 only on a machine without one)"
        ),
    }
}

/// The gpu backend against transformers on every model and weight type, with the CPU
/// backends' tolerances and argmax agreement (batched and token by token), and no further
/// from transformers than scalar is plus the gpu-vs-scalar allowance of the dense models
/// (2e-2 of the logit scale).
#[test]
fn qwen3moe_logits_match_transformers_on_the_gpu() {
    let Some(gpu) = gpu() else { return };
    let m = FIXTURE.manifest();
    let mut report = String::new();
    for (e, dtype, file) in files(&m) {
        let g = FIXTURE.open(&file);
        let model = Model::load(&g, gpu.clone()).expect("loads on gpu");
        let scalar = Model::load(&g, cpu("scalar")).expect("loads");
        let vocab = model.config.vocab;
        let (mut batched, mut stepwise) = (Score::default(), Score::default());
        for seq in e["sequences"].as_array().unwrap() {
            let ids = ids(&seq["ids"]);
            let hf = FIXTURE.read_f32(seq["hf_logits"].as_str().unwrap());
            let ours = logits(&model, &ids, 64);
            batched.add(&ours, &hf, vocab);
            stepwise.add(&logits(&model, &ids, 1), &hf, vocab);
            let theirs = logits(&scalar, &ids, 64);
            for ((o, s), h) in ours
                .chunks(vocab)
                .zip(theirs.chunks(vocab))
                .zip(hf.chunks(vocab))
            {
                let (e_gpu, scale) = common::row_error(o, h);
                let (e_cpu, _) = common::row_error(s, h);
                assert!(
                    e_gpu <= e_cpu + 2e-2 * scale,
                    "{file}: gpu {e_gpu} vs scalar {e_cpu} from transformers (scale {scale})"
                );
            }
        }
        report += &format!(
            "gpu {file}: vs HF rel {:.2e} (stepwise {:.2e}), argmax {}/{}\n",
            batched.max_rel, stepwise.max_rel, batched.agree, batched.total
        );
        within_tolerance(&format!("gpu {file}"), &dtype, &batched, &stepwise);
    }
    println!("{report}");
}

#[test]
fn qwen3moe_f32_greedy_continuation_is_transformers_on_the_gpu() {
    let Some(gpu) = gpu() else { return };
    let m = FIXTURE.manifest();
    for e in m["models"].as_array().unwrap() {
        let file = e["gguf"]["f32"].as_str().unwrap();
        let model = Model::load(&FIXTURE.open(file), gpu.clone()).unwrap();
        let prompt = ids(&e["greedy"]["prompt"]);
        let want = ids(&e["greedy"]["hf"]);
        assert_eq!(
            greedy(&model, &prompt, want.len()),
            want,
            "gpu {file}: greedy tokens differ from transformers"
        );
    }
}

/// Only the chosen experts are computed: with one expert of layer 0 filled with NaN, a
/// single token's logits turn NaN for exactly the `n_used` experts its router picks there,
/// and stay bit for bit the same for every other expert (a dense product masked by a zero
/// weight would spread the NaN from any of them). On the gpu every expert of a projection
/// is in one device buffer, so this also shows that a product's workgroups for unrouted
/// experts read none of their weights.
#[test]
fn experts_the_router_does_not_choose_are_never_computed() {
    let file = "tiny-qwen3moe.f32.gguf";
    let name = "blk.0.ffn_up_exps.weight";
    let mut devices = vec![("scalar", cpu("scalar")), ("pool", cpu("pool"))];
    devices.extend(gpu().map(|g| ("gpu", g)));
    for (backend, device) in devices {
        let clean = logits(
            &Model::load(&FIXTURE.open(file), device.clone()).unwrap(),
            &[42],
            1,
        );
        assert!(clean.iter().all(|v| v.is_finite()));
        let mut poisoned_by = Vec::new();
        for expert in 0..8 {
            let src = FIXTURE.open(file);
            let mut w = GgufWriter::new();
            for (k, v) in src.metadata() {
                w.add(k.clone(), v.clone());
            }
            for t in src.tensors() {
                let mut data = src.tensor_data(&t.name).unwrap().as_slice().to_vec();
                if t.name == name {
                    let size = data.len() / 8;
                    for c in data[expert * size..(expert + 1) * size].chunks_exact_mut(4) {
                        c.copy_from_slice(&f32::NAN.to_le_bytes());
                    }
                }
                w.add_tensor(&t.name, &t.dims, t.dtype, data).unwrap();
            }
            let g = GgufFile::from_bytes(w.to_bytes()).unwrap();
            let got = logits(&Model::load(&g, device.clone()).unwrap(), &[42], 1);
            if got.iter().any(|v| v.is_nan()) {
                poisoned_by.push(expert);
            } else {
                let same = got
                    .iter()
                    .zip(&clean)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{backend}: expert {expert} changed the logits without NaN"
                );
            }
        }
        assert_eq!(
            poisoned_by.len(),
            2,
            "{backend}: experts read: {poisoned_by:?}"
        );
    }
}
