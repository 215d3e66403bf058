//! The weights are resident once on the CPU backends that repack them: after loading a
//! memory-mapped model on `simd` or `pool` and running a short prompt and a few decode steps,
//! the process has grown by at most the file's size plus 5 % plus its activation buffers
//! (KV cache and scratch), for Q8_0, Q4_0, Q5_0, Q4_1, Q5_1, Q4_K and Q6_K weights. Before, a
//! repacked matrix kept
//! its mapped pages resident beside the packed copy (about twice the file).
//!
//! Each file is dropped from the page cache before it is loaded, so it is read cold, as a
//! downloaded model is (see `evict_from_page_cache`).
//!
//! Each case runs in a fresh child process (this test binary re-run on this test alone): in
//! one process the memory freed by an earlier model would be reused by the next and hide
//! its growth. Memory assertions only; nothing is timed. Linux only (`/proc/self/status`).

#![cfg(target_os = "linux")]

use inferno::backend::{create_backend, BackendOptions};
use inferno::engine::memory::resident_bytes;
use inferno::gguf::{GgufFile, GgufWriter};
use inferno::model::synth::{self, SynthSpec};
use inferno::model::{Logits, Model};
use inferno::tensor::{self, GgmlType};
use std::path::Path;
use std::process::Command;

const CASE_ENV: &str = "INFERNO_RESIDENT_CASE";
const TEST_NAME: &str = "weights_are_resident_once_on_simd_and_pool";
const PROMPT: usize = 24;
const DECODE: usize = 4;
const BATCH: usize = 16;

/// Tens of MB per file (so 5 % is well above the process's other growth): 8 layers of a
/// Qwen3-0.6B-wide model with a small vocabulary and a tied head (whose row lookups must
/// read the packed embedding too).
fn spec(dtype: GgmlType) -> SynthSpec {
    let mut s = SynthSpec::preset("0.6b", dtype).expect("preset");
    s.n_layers = 8;
    s.vocab = 2048;
    s.context_length = 256;
    s.tied = true;
    s
}

fn load(gguf: &GgufFile, backend: &str) -> Model {
    let device = create_backend(
        backend,
        &BackendOptions {
            threads: 2,
            tracing: false,
        },
    )
    .expect("backend");
    Model::load(gguf, device).expect("load")
}

/// A prompt and a few decode steps.
fn run(model: &Model) -> inferno::model::State {
    let vocab = model.config.vocab as u32;
    let mut st = model.new_state(PROMPT + DECODE + 1, BATCH);
    let mut logits = vec![0.0f32; vocab as usize];
    let prompt: Vec<u32> = (0..PROMPT as u32).map(|i| (i * 97 + 11) % vocab).collect();
    model
        .forward(&mut st, &prompt, Logits::Last(&mut logits))
        .expect("prefill");
    for i in 0..DECODE as u32 {
        model
            .forward(&mut st, &[i * 13 % vocab], Logits::Last(&mut logits))
            .expect("decode");
    }
    st
}

/// Measures one case in this process: (growth after load, growth after the run, allowed),
/// in bytes.
fn measure(path: &Path, backend: &str) -> (u64, u64, u64) {
    // First the same work on a small in-memory model of the type, so the growth measured
    // below is not the code of the load and forward paths faulting in, the backend's threads
    // starting or the allocator's first arenas.
    let dtype = match GgufFile::open(path).expect("open").tensors()[0].dtype {
        // synth writes no K-quants nor Q4_1 / Q5_1 (their files come from `quantize`).
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q4_1 | GgmlType::Q5_1 => {
            GgmlType::Q8_0
        }
        d => d,
    };
    let mut small = spec(dtype);
    (small.n_layers, small.hidden, small.ffn, small.vocab) = (2, 256, 512, 512);
    let small =
        GgufFile::from_bytes(synth::build(&small).expect("synth").to_bytes()).expect("gguf");
    drop(run(&load(&small, backend)));
    drop(small);

    let before = resident_bytes().expect("VmRSS");
    let file = std::fs::metadata(path).expect("model file").len();
    let gguf = GgufFile::open(path).expect("open");
    let model = load(&gguf, backend);
    let after_load = resident_bytes().expect("VmRSS");
    let st = run(&model);
    let after_run = resident_bytes().expect("VmRSS");
    let c = &model.config;
    // Activation buffers: the KV cache, the scratch rows of every width the forward pass
    // uses (see `Model::new_scratch`) with their logits, and the caller's logits.
    let (h, qd, kvd, ffn) = (c.hidden, c.q_dim(), c.kv_dim(), c.ffn);
    let widths = 2 * h + 2 * qd + 2 * kvd + 2 * ffn;
    let scratch = (BATCH * (widths + c.vocab) + c.vocab) * 4;
    let activations = (st.kv.bytes() + scratch) as u64;
    let allowed = file + file / 20 + activations;
    println!(
        "{backend} {}: file {file}, growth after load {}, after the run {}, allowed {allowed} \
         (activations {activations})",
        path.display(),
        after_load.saturating_sub(before),
        after_run.saturating_sub(before),
    );
    (
        after_load.saturating_sub(before),
        after_run.saturating_sub(before),
        allowed,
    )
}

/// Syncs `path` to disk and drops it from the page cache, so the child maps it cold, as a
/// downloaded model is: its reads then come through readahead, which may cache the file in
/// large folios (2 MiB), and a fault on one tensor maps its neighbours' pages of the folio
/// too. A file just written sits in the small folios of the write path instead.
fn evict_from_page_cache(path: &Path) {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).expect("open the written file");
    f.sync_all().expect("sync");
    // SAFETY: a plain advisory call on an open descriptor; it changes no memory of ours.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise");
}

/// Q4_1 blocks from Q5_1 ones: value `2d · ⌊q / 2⌋ + m`, the same `m`.
fn q4_1_from_q5_1(q5_1: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(q5_1.len() / 24 * 20);
    for b in q5_1.chunks_exact(24) {
        let d = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
        out.extend_from_slice(&half::f16::from_f32(2.0 * d).to_le_bytes());
        out.extend_from_slice(&b[2..4]);
        // Q5_1 byte j holds the low four bits of elements j and j + 16 (bits j and j + 16
        // of qh their fifth); Q4_1 wants the top four of the five bits in the same places.
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        for (j, &q) in b[8..24].iter().enumerate() {
            let lo = ((q & 0x0f) >> 1) | ((((qh >> j) & 1) as u8) << 3);
            let hi = (q >> 5) | ((((qh >> (j + 16)) & 1) as u8) << 3);
            out.push(lo | (hi << 4));
        }
    }
    out
}

/// The Q8_0 file at `src` with its Q8_0 matrices requantized to `dtype` (Q5_1 through the
/// library's quantizer; Q4_1, which has none, from those Q5_1 blocks), all else as it is.
/// (`inferno quantize` writes neither type.)
fn requantize(src: &Path, dst: &Path, dtype: GgmlType) {
    let gguf = GgufFile::open(src).expect("open");
    let mut w = GgufWriter::new();
    w.set_alignment(gguf.alignment() as u32);
    for (key, value) in gguf.metadata() {
        if key.as_str() != "general.alignment" {
            w.try_add(key.clone(), value.clone()).expect("metadata");
        }
    }
    let mut converted = 0;
    for t in gguf.tensors() {
        let data = gguf.tensor_data(&t.name).expect("tensor data");
        let (dt, bytes) = if t.dtype == GgmlType::Q8_0 {
            converted += 1;
            let n = t.dims.iter().product::<u64>() as usize;
            let mut vals = vec![0.0f32; n];
            tensor::dequantize_row(GgmlType::Q8_0, data.as_slice(), &mut vals).expect("Q8_0");
            let q5_1 = tensor::encode(&vals, GgmlType::Q5_1).expect("Q5_1");
            match dtype {
                GgmlType::Q5_1 => (dtype, q5_1),
                GgmlType::Q4_1 => (dtype, q4_1_from_q5_1(&q5_1)),
                _ => unreachable!("only Q4_1 and Q5_1"),
            }
        } else {
            (t.dtype, data.as_slice().to_vec())
        };
        w.add_tensor(t.name.clone(), &t.dims, dt, bytes)
            .expect("tensor");
    }
    assert!(converted > 0, "no Q8_0 matrices in {}", src.display());
    w.write_to(dst).expect("write");
}

#[test]
fn weights_are_resident_once_on_simd_and_pool() {
    if let Ok(case) = std::env::var(CASE_ENV) {
        // A child: measure the one case and fail here if it is over.
        let (backend, path) = case.split_once(':').expect("backend:path");
        let (load, run, allowed) = measure(Path::new(path), backend);
        assert!(
            load <= allowed,
            "{case}: {load} bytes after load > {allowed}"
        );
        assert!(
            run <= allowed,
            "{case}: {run} bytes after the run > {allowed}"
        );
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = std::env::current_exe().expect("test binary");
    let mut failures = Vec::new();
    for dtype in [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q4_1,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        let path = dir.path().join(format!("resident-{dtype}.gguf"));
        // synth writes the round-to-nearest types Q8_0, Q4_0 and Q5_0; the others are made
        // from a Q8_0 file.
        let q8 = dir.path().join("resident-q8-source.gguf");
        let from_q8 = matches!(
            dtype,
            GgmlType::Q4_K | GgmlType::Q6_K | GgmlType::Q4_1 | GgmlType::Q5_1
        );
        if from_q8 && !q8.exists() {
            synth::build(&spec(GgmlType::Q8_0))
                .expect("synth")
                .write_to(&q8)
                .expect("write");
        }
        if matches!(dtype, GgmlType::Q4_1 | GgmlType::Q5_1) {
            requantize(&q8, &path, dtype);
        } else if from_q8 {
            // The K-quants come from `quantize`.
            let name = dtype.to_string().to_ascii_lowercase();
            let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
                .args(["quantize", "--dtype", &name, "-m"])
                .arg(&q8)
                .arg("-o")
                .arg(&path)
                .output()
                .expect("inferno quantize");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            synth::build(&spec(dtype))
                .expect("synth")
                .write_to(&path)
                .expect("write");
        }
        let size = std::fs::metadata(&path).expect("written").len();
        assert!(size > 60 << 20, "{dtype}: only {size} bytes");
        evict_from_page_cache(&path);
        for backend in ["simd", "pool"] {
            let out = Command::new(&exe)
                .args(["--exact", TEST_NAME, "--nocapture", "--test-threads", "1"])
                .env(CASE_ENV, format!("{backend}:{}", path.display()))
                .output()
                .expect("child test");
            let text = String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr);
            println!("{text}");
            if !out.status.success() || !text.contains("allowed") {
                failures.push(format!("{backend} {dtype}"));
            }
        }
    }
    assert!(failures.is_empty(), "over the limit: {failures:?}");
}
