//! The fast backends against each other and against the reference:
//! - `pool` (at 1, 2, 3 and 4 threads) and `parallel` produce exactly `simd`'s bytes, on logits
//!   and on 64 greedy tokens (the fixture models when present, and small synthetic ones);
//! - every SIMD kernel, on every instruction set this CPU has, matches the scalar definition:
//!   bit for bit where the arithmetic is the same (Q8_0 products, activation quantization
//!   to Q8_0 and Q8_1, RoPE, add), within a derived bound where the summation order differs;
//! - whole models on `simd` stay within a derived tolerance of `scalar`.

mod common;

use inferno::backend::cpu::simd::{AttentionWidth, Isa, Kernels, SimdBackend};
use inferno::backend::{
    create_backend, AttentionJob, AttentionShape, Backend, BackendOptions, Device, KvCache,
    KvLayer, KvRows, KvShape, KvStore, KvType, ParallelBackend, PoolBackend, ScalarBackend,
};
use inferno::gguf::GgufFile;
use inferno::model::{Logits, Model};
use inferno::tensor::{float, legacy, q8_0, GgmlType, Matrix, TensorBytes};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

fn randn(r: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (r.random::<f32>() - 0.5) * 2.0 * scale)
        .collect()
}

fn matrix(dtype: GgmlType, rows: usize, cols: usize, data: Vec<u8>) -> Matrix {
    Matrix {
        name: "w".into(),
        dtype,
        rows,
        cols,
        data: TensorBytes::from_vec(data),
        prepared: None,
    }
}

/// A random Q8_0 matrix; some blocks hold the extreme quant -128 (never produced by
/// quantization, but legal in a file) and some are all zero.
fn q8_matrix(r: &mut ChaCha8Rng, rows: usize, cols: usize) -> Matrix {
    let vals = randn(r, rows * cols, 1.0);
    let mut data = vec![0u8; rows * cols / 32 * 34];
    q8_0::quantize(&vals, &mut data);
    for (i, blk) in data.chunks_exact_mut(34).enumerate() {
        match i % 7 {
            3 => blk[2 + (i % 32)] = 0x80,
            5 => blk[2..].fill(0x80),
            6 if i % 3 == 0 => blk.fill(0),
            _ => {}
        }
    }
    matrix(GgmlType::Q8_0, rows, cols, data)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn simd(isa: Isa) -> SimdBackend<ScalarBackend> {
    SimdBackend::with_isa(ScalarBackend::new(), isa)
}

fn matmul(be: &dyn Backend, w: &Matrix, x: &[f32], n: usize) -> Vec<f32> {
    let mut w = w.clone();
    be.prepare(&mut w);
    let mut out = vec![f32::NAN; n * w.rows];
    be.matmul(&w, x, n, &mut out);
    out
}

// ---------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------

#[test]
fn isa_detection_is_consistent() {
    let avail = Isa::available();
    assert!(avail.contains(&Isa::Portable));
    assert!(avail.contains(&Isa::best()));
    assert!(Isa::selected().is_available());
    for i in Isa::ALL {
        assert_eq!(Isa::from_name(i.name()), Some(i));
    }
}

#[test]
fn activation_quantization_matches_the_scalar_definition() {
    let mut r = rng(1);
    for isa in Isa::available() {
        let k = Kernels::new(isa);
        for case in 0..40 {
            let cols = 32 * (1 + case % 9);
            let mut x = randn(&mut r, cols, 10.0f32.powi(case as i32 % 5 - 2));
            if case % 4 == 0 {
                // Ties: amax 127 makes the scale exactly 1, so x.5 values must round away
                // from zero as `f32::round` does.
                x[0] = 127.0;
                for (i, v) in x.iter_mut().enumerate().skip(1) {
                    *v = (i as f32 - 16.0) + 0.5;
                }
            }
            if case % 5 == 1 {
                x[..32].fill(0.0);
            }
            let mut reference = vec![0u8; cols / 32 * 34];
            q8_0::quantize(&x, &mut reference);
            // The Q4_1 / Q5_1 kernels read the same rows as Q8_1 (quants, d and s).
            let mut reference_1 = vec![0u8; cols / 32 * legacy::Q8_1_BYTES];
            legacy::quantize_q8_1(&x, &mut reference_1);
            let nb = cols / 32;
            let (mut q, mut d, mut s) = (vec![0i8; cols], vec![0f32; nb], vec![0i32; nb]);
            let mut m = vec![f32::NAN; nb];
            k.quantize(&x, &mut q, &mut d, &mut s, &mut m);
            for b in 0..nb {
                let blk = &reference[b * 34..(b + 1) * 34];
                assert_eq!(d[b].to_bits(), q8_0::block_scale(blk).to_bits(), "{isa:?}");
                let want: Vec<i8> = blk[2..].iter().map(|&v| v as i8).collect();
                assert_eq!(&q[b * 32..(b + 1) * 32], &want[..], "{isa:?} case {case}");
                assert_eq!(s[b], -128 * want.iter().map(|&v| v as i32).sum::<i32>());
                let blk1 = &reference_1[b * legacy::Q8_1_BYTES..(b + 1) * legacy::Q8_1_BYTES];
                let f16_at = |i: usize| half::f16::from_le_bytes([blk1[i], blk1[i + 1]]);
                assert_eq!(
                    d[b].to_bits(),
                    f16_at(0).to_f32().to_bits(),
                    "{isa:?} Q8_1 d"
                );
                assert_eq!(&blk1[4..], &blk[2..], "{isa:?} case {case}: Q8_1 quants");
                assert_eq!(
                    m[b].to_bits(),
                    f16_at(2).to_f32().to_bits(),
                    "{isa:?} case {case}: Q8_1 s of block {b}"
                );
            }
        }
    }
}

#[test]
fn q8_0_matmul_is_bit_identical_to_scalar_on_every_isa() {
    let mut r = rng(2);
    let scalar = ScalarBackend::new();
    for (rows, cols) in [(1, 32), (15, 64), (16, 96), (17, 32), (33, 320), (100, 128)] {
        let w = q8_matrix(&mut r, rows, cols);
        for n in [1, 2, 3, 4, 5, 9] {
            let x = randn(&mut r, n * cols, 3.0);
            let want = matmul(&scalar, &w, &x, n);
            for isa in Isa::available() {
                let got = matmul(&simd(isa), &w, &x, n);
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{isa:?} rows {rows} cols {cols} n {n}"
                );
            }
        }
    }
}

#[test]
fn float_matmul_is_within_summation_error_of_scalar() {
    let mut r = rng(3);
    let scalar = ScalarBackend::new();
    for dtype in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        for (rows, cols) in [(5, 7), (16, 64), (9, 100), (3, 1024)] {
            let vals = randn(&mut r, rows * cols, 1.0);
            let data = match dtype {
                GgmlType::F16 => float::f32_to_f16_bytes(&vals),
                GgmlType::BF16 => float::f32_to_bf16_bytes(&vals),
                _ => float::f32_to_le_bytes(&vals),
            };
            let w = matrix(dtype, rows, cols, data);
            let n = 3;
            let x = randn(&mut r, n * cols, 1.0);
            let want = matmul(&scalar, &w, &x, n);
            for isa in Isa::available() {
                let got = matmul(&simd(isa), &w, &x, n);
                // Reordered f32 sums of `cols` products of magnitude <= 1: each differs from
                // the sequential sum by at most ~cols * eps * Σ|products| <= cols² eps.
                for (a, b) in got.iter().zip(&want) {
                    let bound = (cols * cols) as f32 * f32::EPSILON;
                    assert!((a - b).abs() <= bound, "{isa:?} {dtype}: {a} vs {b}");
                }
            }
        }
    }
}

#[test]
fn elementwise_kernels_match_scalar() {
    let mut r = rng(4);
    let scalar = ScalarBackend::new();
    for isa in Isa::available() {
        let be = simd(isa);
        for dim in [8, 13, 64, 100, 1024] {
            let rows = 3;
            let x = randn(&mut r, rows * dim, 4.0);
            let g = randn(&mut r, dim, 1.0);
            let (mut a, mut b) = (x.clone(), x.clone());
            scalar.rms_norm(&mut a, &g, 1e-6);
            be.rms_norm(&mut b, &g, 1e-6);
            assert!(common::rel_err(&b, &a) < 1e-5, "{isa:?} rms_norm {dim}");

            let up = randn(&mut r, rows * dim, 2.0);
            let (mut a, mut b) = (x.clone(), x.clone());
            scalar.silu_mul(&mut a, &up);
            be.silu_mul(&mut b, &up);
            // The vector exponential is within 2 ulp; silu(x)·u amplifies that by at most ~2.
            for (p, q) in b.iter().zip(&a) {
                assert!(
                    (p - q).abs() <= 1e-6 * q.abs().max(1e-3),
                    "{isa:?} silu {p} {q}"
                );
            }

            let (mut a, mut b) = (x.clone(), x.clone());
            scalar.add(&mut a, &up);
            be.add(&mut b, &up);
            assert_eq!(bits(&a), bits(&b), "{isa:?} add");
        }
        for (n_heads, hd) in [(2, 8), (3, 20), (4, 64), (2, 128)] {
            let inv_freq: Vec<f32> = (0..hd / 2)
                .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / hd as f32))
                .collect();
            for pos0 in [0, 7, 300] {
                let x = randn(&mut r, 3 * n_heads * hd, 2.0);
                let (mut a, mut b) = (x.clone(), x.clone());
                scalar.rope(&mut a, n_heads, hd, pos0, &inv_freq);
                be.rope(&mut b, n_heads, hd, pos0, &inv_freq);
                assert_eq!(bits(&a), bits(&b), "{isa:?} rope hd {hd} pos {pos0}");
            }
        }
    }
}

/// The element-wise operations a prompt's rows are large enough to split across the pool's
/// threads (residual add, RoPE by token, SiLU·up, RMS norm by row) give the bits of one
/// thread at every thread count: each element takes the same path as alone, and RoPE's
/// angles are the caller's table.
#[test]
fn split_elementwise_operations_match_one_thread_bit_for_bit() {
    let mut r = rng(14);
    for isa in Isa::available() {
        let one = simd(isa);
        let (n_heads, hd, tokens) = (16, 64, 37);
        let n = n_heads * hd * tokens;
        let inv_freq: Vec<f32> = (0..hd / 2)
            .map(|i| 1.0 / 10000f32.powf(2.0 * i as f32 / hd as f32))
            .collect();
        let x = randn(&mut r, n + 5, 2.0);
        let y = randn(&mut r, n + 5, 2.0);
        let g = randn(&mut r, n_heads * hd, 1.0);
        let run = |be: &dyn Backend| {
            let mut a = x.clone();
            be.add(&mut a, &y);
            let mut b = x[..n].to_vec();
            be.rope(&mut b, n_heads, hd, 300, &inv_freq);
            let mut c = x.clone();
            be.silu_mul(&mut c, &y);
            let mut d = x[..n].to_vec();
            be.rms_norm(&mut d, &g, 1e-6);
            [a, b, c, d]
        };
        let want = run(&one);
        for t in 1..=3 {
            let got = run(&PoolBackend::new(simd(isa), t));
            for (op, (g, w)) in ["add", "rope", "silu_mul", "rms_norm"]
                .iter()
                .zip(got.iter().zip(&want))
            {
                assert_eq!(bits(g), bits(w), "{isa:?} {op} on {t} threads");
            }
        }
    }
}

/// A step's KV stores spread over the pool's threads (eight decoding sequences and one
/// with a prompt of five tokens: the parts of each sequence's keys and of its values) write
/// the bytes that storing each sequence on one thread writes, in every cache type, and
/// leave the rows around them alone.
#[test]
fn kv_stores_spread_over_threads_write_what_one_thread_writes() {
    let mut r = rng(15);
    let (layers, heads, hd, cap) = (2, 8, 128, 12);
    let tokens = [1, 1, 1, 1, 1, 1, 1, 1, 5];
    for kind in [KvType::F32, KvType::F16, KvType::Q8_0] {
        let shape = KvShape {
            n_layers: layers,
            n_kv_heads: heads,
            head_dim: hd,
            types: (kind, kind),
        };
        // Every sequence has three positions of history, then its new rows go to layer 1.
        let history = randn(&mut r, 3 * heads * hd, 1.5);
        let new: Vec<(Vec<f32>, Vec<f32>)> = tokens
            .iter()
            .map(|&n| {
                (
                    randn(&mut r, n * heads * hd, 1.5),
                    randn(&mut r, n * heads * hd, 1.5),
                )
            })
            .collect();
        let caches = || -> Vec<KvCache> {
            (0..tokens.len())
                .map(|_| {
                    let mut c = KvCache::with_shape(shape, cap);
                    for l in 0..layers {
                        c.store(l, 0, &history, &history);
                    }
                    c
                })
                .collect()
        };
        let mut want = caches();
        for (c, (k, v)) in want.iter_mut().zip(&new) {
            c.store(1, 3, k, v);
        }
        for t in 1..=3 {
            let mut got = caches();
            let mut parts: Vec<KvStore<'_>> = got
                .iter_mut()
                .zip(&new)
                .flat_map(|(c, (k, v))| c.store_parts(1, 3, k, v).expect("a host cache"))
                .collect();
            let values: usize = parts.iter().map(KvStore::len).sum();
            assert!(
                values >= 16 * 1024,
                "enough values for the pool to split them"
            );
            PoolBackend::new(simd(Isa::Portable), t).store_kv(&mut parts);
            drop(parts);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                for l in 0..layers {
                    let (gl, wl) = (g.layer(l), w.layer(l));
                    for (gr, wr) in [(gl.k, wl.k), (gl.v, wl.v)] {
                        let (mut a, mut b) = (vec![0.0; hd], vec![0.0; hd]);
                        for row in 0..heads * cap {
                            assert_eq!(
                                bits(gr.row(row, hd, &mut a)),
                                bits(wr.row(row, hd, &mut b)),
                                "{kind} sequence {i} layer {l} row {row}, {t} threads"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The shape of one attention call over a cache of `capacity` positions, with random
/// queries for its tokens and random keys and values for the whole cache.
fn attention_inputs(
    r: &mut ChaCha8Rng,
    (n_heads, n_kv, hd): (usize, usize, usize),
    n_tokens: usize,
    pos0: usize,
    capacity: usize,
) -> (AttentionShape, Vec<f32>, Vec<f32>, Vec<f32>) {
    let shape = AttentionShape {
        n_tokens,
        pos0,
        n_heads,
        n_kv_heads: n_kv,
        head_dim: hd,
        capacity,
        scale: 1.0 / (hd as f32).sqrt(),
    };
    let q = randn(r, n_tokens * n_heads * hd, 1.0);
    let k = randn(r, n_kv * capacity * hd, 1.0);
    let v = randn(r, n_kv * capacity * hd, 1.0);
    (shape, q, k, v)
}

/// A cache's rows (of `hd` values) stored as each KV cache type they can take: F32, F16,
/// and Q8_0 where `hd` is a multiple of 32.
struct Stored {
    f32: Vec<f32>,
    f16: Vec<half::f16>,
    q8_0: Option<Vec<u8>>,
}

impl Stored {
    fn new(x: &[f32], hd: usize) -> Self {
        let q8_0 = hd.is_multiple_of(32).then(|| {
            let rb = hd / 32 * q8_0::BLOCK_BYTES;
            let mut out = vec![0u8; x.len() / hd * rb];
            for (row, o) in x.chunks_exact(hd).zip(out.chunks_exact_mut(rb)) {
                q8_0::quantize(row, o);
            }
            out
        });
        Self {
            f32: x.to_vec(),
            f16: x.iter().map(|&v| half::f16::from_f32(v)).collect(),
            q8_0,
        }
    }

    fn each(&self) -> Vec<KvRows<'_>> {
        let mut out = vec![KvRows::F32(&self.f32), KvRows::F16(&self.f16)];
        out.extend(self.q8_0.as_deref().map(KvRows::Q8_0));
        out
    }
}

/// Key and value types to test together: each type for both, and each mixed pair.
fn type_pairs<'a>(k: &'a Stored, v: &'a Stored) -> Vec<(KvRows<'a>, KvRows<'a>)> {
    let mut out = Vec::new();
    for kr in k.each() {
        for vr in v.each() {
            out.push((kr, vr));
        }
    }
    out
}

#[test]
fn attention_matches_scalar_within_softmax_error() {
    let mut r = rng(5);
    let scalar = ScalarBackend::new();
    for (n_heads, n_kv, hd) in [
        (4, 2, 16),
        (3, 1, 20),
        (6, 3, 24),
        (16, 8, 128),
        (4, 4, 64),
        (16, 1, 32),
        (20, 1, 8),
    ] {
        for (n_tokens, pos0) in [(1, 0), (1, 40), (5, 0), (3, 70), (1, 257), (19, 0), (9, 33)] {
            let (shape, q, k, v) = attention_inputs(
                &mut r,
                (n_heads, n_kv, hd),
                n_tokens,
                pos0,
                pos0 + n_tokens + 3,
            );
            let (ks, vs) = (Stored::new(&k, hd), Stored::new(&v, hd));
            for (kr, vr) in type_pairs(&ks, &vs) {
                let mut want = vec![0.0; q.len()];
                scalar.attention(&shape, &q, KvLayer { k: kr, v: vr }, &mut want);
                for isa in Isa::available() {
                    let mut got = vec![f32::NAN; q.len()];
                    simd(isa).attention(&shape, &q, KvLayer { k: kr, v: vr }, &mut got);
                    // Both read the same stored values; outputs are convex combinations of
                    // values of about unit size; reordered dot products and the 2-ulp
                    // exponential move the weights by ~1e-6 relative.
                    for (a, b) in got.iter().zip(&want) {
                        assert!(
                            (a - b).abs() < 2e-5,
                            "{isa:?} {:?}/{:?} hd {hd} n {n_tokens}: {a} vs {b}",
                            kr.kind(),
                            vr.kind()
                        );
                    }
                }
            }
        }
    }
}

/// The x86 attention kernels (AVX2, and the AVX-512 forms on a VNNI CPU, which put two keys
/// in one register for the scores and sixteen values per lane group for the weighted sum)
/// form every score and every output lane in the same order: the same bits on either ISA,
/// for decode steps and prompts (rows grouped 1, 2 and 4 to a key), every cache type, head
/// sizes with and without a 16-wide remainder, and chunks with a remainder of keys. A VNNI
/// CPU runs every choice of forms here, whichever it picks by default.
#[test]
fn attention_is_bit_identical_on_every_x86_isa() {
    let mut backends: Vec<(String, SimdBackend<ScalarBackend>)> = Vec::new();
    for isa in Isa::available() {
        match isa {
            Isa::Avx2 => backends.push(("avx2".into(), simd(isa))),
            Isa::Avx512Vnni => {
                for width in [
                    AttentionWidth::Zmm,
                    AttentionWidth::ZmmExceptF16OrWidened,
                    AttentionWidth::Ymm,
                ] {
                    let name = format!("avx512vnni, attention {width:?}");
                    backends.push((name, simd(isa).with_attention_width(width)));
                }
            }
            _ => {}
        }
    }
    let isas: Vec<&str> = backends.iter().map(|(name, _)| name.as_str()).collect();
    if isas.len() < 2 {
        eprintln!("only {isas:?} here: nothing to compare");
        return;
    }
    let mut r = rng(8);
    for (n_heads, n_kv, hd) in [
        (16, 8, 128),
        (4, 2, 64),
        (16, 1, 32),
        (6, 3, 24),
        (20, 1, 8),
    ] {
        for (n_tokens, pos0) in [
            (1, 0),
            (1, 45),
            (5, 0),
            (3, 70),
            (19, 0),
            (9, 33),
            (2, 1030),
        ] {
            let (shape, q, k, v) = attention_inputs(
                &mut r,
                (n_heads, n_kv, hd),
                n_tokens,
                pos0,
                pos0 + n_tokens + 3,
            );
            let (ks, vs) = (Stored::new(&k, hd), Stored::new(&v, hd));
            for (kr, vr) in type_pairs(&ks, &vs) {
                let outs: Vec<Vec<u32>> = backends
                    .iter()
                    .map(|(_, be)| {
                        let mut got = vec![f32::NAN; q.len()];
                        be.attention(&shape, &q, KvLayer { k: kr, v: vr }, &mut got);
                        bits(&got)
                    })
                    .collect();
                for (isa, o) in isas.iter().zip(&outs).skip(1) {
                    assert!(
                        *o == outs[0],
                        "{isa:?} differs from {:?}: {:?}/{:?} heads {n_heads}/{n_kv} hd {hd} \
                         n {n_tokens} at {pos0}",
                        isas[0],
                        kr.kind(),
                        vr.kind()
                    );
                }
            }
        }
    }
}

#[test]
fn a_prompts_attention_in_one_call_equals_its_tokens_one_by_one_bit_for_bit() {
    // The fast paths group several tokens' query rows per KV head so they share each key
    // and value read; each row's arithmetic must not depend on its companions, or a batched
    // prompt chunk would differ from the same tokens run alone.
    let mut r = rng(6);
    for (n_heads, n_kv, hd) in [(16, 8, 128), (4, 2, 16), (16, 1, 32), (6, 3, 24)] {
        let (n_tokens, pos0) = (21, 30);
        let (whole, q, k, v) =
            attention_inputs(&mut r, (n_heads, n_kv, hd), n_tokens, pos0, pos0 + n_tokens);
        let shape = |n_tokens, pos0| AttentionShape {
            n_tokens,
            pos0,
            ..whole
        };
        let row = n_heads * hd;
        let (ks, vs) = (Stored::new(&k, hd), Stored::new(&v, hd));
        for ((kr, vr), isa) in type_pairs(&ks, &vs)
            .into_iter()
            .flat_map(|p| Isa::available().into_iter().map(move |i| (p, i)))
        {
            let one = simd(isa);
            let mut want = vec![f32::NAN; q.len()];
            for t in 0..n_tokens {
                one.attention(
                    &shape(1, pos0 + t),
                    &q[t * row..(t + 1) * row],
                    KvLayer { k: kr, v: vr },
                    &mut want[t * row..(t + 1) * row],
                );
            }
            let pools: Vec<Box<dyn Backend>> = vec![
                Box::new(simd(isa)),
                Box::new(PoolBackend::new(simd(isa), 3)),
                Box::new(ParallelBackend::new(simd(isa), 2)),
            ];
            for be in &pools {
                let mut got = vec![f32::NAN; q.len()];
                be.attention(
                    &shape(n_tokens, pos0),
                    &q,
                    KvLayer { k: kr, v: vr },
                    &mut got,
                );
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{isa:?} {:?}/{:?} heads {n_heads}/{n_kv} hd {hd}",
                    kr.kind(),
                    vr.kind()
                );
            }
        }
    }
}

/// Past a thousand cached positions the softmax runs in partitions folded in order, and the
/// pool splits a decode step's partitions across threads when there are too few KV heads to
/// share out: every thread count, the parallel backend and a single thread give the same
/// bits, for one decoding token and for a short prompt chunk, and stay within the softmax
/// error of the scalar reference.
#[test]
fn long_attention_split_by_positions_is_bit_identical_at_any_thread_count() {
    let mut r = rng(7);
    let scalar = ScalarBackend::new();
    for (n_heads, n_kv, hd) in [(14, 2, 64), (16, 1, 32), (4, 2, 16)] {
        for (n_tokens, pos0) in [(1, 2347), (1, 1023), (1, 1024), (5, 2100)] {
            let (shape, q, k, v) =
                attention_inputs(&mut r, (n_heads, n_kv, hd), n_tokens, pos0, pos0 + n_tokens);
            let (ks, vs) = (Stored::new(&k, hd), Stored::new(&v, hd));
            for (kr, vr) in type_pairs(&ks, &vs) {
                let kv = KvLayer { k: kr, v: vr };
                let mut want = vec![0.0; q.len()];
                scalar.attention(&shape, &q, kv, &mut want);
                for isa in Isa::available() {
                    let mut one = vec![f32::NAN; q.len()];
                    simd(isa).attention(&shape, &q, kv, &mut one);
                    for (a, b) in one.iter().zip(&want) {
                        assert!(
                            (a - b).abs() < 2e-5,
                            "{isa:?} hd {hd} pos {pos0}: {a} vs {b}"
                        );
                    }
                    let mut others: Vec<(String, Box<dyn Backend>)> = (1..=4)
                        .map(|t| {
                            let be: Box<dyn Backend> = Box::new(PoolBackend::new(simd(isa), t));
                            (format!("pool/{t}"), be)
                        })
                        .collect();
                    others.push((
                        "parallel/3".into(),
                        Box::new(ParallelBackend::new(simd(isa), 3)),
                    ));
                    if isa == Isa::Avx512Vnni {
                        // Every form of attention, split too, whichever this CPU picks.
                        for width in [
                            AttentionWidth::Zmm,
                            AttentionWidth::ZmmExceptF16OrWidened,
                            AttentionWidth::Ymm,
                        ] {
                            let be = PoolBackend::new(simd(isa).with_attention_width(width), 2);
                            others.push((format!("pool/2, attention {width:?}"), Box::new(be)));
                        }
                    }
                    for (name, be) in &others {
                        let mut got = vec![f32::NAN; q.len()];
                        be.attention(&shape, &q, kv, &mut got);
                        assert_eq!(
                            bits(&got),
                            bits(&one),
                            "{isa:?} {name} {:?}/{:?} heads {n_heads}/{n_kv} hd {hd} n {n_tokens} pos {pos0}",
                            kr.kind(),
                            vr.kind()
                        );
                    }
                }
            }
        }
    }
}

/// A batched step's attention in one call (`attention_batch`): sequences decoding one token
/// at short and long histories (a long one on a model with few KV heads keeps its own
/// split by positions) and a prompt chunk, in any order and at every thread count, give
/// each sequence the bits of its own `attention` call on `simd`, and leave the rows of
/// the output that no sequence owns alone.
#[test]
fn a_steps_attention_in_one_call_equals_each_sequence_alone_bit_for_bit() {
    let mut r = rng(19);
    for (n_heads, n_kv, hd) in [(14, 2, 64), (16, 8, 128), (4, 1, 32)] {
        let seqs: Vec<(usize, usize)> =
            vec![(1, 40), (1, 0), (1, 2347), (7, 300), (1, 5), (1, 1100)];
        let inputs: Vec<_> = seqs
            .iter()
            .map(|&(n, pos0)| attention_inputs(&mut r, (n_heads, n_kv, hd), n, pos0, pos0 + n + 3))
            .collect();
        let stored: Vec<_> = inputs
            .iter()
            .map(|(_, _, k, v)| (Stored::new(k, hd), Stored::new(v, hd)))
            .collect();
        let w = n_heads * hd;
        let rows: usize = seqs.iter().map(|s| s.0).sum();
        for isa in Isa::available() {
            // Each sequence alone on `simd`, its rows at their place in the step; one row of
            // padding after them must stay untouched.
            let mut want = vec![f32::NAN; (rows + 1) * w];
            let mut jobs = Vec::new();
            let mut at = 0;
            for ((shape, q, _, _), (ks, vs)) in inputs.iter().zip(&stored) {
                let kv = KvLayer {
                    k: KvRows::F16(&ks.f16),
                    v: KvRows::F16(&vs.f16),
                };
                let job = AttentionJob {
                    shape: *shape,
                    q,
                    kv,
                    at,
                };
                simd(isa).attention(shape, q, kv, &mut want[at..at + job.out_len()]);
                at += job.out_len();
                jobs.push(job);
            }
            let mut backends: Vec<(String, Box<dyn Backend>)> = (1..=4)
                .map(|t| {
                    let be: Box<dyn Backend> = Box::new(PoolBackend::new(simd(isa), t));
                    (format!("pool/{t}"), be)
                })
                .collect();
            backends.push(("simd".into(), Box::new(simd(isa))));
            for (name, be) in &backends {
                for order in [false, true] {
                    let mut js = jobs.clone();
                    if order {
                        js.reverse();
                    }
                    let mut got = vec![f32::NAN; (rows + 1) * w];
                    be.attention_batch(&js, &mut got);
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{isa:?} {name} heads {n_heads}/{n_kv} hd {hd} reversed {order}"
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Whole models
// ---------------------------------------------------------------------------------------

fn synth_models() -> Vec<(String, GgufFile)> {
    common::synth_models()
}

/// Fixture models made by `tests/fixtures/models/gen_models.py`,
/// `tests/fixtures/llama/gen_llama.py` and `tests/fixtures/qwen3moe/gen_qwen3moe.py`, when
/// they are present.
fn fixture_models() -> Vec<(String, GgufFile)> {
    let mut out = Vec::new();
    for dir in [
        common::models_dir(),
        common::fixtures().join("llama"),
        common::fixtures().join("qwen3moe"),
    ] {
        out.extend(gguf_files_in(&dir));
    }
    out
}

fn gguf_files_in(dir: &std::path::Path) -> Vec<(String, GgufFile)> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".gguf"))
            .collect();
        names.sort();
        for n in names {
            if let Ok(g) = GgufFile::open(dir.join(&n)) {
                out.push((n, g));
            }
        }
    }
    out
}

fn load(g: &GgufFile, be: impl Into<Device>) -> Model {
    Model::load(g, be).expect("model loads")
}

fn backend(name: &str, threads: usize) -> Device {
    create_backend(
        name,
        &BackendOptions {
            threads,
            tracing: false,
        },
    )
    .expect("backend")
}

fn run(model: &Model) -> (Vec<f32>, Vec<u32>) {
    common::greedy_run(model, 64)
}

#[test]
fn pool_and_parallel_are_byte_identical_to_simd_at_any_thread_count() {
    let mut models = synth_models();
    models.extend(fixture_models());
    for (name, g) in &models {
        let (want_logits, want_tokens) = run(&load(g, backend("simd", 1)));
        for threads in [1, 2, 3, 4] {
            for kind in ["pool", "parallel"] {
                let (logits, tokens) = run(&load(g, backend(kind, threads)));
                assert_eq!(tokens, want_tokens, "{name}: {kind} x{threads} tokens");
                assert!(
                    bits(&logits) == bits(&want_logits),
                    "{name}: {kind} x{threads} logits differ from simd"
                );
            }
        }
    }
}

#[test]
fn pool_is_identical_with_every_isa() {
    // The split does not depend on the instruction set: check the pool on each one this CPU
    // has against the one-thread backend on the same instruction set.
    let models = synth_models();
    let (name, g) = &models[0];
    for isa in Isa::available() {
        let one = Arc::new(simd(isa)) as Arc<dyn Backend>;
        let many = Arc::new(PoolBackend::new(simd(isa), 3)) as Arc<dyn Backend>;
        let par = Arc::new(ParallelBackend::new(simd(isa), 2)) as Arc<dyn Backend>;
        let (a, ta) = run(&load(g, one));
        let (b, tb) = run(&load(g, many));
        let (c, tc) = run(&load(g, par));
        assert_eq!(ta, tb, "{name} {isa:?}");
        assert_eq!(ta, tc, "{name} {isa:?}");
        assert!(
            bits(&a) == bits(&b) && bits(&a) == bits(&c),
            "{name} {isa:?}"
        );
    }
}

#[test]
fn simd_stays_close_to_scalar() {
    let mut models = synth_models();
    models.extend(fixture_models());
    for (name, g) in &models {
        let scalar = load(g, backend("scalar", 1));
        let fast = load(g, backend("simd", 1));
        let vocab = scalar.config.vocab;
        let prompt: Vec<u32> = (0..9u32).map(|i| (i * 53 + 1) % vocab as u32).collect();
        let mut want = vec![0.0; prompt.len() * vocab];
        let mut got = vec![0.0; prompt.len() * vocab];
        let mut s1 = scalar.new_state(16, 4);
        let mut s2 = fast.new_state(16, 4);
        scalar
            .forward(&mut s1, &prompt, Logits::All(&mut want))
            .unwrap();
        fast.forward(&mut s2, &prompt, Logits::All(&mut got))
            .unwrap();
        let quantized = scalar.weights.main_dtype() == GgmlType::Q8_0;
        // Float models: only summation order and the 2-ulp exponential differ, ~1e-6 per
        // operation, far below 1e-4 of the logit scale after a few layers.
        // Q8_0 models: a last-bit difference in an activation can move one 8-bit
        // activation quant by one step (1/254 of its block's range), so logits may move by
        // a fraction of the Q8_0 error itself (~1e-2 of the logit scale); 2e-2 bounds it.
        let tol = if quantized { 2e-2 } else { 1e-4 };
        let mut agree = 0;
        for (a, b) in got.chunks(vocab).zip(want.chunks(vocab)) {
            let e = common::rel_err(a, b);
            assert!(e < tol, "{name}: simd vs scalar {e} >= {tol}");
            agree += usize::from(common::argmax(a) == common::argmax(b));
        }
        assert!(
            agree * 10 >= prompt.len() * 9,
            "{name}: argmax agreement {agree}"
        );
    }
}
