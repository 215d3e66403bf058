//! The `inferno` binary end to end: commands on a synthetic model, and errors that print one
//! clear line and exit non-zero.

mod service_support;

use inferno::gguf::{GgufWriter, Value};
use inferno::model::synth::{self, SynthSpec};
use inferno::tensor::GgmlType;
use service_support::real_model_or_skip;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn inferno(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run inferno")
}

fn demo_model(dir: &Path) -> PathBuf {
    let path = dir.join("demo.gguf");
    let spec = SynthSpec::preset("demo", GgmlType::Q8_0).unwrap();
    synth::build(&spec).unwrap().write_to(&path).unwrap();
    path
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A failed command prints exactly one `error:` line, no panic or backtrace.
fn assert_clean_error(o: &Output, needle: &str) {
    assert!(!o.status.success(), "expected failure");
    let err = stderr(o);
    assert!(!err.contains("panicked"), "panic: {err}");
    assert_eq!(
        err.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "one line: {err}"
    );
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(needle), "expected {needle:?} in {err:?}");
}

#[test]
fn generate_tokenize_logits_info_on_a_synthetic_model() {
    let dir = tempfile::tempdir().unwrap();
    let model = demo_model(dir.path());
    let m = model.to_str().unwrap();

    let o = inferno(&["tokenize", "--model", m, "hi <|im_end|>"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ids: Vec<u32> = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(ids, vec![104, 105, 32, 258]);

    // 12 greedy tokens of "Hello" as JSON, with `extra` flags.
    let greedy_json = |extra: &[&str]| {
        let mut args = vec!["generate", "--model", m, "--temperature", "0"];
        args.extend_from_slice(&["--max-tokens", "12", "--ignore-eos", "--output", "json"]);
        args.extend_from_slice(extra);
        args.push("Hello");
        inferno(&args)
    };
    let o = greedy_json(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["tokens"].as_array().unwrap().len(), 12);
    // One spelling of finish reasons everywhere: the gRPC enum's name.
    assert_eq!(v["finish_reason"], "FINISH_REASON_LENGTH");
    assert_eq!(
        v["finish_reason"],
        inferno::server::pb::FinishReason::Length.as_str_name()
    );
    assert!(v["metrics"]["decode_tokens_per_second"].as_f64().unwrap() > 0.0);

    // --logit-bias: 'e' (byte token 101) forced; the greedy first token banned; a token the
    // model does not have refused before anything runs.
    let o = greedy_json(&["--logit-bias", "101=100"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let forced: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(forced["text"], "e".repeat(12));
    let first = v["tokens"][0].as_u64().unwrap();
    let o = greedy_json(&["--logit-bias", &format!("{first}-100")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let banned: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let banned: Vec<u64> = serde_json::from_value(banned["tokens"].clone()).unwrap();
    assert!(!banned.contains(&first), "{first} in {banned:?}");
    let o = greedy_json(&["--logit-bias", "999999=1"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("--logit-bias names token 999999, outside the model's vocabulary"),
        "{}",
        stderr(&o)
    );

    // Text mode streams the same greedy text and reports the metrics on stderr.
    let o2 = inferno(&[
        "generate",
        "--model",
        m,
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        "--ignore-eos",
        // The model's whole context may be asked for.
        "--ctx-size",
        "4096",
        "Hello",
    ]);
    assert!(o2.status.success());
    assert_eq!(
        String::from_utf8_lossy(&o2.stdout).trim_end_matches('\n'),
        v["text"].as_str().unwrap()
    );
    for key in [
        "time_to_first_token_ms",
        "decode_tokens_per_second",
        "per_forward_ms",
    ] {
        assert!(stderr(&o2).contains(key), "{key} missing");
    }
    let err2 = stderr(&o2);
    assert!(
        err2.contains("finish_reason: FINISH_REASON_LENGTH\n"),
        "{err2}"
    );
    // The context and the KV cache at start: 4 layers x 2 KV heads x 64 x (K + V) in F16.
    assert!(
        err2.contains(
            "context: 4096 tokens (model: 4096); KV cache f16/f16, 2048 bytes per position"
        ),
        "{err2}"
    );
    // Only the positions the run fills are allocated: the 5-token prompt plus 12.
    assert!(
        err2.contains("34.00 KiB for this run's 17 positions"),
        "{err2}"
    );
    // The backend as the user named it, not the internal decorator's name.
    assert!(err2.contains("backend: pool ("), "{err2}");
    assert!(!err2.contains("tracing("), "{err2}");
    // Prompt lookup is on by default and `--speculative off` turns it off; the tokens are
    // the same either way.
    assert!(err2.contains("  speculative (ngram): drafted "), "{err2}");
    let o3 = greedy_json(&["--speculative", "off"]);
    assert!(o3.status.success(), "{}", stderr(&o3));
    let v3: serde_json::Value = serde_json::from_slice(&o3.stdout).unwrap();
    assert_eq!(v3["tokens"], v["tokens"]);
    assert_eq!(v3["metrics"]["verify_steps"], 0);
    let o4 = inferno(&[
        "generate",
        "--model",
        m,
        "--max-tokens",
        "1",
        "--speculative",
        "off",
        "Hello",
    ]);
    assert!(o4.status.success(), "{}", stderr(&o4));
    assert!(!stderr(&o4).contains("speculative ("), "{}", stderr(&o4));

    let o = inferno(&["logits", "--model", m, "--ids", "1,2,3", "--all"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let vocab = v["n_vocab"].as_u64().unwrap() as usize;
    assert_eq!(v["logits"].as_array().unwrap().len(), 3);
    assert_eq!(v["logits"][2].as_array().unwrap().len(), vocab);
    let last = inferno(&["logits", "--model", m, "--ids", "1,2,3"]);
    let last: serde_json::Value = serde_json::from_slice(&last.stdout).unwrap();
    assert_eq!(last["logits"][0], v["logits"][2]);

    let o = inferno(&["info", "--model", m]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("architecture: qwen3") && out.contains("blk.0.attn_q.weight"),
        "{out}"
    );
    assert!(out.contains(&format!("  vocab: {vocab}\n")), "{out}");

    // JSON: the config is an object with the hyper-parameters, not a debug string.
    let o = inferno(&["info", "--model", m, "--output", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let config = v["config"].as_object().expect("config is an object");
    let spec = SynthSpec::preset("demo", GgmlType::Q8_0).unwrap();
    assert_eq!(config["architecture"], "qwen3");
    assert_eq!(config["layers"], spec.n_layers);
    assert_eq!(config["hidden"], spec.hidden);
    assert_eq!(config["ffn"], spec.ffn);
    assert_eq!(config["heads"], spec.n_heads);
    assert_eq!(config["kv_heads"], spec.n_kv_heads);
    assert_eq!(config["head_dim"], spec.head_dim);
    assert_eq!(config["vocab"], vocab);
    assert_eq!(config["context_length"], spec.context_length);
    assert_eq!(config["rope_theta"], 1_000_000.0);
    assert_eq!(config["rms_eps"], 1e-6);
    assert!(v["config_error"].is_null());
}

#[test]
fn errors_are_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf");
    assert_clean_error(
        &inferno(&["generate", "--model", missing.to_str().unwrap(), "x"]),
        "missing.gguf",
    );

    let not_gguf = dir.path().join("notes.txt");
    std::fs::write(&not_gguf, b"this is not a model file at all").unwrap();
    assert_clean_error(
        &inferno(&["info", "--model", not_gguf.to_str().unwrap()]),
        "GGUF",
    );

    let model = demo_model(dir.path());
    let bytes = std::fs::read(&model).unwrap();
    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    assert_clean_error(
        &inferno(&["generate", "--model", truncated.to_str().unwrap(), "x"]),
        "truncated.gguf",
    );

    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("gptneox".into()));
    let other = dir.path().join("gptneox.gguf");
    w.write_to(&other).unwrap();
    assert_clean_error(
        &inferno(&["generate", "--model", other.to_str().unwrap(), "x"]),
        "unsupported architecture \"gptneox\" (supported: qwen3, qwen2, llama, qwen3moe)",
    );
    // synth knows three architectures and each one's presets.
    let out = dir.path().join("never.gguf");
    let o = out.to_str().unwrap();
    assert_clean_error(
        &inferno(&["synth", "--arch", "gptneox", "-o", o]),
        "unknown --arch \"gptneox\" (synthesized: qwen3, llama, qwen3moe)",
    );
    assert_clean_error(
        &inferno(&["synth", "--arch", "llama", "--preset", "demo", "-o", o]),
        "unknown --preset \"demo\" for llama (available: 1b)",
    );
    assert_clean_error(
        &inferno(&["synth", "--arch", "qwen3moe", "--preset", "1b", "-o", o]),
        "unknown --preset \"1b\" for qwen3moe (available: 30b-a3b, tiny)",
    );
    assert_clean_error(
        &inferno(&[
            "synth", "--arch", "qwen3moe", "--preset", "tiny", "--layers", "3", "-o", o,
        ]),
        "--layers 3: the tiny preset has 1 to 2 layers",
    );
    // Fewer layers keep the preset's per-layer shape.
    let one = dir.path().join("one-layer.gguf");
    let synth = inferno(&[
        "synth",
        "--arch",
        "qwen3moe",
        "--preset",
        "tiny",
        "--layers",
        "1",
        "-o",
        one.to_str().unwrap(),
    ]);
    assert!(synth.status.success(), "{}", stderr(&synth));
    let gguf = inferno::gguf::GgufFile::open(&one).unwrap();
    let cfg = inferno::model::ModelConfig::from_gguf(&gguf).unwrap();
    assert_eq!((cfg.n_layers, cfg.hidden), (1, 64));
    assert_eq!(cfg.moe.map(|m| m.n_experts), Some(8));

    let m = model.to_str().unwrap();
    let long = "a".repeat(300);
    assert_clean_error(
        &inferno(&["generate", "--model", m, "--ctx-size", "64", &long]),
        "context",
    );
    // Above the model's context: an error naming both numbers.
    assert_clean_error(
        &inferno(&["generate", "--model", m, "--ctx-size", "4097", "x"]),
        "--ctx-size 4097 exceeds the model's context window of 4096 tokens",
    );
    assert_clean_error(
        &inferno(&["generate", "--model", m, "--top-p", "1.5", "x"]),
        "top_p",
    );
    assert_clean_error(
        &inferno(&["generate", "--model", m, "--backend", "quantum", "x"]),
        "unknown backend",
    );
}

/// `inferno tokenize` works on a vocab-only GGUF (tokenizer metadata, no tensors) and gives
/// the HF tokenizer's ids.
#[test]
fn tokenize_on_a_vocab_only_file_matches_hf() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("cases.json")).unwrap()).unwrap();
    let vocab = dir.join("qwen3-vocab.gguf");
    let cases = cases["cases"].as_array().unwrap();
    for case in cases
        .iter()
        .filter(|c| c["category"] == "cjk" || c["category"] == "code")
        .take(4)
    {
        let o = inferno(&[
            "tokenize",
            "--model",
            vocab.to_str().unwrap(),
            case["text"].as_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let ids: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(ids, case["ids"], "{}", case["text"]);
    }
}

/// `quantize` of an F32 model gives exactly the tensors the synthesizer writes when it
/// quantizes the same values itself (one Q8_0 definition), keeps the 1-D tensors and the
/// metadata, and refuses a type it cannot write.
#[test]
fn quantize_rewrites_matrices_and_keeps_the_rest() {
    use inferno::gguf::GgufFile;
    let dir = tempfile::tempdir().unwrap();
    let f32_path = dir.path().join("demo-f32.gguf");
    let q8_path = dir.path().join("demo-q8.gguf");
    let out = dir.path().join("requantized.gguf");
    for (dtype, path) in [(GgmlType::F32, &f32_path), (GgmlType::Q8_0, &q8_path)] {
        let spec = SynthSpec::preset("demo", dtype).unwrap();
        synth::build(&spec).unwrap().write_to(path).unwrap();
    }
    let (src, dst) = (f32_path.to_str().unwrap(), out.to_str().unwrap());
    let o = inferno(&["quantize", "-m", src, "-o", dst, "--dtype", "q8_0"]);
    assert!(o.status.success(), "{}", stderr(&o));

    let got = GgufFile::open(&out).unwrap();
    let want = GgufFile::open(&q8_path).unwrap();
    assert_eq!(got.tensors().len(), want.tensors().len());
    let mut matrices = 0;
    for t in want.tensors() {
        let g = got.tensor_info(&t.name).expect("tensor kept");
        assert_eq!((g.dtype, &g.dims), (t.dtype, &t.dims), "{}", t.name);
        assert_eq!(
            got.tensor_data(&t.name).unwrap().as_slice(),
            want.tensor_data(&t.name).unwrap().as_slice(),
            "{}",
            t.name
        );
        matrices += (t.dtype == GgmlType::Q8_0) as usize;
    }
    assert!(matrices > 0);
    assert_eq!(got.get_u64("general.file_type").unwrap(), 7);
    assert_eq!(
        got.get_array("tokenizer.ggml.tokens").unwrap().len(),
        want.get_array("tokenizer.ggml.tokens").unwrap().len()
    );

    let o = inferno(&["quantize", "-m", src, "-o", dst, "--dtype", "q3_k"]);
    assert_clean_error(&o, "cannot write");
}

/// `quantize --dtype q4_k_m` gives each tensor the type the mixture rules choose (some
/// Q6_K, most Q4_K, norms kept), writes exactly what the library quantizer writes for the
/// dequantized input rows, records llama.cpp's file type 15, and the result generates.
#[test]
fn quantize_to_q4_k_m_follows_the_mixture_and_generates() {
    use inferno::gguf::GgufFile;
    use inferno::tensor::{self, mixture};
    let dir = tempfile::tempdir().unwrap();
    let f32_path = dir.path().join("demo-f32.gguf");
    let out = dir.path().join("demo-q4_k_m.gguf");
    let spec = SynthSpec::preset("demo", GgmlType::F32).unwrap();
    synth::build(&spec).unwrap().write_to(&f32_path).unwrap();
    let (src, dst) = (f32_path.to_str().unwrap(), out.to_str().unwrap());
    let o = inferno(&["quantize", "-m", src, "-o", dst, "--dtype", "q4_k_m"]);
    assert!(o.status.success(), "{}", stderr(&o));

    let input = GgufFile::open(&f32_path).unwrap();
    let got = GgufFile::open(&out).unwrap();
    assert_eq!(got.get_u64("general.file_type").unwrap(), 15);
    let list: Vec<(&str, &[u64])> = input
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.dims.as_slice()))
        .collect();
    let layers = input.get_u64("qwen3.block_count").unwrap() as usize;
    let plan = mixture::plan(mixture::Scheme::Q4KM, &list, layers);
    let mut count = std::collections::HashMap::new();
    for (t, want) in input.tensors().iter().zip(plan) {
        let g = got.tensor_info(&t.name).expect("tensor kept");
        assert_eq!(g.dims, t.dims, "{}", t.name);
        let data = got.tensor_data(&t.name).unwrap();
        match want {
            None => {
                assert_eq!(g.dtype, t.dtype, "{}", t.name);
                assert_eq!(
                    data.as_slice(),
                    input.tensor_data(&t.name).unwrap().as_slice()
                );
            }
            Some(dt) => {
                assert_eq!(g.dtype, dt, "{}", t.name);
                let mut vals = vec![0f32; t.n_elements() as usize];
                let raw = input.tensor_data(&t.name).unwrap();
                tensor::dequantize_row(t.dtype, raw.as_slice(), &mut vals).unwrap();
                let cols = t.dims[0] as usize;
                let want: Vec<u8> = vals
                    .chunks(cols)
                    .flat_map(|row| tensor::encode(row, dt).unwrap())
                    .collect();
                assert_eq!(data.as_slice(), &want[..], "{}", t.name);
            }
        }
        *count.entry(g.dtype).or_insert(0usize) += 1;
    }
    // The demo model's shapes all split into 256-value blocks: no fallback types.
    assert!(count[&GgmlType::Q6_K] >= 2, "{count:?}");
    assert!(count[&GgmlType::Q4_K] > count[&GgmlType::Q6_K], "{count:?}");
    assert!(count[&GgmlType::F32] > 0, "{count:?}");
    assert_eq!(count.len(), 3, "{count:?}");

    let o = inferno(&[
        "generate",
        "--model",
        dst,
        "--temperature",
        "0",
        "--max-tokens",
        "8",
        "--ignore-eos",
        "--output",
        "json",
        "Hello",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["tokens"].as_array().unwrap().len(), 8);
}

#[test]
fn bench_times_batched_decode_of_several_streams() {
    let dir = tempfile::tempdir().unwrap();
    let m = demo_model(dir.path());
    let m = m.to_str().unwrap();
    let o = inferno(&[
        "bench", "-m", m, "-b", "simd", "-p", "8", "-n", "3", "-s", "1,4", "-r", "2", "-o", "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let tests: Vec<(&str, u64)> = rows
        .iter()
        .map(|r| (r["test"].as_str().unwrap(), r["streams"].as_u64().unwrap()))
        .collect();
    // The prompt test runs once, with one sequence; the generation test once per count.
    assert_eq!(tests, [("pp8", 1), ("tg3", 1), ("tg3 x4", 4)]);
    for r in &rows {
        let samples = r["samples_ts"].as_array().unwrap();
        assert_eq!(samples.len(), 2);
        assert!(samples.iter().all(|s| s.as_f64().unwrap() > 0.0), "{r}");
    }
    assert_clean_error(
        &inferno(&["bench", "-m", m, "-p", "0", "-n", "2", "-s", "0"]),
        "--streams must be at least 1",
    );
}

/// On a mixture-of-experts file `bench` says how the experts were loaded and what one
/// decode step reads: the routed experts' share, not every expert.
#[test]
fn bench_reports_a_moe_steps_active_parameters_and_expert_loading() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("moe.gguf");
    let f = f.to_str().unwrap();
    let o = inferno(&["synth", "--arch", "qwen3moe", "--preset", "tiny", "-o", f]);
    assert!(o.status.success(), "{}", stderr(&o));
    for (mode, says) in [
        ("mmap", "experts memory-mapped (--experts mmap)"),
        ("repack", "experts repacked (--experts repack)"),
    ] {
        let o = inferno(&[
            "bench",
            "-m",
            f,
            "-b",
            "simd",
            "-p",
            "0",
            "-n",
            "2",
            "-r",
            "1",
            "--experts",
            mode,
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let text = String::from_utf8_lossy(&o.stdout).to_string() + &stderr(&o);
        assert!(text.contains(says), "{text}");
        let note = text
            .lines()
            .find(|l| l.starts_with("mixture of experts, 2 of 8 per token"))
            .unwrap_or_else(|| panic!("no experts note: {text}"));
        // "... N active parameters of T": fewer active than total.
        let nums: Vec<f64> = note
            .split(|c: char| !(c.is_ascii_digit() || c == '.'))
            .filter_map(|w| w.parse().ok())
            .collect();
        let (active, total) = (nums[nums.len() - 2], nums[nums.len() - 1]);
        assert!(active < total, "{note}");
    }
    // The scalar backend repacks nothing, and says so.
    let o = inferno(&[
        "bench", "-m", f, "-b", "scalar", "-p", "0", "-n", "2", "-r", "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &stderr(&o);
    assert!(
        text.contains("experts memory-mapped (the scalar backend multiplies them as stored)"),
        "{text}"
    );
    // Refused by the argument parser, which names the value and the choices.
    let o = inferno(&["bench", "-m", f, "-p", "0", "-n", "2", "--experts", "paged"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("unknown experts mode \"paged\" (supported: auto, repack, mmap)"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn bench_compares_constrained_decode_with_unconstrained() {
    let dir = tempfile::tempdir().unwrap();
    let m = demo_model(dir.path());
    let m = m.to_str().unwrap();
    let schema = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/schemas/catalog.json");
    let (n, reps) = (6u64, 2u64);
    let o = inferno(&[
        "bench",
        "-m",
        m,
        "-p",
        "4",
        "-n",
        "6",
        "-s",
        "1,3",
        "-r",
        "2",
        "-t",
        "1",
        "--json-schema",
        schema,
        "-o",
        "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let tests: Vec<&str> = rows.iter().map(|r| r["test"].as_str().unwrap()).collect();
    // The prompt test runs once; each generation test unconstrained, then constrained.
    assert_eq!(
        tests,
        ["pp4", "tg6", "tg6 +schema", "tg6 x3", "tg6 x3 +schema"]
    );
    for r in &rows {
        let samples = r["samples_ts"].as_array().unwrap();
        assert_eq!(samples.len(), reps as usize, "{r}");
        assert!(samples.iter().all(|s| s.as_f64().unwrap() > 0.0), "{r}");
    }
    for pair in [&rows[1..3], &rows[3..5]] {
        let (free, held) = (&pair[0], &pair[1]);
        assert!(free.get("constraint").is_none(), "{free}");
        let c = &held["constraint"];
        assert_eq!(c["format"], "json_schema");
        let ratio = c["ratio"].as_f64().unwrap();
        let want = held["avg_ts"].as_f64().unwrap() / free["avg_ts"].as_f64().unwrap();
        assert!((ratio - want).abs() < 1e-9 * want, "{ratio} vs {want}");
        // One mask per token of every stream in every timed run, one more per restart.
        let streams = held["streams"].as_u64().unwrap();
        let restarts = c["restarts"].as_u64().unwrap();
        for key in ["mask", "mask_wait"] {
            let t = &c[key];
            assert_eq!(
                t["n"].as_u64().unwrap(),
                n * streams * reps + restarts,
                "{c}"
            );
            let (p50, p99, max) = (
                t["p50_ms"].as_f64().unwrap(),
                t["p99_ms"].as_f64().unwrap(),
                t["max_ms"].as_f64().unwrap(),
            );
            assert!(0.0 <= p50 && p50 <= p99 && p99 <= max && max > 0.0, "{c}");
        }
    }
    // The table shows both figures, and the ratio with the mask times beneath it.
    let o = inferno(&[
        "bench",
        "-m",
        m,
        "-p",
        "0",
        "-n",
        "3",
        "-r",
        "1",
        "-t",
        "1",
        "--json-object",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8(o.stdout).unwrap();
    assert!(out.contains(" tg3 |"), "{out}");
    assert!(out.contains("tg3 +object |"), "{out}");
    assert!(
        out.contains("tg3 +object: ") && out.contains("× unconstrained; mask p50 "),
        "{out}"
    );
    assert!(out.contains("sampling waited p50 "), "{out}");
    // A schema that is not JSON, or that llguidance refuses, fails before any model loads.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"type\": ").unwrap();
    let bad = bad.to_str().unwrap();
    let o = inferno(&["bench", "-m", m, "-p", "0", "-n", "2", "--json-schema", bad]);
    assert_clean_error(&o, "cannot use the schema in");
    assert_clean_error(&o, "json_schema is not valid JSON");
    let odd = dir.path().join("odd.json");
    std::fs::write(&odd, r#"{"type": "no-such-type"}"#).unwrap();
    assert_clean_error(
        &inferno(&[
            "bench",
            "-m",
            m,
            "-p",
            "0",
            "-n",
            "2",
            "--json-schema",
            odd.to_str().unwrap(),
        ]),
        "cannot compile the json_schema response format",
    );
}

#[test]
fn logs_carry_no_colour_codes_off_a_terminal() {
    // `serve` warns about a non-loopback address before it checks the backend, which then
    // fails: a logged line, then exit, without binding anything.
    let o = inferno(&["serve", "--listen", "0.0.0.0:0", "--backend", "no-such"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("listening beyond loopback"), "{err}");
    assert!(
        !err.contains('\u{1b}'),
        "ANSI escape in piped logs: {err:?}"
    );
}

/// `synth --arch qwen3moe` writes a mixture-of-experts file that `info` describes and
/// `generate` runs.
#[test]
fn a_synthesized_qwen3moe_model_generates() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("moe.gguf");
    let m = out.to_str().unwrap();
    let o = inferno(&["synth", "--arch", "qwen3moe", "--preset", "tiny", "-o", m]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("synthetic-qwen3moe-tiny"),
        "{}",
        stderr(&o)
    );
    let o = inferno(&["info", "--model", m]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("architecture: qwen3moe")
            && text.contains("experts: 8 (2 used per token, expert ffn 32, renormalised)"),
        "{text}"
    );
    let o = inferno(&[
        "generate",
        "--model",
        m,
        "--temperature",
        "0",
        "--max-tokens",
        "6",
        "--ignore-eos",
        "--output",
        "json",
        "Hello",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["tokens"].as_array().unwrap().len(), 6);
    assert_eq!(v["finish_reason"], "FINISH_REASON_LENGTH");
}

#[test]
fn long_commands_draw_no_progress_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo.gguf");
    let o = inferno(&["synth", "--preset", "demo", "--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    // Only the summary: no bar, no carriage returns or escapes.
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert!(err.starts_with("wrote "), "{err:?}");
    assert!(!err.contains('\r') && !err.contains('\u{1b}'), "{err:?}");
    let m = out.to_str().unwrap();
    let o = inferno(&[
        "bench", "-m", m, "-p", "8", "-n", "2", "-r", "1", "-d", "0,4",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), "", "bench wrote to stderr");
    let table = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        table.lines().filter(|l| l.starts_with('|')).count(),
        2 + 4,
        "{table}"
    );
    // Under the table: the KV cache's type and size, and the resident memory.
    assert!(
        table.contains("KV cache f16/f16, 26.00 KiB per sequence of 13 positions")
            && table.contains("resident memory after load"),
        "{table}"
    );
    // A small model's size keeps its digits.
    assert!(
        table.contains(" MiB |") && !table.contains("0.00 GiB"),
        "{table}"
    );
}

#[test]
fn generate_follows_a_regex_or_a_json_schema_and_refuses_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let model = demo_model(dir.path());
    let m = model.to_str().unwrap();
    let rx = "(red|green|blue)-[0-9]{3}";
    let schema = dir.path().join("schema.json");
    std::fs::write(
        &schema,
        r#"{"type": "object", "properties": {"ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["ok", "n"], "additionalProperties": false}"#,
    )
    .unwrap();
    let s = schema.to_str().unwrap();
    for flags in [["--regex", rx], ["--json-schema", s]] {
        let o = inferno(&[
            "generate",
            "--model",
            m,
            "--temperature",
            "1.5",
            "--seed",
            "3",
            "--max-tokens",
            "64",
            "--output",
            "json",
            flags[0],
            flags[1],
            "Hello",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let text = v["text"].as_str().unwrap();
        assert_eq!(v["finish_reason"], "FINISH_REASON_EOS", "{text:?}");
        if flags[0] == "--regex" {
            let full = regex::Regex::new(&format!("^(?:{rx})$")).unwrap();
            assert!(full.is_match(text), "{text:?}");
        } else {
            let j: serde_json::Value = serde_json::from_str(text).unwrap();
            assert!(
                j["ok"].is_boolean() && j["n"].as_u64().unwrap() <= 9,
                "{text}"
            );
        }
        // One mask per token: both formats are complete (and end the run) at their last
        // token, so no end-of-generation token is ever sampled.
        let masks = v["metrics"]["masks"].as_u64().unwrap();
        assert_eq!(masks, v["tokens"].as_array().unwrap().len() as u64);
        assert!(v["metrics"]["mask_ms_p99"].as_f64().unwrap() > 0.0);
    }
    assert_clean_error(
        &inferno(&["generate", "--model", m, "--regex", "(oops", "x"]),
        "cannot compile the regex response format",
    );
}

/// A tools file in both accepted shapes: OpenAI's wrapped form and the bare function.
fn tools_file(dir: &Path) -> PathBuf {
    let path = dir.join("tools.json");
    std::fs::write(
        &path,
        r#"[
          {"type": "function", "function": {"name": "get_weather",
            "description": "The weather in a city now.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string",
              "minLength": 1, "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
              "required": ["city", "unit"], "additionalProperties": false}}},
          {"name": "get_time", "description": "The local time in a time zone.",
           "parameters": {"type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}},
             "required": ["tz"], "additionalProperties": false}}
        ]"#,
    )
    .unwrap();
    path
}

/// Whether `call` ({"name", "arguments"}) is a valid call of one of `tools_file`'s tools.
fn check_call(call: &serde_json::Value, names: &[&str]) {
    let name = call["name"].as_str().unwrap();
    assert!(names.contains(&name), "{call}");
    let args = call["arguments"].as_object().unwrap();
    if name == "get_time" {
        assert!(
            ["UTC", "CET"].contains(&args["tz"].as_str().unwrap()),
            "{call}"
        );
        assert_eq!(args.len(), 1, "{call}");
    } else {
        let city = args["city"].as_str().unwrap();
        assert!((1..=12).contains(&city.chars().count()), "{call}");
        assert!(
            ["c", "f"].contains(&args["unit"].as_str().unwrap()),
            "{call}"
        );
        assert_eq!(args.len(), 2, "{call}");
    }
}

#[test]
fn generate_calls_tools_from_a_file_on_the_real_checkpoint() {
    let Some(path) = real_model_or_skip() else {
        return;
    };
    let m = path.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let tools = tools_file(dir.path());
    let t = tools.to_str().unwrap();
    for (choice, names) in [
        ("required", &["get_weather", "get_time"][..]),
        ("get_time", &["get_time"][..]),
    ] {
        let args = [
            "generate",
            "--model",
            m,
            "--ctx-size",
            "1024",
            "--temperature",
            "0",
            "--max-tokens",
            "120",
            "--tools",
            t,
            "--tool-choice",
            choice,
            "What is the weather in Paris, and what time is it there?",
        ];
        // Text output: the call is one JSON line on stdout, and nothing else is.
        let o = inferno(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{out:?}");
        let call: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        check_call(&call, names);
        assert!(
            stderr(&o).contains("finish_reason: FINISH_REASON_TOOL_CALLS"),
            "{}",
            stderr(&o)
        );
        // JSON output: the same call (greedy), in "tool_calls", and no text.
        let mut json_args = args.to_vec();
        json_args.splice(1..1, ["--output", "json"]);
        let o = inferno(&json_args);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["finish_reason"], "FINISH_REASON_TOOL_CALLS", "{v}");
        assert_eq!(v["tool_calls"], serde_json::json!([call]), "{v}");
        assert_eq!(v["text"], "", "{v}");
    }
}

#[test]
fn tools_files_and_tool_choices_that_cannot_work_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    // The flags are checked before the model loads: no model file is needed.
    let m = dir.path().join("absent.gguf");
    let m = m.to_str().unwrap();
    let good = tools_file(dir.path());
    let run = |tools: &Path, choice: &str| {
        inferno(&[
            "generate",
            "--model",
            m,
            "--tools",
            tools.to_str().unwrap(),
            "--tool-choice",
            choice,
            "hi",
        ])
    };
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    assert_clean_error(
        &run(&dir.path().join("missing.json"), "auto"),
        "cannot read the tools file",
    );
    for (text, says) in [
        ("[{\"name\": ", "is not valid JSON"),
        ("{\"name\": \"f\"}", "must hold a JSON array of tools"),
        ("[]", "holds no tools"),
        (
            "[{\"description\": \"x\"}]",
            "tool 0 has no \"name\" string",
        ),
        (
            "[{\"name\": \"f\"}, {\"type\": \"function\"}]",
            "tool 1 has type \"function\" but no \"function\" object",
        ),
        ("[{\"type\": \"retrieval\"}]", "only \"function\" is known"),
        (
            "[{\"name\": \"f\", \"parameters\": [1]}]",
            "\"parameters\" that are not a JSON object",
        ),
        (
            "[{\"name\": \"has space\"}]",
            "tools[0].name must be letters",
        ),
    ] {
        let p = write("bad.json", text);
        assert_clean_error(&run(&p, "auto"), says);
    }
    assert_clean_error(
        &run(&good, "no_such_tool"),
        "--tool-choice names the function \"no_such_tool\"",
    );
    // A tool choice needs tools.
    let o = inferno(&["generate", "--model", m, "--tool-choice", "required", "hi"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--tools"), "{}", stderr(&o));
}

#[test]
fn generate_separates_reasoning_from_the_answer() {
    let dir = tempfile::tempdir().unwrap();
    let model = demo_model(dir.path());
    let m = model.to_str().unwrap();
    // Random weights do not think: a regex writes the section.
    let rx = "<think>\n[a-z]{1,8}\n</think>\n\n[a-z]{1,8}";
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--model",
            m,
            "--temperature",
            "1.5",
            "--seed",
            "5",
            "--max-tokens",
            "64",
            "--regex",
            rx,
        ];
        args.extend_from_slice(extra);
        args.push("Hello");
        let o = inferno(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        o
    };
    let plain: serde_json::Value =
        serde_json::from_slice(&run(&["--output", "json"]).stdout).unwrap();
    let text = plain["text"].as_str().unwrap();
    assert!(plain.get("reasoning_content").is_none());
    let (reasoning, answer) = text
        .strip_prefix("<think>\n")
        .and_then(|t| t.split_once("\n</think>\n\n"))
        .unwrap_or_else(|| panic!("{text:?}"));
    let sep: serde_json::Value =
        serde_json::from_slice(&run(&["--output", "json", "--separate-reasoning"]).stdout).unwrap();
    assert_eq!(sep["tokens"], plain["tokens"]);
    assert_eq!(sep["reasoning_content"], reasoning);
    assert_eq!(sep["text"], answer);
    // Text output: the answer alone on stdout, the reasoning marked on stderr.
    let o = run(&["--separate-reasoning"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), format!("{answer}\n"));
    assert!(
        stderr(&o).contains(&format!("[reasoning]\n{reasoning}\n[/reasoning]\n")),
        "{}",
        stderr(&o)
    );
    // Without the flag, stdout has all of it, tags included.
    let o = run(&[]);
    assert_eq!(String::from_utf8_lossy(&o.stdout), format!("{text}\n"));
}
