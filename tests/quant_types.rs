//! The quantized block types against gguf-py's reference (`gguf.quants`), on random blocks
//! with ordinary and extreme scale fields (`tests/fixtures/quants`, made by
//! `gen_quants.py`), and the integer dot products against the f32 dot of dequantized
//! values.

use inferno::tensor::{self, k_quants, legacy, q8_0, GgmlType};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/quants")
}

fn manifest() -> Value {
    let text = std::fs::read_to_string(dir().join("manifest.json"))
        .expect("tests/fixtures/quants/manifest.json (run gen_quants.py)");
    serde_json::from_str(&text).expect("manifest is JSON")
}

fn read(name: &str) -> Vec<u8> {
    std::fs::read(dir().join(name)).expect(name)
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// One fixture type: its raw blocks and gguf-py's values.
struct Case {
    dtype: GgmlType,
    blocks: Vec<u8>,
    values: Vec<f32>,
    /// Byte offsets of the offset field (`m` or `dmin`), if the type has one.
    min_field: Option<usize>,
    /// Which scale kinds each block holds, for messages.
    cases: Vec<String>,
}

fn cases() -> Vec<Case> {
    let m = manifest();
    m["types"]
        .as_array()
        .expect("types")
        .iter()
        .map(|t| {
            let name = t["type"].as_str().unwrap();
            let dtype = GgmlType::from_name(name).expect(name);
            assert_eq!(
                t["block_size"].as_u64().unwrap() as usize,
                dtype.block_size()
            );
            assert_eq!(t["type_size"].as_u64().unwrap() as usize, dtype.type_size());
            let fields = &t["scale_fields"];
            let min_field = ["m", "dmin"]
                .iter()
                .find_map(|f| fields.get(*f).and_then(|v| v.as_u64()))
                .map(|v| v as usize);
            Case {
                dtype,
                blocks: read(t["blocks"].as_str().unwrap()),
                values: f32s(&read(t["values"].as_str().unwrap())),
                min_field,
                cases: t["cases"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c.to_string())
                    .collect(),
            }
        })
        .collect()
}

#[test]
fn every_type_in_the_fixture_is_present_and_supported() {
    let names: Vec<GgmlType> = cases().iter().map(|c| c.dtype).collect();
    use GgmlType::*;
    for t in [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K] {
        assert!(names.contains(&t), "{t} missing from the fixture");
        assert!(tensor::is_supported(t), "{t} not supported");
        assert!(tensor::activation_type(t).is_some(), "{t} has no dot");
    }
    for t in [F32, F16, BF16] {
        assert!(tensor::is_supported(t));
        assert_eq!(tensor::activation_type(t), None);
    }
    for t in [IQ2_XXS, IQ4_NL, TQ1_0, MXFP4, Q8_K, I32] {
        assert!(!tensor::is_supported(t), "{t} claims support");
    }
}

/// Every value equal to gguf-py's bit for bit (so also -0.0 where it has -0.0). Both sides
/// widen the f16 fields exactly and apply the same f32 operations in the same order
/// (e.g. `(d·sc)·q − dmin·m`), so no rounding difference is possible.
#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    let mut report = String::new();
    for c in cases() {
        let n = c.values.len();
        let mut out = vec![f32::NAN; n];
        tensor::dequantize_row(c.dtype, &c.blocks, &mut out).expect("dequantize");
        let bs = c.dtype.block_size();
        let mut mismatches = 0;
        for (i, (a, b)) in out.iter().zip(&c.values).enumerate() {
            if a.to_bits() != b.to_bits() {
                mismatches += 1;
                if mismatches <= 5 {
                    eprintln!(
                        "{} block {} ({}) element {}: ours {a:e} ({:#010x}), gguf-py {b:e} ({:#010x})",
                        c.dtype,
                        i / bs,
                        c.cases[i / bs],
                        i % bs,
                        a.to_bits(),
                        b.to_bits()
                    );
                }
            }
        }
        assert_eq!(mismatches, 0, "{}: {mismatches}/{n} values differ", c.dtype);
        report += &format!("{}: {n} values identical\n", c.dtype);
    }
    println!("{report}");
}

#[test]
fn q8_0_quantize_matches_gguf_py_byte_for_byte() {
    let m = manifest();
    let q = &m["q8_0_quantize"];
    let x = f32s(&read(q["input"].as_str().unwrap()));
    let want = read(q["blocks"].as_str().unwrap());
    let mut got = vec![0u8; want.len()];
    tensor::quantize_activation(GgmlType::Q8_0, &x, &mut got).unwrap();
    for (b, (g, w)) in got
        .chunks_exact(q8_0::BLOCK_BYTES)
        .zip(want.chunks_exact(q8_0::BLOCK_BYTES))
        .enumerate()
    {
        assert_eq!(g, w, "Q8_0 block {b}");
    }
}

/// The Q4_0 and Q5_0 writers (`tensor::encode`, used by `inferno synth` and `inferno
/// quantize`) against llama.cpp's reference quantizers (`gen_legacy_quantize.py`).
#[test]
fn q4_0_and_q5_0_encoding_matches_llama_cpp_byte_for_byte() {
    let text = std::fs::read_to_string(dir().join("legacy_quantize.json"))
        .expect("tests/fixtures/quants/legacy_quantize.json (run gen_legacy_quantize.py)");
    let m: Value = serde_json::from_str(&text).expect("JSON");
    let x = f32s(&read(m["input"].as_str().unwrap()));
    assert_eq!(x.len() as u64, m["n_values"].as_u64().unwrap());
    for (name, dtype) in [("q4_0", GgmlType::Q4_0), ("q5_0", GgmlType::Q5_0)] {
        let want = read(m["blocks"][name].as_str().unwrap());
        let got = tensor::encode(&x, dtype).unwrap();
        assert_eq!(got.len(), want.len(), "{dtype}");
        let size = dtype.type_size();
        for (b, (g, w)) in got
            .chunks_exact(size)
            .zip(want.chunks_exact(size))
            .enumerate()
        {
            assert_eq!(g, w, "{dtype} block {b}");
        }
    }
}

/// A random activation row: blocks of uniform values at scales from 0.01 to 100, one zero
/// block and one block with a single spike.
fn activation(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    let mut x = vec![0.0f32; n];
    for (b, xb) in x.chunks_mut(32).enumerate() {
        match b % 7 {
            3 => {}
            5 => xb[b % 32] = -7.25,
            _ => {
                let scale = 10f32.powf(rng.random_range(-2.0..2.0));
                xb.iter_mut()
                    .for_each(|v| *v = rng.random_range(-1.0f32..1.0) * scale);
            }
        }
    }
    x
}

fn dequantize_activation(act: GgmlType, q: &[u8], out: &mut [f32]) {
    match act {
        GgmlType::Q8_0 => q8_0::dequantize(q, out),
        GgmlType::Q8_1 => legacy::dequantize_q8_1(q, out),
        GgmlType::Q8_K => k_quants::dequantize_q8_k(q, out),
        other => panic!("no activation type {other}"),
    }
}

/// Largest |x̂ − x| the activation quantizer may leave in a block of `x`, from its maximum
/// magnitude alone: half a step, plus (Q8_0/Q8_1) the f16 rounding of the step times the
/// largest |q| = 127, or (Q8_K, f32 step) the rounding of `1/iscale`.
fn activation_half_step(act: GgmlType, xb: &[f32]) -> f64 {
    let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64;
    let step = amax / 127.0;
    match act {
        GgmlType::Q8_K => step * (0.5 + 127.0 * 2f64.powi(-23)) * (1.0 + 1e-6),
        _ => step * (0.5 + 127.0 * 2f64.powi(-11)) * (1.0 + 1e-6),
    }
}

/// `vec_dot` against exact (f64) dot products of the dequantized weights:
///
/// 1. with the dequantized *quantized* activation x̂, the only differences are f32
///    roundings: each block forms its scale products, the i32 → f32 conversion, the products
///    and the running sum, each off by at most ε = 2⁻²⁴ relative to the magnitudes involved;
///    gguf-py's ŵ adds up to two more roundings per value. The magnitudes are those of the
///    two parts of a value — `a = d·sc·q` and `b` = the offset (`m` or `−dmin·m`) — which can
///    cancel, so the bound is `(n_blocks + 8)·ε·Σ(|a|+|b|)·|x̂|`. Q4_1/Q5_1 also use the
///    activation block's f16 sum `s` for `Σx̂`, off by at most 2⁻¹⁰·Σ|x̂| (f16 rounding of
///    the scale and of `s`), times |m|;
/// 2. with the original x, the activation rounding adds at most `Σ|ŵ|·half_step`.
#[test]
fn vec_dot_is_within_the_derived_bound_of_the_f32_dot() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let eps = 2f64.powi(-24);
    let mut report = String::new();
    for c in cases() {
        let act = tensor::activation_type(c.dtype).unwrap();
        let n = c.values.len();
        let bs = c.dtype.block_size();
        // The value parts: `a` from the blocks with the offset field zeroed, `b = ŵ − a`.
        let parts_a = match c.min_field {
            Some(off) => {
                let mut zeroed = c.blocks.clone();
                for b in zeroed.chunks_exact_mut(c.dtype.type_size()) {
                    b[off..off + 2].copy_from_slice(&[0, 0]);
                }
                let mut a = vec![0.0f32; n];
                tensor::dequantize_row(c.dtype, &zeroed, &mut a).unwrap();
                a
            }
            None => c.values.clone(),
        };
        let offset_is_folded = matches!(act, GgmlType::Q8_1);

        let mut worst_tight = 0.0f64;
        let mut worst_full = 0.0f64;
        for trial in 0..4 {
            let x = activation(&mut rng, n);
            let mut xq = vec![0u8; act.row_size(n as u64).unwrap() as usize];
            tensor::quantize_activation(act, &x, &mut xq).unwrap();
            let mut xh = vec![0.0f32; n];
            dequantize_activation(act, &xq, &mut xh);

            // Whole row, and each weight block alone against its activation block.
            let n_blocks = n / bs;
            let ab = act.type_size() * bs / act.block_size();
            let mut spans: Vec<(usize, usize)> = (0..n_blocks).map(|b| (b, b + 1)).collect();
            spans.push((0, n_blocks));
            for (b0, b1) in spans {
                let (lo, hi) = (b0 * bs, b1 * bs);
                let w = &c.blocks[b0 * c.dtype.type_size()..b1 * c.dtype.type_size()];
                let got = tensor::vec_dot(c.dtype, w, &xq[b0 * ab..b1 * ab]).unwrap() as f64;

                let (mut exact_q, mut exact, mut mag, mut mag_off, mut act_err) =
                    (0.0f64, 0.0f64, 0.0f64, 0.0f64, 0.0f64);
                for i in lo..hi {
                    let (wv, a) = (c.values[i] as f64, parts_a[i] as f64);
                    let b = wv - a;
                    exact_q += wv * xh[i] as f64;
                    exact += wv * x[i] as f64;
                    mag += (a.abs() + b.abs()) * (xh[i] as f64).abs();
                    mag_off += b.abs() * (xh[i] as f64).abs();
                }
                for ablk in (lo..hi).step_by(act.block_size()) {
                    let xb = &x[ablk..ablk + act.block_size()];
                    let h = activation_half_step(act, xb);
                    for i in ablk..ablk + act.block_size() {
                        act_err += (c.values[i] as f64).abs() * h;
                    }
                }
                let mut tight = ((b1 - b0) as f64 + 8.0) * eps * mag;
                if offset_is_folded {
                    tight += 2f64.powi(-10) * 1.01 * mag_off;
                }
                let full = tight + act_err;
                let (e_tight, e_full) = ((got - exact_q).abs(), (got - exact).abs());
                assert!(
                    e_tight <= tight,
                    "{} trial {trial} blocks {b0}..{b1} ({}): vec_dot {got:e} vs Σŵx̂ {exact_q:e}, \
                     |Δ| {e_tight:e} > bound {tight:e}",
                    c.dtype,
                    c.cases[b0]
                );
                assert!(
                    e_full <= full,
                    "{} trial {trial} blocks {b0}..{b1}: vec_dot {got:e} vs Σŵx {exact:e}, \
                     |Δ| {e_full:e} > bound {full:e}",
                    c.dtype
                );
                if full > 0.0 {
                    worst_tight = worst_tight.max(e_tight / tight.max(f64::MIN_POSITIVE));
                    worst_full = worst_full.max(e_full / full);
                }
            }
        }
        report += &format!(
            "{} (· {act}): worst |Δ|/bound {worst_tight:.3} vs Σŵx̂, {worst_full:.3} vs Σŵx\n",
            c.dtype
        );
    }
    println!("{report}");
}

#[test]
fn the_dispatch_rejects_bad_sizes_and_types_without_panicking() {
    use GgmlType::*;
    let mut out = vec![0.0f32; 256];
    assert!(tensor::dequantize_row(Q4_K, &[0u8; 143], &mut out).is_err());
    assert!(tensor::dequantize_row(Q4_0, &[0u8; 18], &mut out[..31]).is_err());
    assert!(tensor::dequantize_row(IQ2_XXS, &[0u8; 66], &mut out).is_err());
    let mut q = vec![0u8; 292];
    assert!(tensor::quantize_activation(Q8_K, &out[..255], &mut q).is_err());
    assert!(tensor::quantize_activation(Q8_K, &out, &mut q[..291]).is_err());
    assert!(tensor::quantize_activation(Q4_0, &out[..32], &mut q[..18]).is_err());
    tensor::quantize_activation(Q8_K, &out, &mut q).unwrap();
    assert!(tensor::vec_dot(Q4_K, &[0u8; 144], &q[..291]).is_err());
    assert!(tensor::vec_dot(Q4_K, &[0u8; 145], &q).is_err());
    assert!(tensor::vec_dot(F32, &[0u8; 4], &q).is_err());
    assert_eq!(tensor::vec_dot(Q4_K, &[0u8; 144], &q).unwrap(), 0.0);
}

/// The weight quantizers (`tensor::encode`) on `tests/fixtures/quants/quantize.*`, made by
/// `gen_quantize.py`: for Q4_K, Q5_K and Q6_K the committed blocks are what the quantizer
/// writes for the committed input today, and gguf-py's dequantization of those blocks equals
/// ours bit for bit (so llama.cpp reads our files as we do); the error against the input is
/// also bounded per row. For Q5_0 and Q5_1 (the short-row fallbacks) the quantizer
/// reproduces gguf-py's own quantization byte for byte.
fn quantize_fixture() -> (Value, Vec<f32>) {
    let text = std::fs::read_to_string(dir().join("quantize.json"))
        .expect("tests/fixtures/quants/quantize.json (run gen_quantize.py)");
    let m: Value = serde_json::from_str(&text).expect("quantize.json is JSON");
    let x = f32s(&read(m["input"].as_str().unwrap()));
    let (rows, cols) = (m["rows"].as_u64().unwrap(), m["cols"].as_u64().unwrap());
    assert_eq!(x.len() as u64, rows * cols);
    (m, x)
}

#[test]
fn k_quantizer_blocks_dequantize_in_gguf_py_exactly_as_here() {
    let (m, x) = quantize_fixture();
    let cols = m["cols"].as_u64().unwrap() as usize;
    let kinds: Vec<&str> = m["row_kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    let entries = m["ours_dequantized_by_gguf_py"].as_array().unwrap();
    let names: Vec<&str> = entries
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Q4_K", "Q5_K", "Q6_K"]);
    for e in entries {
        let dtype = GgmlType::from_name(e["type"].as_str().unwrap()).unwrap();
        let blocks = read(e["blocks"].as_str().unwrap());
        let want = f32s(&read(e["values"].as_str().unwrap()));
        assert_eq!(
            tensor::encode(&x, dtype).unwrap(),
            blocks,
            "{dtype}: the quantizer no longer writes the committed blocks (rerun gen_quantize.py)"
        );
        let mut ours = vec![f32::NAN; x.len()];
        tensor::dequantize_row(dtype, &blocks, &mut ours).unwrap();
        let differ = ours
            .iter()
            .zip(&want)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differ, 0, "{dtype}: {differ} values differ from gguf-py");
        // Round-trip error per row, relative to the row's RMS: at most a few quantization
        // steps' worth (the types keep 4, 5 and 6 bits plus per-sub-block scales). Rows
        // whose scale underflows f16 (the "tiny" row) may come back as zeros, error = RMS.
        for (r, kind) in kinds.iter().enumerate() {
            let (xr, yr) = (
                &x[r * cols..(r + 1) * cols],
                &ours[r * cols..(r + 1) * cols],
            );
            let ms = |v: &mut dyn Iterator<Item = f32>| v.map(|a| a * a).sum::<f32>() / cols as f32;
            let rms = ms(&mut xr.iter().copied()).sqrt();
            let err = ms(&mut xr.iter().zip(yr).map(|(a, b)| a - b)).sqrt();
            let limit = match (dtype, *kind) {
                (_, "tiny") => rms,
                (GgmlType::Q4_K, _) => 0.15 * rms,
                (GgmlType::Q5_K, _) => 0.075 * rms,
                _ => 0.04 * rms,
            };
            assert!(
                err <= limit,
                "{dtype} row {r} ({kind}): RMSE {err:e} > {limit:e}"
            );
        }
    }
}

#[test]
fn q5_0_and_q5_1_quantizers_match_gguf_py_byte_for_byte() {
    let (m, x) = quantize_fixture();
    let entries = m["gguf_py_quantized"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    for e in entries {
        let dtype = GgmlType::from_name(e["type"].as_str().unwrap()).unwrap();
        let want = read(e["blocks"].as_str().unwrap());
        let got = tensor::encode(&x, dtype).unwrap();
        assert_eq!(got.len(), want.len(), "{dtype}");
        for (b, (g, w)) in got
            .chunks_exact(dtype.type_size())
            .zip(want.chunks_exact(dtype.type_size()))
            .enumerate()
        {
            assert_eq!(g, w, "{dtype} block {b}");
        }
    }
}

#[test]
fn the_weight_quantizers_refuse_bad_input_without_panicking() {
    for dtype in [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
    ] {
        let partial = vec![0.5f32; dtype.block_size() + 1];
        assert!(
            matches!(
                tensor::encode(&partial, dtype),
                Err(tensor::TensorError::PartialBlock { .. })
            ),
            "{dtype}"
        );
        let mut x = vec![0.5f32; dtype.block_size()];
        x[3] = f32::NAN;
        assert!(
            matches!(
                tensor::encode(&x, dtype),
                Err(tensor::TensorError::NonFinite { index: 3, .. })
            ),
            "{dtype}"
        );
    }
    assert!(tensor::encode(&[0.0; 256], GgmlType::Q3_K).is_err());
}
