//! Micro-benchmarks of each kernel, on Qwen3-0.6B's shapes (hidden 1024, FFN 3072, 16/8
//! heads of 128) and, for the quantized types other than Q8_0, Qwen2.5-0.5B's (hidden 896,
//! FFN 4864), for the scalar reference and every instruction set this CPU has, plus the
//! thread pool's dispatch cost, and the sampler's pass over a row of logits. Run with
//! `cargo bench --bench kernels`.

use divan::{black_box, Bencher};
use inferno::backend::cpu::simd::{AttentionWidth, Isa, Kernels, SimdBackend};
use inferno::backend::cpu::threadpool::ThreadPool;
use inferno::backend::{
    AttentionShape, Backend, KvCache, KvShape, KvType, PoolBackend, ScalarBackend,
};
use inferno::tensor::{q8_0, GgmlType, Matrix, TensorBytes};

fn main() {
    divan::main();
}

/// "scalar" and the name of every available instruction set.
fn kernels() -> Vec<&'static str> {
    let mut v = vec!["scalar"];
    v.extend(Isa::available().into_iter().map(Isa::name));
    v
}

fn backend(name: &str) -> Box<dyn Backend> {
    // "avx512vnni/zmm" and "avx512vnni/ymm": attention's 16- or 8-lane forms, whichever the
    // CPU picks by default.
    let (isa, width) = match name.split_once('/') {
        Some((isa, "zmm")) => (isa, Some(AttentionWidth::Zmm)),
        Some((isa, _)) => (isa, Some(AttentionWidth::Ymm)),
        None => (name, None),
    };
    match Isa::from_name(isa) {
        Some(isa) => {
            let be = SimdBackend::with_isa(ScalarBackend::new(), isa);
            Box::new(match width {
                Some(width) => be.with_attention_width(width),
                None => be,
            })
        }
        None => Box::new(ScalarBackend::new()),
    }
}

/// [`kernels`], and AVX-512's two forms of attention named apart where it is available
/// ("avx512vnni" alone runs the forms this CPU picks).
fn attention_kernels() -> Vec<&'static str> {
    let mut v = kernels();
    if Isa::Avx512Vnni.is_available() {
        v.extend(["avx512vnni/zmm", "avx512vnni/ymm"]);
    }
    v
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    // A cheap deterministic pseudo-random sequence in [-1, 1).
    let mut s = seed.wrapping_mul(2654435761).max(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) * 2.0 - 1.0
        })
        .collect()
}

fn q8_matrix(rows: usize, cols: usize) -> Matrix {
    let v = values(rows * cols, 7);
    let mut data = vec![0u8; rows * cols / 32 * 34];
    q8_0::quantize(&v, &mut data);
    Matrix {
        name: "w".into(),
        dtype: GgmlType::Q8_0,
        rows,
        cols,
        data: TensorBytes::from_vec(data),
        prepared: None,
    }
}

fn bench_matmul(b: Bencher, be: &dyn Backend, rows: usize, cols: usize, n: usize) {
    let mut w = q8_matrix(rows, cols);
    be.prepare(&mut w);
    let x = values(n * cols, 3);
    let mut out = vec![0.0f32; n * rows];
    b.counter(divan::counter::BytesCount::new(w.data.len()))
        .bench_local(|| be.matmul(black_box(&w), black_box(&x), n, &mut out));
}

/// A decode matvec: the FFN up projection (3072 × 1024), one token.
#[divan::bench(args = kernels())]
fn q8_matvec_3072x1024(b: Bencher, k: &str) {
    bench_matmul(b, backend(k).as_ref(), 3072, 1024, 1);
}

/// The FFN down projection (1024 × 3072), one token.
#[divan::bench(args = kernels())]
fn q8_matvec_1024x3072(b: Bencher, k: &str) {
    bench_matmul(b, backend(k).as_ref(), 1024, 3072, 1);
}

/// A batched decode step: eight streams' tokens through the 3072 × 1024 projection.
#[divan::bench(args = kernels())]
fn q8_matmul_8x3072x1024(b: Bencher, k: &str) {
    bench_matmul(b, backend(k).as_ref(), 3072, 1024, 8);
}

/// A prefill matmul: 64 tokens through the 3072 × 1024 projection.
#[divan::bench(args = kernels(), sample_count = 20)]
fn q8_matmul_64x3072x1024(b: Bencher, k: &str) {
    bench_matmul(b, backend(k).as_ref(), 3072, 1024, 64);
}

/// A prompt's activations quantized to Q8_K for the K-quant products: 64 tokens of the
/// hidden size, 1024 values each (without the packed kernels' min pairs).
#[divan::bench(args = kernels())]
fn q8_k_quantize_64x1024(b: Bencher, k: &str) {
    let kq = match Isa::from_name(k) {
        Some(isa) => Kernels::new(isa).quant_dot(GgmlType::Q4_K),
        None => inferno::tensor::quant_dot(GgmlType::Q4_K),
    }
    .expect("Q4_K has an integer product");
    let x = values(64 * 1024, 5);
    let row = GgmlType::Q8_K.row_size(1024).unwrap() as usize;
    let mut q = vec![0u8; 64 * row];
    b.counter(divan::counter::ItemsCount::new(x.len()))
        .bench_local(|| {
            for (xr, qr) in x.chunks_exact(1024).zip(q.chunks_exact_mut(row)) {
                (kq.quantize)(black_box(xr), qr);
            }
        });
}

/// A matrix of quantized type `t` with pseudo-random quant bytes and moderate f16 scales
/// (these types have no quantizer here; the kernels' speed does not depend on the values).
fn quant_matrix(t: GgmlType, rows: usize, cols: usize) -> Matrix {
    let f16_fields: &[usize] = match t {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[0, 2],
    };
    let size = t.row_size(cols as u64).unwrap() as usize * rows;
    let v = values(size.div_ceil(4), 11);
    let mut data: Vec<u8> = v.iter().flat_map(|x| x.to_bits().to_le_bytes()).collect();
    data.truncate(size);
    for (i, blk) in data.chunks_exact_mut(t.type_size()).enumerate() {
        for &f in f16_fields {
            let d = 0.01 + (i % 7) as f32 * 0.003;
            blk[f..f + 2].copy_from_slice(&half::f16::from_f32(d).to_bits().to_le_bytes());
        }
    }
    Matrix {
        name: "w".into(),
        dtype: t,
        rows,
        cols,
        data: TensorBytes::from_vec(data),
        prepared: None,
    }
}

/// [`quant_matrix`] as the backend holds it after load: in its own layout where it has one
/// (the K-quants' packed groups).
fn prepared_quant_matrix(be: &dyn Backend, t: GgmlType, rows: usize, cols: usize) -> Matrix {
    let mut w = quant_matrix(t, rows, cols);
    if t != GgmlType::Q8_0 {
        be.prepare(&mut w);
    }
    w
}

fn bench_quant(b: Bencher, be: &dyn Backend, t: GgmlType, rows: usize, cols: usize, n: usize) {
    let w = prepared_quant_matrix(be, t, rows, cols);
    let x = values(n * cols, 3);
    let mut out = vec![0.0f32; n * rows];
    b.counter(divan::counter::BytesCount::new(w.data.len()))
        .bench_local(|| be.matmul(black_box(&w), black_box(&x), n, &mut out));
}

// Decode matvecs of the types multiplied in their stored layout, on Qwen2.5-0.5B's FFN
// shapes: 4864 × 896 (gate/up) for the 32-value types, 896 × 4864 (down; K-quant rows must
// be multiples of 256) for the K-quants.

#[divan::bench(args = kernels())]
fn q4_0_matvec_4864x896(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q4_0, 4864, 896, 1);
}

#[divan::bench(args = kernels())]
fn q4_1_matvec_4864x896(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q4_1, 4864, 896, 1);
}

#[divan::bench(args = kernels())]
fn q5_0_matvec_4864x896(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q5_0, 4864, 896, 1);
}

#[divan::bench(args = kernels())]
fn q5_1_matvec_4864x896(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q5_1, 4864, 896, 1);
}

/// Q8_0 without the repacked layout (a matrix no backend prepared).
#[divan::bench(args = kernels())]
fn q8_0_unpacked_matvec_4864x896(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q8_0, 4864, 896, 1);
}

#[divan::bench(args = kernels())]
fn q2_k_matvec_896x4864(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q2_K, 896, 4864, 1);
}

#[divan::bench(args = kernels())]
fn q3_k_matvec_896x4864(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q3_K, 896, 4864, 1);
}

#[divan::bench(args = kernels())]
fn q4_k_matvec_896x4864(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q4_K, 896, 4864, 1);
}

#[divan::bench(args = kernels())]
fn q5_k_matvec_896x4864(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q5_K, 896, 4864, 1);
}

#[divan::bench(args = kernels())]
fn q6_k_matvec_896x4864(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q6_K, 896, 4864, 1);
}

/// The instruction sets alone, without the scalar reference (slow on the batched shapes,
/// and the same for every change to the SIMD kernels).
fn isas() -> Vec<&'static str> {
    Isa::available().into_iter().map(Isa::name).collect()
}

// Batched decode of every K-quant type: eight streams' tokens through Qwen3-0.6B's FFN up
// projection (3072 × 1024), beside Q8_0 on the same shape (`q8_matmul_8x3072x1024`).

#[divan::bench(args = isas())]
fn q2_k_matmul_8x3072x1024(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q2_K, 3072, 1024, 8);
}

#[divan::bench(args = isas())]
fn q3_k_matmul_8x3072x1024(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q3_K, 3072, 1024, 8);
}

/// Four decoding streams of a Q3_K matrix: one tile of 4 (see `q3_vnni`).
#[divan::bench(args = isas())]
fn q3_k_matmul_4x3072x1024(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q3_K, 3072, 1024, 4);
}

#[divan::bench(args = isas())]
fn q4_k_matmul_8x3072x1024(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q4_K, 3072, 1024, 8);
}

#[divan::bench(args = isas())]
fn q5_k_matmul_8x3072x1024(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q5_K, 3072, 1024, 8);
}

#[divan::bench(args = isas())]
fn q6_k_matmul_8x3072x1024(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q6_K, 3072, 1024, 8);
}

/// [`bench_quant`] for a product of `n` tokens whose weights come from memory, as in a
/// decode step, rather than from cache: each iteration multiplies the next of enough copies
/// of the matrix to outgrow the last-level cache (128 MiB of weights in all).
fn bench_quant_from_memory(
    b: Bencher,
    be: &dyn Backend,
    t: GgmlType,
    rows: usize,
    cols: usize,
    n: usize,
) {
    let bytes = t.row_size(cols as u64).unwrap() as usize * rows;
    let copies = (128usize << 20).div_ceil(bytes);
    let ws: Vec<Matrix> = (0..copies)
        .map(|_| prepared_quant_matrix(be, t, rows, cols))
        .collect();
    let x = values(n * cols, 3);
    let mut out = vec![0.0f32; n * rows];
    let mut i = 0;
    b.counter(divan::counter::BytesCount::new(bytes))
        .bench_local(|| {
            i = (i + 1) % copies;
            be.matmul(black_box(&ws[i]), black_box(&x), n, &mut out)
        });
}

// The batched decode products above with their weights streamed from memory, as a decode
// step reads them: beside the cached figures, what the memory costs them.

#[divan::bench(args = isas())]
fn q4_k_matmul_8x3072x1024_from_memory(b: Bencher, k: &str) {
    bench_quant_from_memory(b, backend(k).as_ref(), GgmlType::Q4_K, 3072, 1024, 8);
}

#[divan::bench(args = isas())]
fn q6_k_matmul_8x3072x1024_from_memory(b: Bencher, k: &str) {
    bench_quant_from_memory(b, backend(k).as_ref(), GgmlType::Q6_K, 3072, 1024, 8);
}

#[divan::bench(args = isas())]
fn q3_k_matmul_8x3072x1024_from_memory(b: Bencher, k: &str) {
    bench_quant_from_memory(b, backend(k).as_ref(), GgmlType::Q3_K, 3072, 1024, 8);
}

#[divan::bench(args = isas())]
fn q3_k_matmul_4x3072x1024_from_memory(b: Bencher, k: &str) {
    bench_quant_from_memory(b, backend(k).as_ref(), GgmlType::Q3_K, 3072, 1024, 4);
}

#[divan::bench(args = isas())]
fn q2_k_matmul_8x3072x1024_from_memory(b: Bencher, k: &str) {
    bench_quant_from_memory(b, backend(k).as_ref(), GgmlType::Q2_K, 3072, 1024, 8);
}

#[divan::bench(args = isas())]
fn q2_k_matvec_3072x1024_from_memory(b: Bencher, k: &str) {
    bench_quant_from_memory(b, backend(k).as_ref(), GgmlType::Q2_K, 3072, 1024, 1);
}

/// The real model's Q5_0 products in an eight-stream decode step, weights from memory.
#[divan::bench(args = isas())]
fn q5_0_matmul_8x4864x896_from_memory(b: Bencher, k: &str) {
    bench_quant_from_memory(b, backend(k).as_ref(), GgmlType::Q5_0, 4864, 896, 8);
}

/// The same product for one stream.
#[divan::bench(args = isas())]
fn q5_0_matvec_4864x896_from_memory(b: Bencher, k: &str) {
    bench_quant_from_memory(b, backend(k).as_ref(), GgmlType::Q5_0, 4864, 896, 1);
}

#[divan::bench(args = isas())]
fn q4_k_matvec_3072x1024_from_memory(b: Bencher, k: &str) {
    bench_quant_from_memory(b, backend(k).as_ref(), GgmlType::Q4_K, 3072, 1024, 1);
}

#[divan::bench(args = isas())]
fn q4_k_matvec_3072x1024(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q4_K, 3072, 1024, 1);
}

// Prefill matmuls of the K-quants of a Q4_K_M / Q5_K_M file on Qwen3-0.6B's FFN up shape
// (64 tokens through 3072 × 1024), beside Q8_0 on the same shape (`q8_matmul_64x3072x1024`).

#[divan::bench(args = kernels(), sample_count = 10)]
fn q4_k_matmul_64x3072x1024(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q4_K, 3072, 1024, 64);
}

#[divan::bench(args = kernels(), sample_count = 10)]
fn q5_k_matmul_64x3072x1024(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q5_K, 3072, 1024, 64);
}

#[divan::bench(args = kernels(), sample_count = 10)]
fn q3_k_matmul_64x3072x1024(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q3_K, 3072, 1024, 64);
}

#[divan::bench(args = kernels(), sample_count = 10)]
fn q6_k_matmul_64x3072x1024(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q6_K, 3072, 1024, 64);
}

#[divan::bench(args = kernels(), sample_count = 10)]
fn q2_k_matmul_64x3072x1024(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q2_K, 3072, 1024, 64);
}

/// The floor under the three above on a VNNI CPU: the 3072 · 1024 · 64 / 64 = 3,145,728
/// `vpdpbusd` (16 rows × 4 bytes each) that the packed products issue for this shape,
/// alone (`exact_ops = false`), in 16 independent chains, from registers; and with what the
/// Q4_K/Q5_K products add per 64 of them on the same ports for exactness (`true`): 8
/// `vpmulld` (sub-block scales), 4 `vpmaddwd` (mins), 4 `vmulps` (the f32 fold).
#[cfg(target_arch = "x86_64")]
#[divan::bench(args = [false, true], sample_count = 20)]
fn vpdpbusd_alone_64x3072x1024(b: Bencher, exact_ops: bool) {
    if !std::arch::is_x86_feature_detected!("avx512vnni") {
        return;
    }
    let beside = if exact_ops {
        Beside::ExactOps
    } else {
        Beside::Nothing
    };
    b.bench_local(|| {
        // SAFETY: AVX-512 VNNI was detected above.
        unsafe { vpdpbusd_chains(black_box(3072 * 1024 * 64 / 64 / 16), beside) }
    });
}

/// `iters` rounds of 16 independent `vpdpbusd`, each with what `beside` says (independent
/// too), in assembly so nothing is folded away.
///
/// # Safety
/// AVX-512 F, BW and VNNI must be present, and VBMI for [`Beside::FourLookups`];
/// `iters > 0`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn vpdpbusd_chains(iters: usize, beside: Beside) {
    macro_rules! chains {
        ($($extra:literal,)*) => {
            std::arch::asm!(
                "vpxord zmm30, zmm30, zmm30",
                "vpxord zmm31, zmm31, zmm31",
                "2:",
                "vpdpbusd zmm0, zmm30, zmm31",
                "vpdpbusd zmm1, zmm30, zmm31",
                "vpdpbusd zmm2, zmm30, zmm31",
                "vpdpbusd zmm3, zmm30, zmm31",
                "vpdpbusd zmm4, zmm30, zmm31",
                "vpdpbusd zmm5, zmm30, zmm31",
                "vpdpbusd zmm6, zmm30, zmm31",
                "vpdpbusd zmm7, zmm30, zmm31",
                "vpdpbusd zmm8, zmm30, zmm31",
                "vpdpbusd zmm9, zmm30, zmm31",
                "vpdpbusd zmm10, zmm30, zmm31",
                "vpdpbusd zmm11, zmm30, zmm31",
                "vpdpbusd zmm12, zmm30, zmm31",
                "vpdpbusd zmm13, zmm30, zmm31",
                "vpdpbusd zmm14, zmm30, zmm31",
                "vpdpbusd zmm15, zmm30, zmm31",
                $($extra,)*
                "dec {n}",
                "jnz 2b",
                n = inout(reg) iters => _,
                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
                out("zmm30") _, out("zmm31") _,
                options(nomem, nostack),
            )
        };
    }
    // SAFETY: register-only instructions the caller's CPU has; every register written is
    // declared clobbered; `iters > 0`, so the loop ends.
    unsafe {
        match beside {
            Beside::ExactOps => chains!(
                "vpmulld zmm16, zmm30, zmm31",
                "vpmulld zmm17, zmm30, zmm31",
                "vpmaddwd zmm18, zmm30, zmm31",
                "vmulps zmm19, zmm30, zmm31",
            ),
            Beside::Nothing => chains!(),
            Beside::Multiplies => chains!(
                "vpmulld zmm16, zmm30, zmm31",
                "vpmulld zmm17, zmm30, zmm31",
                "vpmulld zmm18, zmm30, zmm31",
                "vpmulld zmm19, zmm30, zmm31",
                "vpmulld zmm16, zmm30, zmm31",
                "vpmulld zmm17, zmm30, zmm31",
                "vpmulld zmm18, zmm30, zmm31",
                "vpmulld zmm19, zmm30, zmm31",
            ),
            Beside::FourMultiplies => chains!(
                "vpmulld zmm16, zmm30, zmm31",
                "vpmulld zmm17, zmm30, zmm31",
                "vpmulld zmm18, zmm30, zmm31",
                "vpmulld zmm19, zmm30, zmm31",
            ),
            Beside::FourLookups => chains!(
                "vpternlogd zmm16, zmm30, zmm31, 0xEA",
                "vpermb zmm16, zmm16, zmm31",
                "vpternlogd zmm17, zmm30, zmm31, 0xEA",
                "vpermb zmm17, zmm17, zmm31",
                "vpternlogd zmm18, zmm30, zmm31, 0xEA",
                "vpermb zmm18, zmm18, zmm31",
                "vpternlogd zmm19, zmm30, zmm31, 0xEA",
                "vpermb zmm19, zmm19, zmm31",
            ),
            Beside::Subtractions => chains!(
                "vpsubd zmm16, zmm16, zmm31",
                "vpsubd zmm17, zmm17, zmm31",
                "vpsubd zmm18, zmm18, zmm31",
                "vpsubd zmm19, zmm19, zmm31",
                "vpsubd zmm16, zmm16, zmm31",
                "vpsubd zmm17, zmm17, zmm31",
                "vpsubd zmm18, zmm18, zmm31",
                "vpsubd zmm19, zmm19, zmm31",
            ),
        }
    }
}

/// What [`vpdpbusd_chains`] issues beside each round of 16 `vpdpbusd`.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
enum Beside {
    Nothing,
    /// What the Q4_K/Q5_K products add for exactness: 2 `vpmulld`, one `vpmaddwd`, one
    /// `vmulps`.
    ExactOps,
    /// Eight `vpmulld`: on Zen 4 they share `vpdpbusd`'s port (the round takes 1.5× as long).
    Multiplies,
    /// Four `vpmulld`: what the Q2_K products issue beside 16 `vpdpbusd` for four tokens.
    FourMultiplies,
    /// Four `vpternlogd` + `vpermb` pairs: what the Q2_K products with scaled codes issue
    /// instead (AVX-512 VBMI). On Zen 4 they cost nothing beside `vpdpbusd`.
    FourLookups,
    /// Eight `vpsubd`: another port (the round takes as long as `vpdpbusd` alone). The VNNI
    /// Q6_K and Q3_K products take their codes' offsets this way, not as pair products.
    Subtractions,
}

/// [`vpdpbusd_alone_64x3072x1024`] with more operations beside every 16 `vpdpbusd`: eight
/// `vpmulld` (the same port on Zen 4) or `vpsubd` (another port); four `vpmulld` or four
/// lookups (see [`Beside`]).
#[cfg(target_arch = "x86_64")]
#[divan::bench(args = ["vpmulld", "vpsubd", "4vpmulld", "4lookups"], sample_count = 20)]
fn vpdpbusd_beside_64x3072x1024(b: Bencher, op: &str) {
    if !std::arch::is_x86_feature_detected!("avx512vnni")
        || (op == "4lookups" && !std::arch::is_x86_feature_detected!("avx512vbmi"))
    {
        return;
    }
    let beside = match op {
        "vpmulld" => Beside::Multiplies,
        "4vpmulld" => Beside::FourMultiplies,
        "4lookups" => Beside::FourLookups,
        _ => Beside::Subtractions,
    };
    b.bench_local(|| {
        // SAFETY: AVX-512 VNNI (and VBMI for the lookups) was detected above.
        unsafe { vpdpbusd_chains(black_box(3072 * 1024 * 64 / 64 / 16), beside) }
    });
}

/// The floor under the AVX2 batched decode products (`q4_k_matmul_8x3072x1024`,
/// `q6_k_matmul_8x3072x1024`): the 3072 · 1024 · 8 / 32 = 786,432 `vpmaddubsw` they issue
/// (8 rows × 4 bytes against one token each), every one with the `vpaddw` that adds it to
/// its line's running sum, plus the `vpmaddwd` by the sub-block scale and its `vpaddd`: one
/// per 8 lines for Q4_K, one per 2 for Q6_K (`i16_lines` in the kernel). In 16 independent
/// chains, from registers: no loads, no unpacking, no fold.
#[cfg(target_arch = "x86_64")]
#[divan::bench(args = ["q4_k", "q6_k"], sample_count = 20)]
fn vpmaddubsw_floor_8x3072x1024(b: Bencher, kind: &str) {
    if !std::arch::is_x86_feature_detected!("avx2") {
        return;
    }
    let q6 = kind == "q6_k";
    b.bench_local(|| {
        // SAFETY: AVX2 was detected above.
        unsafe { vpmaddubsw_chains(black_box(3072 * 1024 * 8 / 32 / 16), q6) }
    });
}

/// `iters` rounds of 16 independent `vpmaddubsw` + `vpaddw` pairs, with 2 (`q6` false) or
/// 8 (`q6` true) `vpmaddwd` + `vpaddd` pairs beside, in assembly so nothing is folded away.
///
/// # Safety
/// AVX2 must be present; `iters > 0`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn vpmaddubsw_chains(iters: usize, q6: bool) {
    macro_rules! chains {
        ($($extra:literal,)*) => {
            std::arch::asm!(
                "vpxor ymm14, ymm14, ymm14",
                "vpxor ymm15, ymm15, ymm15",
                "2:",
                "vpmaddubsw ymm0, ymm14, ymm15", "vpaddw ymm8, ymm8, ymm0",
                "vpmaddubsw ymm1, ymm14, ymm15", "vpaddw ymm9, ymm9, ymm1",
                "vpmaddubsw ymm2, ymm14, ymm15", "vpaddw ymm10, ymm10, ymm2",
                "vpmaddubsw ymm3, ymm14, ymm15", "vpaddw ymm11, ymm11, ymm3",
                "vpmaddubsw ymm4, ymm14, ymm15", "vpaddw ymm8, ymm8, ymm4",
                "vpmaddubsw ymm5, ymm14, ymm15", "vpaddw ymm9, ymm9, ymm5",
                "vpmaddubsw ymm6, ymm14, ymm15", "vpaddw ymm10, ymm10, ymm6",
                "vpmaddubsw ymm7, ymm14, ymm15", "vpaddw ymm11, ymm11, ymm7",
                "vpmaddubsw ymm0, ymm14, ymm15", "vpaddw ymm8, ymm8, ymm0",
                "vpmaddubsw ymm1, ymm14, ymm15", "vpaddw ymm9, ymm9, ymm1",
                "vpmaddubsw ymm2, ymm14, ymm15", "vpaddw ymm10, ymm10, ymm2",
                "vpmaddubsw ymm3, ymm14, ymm15", "vpaddw ymm11, ymm11, ymm3",
                "vpmaddubsw ymm4, ymm14, ymm15", "vpaddw ymm8, ymm8, ymm4",
                "vpmaddubsw ymm5, ymm14, ymm15", "vpaddw ymm9, ymm9, ymm5",
                "vpmaddubsw ymm6, ymm14, ymm15", "vpaddw ymm10, ymm10, ymm6",
                "vpmaddubsw ymm7, ymm14, ymm15", "vpaddw ymm11, ymm11, ymm7",
                $($extra,)*
                "dec {n}",
                "jnz 2b",
                n = inout(reg) iters => _,
                out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _,
                out("ymm4") _, out("ymm5") _, out("ymm6") _, out("ymm7") _,
                out("ymm8") _, out("ymm9") _, out("ymm10") _, out("ymm11") _,
                out("ymm12") _, out("ymm13") _, out("ymm14") _, out("ymm15") _,
                options(nomem, nostack),
            )
        };
    }
    // SAFETY: register-only instructions the caller's CPU has; every register written is
    // declared clobbered; `iters > 0`, so the loop ends.
    unsafe {
        if q6 {
            chains!(
                "vpmaddwd ymm12, ymm14, ymm15",
                "vpaddd ymm13, ymm13, ymm12",
                "vpmaddwd ymm12, ymm14, ymm15",
                "vpaddd ymm13, ymm13, ymm12",
                "vpmaddwd ymm12, ymm14, ymm15",
                "vpaddd ymm13, ymm13, ymm12",
                "vpmaddwd ymm12, ymm14, ymm15",
                "vpaddd ymm13, ymm13, ymm12",
                "vpmaddwd ymm12, ymm14, ymm15",
                "vpaddd ymm13, ymm13, ymm12",
                "vpmaddwd ymm12, ymm14, ymm15",
                "vpaddd ymm13, ymm13, ymm12",
                "vpmaddwd ymm12, ymm14, ymm15",
                "vpaddd ymm13, ymm13, ymm12",
                "vpmaddwd ymm12, ymm14, ymm15",
                "vpaddd ymm13, ymm13, ymm12",
            )
        } else {
            chains!(
                "vpmaddwd ymm12, ymm14, ymm15",
                "vpaddd ymm13, ymm13, ymm12",
                "vpmaddwd ymm12, ymm14, ymm15",
                "vpaddd ymm13, ymm13, ymm12",
            )
        }
    }
}

/// A prefill matmul of the real model's most common type: 64 tokens through 4864 × 896.
#[divan::bench(args = kernels(), sample_count = 10)]
fn q5_0_matmul_64x4864x896(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q5_0, 4864, 896, 64);
}

/// Eight streams' decode step through the same Q5_0 product (the Q5_0 matrices of a
/// Qwen2.5-0.5B Q4_K_M file).
#[divan::bench(args = isas())]
fn q5_0_matmul_8x4864x896(b: Bencher, k: &str) {
    bench_quant(b, backend(k).as_ref(), GgmlType::Q5_0, 4864, 896, 8);
}

/// The Q5_0 and Q4_K decode matvecs on the pool at 1 and 2 threads.
#[divan::bench(args = [1, 2])]
fn pool_q5_0_matvec_4864x896(b: Bencher, threads: usize) {
    let be = PoolBackend::new(SimdBackend::new(ScalarBackend::new()), threads);
    bench_quant(b, &be, GgmlType::Q5_0, 4864, 896, 1);
}

/// Eight streams' Q5_0 decode product on the pool with its weights from memory: at two
/// threads the cores share the memory, as in the service's steps.
#[divan::bench(args = [1, 2])]
fn pool_q5_0_matmul_8x4864x896_from_memory(b: Bencher, threads: usize) {
    let be = PoolBackend::new(SimdBackend::new(ScalarBackend::new()), threads);
    bench_quant_from_memory(b, &be, GgmlType::Q5_0, 4864, 896, 8);
}

#[divan::bench(args = [1, 2])]
fn pool_q4_k_matvec_896x4864(b: Bencher, threads: usize) {
    let be = PoolBackend::new(SimdBackend::new(ScalarBackend::new()), threads);
    bench_quant(b, &be, GgmlType::Q4_K, 896, 4864, 1);
}

/// Eight tokens (eight decoding streams) through Qwen3-0.6B's `ffn_down` shape on the pool:
/// its 64 groups of 16 rows make chunks of 4 groups at two threads, where how evenly the
/// threads finish shows most.
#[divan::bench(args = [1, 2])]
fn pool_q4_k_matmul_8x1024x3072(b: Bencher, threads: usize) {
    let be = PoolBackend::new(SimdBackend::new(ScalarBackend::new()), threads);
    bench_quant(b, &be, GgmlType::Q4_K, 1024, 3072, 8);
}

/// The decode matvec on the pool at 1 and 2 threads.
#[divan::bench(args = [1, 2])]
fn pool_q8_matvec_3072x1024(b: Bencher, threads: usize) {
    let be = PoolBackend::new(SimdBackend::new(ScalarBackend::new()), threads);
    bench_matmul(b, &be, 3072, 1024, 1);
}

/// Publishing an empty job to the pool and waiting for it.
#[divan::bench(args = [2, 4])]
fn pool_dispatch(b: Bencher, threads: usize) {
    let pool = ThreadPool::new(threads);
    b.bench_local(|| pool.run(threads * 2, &|i| _ = black_box(i)));
}

#[divan::bench(args = kernels())]
fn rms_norm_1024(b: Bencher, k: &str) {
    let be = backend(k);
    let mut x = values(1024, 1);
    let g = values(1024, 2);
    b.bench_local(|| be.rms_norm(black_box(&mut x), &g, 1e-6));
}

#[divan::bench(args = kernels())]
fn silu_mul_3072(b: Bencher, k: &str) {
    let be = backend(k);
    let x = values(3072, 1);
    let up = values(3072, 2);
    let mut g = x.clone();
    b.bench_local(|| {
        g.copy_from_slice(&x);
        be.silu_mul(black_box(&mut g), &up)
    });
}

#[divan::bench(args = kernels())]
fn rope_16x128(b: Bencher, k: &str) {
    let be = backend(k);
    let inv: Vec<f32> = (0..64).map(|i| 1e6f32.powf(-(i as f32) / 64.0)).collect();
    let mut x = values(16 * 128, 1);
    let mut pos = 0;
    b.bench_local(|| {
        // A new position each call, as in decode (the angle table is per position).
        pos += 1;
        be.rope(black_box(&mut x), 16, 128, pos, &inv)
    });
}

/// Query heads, KV heads and head size of Qwen3-0.6B (two query rows to each key).
const QWEN3_HEADS: (usize, usize, usize) = (16, 8, 128);

/// Those of Qwen2.5-0.5B, the real test checkpoint (seven query rows to each key, half the
/// head size).
const QWEN2_HEADS: (usize, usize, usize) = (14, 2, 64);

/// An attention call with `heads` (query heads, KV heads, head size): `n` tokens after
/// `pos0` cached positions, in caches of `capacity` positions.
fn attention_shape(
    (n_heads, n_kv_heads, head_dim): (usize, usize, usize),
    n: usize,
    pos0: usize,
    capacity: usize,
) -> AttentionShape {
    AttentionShape {
        n_tokens: n,
        pos0,
        n_heads,
        n_kv_heads,
        head_dim,
        capacity,
        scale: 1.0 / (head_dim as f32).sqrt(),
    }
}

/// One layer's attention with Qwen3-0.6B's heads ([`QWEN3_HEADS`]): `n` tokens after
/// `pos0` cached positions, the keys and values stored in a KV cache of type `kv`, timed
/// on `k`.
fn bench_attention(b: Bencher, k: &str, n: usize, pos0: usize, kv: KvType) {
    bench_attention_shape(b, k, attention_shape(QWEN3_HEADS, n, pos0, pos0 + n), kv);
}

/// One decode step's attention for one layer of Qwen2.5-0.5B at 1024 positions, F16 cache.
#[divan::bench(args = attention_kernels())]
fn attention_decode_ctx1024_f16_qwen2(b: Bencher, k: &str) {
    bench_attention_shape(
        b,
        k,
        attention_shape(QWEN2_HEADS, 1, 1023, 1024),
        KvType::F16,
    );
}

/// A 200-token prompt's attention for one layer of Qwen2.5-0.5B, F16 cache.
#[divan::bench(args = attention_kernels(), sample_count = 20)]
fn attention_prompt_200_f16_qwen2(b: Bencher, k: &str) {
    bench_attention_shape(b, k, attention_shape(QWEN2_HEADS, 200, 0, 200), KvType::F16);
}

/// The last 256-token chunk of a 1,024-token prompt, one layer of Qwen2.5-0.5B, F16 cache.
#[divan::bench(args = attention_kernels(), sample_count = 20)]
fn attention_prompt_256_at_768_f16_qwen2(b: Bencher, k: &str) {
    bench_attention_shape(
        b,
        k,
        attention_shape(QWEN2_HEADS, 256, 768, 1024),
        KvType::F16,
    );
}

/// One attention call of shape `att`, the keys and values of its positions stored in a KV
/// cache of type `kv` and `att.capacity` positions, timed on `k`.
fn bench_attention_shape(b: Bencher, k: &str, att: AttentionShape, kv: KvType) {
    let be = backend(k);
    let (n, ctx) = (att.n_tokens, att.pos0 + att.n_tokens);
    let (n_heads, n_kv, hd) = (att.n_heads, att.n_kv_heads, att.head_dim);
    let q = values(n * n_heads * hd, 1);
    let shape = KvShape {
        n_layers: 1,
        n_kv_heads: n_kv,
        head_dim: hd,
        types: (kv, kv),
    };
    let mut cache = KvCache::with_shape(shape, att.capacity);
    cache.store(
        0,
        0,
        &values(ctx * n_kv * hd, 2),
        &values(ctx * n_kv * hd, 3),
    );
    let mut out = vec![0.0f32; n * n_heads * hd];
    let kv = cache.layer(0);
    b.bench_local(|| be.attention(&att, black_box(&q), kv, &mut out));
}

/// One decode step's attention for one layer at 512 positions of an F32 cache.
#[divan::bench(args = attention_kernels())]
fn attention_decode_ctx512(b: Bencher, k: &str) {
    bench_attention(b, k, 1, 511, KvType::F32);
}

/// One decode step's attention for one layer at 2048 positions of an F16 cache (the default
/// for quantized models).
#[divan::bench(args = attention_kernels())]
fn attention_decode_ctx2048_f16(b: Bencher, k: &str) {
    bench_attention(b, k, 1, 2047, KvType::F16);
}

/// A prompt's attention for one layer: 64 tokens after 2048 cached positions, with an F16
/// cache.
#[divan::bench(args = attention_kernels(), sample_count = 20)]
fn attention_prompt_64_at_2048_f16(b: Bencher, k: &str) {
    bench_attention(b, k, 64, 2048, KvType::F16);
}

/// [`attention_decode_ctx2048_f16`] on a Q8_0 cache, read as stored.
#[divan::bench(args = attention_kernels())]
fn attention_decode_ctx2048_q8_0(b: Bencher, k: &str) {
    bench_attention(b, k, 1, 2047, KvType::Q8_0);
}

/// [`attention_prompt_64_at_2048_f16`] on an F32 cache.
#[divan::bench(args = attention_kernels(), sample_count = 20)]
fn attention_prompt_64_at_2048_f32(b: Bencher, k: &str) {
    bench_attention(b, k, 64, 2048, KvType::F32);
}

/// [`attention_prompt_64_at_2048_f16`] on a Q8_0 cache, each chunk widened to f32 once.
#[divan::bench(args = attention_kernels(), sample_count = 20)]
fn attention_prompt_64_at_2048_q8_0(b: Bencher, k: &str) {
    bench_attention(b, k, 64, 2048, KvType::Q8_0);
}

/// Eight decoding sequences' attention over all 28 layers at `D` cached positions of an F16
/// cache (Qwen3-0.6B's heads), the caches out of every CPU cache first as a decode step's
/// weights leave them: what attention costs a step of eight streams.
#[divan::bench(consts = [32, 256], args = attention_kernels(), sample_count = 20)]
fn attention_decode_8_streams_28_layers_f16<const D: usize>(b: Bencher, k: &str) {
    let be = backend(k);
    let (layers, pos0, ctx) = (28, D - 1, D + 1);
    let att = attention_shape(QWEN3_HEADS, 1, pos0, ctx);
    let (n_heads, n_kv, hd) = (att.n_heads, att.n_kv_heads, att.head_dim);
    let shape = KvShape {
        n_layers: layers,
        n_kv_heads: n_kv,
        head_dim: hd,
        types: (KvType::F16, KvType::F16),
    };
    let caches: Vec<KvCache> = (0..8)
        .map(|s| {
            let mut c = KvCache::with_shape(shape, ctx);
            for l in 0..layers {
                let seed = (s * layers + l) as u32;
                c.store(
                    l,
                    0,
                    &values(D * n_kv * hd, 2 * seed + 7),
                    &values(D * n_kv * hd, 2 * seed + 8),
                );
            }
            c
        })
        .collect();
    let q = values(n_heads * hd, 1);
    let mut out = vec![0.0f32; n_heads * hd];
    let mut flush = vec![0u8; 256 << 20];
    b.with_inputs(|| {
        for (i, x) in flush.iter_mut().enumerate().step_by(64) {
            *x = x.wrapping_add(i as u8);
        }
    })
    .bench_local_values(|()| {
        for c in &caches {
            for l in 0..layers {
                be.attention(&att, black_box(&q), c.layer(l), &mut out);
            }
        }
    });
}

/// What choosing one token costs on a row of Qwen's 151,936 logits, per sampling setting
/// (llama.cpp's defaults: temperature 0.8, top-k 40, top-p 0.95, min-p 0.05; greedy; the
/// defaults with a repetition penalty over 64 tokens; top-k off with top-p 1 and min-p 0,
/// which keeps every token), and the finite-logits check every row gets before it. Paid
/// on the engine thread for every stream, every step.
#[divan::bench(
    args = ["defaults", "greedy", "penalty", "top_k_off", "check"],
    sample_count = 50
)]
fn sample_151936(b: Bencher, setting: &str) {
    use inferno::sampling::{check_logits, Sampler, SamplingParams};
    let vocab = 151_936;
    let logits = values(vocab, 3);
    let history: Vec<u32> = (0..64).map(|i| (i * 2_371) % vocab as u32).collect();
    let params = match setting {
        "greedy" => SamplingParams::greedy(),
        "penalty" => SamplingParams {
            repeat_penalty: 1.1,
            seed: Some(1),
            ..SamplingParams::default()
        },
        "top_k_off" => SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(1),
            ..SamplingParams::default()
        },
        _ => SamplingParams {
            seed: Some(1),
            ..SamplingParams::default()
        },
    };
    let mut sampler = Sampler::new(params, vocab).unwrap();
    if setting == "check" {
        b.bench_local(|| check_logits(black_box(&logits)).is_ok());
    } else {
        b.bench_local(|| sampler.sample(black_box(&logits), &history));
    }
}
