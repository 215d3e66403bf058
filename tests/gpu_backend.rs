//! The `gpu` backend (wgpu: Vulkan, Metal) against the scalar reference, on the same
//! fixtures as the CPU backends:
//! - logits within a derived tolerance of `scalar`, and the same greedy tokens;
//! - a batched pass gives each sequence exactly the logits it gets alone (every row runs the
//!   same kernels in the same order, whatever it is batched with);
//! - a KV prefix copied on the device continues exactly like the original;
//! - the service streams the same tokens on `gpu` as the in-process `generate`;
//! - synthetic Qwen3-MoE models take the same comparisons (close to scalar, batched against
//!   alone, split matrices), and every block type is checked in stacked experts too;
//! - a sequence's rows of one step (its last token and drafts) give the one-row steps'
//!   logits bit for bit, and speculative decoding changes no generation.
//!
//! These tests need a GPU adapter (in CI: Mesa's lavapipe, installed by `scripts/test`) and
//! fail without one. Only where no GPU is expected, `INFERNO_TEST_GPU=0` skips them, and they
//! say so.

mod common;
mod service_support;

use inferno::backend::gpu::GpuBackend;
use inferno::backend::{create_backend, BackendOptions, Device, KvType};
use inferno::engine::loader::{synthetic_assets, LoadOptions};
use inferno::gguf::GgufFile;
use inferno::model::synth::{self, SynthSpec};
use inferno::model::{Architecture, Logits, Model, SeqStep};
use inferno::tensor::GgmlType;
use service_support::*;
use std::sync::Arc;
use tonic::Code;

/// The GPU backend, or `None` (with a note) when this machine is declared to have no GPU.
fn gpu() -> Option<Device> {
    gpu_with(false)
}

/// `plain`: the fallback paths (no subgroups, no packed dot product).
fn gpu_with(plain: bool) -> Option<Device> {
    if std::env::var("INFERNO_TEST_GPU").is_ok_and(|v| v == "0") {
        eprintln!("SKIPPED: INFERNO_TEST_GPU=0 declares that this machine has no GPU adapter");
        return None;
    }
    match GpuBackend::with_paths(plain) {
        Ok(b) => {
            eprintln!("gpu adapter: {}", b.context().describe());
            Some(Device::gpu(Arc::new(b)))
        }
        Err(e) => panic!(
            "{e}\n(the gpu tests need an adapter: scripts/test installs Mesa's lavapipe; \
             set INFERNO_TEST_GPU=0 only on a machine without one)"
        ),
    }
}

fn cpu(name: &str) -> Device {
    create_backend(name, &BackendOptions::default()).expect("backend")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Small synthetic Qwen3 models of every type the kernels read, with GQA, an odd head size
/// and a vocabulary that is not a multiple of the tile sizes (shared with the CPU tests).
fn synth_models() -> Vec<(String, GgufFile)> {
    common::synth_models()
}

/// Small synthetic Qwen3-MoE models (`synth --arch qwen3moe --preset tiny`) in the types
/// the expert products read as stored: Q8_0 and F16 renormalising two of eight experts' weights,
/// F32 with three experts and plain top-k weights (so a row's slots need sorting by expert).
fn moe_models() -> Vec<(String, GgufFile)> {
    let mut out = Vec::new();
    for (i, (dtype, used, normalize)) in [
        (GgmlType::Q8_0, 2, true),
        (GgmlType::F32, 3, false),
        (GgmlType::F16, 2, true),
    ]
    .into_iter()
    .enumerate()
    {
        let mut spec = SynthSpec::preset_for(Architecture::Qwen3Moe, "tiny", dtype).unwrap();
        let moe = spec.moe.as_mut().expect("experts");
        moe.n_used = used;
        moe.normalize = normalize;
        spec.seed = 200 + i as u64;
        let bytes = synth::build(&spec).expect("synth").to_bytes();
        let name = format!("synth-qwen3moe-{i}-{dtype}");
        out.push((name, GgufFile::from_bytes(bytes).expect("gguf")));
    }
    out
}

/// The HF-derived fixture models (`tests/fixtures/models`), f32, f16 and Q8_0.
fn fixture_models() -> Vec<(String, GgufFile)> {
    let manifest = common::manifest();
    let mut out = Vec::new();
    for m in manifest["models"].as_array().expect("models") {
        for dtype in ["f32", "f16", "q8_0"] {
            let file = m["gguf"][dtype].as_str().expect("file");
            let g = GgufFile::open(common::models_dir().join(file)).expect(file);
            out.push((file.to_string(), g));
        }
    }
    out
}

#[test]
fn gpu_logits_stay_close_to_scalar_and_greedy_tokens_match() {
    let Some(gpu) = gpu() else { return };
    close_to_scalar(gpu);
}

#[test]
fn the_plain_paths_stay_close_to_scalar_too() {
    let Some(gpu) = gpu_with(true) else { return };
    close_to_scalar(gpu);
}

fn close_to_scalar(gpu: Device) {
    let mut models = synth_models();
    models.extend(moe_models());
    models.extend(fixture_models());
    for (name, g) in &models {
        let scalar = Model::load(g, cpu("scalar")).expect("loads");
        let on_gpu = Model::load(g, gpu.clone()).expect("loads on gpu");
        let (want, want_tokens) = common::greedy_run(&scalar, 24);
        // The gpu decodes scalar's tokens, so every row compares the same context.
        let got = run_forced(&on_gpu, &want_tokens);
        let (gpu_logits, tokens) = common::greedy_run(&on_gpu, 24);
        let vocab = scalar.config.vocab;
        // Float models differ only in summation order (and the GPU's exp), ~1e-6 per
        // operation. Q8_0 models quantize activations as the CPU does, so a last-bit
        // difference in a sum can move one 8-bit quant by a step when it sits on a rounding
        // tie; from then on the logits move by a fraction of the Q8_0 error itself, which
        // for these fixtures is up to 4.2e-2 of the logit range (manifest: llama.cpp and HF
        // on the Q8_0 file vs the float model). It happens rarely (most models here agree
        // to 1e-7); 5e-2 bounds it.
        let quantized = scalar.weights.main_dtype() == GgmlType::Q8_0;
        let tol = if quantized { 5e-2 } else { 1e-4 };
        let mut worst = 0.0f32;
        for (i, (a, b)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
            let e = common::rel_err(a, b);
            worst = worst.max(e);
            assert!(e < tol, "{name} row {i}: gpu vs scalar {e} >= {tol}");
        }
        eprintln!("{name}: worst relative logit error {worst:e}");
        // Greedy decoding on its own: the same tokens, except where scalar's two best
        // logits are closer than the tolerance allows the gpu to tell apart (then the rest
        // of the sequence legitimately differs).
        if tokens != want_tokens {
            let at = tokens
                .iter()
                .zip(&want_tokens)
                .take_while(|(a, b)| a == b)
                .count();
            let row = &want[(13 + at - 1) * vocab..(13 + at) * vocab];
            let (_, scale) = common::row_error(row, row);
            let gap = row[want_tokens[at] as usize] - row[tokens[at] as usize];
            assert!(
                gap <= 2.0 * tol * scale,
                "{name}: gpu chose token {} over {} at step {at}, a gap of {gap} (scale {scale})",
                tokens[at],
                want_tokens[at]
            );
            eprintln!("{name}: greedy paths part at step {at} on a near tie (gap {gap})");
        }
        drop(gpu_logits);
    }
}

/// `common::greedy_run`'s prompt, then the given decode tokens: every position's logits.
fn run_forced(model: &Model, decode: &[u32]) -> Vec<f32> {
    let vocab = model.config.vocab;
    let prompt: Vec<u32> = (0..13u32).map(|i| (i * 37 + 5) % vocab as u32).collect();
    let mut st = model.new_state(prompt.len() + decode.len() + 1, 5);
    let mut all = vec![0.0; prompt.len() * vocab];
    model
        .forward(&mut st, &prompt, Logits::All(&mut all))
        .expect("prefill");
    let mut logits = vec![0.0; vocab];
    for &t in decode {
        model
            .forward(&mut st, &[t], Logits::Last(&mut logits))
            .expect("decode");
        all.extend_from_slice(&logits);
    }
    all
}

#[test]
fn gpu_logits_match_transformers_like_the_cpu() {
    // The fixture's references: HF transformers (float32) on each model; the gpu gets
    // the same argmax at every position as scalar does. F32 caches on both sides: the
    // cache types are compared on their own below.
    let Some(gpu) = gpu() else { return };
    let manifest = common::manifest();
    for m in manifest["models"].as_array().expect("models") {
        for dtype in ["f32", "f16", "q8_0"] {
            let file = m["gguf"][dtype].as_str().expect("file");
            let g = GgufFile::open(common::models_dir().join(file)).expect(file);
            let mut model = Model::load(&g, gpu.clone()).expect("loads");
            let mut scalar = Model::load(&g, cpu("scalar")).expect("loads");
            model.set_kv_types((KvType::F32, KvType::F32)).unwrap();
            scalar.set_kv_types((KvType::F32, KvType::F32)).unwrap();
            let vocab = model.config.vocab;
            for seq in m["sequences"].as_array().expect("sequences") {
                let ids = common::ids(&seq["ids"]);
                let hf = common::read_f32(seq["hf_logits"].as_str().expect("hf"));
                let mut ours = vec![0.0; ids.len() * vocab];
                let mut st = model.new_state(ids.len(), 64);
                model
                    .forward(&mut st, &ids, Logits::All(&mut ours))
                    .expect("forward");
                let mut theirs = vec![0.0; ids.len() * vocab];
                let mut st = scalar.new_state(ids.len(), 64);
                scalar
                    .forward(&mut st, &ids, Logits::All(&mut theirs))
                    .expect("forward");
                for ((o, s), h) in ours
                    .chunks(vocab)
                    .zip(theirs.chunks(vocab))
                    .zip(hf.chunks(vocab))
                {
                    let (e_gpu, scale) = common::row_error(o, h);
                    let (e_cpu, _) = common::row_error(s, h);
                    // No worse than the CPU's own distance to transformers, plus the
                    // gpu-vs-scalar tolerance above.
                    assert!(
                        e_gpu <= e_cpu + 2e-2 * scale,
                        "{file}: gpu {e_gpu} vs cpu {e_cpu} from transformers (scale {scale})"
                    );
                    assert_eq!(common::argmax(o), common::argmax(s), "{file}: argmax");
                }
            }
        }
    }
}

#[test]
// Steps index both the solo runs (`want[i][step]`) and the tokens fed.
#[allow(clippy::needless_range_loop)]
fn a_batched_gpu_pass_gives_each_sequence_its_logits_alone_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    // Mixtures of experts route each row on its own: batched rows share the expert
    // products' dispatches but not their routes.
    for (name, g) in synth_models().into_iter().chain(moe_models()) {
        let model = Model::load(&g, gpu.clone()).expect("loads");
        let vocab = model.config.vocab as u32;
        let prompts: Vec<Vec<u32>> = (0..3u32)
            .map(|s| {
                (0..5 + 4 * s)
                    .map(|i| (i * 31 + s * 7 + 3) % vocab)
                    .collect()
            })
            .collect();
        // Alone: each prompt in one pass, then two decode tokens.
        let mut want = Vec::new();
        for p in &prompts {
            let mut st = model.new_state(32, 32);
            let mut l = vec![0.0; vocab as usize];
            model.forward(&mut st, p, Logits::Last(&mut l)).unwrap();
            let mut rows = vec![l.clone()];
            for t in [1u32, 2] {
                model.forward(&mut st, &[t], Logits::Last(&mut l)).unwrap();
                rows.push(l.clone());
            }
            want.push(rows);
        }
        // Together: all prompts in one pass, then both decode steps batched.
        let mut kvs: Vec<_> = prompts.iter().map(|_| model.new_kv_cache(32)).collect();
        let mut scratch = model.new_scratch(64, 3);
        let mut outs = vec![vec![0.0f32; vocab as usize]; 3];
        for step in 0..3 {
            let toks: Vec<Vec<u32>> = match step {
                0 => prompts.clone(),
                s => vec![vec![s as u32]; 3],
            };
            let mut batch: Vec<SeqStep<'_>> = kvs
                .iter_mut()
                .zip(&toks)
                .zip(outs.iter_mut())
                .map(|((kv, t), o)| SeqStep {
                    kv,
                    tokens: t,
                    logits: Logits::Last(o),
                })
                .collect();
            model.forward_batch(&mut batch, &mut scratch).unwrap();
            drop(batch);
            for (i, o) in outs.iter().enumerate() {
                assert!(
                    bits(o) == bits(&want[i][step]),
                    "{name}: sequence {i} step {step} differs batched"
                );
            }
        }
    }
}

#[test]
fn a_kv_prefix_copied_on_the_device_continues_like_the_original() {
    let Some(gpu) = gpu() else { return };
    let (_, g) = fixture_models()
        .into_iter()
        .find(|(name, _)| name.starts_with("tiny-gqa-tied.f32"))
        .expect("a fixture with heads of 32 values");
    for kv in [KvType::F32, KvType::F16, KvType::Q8_0] {
        let mut model = Model::load(&g, gpu.clone()).expect("loads");
        model
            .set_kv_types((kv, kv))
            .expect("q8_0 takes heads of 32");
        prefix_copy_continues(&model);
    }
}

fn prefix_copy_continues(model: &Model) {
    let vocab = model.config.vocab;
    let prompt: Vec<u32> = (0..20u32).map(|i| (i * 13 + 1) % vocab as u32).collect();
    let mut a = model.new_state(40, 32);
    let mut l = vec![0.0; vocab];
    model
        .forward(&mut a, &prompt, Logits::Last(&mut l))
        .unwrap();
    // Keep 12 positions in a new cache of another capacity, then run the rest on both.
    let mut b = model.new_state(30, 32);
    assert_eq!(b.kv.copy_prefix_from(&a.kv, 12), 12);
    a.truncate(12);
    let (mut la, mut lb) = (vec![0.0; vocab], vec![0.0; vocab]);
    model
        .forward(&mut a, &prompt[12..], Logits::Last(&mut la))
        .unwrap();
    model
        .forward(&mut b, &prompt[12..], Logits::Last(&mut lb))
        .unwrap();
    let types = model.kv_types();
    assert!(
        bits(&la) == bits(&lb),
        "{types:?}: the copied prefix changed the logits"
    );
    assert!(
        bits(&la) == bits(&l),
        "{types:?}: truncating and rerunning changed the logits"
    );
    assert!(b.kv.on_device(), "the cache lives on the device");
    assert_eq!(b.kv.types(), types);
}

/// F16 and Q8_0 caches on the device hold what the host's hold: the same stored rounding
/// of keys and values. The GPU's keys and values already differ from the CPU's by summation
/// order (~1e-6), which can move a value across an f16 or 8-bit rounding boundary, so the
/// logits agree to the cache type's own resolution: 2e-4 of the logit range for F16 (one
/// f16 step, 2^-11, in a few values), 5e-2 for Q8_0 (one quant step in a block).
#[test]
fn kv_cache_types_on_the_gpu_stay_close_to_scalar() {
    let Some(gpu) = gpu() else { return };
    for (name, g) in fixture_models() {
        for (kv, tol) in [(KvType::F16, 2e-4f32), (KvType::Q8_0, 5e-2)] {
            let mut on_gpu = Model::load(&g, gpu.clone()).expect("loads");
            let mut scalar = Model::load(&g, cpu("scalar")).expect("loads");
            if on_gpu.set_kv_types((kv, kv)).is_err() {
                assert!(!on_gpu.config.head_dim.is_multiple_of(32) && kv == KvType::Q8_0);
                continue;
            }
            scalar.set_kv_types((kv, kv)).unwrap();
            let (want, tokens) = common::greedy_run(&scalar, 12);
            let got = run_forced(&on_gpu, &tokens);
            let vocab = scalar.config.vocab;
            let quantized = scalar.weights.main_dtype() == GgmlType::Q8_0;
            // Q8_0 weights bring their own activation-rounding ties (see above).
            let tol = if quantized { tol.max(5e-2) } else { tol };
            let mut worst = 0.0f32;
            for (a, b) in got.chunks(vocab).zip(want.chunks(vocab)) {
                worst = worst.max(common::rel_err(a, b));
            }
            eprintln!("{name} {kv} cache: worst relative logit error {worst:e}");
            assert!(
                worst < tol,
                "{name} {kv} cache: gpu vs scalar {worst} >= {tol}"
            );
        }
    }
}

#[test]
fn host_and_device_state_do_not_mix() {
    let Some(gpu) = gpu() else { return };
    let (_, g) = synth_models().remove(0);
    let on_gpu = Model::load(&g, gpu).expect("loads");
    let on_cpu = Model::load(&g, cpu("simd")).expect("loads");
    let mut host_state = on_cpu.new_state(8, 8);
    let mut l = vec![0.0; on_gpu.config.vocab];
    let e = on_gpu
        .forward(&mut host_state, &[1, 2], Logits::Last(&mut l))
        .unwrap_err();
    assert!(e.to_string().contains("another model"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_streams_the_same_tokens_on_gpu_as_in_process() {
    if gpu().is_none() {
        return;
    }
    let opts = LoadOptions {
        backend: "gpu".into(),
        ..LoadOptions::default()
    };
    let prompts = [
        "Once upon a time",
        "The quick brown fox",
        "Hello there",
        "Zebras",
    ];
    // In process, one at a time, on the gpu.
    let want = reference_on(&opts, &prompts, 16);

    // Through the service, concurrently (batched on the device).
    let server = inferno::server::start(test_config(), move || synthetic_assets("demo", &opts))
        .await
        .expect("server starts");
    wait_ready(&server).await;
    let addr = server.addr();
    let mut calls = Vec::new();
    for p in prompts {
        calls.push(tokio::spawn(async move {
            let mut c = client(addr).await;
            run(&mut c, greedy(p, 16)).await
        }));
    }
    for (i, call) in calls.into_iter().enumerate() {
        let r = call.await.unwrap();
        assert_eq!(r.code(), Code::Ok, "{:?}", r.status);
        assert_eq!(r.ids(), want[i], "stream {i} on gpu");
    }
    server.shutdown().await.unwrap();
}

fn inferno(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run inferno")
}

fn demo_file(dir: &std::path::Path, dtype: GgmlType) -> String {
    let path = dir.join(format!("demo-{dtype}.gguf"));
    let spec = SynthSpec::preset("demo", dtype).unwrap();
    synth::build(&spec).unwrap().write_to(&path).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn bench_and_generate_run_on_gpu_from_the_command_line() {
    if gpu().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = demo_file(dir.path(), GgmlType::Q8_0);
    let o = inferno(&[
        "bench", "-m", &m, "-b", "gpu", "-p", "16", "-n", "4", "-r", "1",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("| gpu "), "{out}");
    assert!(err.contains("per forward pass"), "no step breakdown: {err}");
    assert!(err.contains("encode"), "{err}");

    let tokens = |backend: &str| {
        let o = inferno(&[
            "generate",
            "--model",
            &m,
            "--backend",
            backend,
            "--temperature",
            "0",
            "--max-tokens",
            "12",
            "--ignore-eos",
            "--output",
            "json",
            "Hello",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["tokens"].clone()
    };
    assert_eq!(tokens("gpu"), tokens("scalar"));
}

/// `inferno synth --arch qwen3moe --preset tiny` (as written, Q8_0) generates the same
/// greedy tokens on gpu as on scalar, from the command line.
#[test]
fn a_synthesized_qwen3moe_model_generates_on_gpu_as_on_scalar() {
    if gpu().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moe.gguf");
    let m = path.to_str().unwrap();
    let o = inferno(&["synth", "--arch", "qwen3moe", "--preset", "tiny", "-o", m]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let tokens = |backend: &str| {
        let o = inferno(&[
            "generate",
            "--model",
            m,
            "--backend",
            backend,
            "--temperature",
            "0",
            "--max-tokens",
            "12",
            "--ignore-eos",
            "--output",
            "json",
            "Hello",
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["tokens"].clone()
    };
    let on_gpu = tokens("gpu");
    assert_eq!(on_gpu.as_array().map(|t| t.len()), Some(12));
    assert_eq!(on_gpu, tokens("scalar"));
}

#[test]
fn a_type_without_gpu_kernels_is_a_clear_error() {
    if gpu().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = demo_file(dir.path(), GgmlType::BF16);
    let o = inferno(&["generate", "--model", &m, "--backend", "gpu", "Hello"]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.contains("BF16") && err.contains("gpu") && err.contains("does not support"),
        "{err}"
    );
}

/// The demo model's shape (every row a multiple of 256 values) with each matrix made of
/// random `dtype` blocks, and the same model with those blocks dequantized to F32; with
/// `experts`, the tiny Qwen3-MoE widened to rows of 256 values (its stacked experts too).
fn random_block_models(dtype: GgmlType, seed: u64, experts: bool) -> (GgufFile, GgufFile) {
    use inferno::gguf::GgufWriter;
    use rand::{Rng, SeedableRng};
    let mut spec = if experts {
        let mut s = SynthSpec::preset_for(Architecture::Qwen3Moe, "tiny", GgmlType::F32).unwrap();
        s.hidden = 256;
        s.head_dim = 64;
        s.moe.as_mut().unwrap().expert_ffn = 256;
        s
    } else {
        SynthSpec::preset("demo", GgmlType::F32).unwrap()
    };
    spec.n_layers = 2;
    let base = GgufFile::from_bytes(synth::build(&spec).unwrap().to_bytes()).unwrap();
    let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let (mut quant, mut deq) = (GgufWriter::new(), GgufWriter::new());
    for (k, v) in base.metadata() {
        quant.try_add(k.clone(), v.clone()).unwrap();
        deq.try_add(k.clone(), v.clone()).unwrap();
    }
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    for t in base.tensors() {
        let data = base.tensor_data(&t.name).unwrap();
        if t.dims.len() < 2 {
            quant
                .add_tensor(t.name.clone(), &t.dims, t.dtype, data.as_slice().to_vec())
                .unwrap();
            deq.add_tensor(t.name.clone(), &t.dims, t.dtype, data.as_slice().to_vec())
                .unwrap();
            continue;
        }
        // A stacked expert tensor's rows are its experts' rows, one after another.
        let cols = t.dims[0] as usize;
        let rows = t.dims[1..].iter().product::<u64>() as usize;
        let row_bytes = dtype.row_size(cols as u64).unwrap() as usize;
        let mut bytes: Vec<u8> = (0..rows * row_bytes).map(|_| r.random()).collect();
        // Scales small enough that activations stay of order one through the layers.
        let s = 1.0 / (cols as f32).sqrt();
        let scale = |r: &mut rand_chacha::ChaCha8Rng, m: f32| f16(r.random_range(0.2..1.0) * s * m);
        for blk in bytes.chunks_exact_mut(dtype.type_size()) {
            match dtype {
                GgmlType::Q4_0 | GgmlType::Q5_0 => blk[..2].copy_from_slice(&scale(&mut r, 0.3)),
                GgmlType::Q4_1 | GgmlType::Q5_1 => {
                    blk[..2].copy_from_slice(&scale(&mut r, 0.3));
                    blk[2..4].copy_from_slice(&scale(&mut r, -2.0));
                }
                GgmlType::Q4_K | GgmlType::Q5_K => {
                    blk[..2].copy_from_slice(&scale(&mut r, 0.01));
                    blk[2..4].copy_from_slice(&scale(&mut r, 0.01));
                }
                // The mixture's activations grow through its layers at the dense model's
                // scale until summation order alone moves its logits by 3e-4 (the GPU's
                // float path on the dequantized file included): half of it keeps them
                // of order one.
                GgmlType::Q6_K => {
                    let m = if experts { 0.0025 } else { 0.005 };
                    blk[208..210].copy_from_slice(&scale(&mut r, m))
                }
                other => panic!("no random blocks for {other}"),
            }
        }
        let mut vals = vec![0.0f32; rows * cols];
        for (o, b) in vals
            .chunks_exact_mut(cols)
            .zip(bytes.chunks_exact(row_bytes))
        {
            inferno::tensor::dequantize_row(dtype, b, o).unwrap();
        }
        let f32s: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        quant
            .add_tensor(t.name.clone(), &t.dims, dtype, bytes)
            .unwrap();
        deq.add_tensor(t.name.clone(), &t.dims, GgmlType::F32, f32s)
            .unwrap();
    }
    (
        GgufFile::from_bytes(quant.to_bytes()).unwrap(),
        GgufFile::from_bytes(deq.to_bytes()).unwrap(),
    )
}

#[test]
fn every_block_type_computes_its_stored_values() {
    let Some(gpu) = gpu() else { return };
    for (i, (dtype, experts)) in [
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q4_1,
        GgmlType::Q5_1,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ]
    .into_iter()
    .enumerate()
    // Each type in dense matrices and in a mixture's stacked experts.
    .flat_map(|(i, d)| [(i, (d, false)), (i + 100, (d, true))])
    {
        let (quant, deq) = random_block_models(dtype, 7 + i as u64, experts);
        let on_gpu = Model::load(&quant, gpu.clone()).expect("loads on gpu");
        let (got, _) = common::greedy_run(&on_gpu, 4);
        let vocab = on_gpu.config.vocab;
        // Q4_0 and Q5_0 run as their exact Q8_0 widening with Q8_0 activations, like the
        // CPU: compared with scalar on the same file, at the Q8_0 tolerance. The other types
        // are dequantized in the shader and multiplied with f32 activations: the same
        // arithmetic as scalar on the dequantized F32 file, up to summation order.
        let widened = matches!(dtype, GgmlType::Q4_0 | GgmlType::Q5_0);
        let mut reference = if widened {
            Model::load(&quant, cpu("scalar")).unwrap()
        } else {
            Model::load(&deq, cpu("scalar")).unwrap()
        };
        // The same cache type on both sides: the block type is what is compared.
        reference.set_kv_types(on_gpu.kv_types()).unwrap();
        let (want, _) = common::greedy_run(&reference, 4);
        let tol = if widened { 2e-2 } else { 1e-4 };
        let mut worst = 0.0f32;
        for (a, b) in got.chunks(vocab).zip(want.chunks(vocab)) {
            worst = worst.max(common::rel_err(a, b));
        }
        let what = if experts { "experts" } else { "dense" };
        eprintln!("{dtype} {what}: worst relative logit error {worst:e}");
        assert!(
            worst < tol,
            "{dtype} {what}: gpu vs reference {worst} >= {tol}"
        );
    }
}

/// With no Vulkan driver (the loader pointed at none), `--backend gpu` is one clear error
/// that names the reason and what to install.
#[cfg(not(target_os = "macos"))]
#[test]
fn no_adapter_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let m = demo_file(dir.path(), GgmlType::Q8_0);
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["generate", "--model", &m, "--backend", "gpu", "Hello"])
        .env("VK_ICD_FILENAMES", dir.path().join("no-such-driver.json"))
        .env_remove("RUST_LOG")
        .output()
        .expect("run inferno");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(
        err.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "{err}"
    );
    assert!(err.contains("no GPU adapter"), "{err}");
    assert!(err.contains("mesa-vulkan-drivers"), "{err}");
}

#[test]
fn split_matrices_and_grouped_logits_give_the_same_bits() {
    // A small binding cap makes every matrix span several row chunks (one dispatch each)
    // and lets only a few rows of logits come back per submit: the paths large models take.
    if gpu().is_none() {
        return;
    }
    let capped = Device::gpu(Arc::new(
        GpuBackend::with_options(false, Some(16 * 1024)).expect("gpu"),
    ));
    // The F32 and F16 mixtures' expert stacks span several chunks of whole experts.
    let models = synth_models()
        .into_iter()
        .chain(moe_models())
        .chain(fixture_models());
    for (name, g) in models {
        let whole = Model::load(&g, gpu().unwrap()).expect("loads");
        let split = Model::load(&g, capped.clone()).expect("loads capped");
        let (a, ta) = common::greedy_run(&whole, 6);
        let (b, tb) = common::greedy_run(&split, 6);
        assert_eq!(ta, tb, "{name}: tokens");
        assert!(
            bits(&a) == bits(&b),
            "{name}: split matrices changed the logits"
        );
    }
}

/// What speculative decoding rests on, on the gpu too: a sequence's last token and its
/// drafts run as rows of one step give each row the logits of its one-row step bit for bit,
/// alone and batched (every row runs the same kernels in the same order: the products'
/// token tiles and attention's workgroups per token are independent of each other), for
/// every weight kind the shaders read, K-quants included.
#[test]
fn verification_rows_on_the_gpu_give_the_one_row_steps_logits_bit_for_bit() {
    let Some(gpu) = gpu() else { return };
    let mut models = synth_models();
    models.extend(moe_models());
    let mut spec = SynthSpec::preset("demo", GgmlType::F32).unwrap();
    (
        spec.n_layers,
        spec.hidden,
        spec.ffn,
        spec.readable,
        spec.tied,
    ) = (2, 256, 512, false, true);
    let base = GgufFile::from_bytes(synth::build(&spec).unwrap().to_bytes()).unwrap();
    for scheme in ["q4_k_m", "q5_k_s", "q6_k", "q4_0"] {
        models.push((
            format!("synth-256-{scheme}"),
            common::requantize(&base, scheme),
        ));
    }
    for (name, g) in &models {
        let model = Model::load(g, gpu.clone()).expect("loads on gpu");
        let vocab = model.config.vocab;
        let prompt = common::tokens(vocab, 7, 1);
        for k in [3, 9] {
            let drafts = common::tokens(vocab, k, 2);
            let want = common::one_by_one(&model, &prompt, &drafts);
            common::check_rows(&format!("{name} on gpu"), &model, &prompt, &drafts, &want);
        }
    }
}

/// Speculation on the gpu gives exactly the generation without it: n-gram drafts, drafts
/// that are always right and always wrong, greedy and seeded sampling.
#[test]
fn speculation_on_the_gpu_changes_nothing() {
    use common::spec::{oracle, solo};
    use inferno::engine::speculative::{Method, Speculation};
    use inferno::engine::GenerateOptions;
    use inferno::sampling::SamplingParams;
    use inferno::tokenizer::Tokenizer;
    let Some(gpu) = gpu() else { return };
    let spec = SynthSpec::preset("demo", GgmlType::Q8_0).unwrap();
    let g = GgufFile::from_bytes(synth::build(&spec).unwrap().to_bytes()).unwrap();
    let tok = Tokenizer::from_gguf(&g).unwrap();
    let model = Model::load(&g, gpu).expect("loads on gpu");
    let vocab = model.config.vocab;
    let prompt = tok.encode("The sea, the sea, the sea", false).unwrap();
    let seeded = SamplingParams {
        temperature: 0.9,
        repeat_penalty: 1.2,
        seed: Some(3),
        ..SamplingParams::default()
    };
    for sampling in [SamplingParams::greedy(), seeded] {
        let opts = GenerateOptions {
            max_tokens: 32,
            sampling,
            ignore_eos: true,
            ..GenerateOptions::default()
        };
        let (want, _) = solo(&model, &tok, None, None, &prompt, &opts);
        let ids: Vec<u32> = want.tokens.iter().map(|t| t.0).collect();
        let reference = vec![(prompt.clone(), ids)];
        for (name, s) in [
            (
                "ngram",
                Speculation::new(Method::Ngram, None).with_costs(0.1, 0.0),
            ),
            ("right", oracle(reference.clone(), 5, false, vocab)),
            ("wrong", oracle(reference, 3, true, vocab)),
        ] {
            let (got, c) = solo(&model, &tok, None, Some(&s), &prompt, &opts);
            assert_eq!(got, want, "{name}");
            assert!(c.drafted > 0, "{name}: {c:?}");
        }
    }
}
