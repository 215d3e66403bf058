//! Expert matrices repacked at load (`--experts repack`, and `auto` when the model fits in
//! memory) against experts multiplied where they lie in the mapped file: the same logits,
//! bit for bit, on the multi-threaded CPU backends, for Q8_0 and for a K-quant mixture whose
//! experts are Q4_K and Q6_K; and the experts' products batched into one dispatch against
//! the same products one by one.

use inferno::backend::{Backend, MatmulJob, PoolBackend, ScalarBackend, SimdBackend};
use inferno::gguf::GgufFile;
use inferno::model::synth::{self, SynthSpec};
use inferno::model::{Architecture, ExpertWeights, Ffn, Model};
use inferno::tensor::GgmlType;
use std::process::Command;

mod common;

use common::arch::{cpu, logits};

/// A 2-layer qwen3moe of 256-wide rows (so K-quants apply), 8 experts of which 2 are used.
fn spec(dtype: GgmlType) -> SynthSpec {
    let mut s = SynthSpec::preset_for(Architecture::Qwen3Moe, "tiny", dtype).unwrap();
    s.hidden = 256;
    s.n_heads = 4;
    s.n_kv_heads = 2;
    s.head_dim = 64;
    if let Some(m) = s.moe.as_mut() {
        m.expert_ffn = 256;
    }
    s
}

/// Every expert matrix of the model, with its layer's stacked tensor name.
fn experts(model: &Model) -> Vec<&inferno::tensor::Matrix> {
    let mut out = Vec::new();
    for lw in &model.weights.layers {
        let Ffn::Moe(moe) = &lw.ffn else {
            panic!("a layer has no experts")
        };
        out.extend(moe.gate.iter().chain(&moe.up).chain(&moe.down));
    }
    out
}

/// `matmul_batch` on the pool (all jobs in one dispatch where they are quantized products)
/// against each job's own `matmul`, bit for bit: inputs shared by consecutive jobs and not,
/// one row and several, jobs of every expert type of the model.
fn batch_equals_one_by_one(model: &Model, what: &str) {
    let Ffn::Moe(moe) = &model.weights.layers[0].ffn else {
        panic!("no experts")
    };
    let be = PoolBackend::new(SimdBackend::new(ScalarBackend), 2);
    let h = moe.gate[0].cols;
    let x: Vec<f32> = (0..3 * h)
        .map(|i| ((i * 7919) % 201) as f32 / 50.0 - 2.0)
        .collect();
    let y: Vec<f32> = x.iter().rev().copied().collect();
    for n in [1, 3] {
        let mut jobs = Vec::new();
        let mut at = 0;
        for (w, input) in [
            (&moe.gate[1], &x),
            (&moe.up[1], &x),
            (&moe.gate[4], &y),
            (&moe.up[6], &x),
        ] {
            jobs.push(MatmulJob {
                w,
                x: &input[..n * h],
                n,
                at,
            });
            at += n * w.rows + 5;
        }
        let mut batched = vec![f32::NAN; at];
        be.matmul_batch(&jobs, &mut batched);
        for j in &jobs {
            let mut alone = vec![0.0f32; j.out_len()];
            be.matmul(j.w, j.x, j.n, &mut alone);
            let got = &batched[j.at..j.at + j.out_len()];
            let same = got
                .iter()
                .zip(&alone)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{what}: {} in a batch of {n}-row jobs differs",
                j.w.name
            );
        }
    }
}

fn check(g: &GgufFile, what: &str, types: &[GgmlType]) {
    let ids: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 256).collect();
    let mut reference: Option<Vec<f32>> = None;
    for backend in ["simd", "pool"] {
        let mapped = Model::load_with(g, cpu(backend), ExpertWeights::Mapped).unwrap();
        let packed = Model::load_with(g, cpu(backend), ExpertWeights::Prepared).unwrap();
        let kinds: Vec<GgmlType> = experts(&packed).iter().map(|m| m.dtype).collect();
        for t in types {
            assert!(kinds.contains(t), "{what}: no {t} experts");
        }
        assert!(
            experts(&mapped).iter().all(|m| m.prepared.is_none()),
            "{what}: a mapped expert was prepared"
        );
        assert!(
            experts(&packed).iter().all(|m| m.prepared.is_some()),
            "{what} on {backend}: an expert was not repacked"
        );
        // 40 tokens routed over 8 experts: several rows per expert, so the multi-row
        // kernels run; one token at a time, the single-row ones.
        for batch in [40, 1] {
            let a = logits(&mapped, &ids, batch);
            let b = logits(&packed, &ids, batch);
            let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{what} on {backend}, batch {batch}: logits differ");
            // One token at a time the experts' products go through `matmul_batch` (one
            // dispatch on the pool, one by one on simd): the same bits either way.
            if batch == 1 {
                match &reference {
                    None => reference = Some(b),
                    Some(r) => {
                        let same = r.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(same, "{what}: pool's batched experts differ from simd's");
                    }
                }
            }
        }
        batch_equals_one_by_one(&mapped, what);
        batch_equals_one_by_one(&packed, what);
    }
}

#[test]
fn repacked_experts_give_the_mapped_experts_logits_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let q8 = dir.path().join("moe.q8_0.gguf");
    synth::build(&spec(GgmlType::Q8_0))
        .unwrap()
        .write_to(&q8)
        .unwrap();
    check(&GgufFile::open(&q8).unwrap(), "q8_0", &[GgmlType::Q8_0]);

    // A Q4_K_M mixture made by `inferno quantize` from F32: Q4_K gate/up, Q6_K down.
    let f32 = dir.path().join("moe.f32.gguf");
    synth::build(&spec(GgmlType::F32))
        .unwrap()
        .write_to(&f32)
        .unwrap();
    let km = dir.path().join("moe.q4_k_m.gguf");
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["quantize", "--dtype", "q4_k_m", "-o"])
        .arg(&km)
        .arg("-m")
        .arg(&f32)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check(
        &GgufFile::open(&km).unwrap(),
        "q4_k_m",
        &[GgmlType::Q4_K, GgmlType::Q6_K],
    );
}
