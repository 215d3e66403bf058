//! The kernels of the quantized weight types multiplied in their stored layout (Q4_0, Q4_1,
//! Q5_0, Q5_1, unpacked Q8_0 and Q2_K–Q6_K):
//! - on every instruction set this CPU has, each type's dot kernel equals `tensor::vec_dot`
//!   bit for bit: on random blocks, extreme f16 scales, all-zero blocks, the largest and
//!   smallest codes and the extremes of the K-quants' sub-block scales; against activations
//!   quantized from random values (with extreme ranges) and against arbitrary activation
//!   bytes; and on rows cut short, which both cut to whole blocks;
//! - matmuls of each type with 1, 2, 3, 5 and 33 tokens give the same bytes on `scalar`,
//!   `simd` (every instruction set), `pool` at 1, 2, 3 and 4 threads and `parallel`, on the
//!   stored layout and on each backend's prepared (packed) one;
//! - the packed layouts `prepare` makes (Q8_0; Q4_0, Q5_0, Q4_1, Q5_1 and Q2_K–Q6_K on x86
//!   and NEON) give the scalar bytes for every token tile size, partial row groups and
//!   thread count, and so do row lookups in them;
//! - a decode matvec of each type allocates nothing on the calling thread once warm.

use half::f16;
use inferno::backend::cpu::simd::{Isa, Kernels, PackedK, SimdBackend};
use inferno::backend::{Backend, MatmulJob, ParallelBackend, PoolBackend, ScalarBackend};
use inferno::tensor::{self, GgmlType, Matrix, TensorBytes};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::ops::Range;

// ---------------------------------------------------------------------------------------
// Allocation counting (for the decode test): only on threads that ask for it.
// ---------------------------------------------------------------------------------------

mod alloc_counter;

#[global_allocator]
static GLOBAL: alloc_counter::Counting = alloc_counter::Counting;

// ---------------------------------------------------------------------------------------
// Random blocks
// ---------------------------------------------------------------------------------------

use GgmlType::*;

const TYPES: [GgmlType; 10] = [Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K];

/// Byte offsets of a block's f16 fields (d, and m / dmin where the type has one).
fn f16_fields(t: GgmlType) -> &'static [usize] {
    match t {
        Q4_0 | Q5_0 | Q8_0 => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => unreachable!(),
    }
}

/// Bytes of a K-quant block holding its sub-block scales (and mins).
fn scale_bytes(t: GgmlType) -> Range<usize> {
    match t {
        Q2_K => 0..16,
        Q3_K => 96..108,
        Q4_K | Q5_K => 4..16,
        Q6_K => 192..208,
        _ => 0..0,
    }
}

/// Whether byte `i` of a block is a quant byte (not an f16 field, not a sub-block scale).
fn is_quant_byte(t: GgmlType, i: usize) -> bool {
    !scale_bytes(t).contains(&i) && !f16_fields(t).iter().any(|&f| i == f || i == f + 1)
}

fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_bits().to_le_bytes()
}

/// A finite f16 scale: often an extreme (largest, smallest subnormal and normal, signed
/// zeros), otherwise a moderate random value.
fn scale(r: &mut ChaCha8Rng, extreme: bool) -> f32 {
    const EXTREMES: [f32; 8] = [
        65504.0,
        -65504.0,
        5.960_464_5e-8, // 2⁻²⁴, the smallest subnormal
        -5.960_464_5e-8,
        6.103_515_6e-5, // the smallest normal
        0.0,
        -0.0,
        1.0,
    ];
    if extreme && r.random_bool(0.6) {
        EXTREMES[r.random_range(0..EXTREMES.len())]
    } else {
        let v: f32 = r.random_range(1e-3..2.0);
        if r.random_bool(0.5) {
            -v
        } else {
            v
        }
    }
}

/// One block of type `t`, shaped by `variant`: random bytes; the largest / smallest codes
/// (0xff, 0x00, and 0x7f / 0x80 for the signed Q8_0); an all-zero block; sub-block scale
/// bytes all set or all clear (the 6-bit extremes 63 and 0, and the mins with them).
fn block(r: &mut ChaCha8Rng, t: GgmlType, variant: usize, extreme: bool) -> Vec<u8> {
    let mut b: Vec<u8> = (0..t.type_size()).map(|_| r.random()).collect();
    let fill_quants = |b: &mut Vec<u8>, v: u8| {
        for (i, x) in b.iter_mut().enumerate() {
            if is_quant_byte(t, i) {
                *x = v;
            }
        }
    };
    match variant % 10 {
        1 => fill_quants(&mut b, 0xff),
        2 => fill_quants(&mut b, 0x00),
        3 => fill_quants(&mut b, 0x80),
        4 => fill_quants(&mut b, 0x7f),
        5 => return vec![0; t.type_size()],
        6 => b[scale_bytes(t)].fill(0xff),
        7 => b[scale_bytes(t)].fill(0x00),
        8 => {
            b[scale_bytes(t)].fill(0xff);
            fill_quants(&mut b, 0xff);
        }
        _ => {}
    }
    for &f in f16_fields(t) {
        b[f..f + 2].copy_from_slice(&f16_bytes(scale(r, extreme)));
    }
    b
}

fn row(r: &mut ChaCha8Rng, t: GgmlType, blocks: usize, extreme: bool) -> Vec<u8> {
    (0..blocks)
        .flat_map(|_| {
            let v = r.random_range(0..10);
            block(r, t, v, extreme)
        })
        .collect()
}

/// `n` activation values in one of several ranges: ordinary, huge, tiny, all zero, or zero
/// with one spike.
fn activations(r: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    let kind = r.random_range(0..6);
    let mag: f32 = match kind {
        1 => 1e4,
        2 => 1e-30,
        _ => 1.0,
    };
    let mut x: Vec<f32> = (0..n).map(|_| r.random_range(-1.0f32..1.0) * mag).collect();
    match kind {
        3 => x.fill(0.0),
        4 => {
            x.fill(0.0);
            let i = r.random_range(0..n);
            x[i] = -3.5;
        }
        _ => {}
    }
    x
}

/// Arbitrary activation bytes of type `act` for `n` values, with finite scales (the sums of
/// Q8_1 and Q8_K are left arbitrary too: the kernels must read them as the scalar code does).
fn raw_activation(r: &mut ChaCha8Rng, act: GgmlType, n: usize) -> Vec<u8> {
    let size = act.row_size(n as u64).unwrap() as usize;
    let mut b: Vec<u8> = (0..size).map(|_| r.random()).collect();
    for blk in b.chunks_exact_mut(act.type_size()) {
        match act {
            Q8_0 => blk[..2].copy_from_slice(&f16_bytes(scale(r, true))),
            Q8_1 => {
                blk[..2].copy_from_slice(&f16_bytes(scale(r, true)));
                blk[2..4].copy_from_slice(&f16_bytes(scale(r, true)));
            }
            Q8_K => {
                let d = scale(r, true) * r.random_range(1e-6f32..1e6);
                blk[..4].copy_from_slice(&d.to_le_bytes());
            }
            _ => unreachable!(),
        }
    }
    b
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

// ---------------------------------------------------------------------------------------
// Dot kernels
// ---------------------------------------------------------------------------------------

#[test]
fn every_type_has_a_kernel_and_the_scheme_of_the_scalar_code() {
    for isa in Isa::available() {
        let k = Kernels::new(isa);
        for t in TYPES {
            let ours = k
                .quant_dot(t)
                .unwrap_or_else(|| panic!("{isa:?}: no kernel for {t}"));
            let reference = tensor::quant_dot(t).unwrap();
            assert_eq!(ours.weight, t);
            assert_eq!(ours.activation, reference.activation, "{t}");
        }
        for t in [F32, F16, BF16, Q8_K, IQ4_XS] {
            assert!(
                k.quant_dot(t).is_none(),
                "{isa:?}: {t} has no integer product"
            );
        }
    }
}

/// Each instruction set's activation quantizer writes the scalar quantizer's bytes: on the
/// ranges of `activations`, on rows whose largest magnitude occurs twice with both signs (the
/// first one sets the scale's sign), on values that land exactly on rounding ties, on rows
/// holding NaN and infinities, and on blocks of NaN and of signed zeros.
#[test]
fn activation_quantizers_write_the_scalar_bytes_on_every_isa() {
    let mut r = ChaCha8Rng::seed_from_u64(0xacc);
    let n = 512;
    let mut inputs: Vec<Vec<f32>> = (0..40).map(|_| activations(&mut r, n)).collect();
    let mut twin = activations(&mut r, n);
    twin[300] = 7.0;
    twin[301] = -7.0;
    inputs.push(twin.clone());
    twin[300] = -7.0;
    twin[301] = 7.0;
    inputs.push(twin);
    // With max = -127 the scale is exactly 1, so halves are ties (0.5, 1.5, 2.5, ...).
    inputs.push(
        (0..n)
            .map(|i| {
                if i == 0 {
                    -127.0
                } else {
                    (i % 200) as f32 * 0.5 - 50.0
                }
            })
            .collect(),
    );
    for special in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut x = activations(&mut r, n);
        x[17] = special;
        x[400] = special;
        inputs.push(x);
    }
    // Both infinities in one block (in either order), a block of NaN beside one of signed
    // zeros, and a block whose largest magnitude is negative.
    for (a, b) in [
        (f32::INFINITY, f32::NEG_INFINITY),
        (f32::NEG_INFINITY, f32::INFINITY),
    ] {
        let mut x = activations(&mut r, n);
        x[17] = a;
        x[200] = b;
        inputs.push(x);
    }
    let mut x = vec![f32::NAN; n];
    x[256..]
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = if i % 2 == 0 { -0.0 } else { 0.0 });
    inputs.push(x);
    let mut x = activations(&mut r, n);
    x[3] = -1e3;
    inputs.push(x);
    for isa in Isa::available() {
        let k = Kernels::new(isa);
        for t in TYPES {
            let (ours, scalar) = (k.quant_dot(t).unwrap(), tensor::quant_dot(t).unwrap());
            let size = scalar.activation.row_size(n as u64).unwrap() as usize;
            for (i, x) in inputs.iter().enumerate() {
                let (mut a, mut b) = (vec![0u8; size], vec![0u8; size]);
                (ours.quantize)(x, &mut a);
                (scalar.quantize)(x, &mut b);
                assert_eq!(a, b, "{isa:?} {t} ({}) input {i}", scalar.activation);
            }
        }
    }
}

#[test]
fn dot_kernels_are_bit_identical_to_vec_dot_on_every_isa() {
    let mut r = ChaCha8Rng::seed_from_u64(0x5eed);
    for isa in Isa::available() {
        let k = Kernels::new(isa);
        for t in TYPES {
            let kd = k.quant_dot(t).unwrap();
            let scalar = tensor::quant_dot(t).unwrap();
            let act = kd.activation;
            // Enough 32-value blocks to cover the kernels' four-block steps and their tails.
            let max_blocks = if t.block_size() == 256 { 3 } else { 9 };
            let mut checked = 0;
            for blocks in 1..=max_blocks {
                for trial in 0..24 {
                    let n = blocks * t.block_size();
                    let w = row(&mut r, t, blocks, true);
                    let xq = if trial % 3 == 2 {
                        raw_activation(&mut r, act, n)
                    } else {
                        let x = activations(&mut r, n);
                        let mut q = vec![0u8; act.row_size(n as u64).unwrap() as usize];
                        tensor::quantize_activation(act, &x, &mut q).unwrap();
                        q
                    };
                    let want = tensor::vec_dot(t, &w, &xq).unwrap();
                    let got = (kd.dot)(&w, &xq);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{isa:?} {t}, {blocks} blocks, trial {trial}: {got} vs {want}"
                    );
                    // Rows cut short are cut to whole blocks by both.
                    let cut = &w[..w.len() - 1];
                    let (got, want) = ((kd.dot)(cut, &xq), (scalar.dot)(cut, &xq));
                    assert_eq!(got.to_bits(), want.to_bits(), "{isa:?} {t}: cut row");
                    let cut = &xq[..xq.len() - 1];
                    let (got, want) = ((kd.dot)(&w, cut), (scalar.dot)(&w, cut));
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{isa:?} {t}: cut activations"
                    );
                    checked += 1;
                }
            }
            assert!(checked > 0);
        }
    }
}

#[test]
fn dot_kernels_on_extreme_blocks_against_extreme_activations() {
    // Every block variant against every activation kind, one block each, so each pairing
    // is seen at least once whatever the random draws.
    let mut r = ChaCha8Rng::seed_from_u64(7);
    for isa in Isa::available() {
        let k = Kernels::new(isa);
        for t in TYPES {
            let kd = k.quant_dot(t).unwrap();
            let n = t.block_size();
            for variant in 0..10 {
                for kind in 0..8 {
                    let w = block(&mut r, t, variant, kind % 2 == 0);
                    let xq = if kind == 7 {
                        raw_activation(&mut r, kd.activation, n)
                    } else {
                        let x = activations(&mut r, n);
                        let mut q = vec![0u8; kd.activation.row_size(n as u64).unwrap() as usize];
                        tensor::quantize_activation(kd.activation, &x, &mut q).unwrap();
                        q
                    };
                    let want = tensor::vec_dot(t, &w, &xq).unwrap();
                    let got = (kd.dot)(&w, &xq);
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{isa:?} {t} variant {variant} kind {kind}: {got} vs {want}"
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Matrix products on every backend
// ---------------------------------------------------------------------------------------

fn matrix(t: GgmlType, rows: usize, cols: usize, data: Vec<u8>) -> Matrix {
    Matrix {
        name: "w".into(),
        dtype: t,
        rows,
        cols,
        data: TensorBytes::from_vec(data),
        prepared: None,
    }
}

fn random_matrix(r: &mut ChaCha8Rng, t: GgmlType, rows: usize, cols: usize) -> Matrix {
    let blocks = cols / t.block_size();
    let data: Vec<u8> = (0..rows).flat_map(|_| row(r, t, blocks, false)).collect();
    matrix(t, rows, cols, data)
}

fn matmul(be: &dyn Backend, w: &Matrix, x: &[f32], n: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; n * w.rows];
    be.matmul(w, x, n, &mut out);
    out
}

fn simd(isa: Isa) -> SimdBackend<ScalarBackend> {
    SimdBackend::with_isa(ScalarBackend::new(), isa)
}

#[test]
fn matmuls_are_byte_identical_on_every_backend_and_thread_count() {
    let mut r = ChaCha8Rng::seed_from_u64(42);
    // 83 rows: six 16-row groups (enough for `pool` to split), the last one partial.
    let (rows, cols) = (83, 512);
    let mut backends: Vec<(String, Box<dyn Backend>)> = Vec::new();
    for isa in Isa::available() {
        backends.push((format!("simd/{isa:?}"), Box::new(simd(isa))));
        for threads in 1..=4 {
            backends.push((
                format!("pool/{isa:?}/{threads}"),
                Box::new(PoolBackend::new(simd(isa), threads)),
            ));
        }
        backends.push((
            format!("parallel/{isa:?}/3"),
            Box::new(ParallelBackend::new(simd(isa), 3)),
        ));
    }
    for t in TYPES {
        let w = random_matrix(&mut r, t, rows, cols);
        let prepared: std::collections::HashMap<&String, Matrix> = backends
            .iter()
            .map(|(name, be)| {
                let mut p = w.clone();
                be.prepare(&mut p);
                if PackedK::isa_has_kernels(isa_of(name), t) {
                    assert!(PackedK::of(&p).is_some(), "{name} left {t} unpacked");
                }
                (name, p)
            })
            .collect();
        // 33 tokens × 512 values is large enough for `pool` to quantize on several threads;
        // 1, 2, 3 and 5 tokens reach every token tile of the packed kernels.
        for n in [1, 2, 3, 5, 33] {
            let x: Vec<f32> = (0..n * cols)
                .map(|_| r.random_range(-2.0f32..2.0))
                .collect();
            let want = matmul(&ScalarBackend::new(), &w, &x, n);
            // The scalar backend's outputs are vec_dot's.
            let act = tensor::activation_type(t).unwrap();
            let qrow = act.row_size(cols as u64).unwrap() as usize;
            let mut q = vec![0u8; qrow];
            tensor::quantize_activation(act, &x[(n - 1) * cols..], &mut q).unwrap();
            let last = tensor::vec_dot(t, w.row(rows - 1), &q).unwrap();
            assert_eq!(want[n * rows - 1].to_bits(), last.to_bits(), "{t}");
            for (name, be) in &backends {
                let got = matmul(be.as_ref(), &w, &x, n);
                assert_eq!(bits(&got), bits(&want), "{name}: {t}, {n} tokens");
                // And with the backend's own layout (packed groups of rows), as at load.
                let got = matmul(be.as_ref(), &prepared[name], &x, n);
                assert_eq!(bits(&got), bits(&want), "{name} prepared: {t}, {n} tokens");
            }
        }
    }
}

/// The instruction set a backend of these tests was built on, from its name.
fn isa_of(name: &str) -> Isa {
    Isa::available()
        .into_iter()
        .find(|i| name.contains(&format!("/{i:?}")))
        .unwrap_or_else(|| panic!("no ISA in {name}"))
}

/// Bits, with every NaN the same (NaN payloads are not specified).
fn bits_nan(v: &[f32]) -> Vec<u32> {
    v.iter()
        .map(|x| if x.is_nan() { u32::MAX } else { x.to_bits() })
        .collect()
}

/// The packed layouts `prepare` makes (Q8_0 everywhere, Q4_0, Q5_0, Q4_1 and Q5_1 on x86
/// and NEON) against the scalar definitions: every token tile size and remainder (1–10
/// tokens, 16, 17, 33), row counts that fill no group, exactly one, one and a bit and several
/// with a partial last one, row lengths of one to sixteen blocks and 34 (two slices of the
/// codes that products of several tokens unpack once per group), extreme f16 scales, on
/// every instruction set, `pool` at 1–4 threads and `parallel`. Row lookups (a tied
/// embedding) read the packed form and must give `scalar`'s values too.
#[test]
fn packed_products_and_row_lookups_are_byte_identical_to_scalar() {
    use inferno::backend::cpu::simd::{PackedLegacy, PackedQ8};
    let mut r = ChaCha8Rng::seed_from_u64(7);
    let scalar = ScalarBackend::new();
    let mut backends: Vec<(String, Box<dyn Backend>)> = Vec::new();
    for isa in Isa::available() {
        backends.push((format!("simd/{isa:?}"), Box::new(simd(isa))));
        for threads in 1..=4 {
            backends.push((
                format!("pool/{isa:?}/{threads}"),
                Box::new(PoolBackend::new(simd(isa), threads)),
            ));
        }
        backends.push((
            format!("parallel/{isa:?}/3"),
            Box::new(ParallelBackend::new(simd(isa), 3)),
        ));
    }
    let mut packed_legacy = std::collections::HashMap::new();
    for t in [Q4_0, Q5_0, Q4_1, Q5_1, Q8_0] {
        for (rows, cols) in [
            (1, 32),
            (15, 96),
            (16, 512),
            (17, 64),
            (83, 512),
            (17, 1088),
        ] {
            let blocks = cols / 32;
            let data: Vec<u8> = (0..rows)
                .flat_map(|i| row(&mut r, t, blocks, i % 3 == 1))
                .collect();
            let w = matrix(t, rows, cols, data);
            let mut prepared = Vec::new();
            for (name, be) in &backends {
                let mut wp = w.clone();
                be.prepare(&mut wp);
                if t == Q8_0 {
                    assert!(PackedQ8::of(&wp).is_some(), "{name}: {t} not packed");
                }
                *packed_legacy.entry(t).or_insert(0) += PackedLegacy::of(&wp).is_some() as usize;
                prepared.push(wp);
            }
            for n in (1..=10).chain([16, 17, 33]) {
                let x: Vec<f32> = (0..n * cols)
                    .map(|_| r.random_range(-2.0f32..2.0))
                    .collect();
                let want = matmul(&scalar, &w, &x, n);
                for ((name, be), wp) in backends.iter().zip(&prepared) {
                    let got = matmul(be.as_ref(), wp, &x, n);
                    assert_eq!(
                        bits_nan(&got),
                        bits_nan(&want),
                        "{name}: {t} {rows}x{cols}, {n} tokens"
                    );
                }
            }
            for i in 0..rows {
                let mut want = vec![0.0f32; cols];
                scalar.get_row(&w, i, &mut want);
                for ((name, be), wp) in backends.iter().zip(&prepared) {
                    let mut got = vec![f32::NAN; cols];
                    be.get_row(wp, i, &mut got);
                    assert_eq!(bits(&got), bits(&want), "{name}: {t} row {i}");
                }
            }
        }
    }
    // Each legacy type must have taken the packed path (else this tested nothing new), on
    // every vector instruction set the CPU has.
    let vector = Isa::available()
        .into_iter()
        .filter(|&i| PackedLegacy::supported_on(i))
        .count();
    for t in [Q4_0, Q5_0, Q4_1, Q5_1] {
        // Per vector ISA: simd, pool at 1–4 threads and parallel, for each of 6 shapes.
        assert_eq!(
            packed_legacy.get(&t).copied().unwrap_or(0),
            vector * 6 * 6,
            "packed {t} matrices"
        );
    }
    assert_eq!(packed_legacy.get(&Q8_0), Some(&0));
}

/// The packed K-quant layouts ([`PackedK`], Q2_K–Q6_K) against the scalar definitions: every
/// token tile size and remainder (1–10 tokens; 17 and 23, where prompts unpack each group
/// once), row counts that fill no group, exactly one, one and a bit and several with a
/// partial last one, one to three super-blocks a row and six (two slices of unpacked codes),
/// extreme f16 scales and the extreme codes and sub-block scales of `block`, on every
/// instruction set, `pool` at 1–4 threads and `parallel`; row lookups in the packed form
/// too. Where an instruction set has kernels for a type, `prepare` must have packed it.
#[test]
fn packed_k_products_and_row_lookups_are_byte_identical_to_scalar() {
    let mut r = ChaCha8Rng::seed_from_u64(11);
    let scalar = ScalarBackend::new();
    let mut backends: Vec<(String, Isa, Box<dyn Backend>)> = Vec::new();
    for isa in Isa::available() {
        backends.push((format!("simd/{isa:?}"), isa, Box::new(simd(isa))));
        for threads in 1..=4 {
            backends.push((
                format!("pool/{isa:?}/{threads}"),
                isa,
                Box::new(PoolBackend::new(simd(isa), threads)),
            ));
        }
        backends.push((
            format!("parallel/{isa:?}/3"),
            isa,
            Box::new(ParallelBackend::new(simd(isa), 3)),
        ));
    }
    let mut packed = 0;
    for t in [Q2_K, Q3_K, Q4_K, Q5_K, Q6_K] {
        for (rows, cols) in [
            (1, 256),
            (15, 512),
            (16, 256),
            (17, 768),
            (83, 512),
            (20, 1536),
        ] {
            let blocks = cols / 256;
            let data: Vec<u8> = (0..rows)
                .flat_map(|i| row(&mut r, t, blocks, i % 3 == 1))
                .collect();
            let w = matrix(t, rows, cols, data);
            let mut prepared = Vec::new();
            for (name, isa, be) in &backends {
                let mut wp = w.clone();
                be.prepare(&mut wp);
                let is_packed = PackedK::of(&wp).is_some();
                assert_eq!(
                    is_packed,
                    PackedK::isa_has_kernels(*isa, t),
                    "{name}: {t} packed {is_packed}"
                );
                packed += is_packed as usize;
                prepared.push(wp);
            }
            for n in (1..=10).chain([17, 23]) {
                let x = activations(&mut r, n * cols);
                let want = matmul(&scalar, &w, &x, n);
                for ((name, _, be), wp) in backends.iter().zip(&prepared) {
                    let got = matmul(be.as_ref(), wp, &x, n);
                    assert_eq!(
                        bits_nan(&got),
                        bits_nan(&want),
                        "{name}: {t} {rows}x{cols}, {n} tokens"
                    );
                }
            }
            for i in 0..rows {
                let mut want = vec![0.0f32; cols];
                scalar.get_row(&w, i, &mut want);
                for ((name, _, be), wp) in backends.iter().zip(&prepared) {
                    let mut got = vec![f32::NAN; cols];
                    be.get_row(wp, i, &mut got);
                    assert_eq!(bits_nan(&got), bits_nan(&want), "{name}: {t} row {i}");
                }
            }
        }
    }
    // Off the portable kernels the packed path must have been taken (else this tested
    // nothing new).
    let vector = Isa::available().iter().any(|&i| i != Isa::Portable);
    assert_eq!(packed > 0, vector, "{packed} packed matrices");
}

/// The packed K-quant products at their integer extremes: every code at its largest (all
/// quant bytes 0xff, sub-block scales all set) against activations that all quantize to the
/// same largest magnitude (-127, or 127), so every partial sum the kernels form reaches its
/// bound. Kernels that add several lines' 16-bit products before scaling them (AVX2) would
/// wrap if they added one line too many; the outputs must still be the scalar bytes, for
/// decode and prompt token counts.
#[test]
fn packed_k_products_hold_the_largest_partial_sums() {
    assert_largest_partial_sums(&[Q2_K, Q3_K, Q4_K, Q5_K, Q6_K], 17);
}

/// As [`packed_k_products_hold_the_largest_partial_sums`], for the packed legacy types
/// (Q4_0, Q5_0, Q4_1, Q5_1: all codes and fifth bits set), whose AVX2 kernels add 16-bit
/// products over a block (four-bit codes) or half of one (five-bit codes).
#[test]
fn packed_legacy_products_hold_the_largest_partial_sums() {
    assert_largest_partial_sums(&[Q4_0, Q5_0, Q4_1, Q5_1], 19);
}

fn assert_largest_partial_sums(types: &[GgmlType], seed: u64) {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    let (rows, cols) = (32, 512);
    let scalar = ScalarBackend::new();
    for &t in types {
        let data: Vec<u8> = (0..rows * cols / t.block_size())
            .flat_map(|_| {
                let mut b = block(&mut r, t, 8, false);
                // Positive block scales, so that no sum cancels in the f32 fold either.
                for &f in f16_fields(t) {
                    b[f..f + 2].copy_from_slice(&f16_bytes(0.5));
                }
                b
            })
            .collect();
        let w = matrix(t, rows, cols, data);
        for isa in Isa::available() {
            for be in [
                Box::new(simd(isa)) as Box<dyn Backend>,
                Box::new(PoolBackend::new(simd(isa), 2)),
            ] {
                let mut wp = w.clone();
                be.prepare(&mut wp);
                for n in [1, 2, 3, 4, 8, 12, 16, 23] {
                    for v in [1.0f32, -1.0] {
                        let x = vec![v; n * cols];
                        let want = matmul(&scalar, &w, &x, n);
                        let got = matmul(be.as_ref(), &wp, &x, n);
                        assert_eq!(bits(&got), bits(&want), "{isa:?}: {t}, {n} tokens of {v}");
                    }
                }
            }
        }
    }
}

/// `matmul_batch` on the pool (the jobs' packed K-quant products in one dispatch, as the
/// MoE experts take them) against the scalar products of each job, bit for bit: jobs of
/// every packed K type with partial row groups, sharing an input and not, at 1 and 3 tokens.
#[test]
fn batched_packed_k_products_are_byte_identical_to_scalar() {
    let mut r = ChaCha8Rng::seed_from_u64(13);
    let cols = 512;
    let weights: Vec<Matrix> = [Q2_K, Q3_K, Q4_K, Q6_K, Q3_K, Q2_K]
        .into_iter()
        .enumerate()
        .map(|(i, t)| random_matrix(&mut r, t, 17 + 8 * i, cols))
        .collect();
    let x: Vec<f32> = (0..3 * cols)
        .map(|_| r.random_range(-2.0f32..2.0))
        .collect();
    let y: Vec<f32> = x.iter().rev().copied().collect();
    for isa in Isa::available() {
        let be = PoolBackend::new(simd(isa), 3);
        let prepared: Vec<Matrix> = weights
            .iter()
            .map(|w| {
                let mut p = w.clone();
                be.prepare(&mut p);
                assert_eq!(
                    PackedK::of(&p).is_some(),
                    PackedK::isa_has_kernels(isa, w.dtype),
                    "{isa:?}: {}",
                    w.dtype
                );
                p
            })
            .collect();
        for n in [1, 3] {
            let mut jobs = Vec::new();
            let mut at = 0;
            for (i, w) in prepared.iter().enumerate() {
                let input = if i % 3 == 2 { &y } else { &x };
                jobs.push(MatmulJob {
                    w,
                    x: &input[..n * cols],
                    n,
                    at,
                });
                at += n * w.rows + 3;
            }
            let mut batched = vec![f32::NAN; at];
            be.matmul_batch(&jobs, &mut batched);
            for (j, w) in jobs.iter().zip(&weights) {
                let want = matmul(&ScalarBackend::new(), w, j.x, n);
                let got = &batched[j.at..j.at + j.out_len()];
                assert_eq!(bits(got), bits(&want), "{isa:?}: {} x{n}", w.dtype);
            }
        }
    }
}

/// `matmul_shared` (a layer's q, k and v from one input: quantized once, one dispatch on the
/// pool) against each product alone on the same backend, bit for bit: K-quants, packed
/// Q8_0 and legacy types together, and a mix of packed and stored forms (which goes one
/// product at a time), with partial row groups, at decode and prompt token counts, on every
/// instruction set and at 1–3 threads.
#[test]
fn shared_input_products_equal_each_product_alone() {
    let mut r = ChaCha8Rng::seed_from_u64(21);
    let cols = 512;
    // The fourth is the real checkpoint's q, k and v in half its layers: two packed forms.
    let sets: [&[GgmlType]; 6] = [
        &[Q4_K, Q4_K, Q6_K],
        &[Q5_K, Q3_K, Q2_K],
        &[Q8_0, Q8_0, Q8_0],
        &[Q5_0, Q5_0, Q8_0],
        &[Q4_0, Q5_1, Q5_0],
        &[Q8_0, Q4_K, Q4_1],
    ];
    for isa in Isa::available() {
        for threads in [1, 2, 3] {
            let be = PoolBackend::new(simd(isa), threads);
            for (s, types) in sets.iter().enumerate() {
                let ws: Vec<Matrix> = types
                    .iter()
                    .enumerate()
                    .map(|(i, &t)| {
                        let mut w = random_matrix(&mut r, t, 40 + 9 * i + 16 * s, cols);
                        be.prepare(&mut w);
                        w
                    })
                    .collect();
                for n in [1, 8, 20] {
                    let x: Vec<f32> = (0..n * cols)
                        .map(|_| r.random_range(-2.0f32..2.0))
                        .collect();
                    let mut outs: Vec<Vec<f32>> =
                        ws.iter().map(|w| vec![f32::NAN; n * w.rows]).collect();
                    let refs: Vec<&Matrix> = ws.iter().collect();
                    let mut slices: Vec<&mut [f32]> =
                        outs.iter_mut().map(|o| o.as_mut_slice()).collect();
                    be.matmul_shared(&refs, &x, n, &mut slices);
                    for (w, got) in ws.iter().zip(&outs) {
                        let want = matmul(&be, w, &x, n);
                        assert_eq!(
                            bits(got),
                            bits(&want),
                            "{isa:?} {threads} threads: {} in {types:?}, {n} tokens",
                            w.dtype
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn decode_matvecs_allocate_nothing_once_warm() {
    let mut r = ChaCha8Rng::seed_from_u64(3);
    let (rows, cols) = (96, 768);
    let backends: Vec<Box<dyn Backend>> = vec![
        Box::new(simd(Isa::selected())),
        Box::new(PoolBackend::new(simd(Isa::selected()), 2)),
        Box::new(ParallelBackend::new(simd(Isa::selected()), 2)),
    ];
    for t in TYPES {
        let w = random_matrix(&mut r, t, rows, cols);
        let x: Vec<f32> = (0..cols).map(|_| r.random_range(-1.0f32..1.0)).collect();
        let mut out = vec![0.0f32; rows];
        for be in &backends {
            be.matmul(&w, &x, 1, &mut out);
            let n = alloc_counter::allocations_in(|| {
                for _ in 0..5 {
                    be.matmul(&w, &x, 1, &mut out);
                }
            });
            assert_eq!(n, 0, "{} {t}: {n} allocations in 5 matvecs", be.name());
        }
    }
}
