//! The forward pass against references nobody here wrote: HF transformers' float32 logits
//! and llama.cpp's logits on the same GGUF files (`tests/fixtures/models`, made by
//! `gen_models.py`).

mod common;

use common::*;
use inferno::backend::KvType;
use inferno::model::Logits;

const DTYPES: [&str; 3] = ["f32", "f16", "q8_0"];

/// Worst error relative to the per-position logit scale, and argmax agreement, over all
/// sequences of one model file.
#[derive(Default)]
struct Score {
    max_rel: f32,
    max_abs: f32,
    agree: usize,
    total: usize,
}

fn score(rows_ours: &[f32], rows_ref: &[f32], vocab: usize, s: &mut Score) {
    for (a, b) in rows_ours.chunks(vocab).zip(rows_ref.chunks(vocab)) {
        let (abs, scale) = row_error(a, b);
        s.max_abs = s.max_abs.max(abs);
        s.max_rel = s.max_rel.max(abs / scale);
        s.agree += (argmax(a) == argmax(b)) as usize;
        s.total += 1;
    }
}

/// Our logits for `ids` with the model's default KV cache types, or with F32 caches.
fn our_logits(file: &str, ids: &[u32], f32_cache: bool) -> (Vec<f32>, usize) {
    let mut model = load_model(file, "scalar");
    if f32_cache {
        model.set_kv_types((KvType::F32, KvType::F32)).unwrap();
    }
    let vocab = model.config.vocab;
    let mut st = model.new_state(ids.len(), 64);
    let mut out = vec![0.0; ids.len() * vocab];
    model
        .forward(&mut st, ids, Logits::All(&mut out))
        .expect("forward");
    (out, vocab)
}

#[test]
fn logits_match_transformers_and_llama_cpp() {
    let manifest = manifest();
    let mut report = String::new();
    for m in manifest["models"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap();
        for dtype in DTYPES {
            let file = m["gguf"][dtype].as_str().unwrap();
            let mut vs_hf = Score::default();
            let mut llama_vs_hf = Score::default();
            // HF run on the weights as stored in this file (dequantized to f32).
            let mut vs_hf_deq = Score::default();
            for seq in m["sequences"].as_array().unwrap() {
                let ids = ids(&seq["ids"]);
                // The default cache types (F16 for F16 and Q8_0 files, as llama.cpp's).
                let (ours, vocab) = our_logits(file, &ids, false);
                let hf = read_f32(seq["hf_logits"].as_str().unwrap());
                let llama = read_f32(seq["llama_logits"][dtype].as_str().unwrap());
                assert_eq!(hf.len(), ours.len(), "{name}: reference shape");
                score(&ours, &hf, vocab, &mut vs_hf);
                score(&llama, &hf, vocab, &mut llama_vs_hf);
                if let Some(f) = seq["hf_dequant_logits"][dtype].as_str() {
                    // F32 caches: only the weights' rounding is shared with this reference.
                    let (exact, _) = our_logits(file, &ids, true);
                    score(&exact, &read_f32(f), vocab, &mut vs_hf_deq);
                }
            }
            report += &format!(
                "{name} {dtype}: ours vs HF max|Δ| {:.3e} (rel {:.3e}), argmax {}/{}; \
                 llama.cpp vs HF max|Δ| {:.3e} (rel {:.3e}), argmax {}/{}\n",
                vs_hf.max_abs,
                vs_hf.max_rel,
                vs_hf.agree,
                vs_hf.total,
                llama_vs_hf.max_abs,
                llama_vs_hf.max_rel,
                llama_vs_hf.agree,
                llama_vs_hf.total,
            );
            if vs_hf_deq.total > 0 {
                report += &format!(
                    "{name} {dtype}: ours vs HF on this file's dequantized weights max|Δ| {:.3e} \
                     (rel {:.3e}), argmax {}/{}\n",
                    vs_hf_deq.max_abs, vs_hf_deq.max_rel, vs_hf_deq.agree, vs_hf_deq.total,
                );
            }
            // F16 weights are widened to f32 and, with an F32 cache, everything after is f32,
            // so against HF run on the same rounded weights only summation order differs, as
            // for F32.
            if dtype == "f16" {
                assert!(
                    vs_hf_deq.total > 0 && vs_hf_deq.max_rel <= 1e-4,
                    "{name} f16 vs HF on dequantized weights: {}",
                    vs_hf_deq.max_rel
                );
            }
            match dtype {
                // An F32 path end to end (weights, activations, KV cache): only summation
                // order differs from transformers.
                "f32" => assert!(
                    vs_hf.max_rel <= 1e-4,
                    "{name} f32 rel error {}",
                    vs_hf.max_rel
                ),
                // F16 and Q8_0 must be at least as close to transformers as llama.cpp is on
                // the same file. Both sides round the same weights; llama.cpp adds F16
                // activations/KV (F16) or 8-bit activation blocks (Q8_0), as we do for Q8_0,
                // so our error is dominated by the same weight rounding. A 10% allowance
                // covers the different activation rounding points (nearest-even vs away from
                // zero, f16 scale) that move individual logits either way.
                _ => assert!(
                    vs_hf.max_rel <= llama_vs_hf.max_rel * 1.10,
                    "{name} {dtype}: ours {} vs llama.cpp {}",
                    vs_hf.max_rel,
                    llama_vs_hf.max_rel
                ),
            }
        }
    }
    println!("{report}");
}

/// `n` greedy tokens after `prompt`.
fn greedy(model: &inferno::model::Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let vocab = model.config.vocab;
    let mut st = model.new_state(prompt.len() + n + 1, 64);
    let mut logits = vec![0.0; vocab];
    model
        .forward(&mut st, prompt, Logits::Last(&mut logits))
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..n {
        let id = argmax(&logits) as u32;
        got.push(id);
        model
            .forward(&mut st, &[id], Logits::Last(&mut logits))
            .unwrap();
    }
    got
}

#[test]
fn greedy_continuation_matches_transformers() {
    let manifest = manifest();
    for m in manifest["models"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap();
        let g = &m["greedy"];
        let prompt = ids(&g["prompt"]);
        let want = ids(&g["hf"]);
        for dtype in DTYPES {
            let model = load_model(m["gguf"][dtype].as_str().unwrap(), "scalar");
            let got = greedy(&model, &prompt, want.len());
            let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            let llama = ids(&g["llama"][dtype]);
            let same_llama = got.iter().zip(&llama).take_while(|(a, b)| a == b).count();
            println!(
                "{name} {dtype}: greedy prefix equal to HF {same}/{}, to llama.cpp {same_llama}/{}",
                want.len(),
                llama.len()
            );
            if dtype == "f32" {
                assert_eq!(
                    got, want,
                    "{name}: f32 greedy tokens differ from transformers"
                );
            }
        }
    }
}

/// Prefill as one batch and token-by-token decode through the KV cache must agree exactly:
/// each row runs the same kernels in the same order.
#[test]
fn batched_prefill_equals_incremental_decode() {
    let manifest = manifest();
    for m in manifest["models"].as_array().unwrap() {
        for dtype in DTYPES {
            let model = load_model(m["gguf"][dtype].as_str().unwrap(), "scalar");
            let vocab = model.config.vocab;
            let ids = ids(&m["sequences"][1]["ids"]);
            let mut st = model.new_state(ids.len(), 64);
            let mut all = vec![0.0; ids.len() * vocab];
            model.forward(&mut st, &ids, Logits::All(&mut all)).unwrap();
            let mut st = model.new_state(ids.len(), 64);
            let mut one = vec![0.0; vocab];
            for (t, &id) in ids.iter().enumerate() {
                model
                    .forward(&mut st, &[id], Logits::Last(&mut one))
                    .unwrap();
                assert_eq!(&all[t * vocab..(t + 1) * vocab], &one[..], "position {t}");
            }
        }
    }
}

/// F16 and Q8_0 KV caches against transformers on the F32 files (so the cache is the only
/// rounding): F32 stays within summation order (1e-4 of the logit scale), F16 within 3e-3
/// (measured up to 1.1e-3: f16 keeps 11 bits, and these random models' logits move by about
/// twice the relative rounding of their keys and values), Q8_0 within 3e-2 (measured up to
/// 2.9e-2 on one of tiny-gqa-tied's three sequences, 1.5e-2 and 1.7e-2 on the others: a
/// 32-value block keeps about 8 bits of its largest value, 16 times f16's step), and greedy
/// continuations stay transformers' with either. Q8_0 needs heads of a multiple of 32
/// values; a fixture without them must refuse it, as llama.cpp does.
///
/// The same caches in llama.cpp (`llama-f32-kv-*`, flash attention on) are the yardstick:
/// on every sequence our Q8_0 cache is no further from transformers than llama.cpp's
/// (1.9e-2, 2.2e-2 and 4.0e-2 on tiny-gqa-tied's), whose attention kernel also rounds the
/// query to Q8_0 blocks where ours keeps it in f32. With F16 caches both are about 1e-3, ours
/// at times a hair above llama.cpp's, so that comparison is reported, not asserted.
#[test]
fn kv_cache_types_stay_within_their_error_of_transformers() {
    let manifest = manifest();
    let mut report = String::new();
    for m in manifest["models"].as_array().unwrap() {
        let name = m["name"].as_str().unwrap();
        let file = m["gguf"]["f32"].as_str().unwrap();
        for (kv, tol) in [
            (KvType::F32, 1e-4f32),
            (KvType::F16, 3e-3),
            (KvType::Q8_0, 3e-2),
        ] {
            // llama.cpp's logits with this cache (F32 has none: its error is summation order).
            let llama_kv = (kv != KvType::F32).then(|| kv.name());
            let mut model = load_model(file, "scalar");
            if let Err(e) = model.set_kv_types((kv, kv)) {
                assert_eq!(kv, KvType::Q8_0, "{name}: {kv} refused: {e}");
                assert!(
                    !model.config.head_dim.is_multiple_of(32),
                    "{name}: q8_0 refused: {e}"
                );
                assert!(
                    m["llama_f32_kv_vs_hf"]["q8_0"]["refused"].is_string(),
                    "{name}: llama.cpp made a q8_0 cache that we refuse"
                );
                report += &format!("{name} {kv}: refused ({e}), as by llama.cpp\n");
                continue;
            }
            let vocab = model.config.vocab;
            let mut s = Score::default();
            for (k, seq) in m["sequences"].as_array().unwrap().iter().enumerate() {
                let ids = ids(&seq["ids"]);
                let mut st = model.new_state(ids.len(), 64);
                assert_eq!(st.kv.types(), (kv, kv));
                let mut out = vec![0.0; ids.len() * vocab];
                model
                    .forward(&mut st, &ids, Logits::All(&mut out))
                    .expect("forward");
                let hf = read_f32(seq["hf_logits"].as_str().unwrap());
                let mut ours = Score::default();
                score(&out, &hf, vocab, &mut ours);
                score(&out, &hf, vocab, &mut s);
                let Some(llama_kv) = llama_kv else { continue };
                let llama_file = seq["llama_f32_kv_logits"][llama_kv]
                    .as_str()
                    .unwrap_or_else(|| panic!("{name}: no llama.cpp {kv} cache logits"));
                let mut llama = Score::default();
                score(&read_f32(llama_file), &hf, vocab, &mut llama);
                report += &format!(
                    "{name} seq{} {kv} cache vs HF rel: ours {:.3e}, llama.cpp {:.3e}\n",
                    k + 1,
                    ours.max_rel,
                    llama.max_rel
                );
                if kv == KvType::Q8_0 {
                    assert!(
                        ours.max_rel <= llama.max_rel,
                        "{name} seq{} q8_0 cache: {} > llama.cpp's {}",
                        k + 1,
                        ours.max_rel,
                        llama.max_rel
                    );
                }
            }
            let g = &m["greedy"];
            let (prompt, want) = (ids(&g["prompt"]), ids(&g["hf"]));
            let got = greedy(&model, &prompt, want.len());
            report += &format!(
                "{name} {kv} cache: vs HF rel {:.3e}, argmax {}/{}, greedy {}\n",
                s.max_rel,
                s.agree,
                s.total,
                if got == want { "equal" } else { "differs" }
            );
            assert!(s.max_rel <= tol, "{name} {kv} cache: {} > {tol}", s.max_rel);
            assert_eq!(got, want, "{name} {kv} cache: greedy tokens differ from HF");
        }
    }
    println!("{report}");
}
