//! The `simd` backend and the vector kernels shared by the multi-threaded backends.
//!
//! It owns:
//! - [`Isa`]: the instruction set picked at run time (AVX-512 VNNI, AVX2, NEON with `sdot`,
//!   or portable code), overridable with `INFERNO_SIMD` for comparisons;
//! - [`PackedQ8`]: Q8_0 weights repacked at load into 16-row interleaved groups, the layout
//!   the integer kernels want (built through [`Backend::prepare`]), and [`PackedLegacy`],
//!   the same for Q4_0, Q5_0, Q4_1 and Q5_1 at their own size; a packed matrix's
//!   stored pages are released, so its weights are resident once;
//! - [`ActQ8`]: activations quantized to Q8_0 (with Q8_1's block sums) for the integer
//!   products;
//! - [`Kernels`]: entry points that compute a given share of an operation (rows of a matmul,
//!   heads of an attention), so `simd` runs all of it on one thread and `parallel` / `pool`
//!   hand the shares to threads — each output value is computed by the same code in the same
//!   order whatever the split, so results are identical at any thread count;
//! - [`quants::QuantMatmul`]: the other quantized types (and Q4_0 … Q5_1, Q2_K … Q6_K on
//!   the portable code) multiplied in their stored layout, one vector dot kernel call per
//!   output;
//! - [`SimdBackend`], which decorates a reference backend (normally `scalar`) and forwards it
//!   the types it has no kernel for.
//!
//! Layout: one folder per concern, its dispatcher the parent of its x86, AArch64 and portable
//! kernels: `packed_q8/`, `packed_legacy/`, `packed_k/` (weights repacked at load and their
//! products), `quants/` (row dots of the types in their stored layout), `float/` (float
//! products and element-wise operations), `attention/`. The files beside them hold what the
//! concerns share: `x86.rs`, `aarch64.rs` and `portable.rs` (activation quantization and
//! vector helpers), and this file (the ISA, the kernel table, the backend).
//!
//! Numerics: the quantized products, RoPE and `add` reproduce the scalar backend bit for bit.
//! The float-weight products, RMSNorm's sum of squares and attention's dot products sum in a
//! different order, and SiLU and softmax use a vector exponential (within 2 ulp), so those
//! differ from `scalar` by a few ulp per operation.

/// The token tiling every Q8_0 group kernel shares: `$kernel::<N>$args` over tokens `0..$n`
/// in tiles of the listed sizes, largest first (each size runs while it fits, so with
/// `8, 4, 3, 2, 1` a remainder below four is one tile of its own size). `$t` names the first
/// token of the tile, for `$args` to pass on. Expands to unsafe calls: the caller's own
/// contract must cover them. `$kernel::<_, K, ...>` passes further const generics after the
/// tile's size to every tile (the packed K-quant codes kernels' type; the packed legacy
/// codes kernel's `FIVE` and `MIN`). The sizes are taken one at a time (`@tiles`), so that
/// the list of generics repeats once per call rather than inside the sizes' repetition.
#[allow(unused_macros)]
macro_rules! for_token_tiles {
    ($n:expr, $t:ident, [$($tile:literal),+], $kernel:ident::<_ $(, $g:ident)*> $args:tt) => {{
        let mut $t = 0;
        for_token_tiles!(@tiles $n, $t, [$($tile),+], $kernel, [$($g),*], $args);
    }};
    ($n:expr, $t:ident, [$($tile:literal),+], $kernel:ident $args:tt) => {{
        let mut $t = 0;
        for_token_tiles!(@tiles $n, $t, [$($tile),+], $kernel, [], $args);
    }};
    (@tiles $n:expr, $t:ident, [$tile:literal $(, $rest:literal)*], $kernel:ident,
        [$($g:ident),*], $args:tt) => {
        // "t + 1 <= n" for the one-token tile reads as the others do.
        #[allow(clippy::int_plus_one)]
        while $t + $tile <= $n {
            // SAFETY: forwarded from the caller's contract; tokens t..t + tile exist.
            unsafe { $kernel::<$tile $(, $g)*> $args };
            $t += $tile;
        }
        for_token_tiles!(@tiles $n, $t, [$($rest),*], $kernel, [$($g),*], $args);
    };
    (@tiles $n:expr, $t:ident, [], $kernel:ident, [$($g:ident),*], $args:tt) => {};
}

#[cfg(target_arch = "aarch64")]
mod aarch64;
mod attention;
mod float;
pub mod packed_k;
mod packed_legacy;
mod packed_q8;
pub mod portable;
pub mod quants;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::{AttentionShape, Backend, KvLayer};
use inferno_tensor::{q8_0, GgmlType, Matrix};
use rayon::prelude::*;
use std::any::Any;
use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

pub use packed_legacy::PackedLegacy;

/// Rows interleaved in one packed group: one 64-byte vector holds 4 bytes of each.
pub const GROUP: usize = 16;

/// An instruction set the kernels can use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Plain Rust, any CPU.
    Portable,
    /// AVX2 + FMA + F16C (`maddubs` for the integer products).
    Avx2,
    /// AVX-512 F/BW + VNNI (`vpdpbusd`) for the integer products, AVX2 for the rest.
    Avx512Vnni,
    /// NEON with the dot-product extension (`sdot`).
    Neon,
}

impl Isa {
    pub const ALL: [Isa; 4] = [Isa::Portable, Isa::Avx2, Isa::Avx512Vnni, Isa::Neon];

    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Neon => "neon",
        }
    }

    pub fn from_name(s: &str) -> Option<Isa> {
        Self::ALL
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(s.trim()))
    }

    /// Whether this CPU can run it.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                Isa::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("dotprod"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The best available instruction set.
    pub fn best() -> Isa {
        [Isa::Avx512Vnni, Isa::Avx2, Isa::Neon]
            .into_iter()
            .find(|i| i.is_available())
            .unwrap_or(Isa::Portable)
    }

    /// The instruction set new backends use: `INFERNO_SIMD` when it names an available one,
    /// else the best available. Decided once per process.
    pub fn selected() -> Isa {
        static SELECTED: OnceLock<Isa> = OnceLock::new();
        *SELECTED.get_or_init(|| {
            std::env::var("INFERNO_SIMD")
                .ok()
                .and_then(|v| Isa::from_name(&v))
                .filter(|i| i.is_available())
                .unwrap_or_else(Isa::best)
        })
    }

    /// Every instruction set this CPU can run (for tests and benchmarks).
    pub fn available() -> Vec<Isa> {
        Self::ALL.into_iter().filter(|i| i.is_available()).collect()
    }

    /// Which forms attention runs by default: AVX-512's on a VNNI CPU (every one has AVX-512
    /// F), except on AMD's family 19h (Zen 4), which splits each 512-bit operation into two
    /// 256-bit halves. There the 16-lane forms won on F32 rows and on Q8_0 rows as stored,
    /// and lost on F16 rows and on Q8_0 chunks widened to f32 for a prompt (`cargo bench
    /// --bench kernels -- attention_`; docs/decisions/attention-forms-by-cpu.md). Every form
    /// gives the same bits.
    fn attention_width(self) -> AttentionWidth {
        match self {
            Isa::Avx512Vnni if splits_512_bit_ops() => AttentionWidth::ZmmExceptF16OrWidened,
            Isa::Avx512Vnni => AttentionWidth::Zmm,
            _ => AttentionWidth::Ymm,
        }
    }

    /// Whether the AVX2 kernels for the non-matmul operations apply.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn x86_vector(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::Avx512Vnni)
    }
}

// -----------------------------------------------------------------------------------------
// Packed Q8_0 weights
// -----------------------------------------------------------------------------------------

/// A 64-byte aligned line, so packed slices never straddle cache lines.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

pub use packed_k::PackedK;
pub use packed_q8::PackedQ8;

/// A matrix's packed form, which the integer group kernels multiply ([`Kernels::gemm_packed`]).
#[derive(Clone, Copy)]
pub enum Packed<'a> {
    Q8(&'a PackedQ8),
    Legacy(&'a PackedLegacy),
}

impl<'a> Packed<'a> {
    /// The packed form of `m` that `k`'s kernels multiply, if `prepare` made one.
    pub fn of(k: &Kernels, m: &'a Matrix) -> Option<Packed<'a>> {
        if let Some(p) = PackedQ8::for_q8_0(m) {
            return Some(Packed::Q8(p));
        }
        PackedLegacy::of(m)
            .filter(|_| PackedLegacy::supported_on(k.isa))
            .map(Packed::Legacy)
    }

    /// Groups of 16 rows.
    pub fn groups(&self) -> usize {
        match self {
            Packed::Q8(p) => p.groups,
            Packed::Legacy(p) => p.groups,
        }
    }
}

/// `chunk`-sized parallel chunks of `v`, or `n` empty slices when `v` is empty.
fn par_chunks_or_empty<T: Send>(
    v: &mut [T],
    chunk: usize,
    n: usize,
) -> rayon::vec::IntoIter<&mut [T]> {
    if chunk == 0 {
        (0..n)
            .map(|_| <&mut [T]>::default())
            .collect::<Vec<_>>()
            .into_par_iter()
    } else {
        v.chunks_mut(chunk).collect::<Vec<_>>().into_par_iter()
    }
}

// -----------------------------------------------------------------------------------------
// Quantized activations
// -----------------------------------------------------------------------------------------

/// Activation rows quantized to Q8_0 in split form: quants, widened scales, per block
/// −128 × the sum of its quants (the VNNI kernel's offset correction, stored ready to start
/// its integer sums from), and per block Q8_1's `s` (the sum of the quants times the
/// unrounded scale, rounded to f16 and widened). Q8_1's quants and `d` are Q8_0's, so the
/// same rows serve the Q4_1 / Q5_1 kernels.
#[derive(Default)]
pub struct ActQ8 {
    pub quants: Vec<i8>,
    pub scales: Vec<f32>,
    pub offsets: Vec<i32>,
    pub sums: Vec<f32>,
}

/// A read-only view of [`ActQ8`], shared by the threads of one product.
#[derive(Clone, Copy)]
pub struct ActQ8Ref<'a> {
    pub quants: &'a [i8],
    pub scales: &'a [f32],
    pub offsets: &'a [i32],
    pub sums: &'a [f32],
}

impl ActQ8 {
    /// Makes room for `n` rows of `cols` values; grows only, so steady state allocates nothing.
    pub fn reserve(&mut self, n: usize, cols: usize) {
        let nb = cols / q8_0::BLOCK;
        if self.quants.len() < n * cols {
            self.quants.resize(n * cols, 0);
        }
        if self.scales.len() < n * nb {
            self.scales.resize(n * nb, 0.0);
            self.offsets.resize(n * nb, 0);
            self.sums.resize(n * nb, 0.0);
        }
    }

    pub fn view(&self, n: usize, cols: usize) -> ActQ8Ref<'_> {
        let nb = cols / q8_0::BLOCK;
        ActQ8Ref {
            quants: &self.quants[..n * cols],
            scales: &self.scales[..n * nb],
            offsets: &self.offsets[..n * nb],
            sums: &self.sums[..n * nb],
        }
    }
}

thread_local! {
    static ACT: RefCell<ActQ8> = RefCell::new(ActQ8::default());
}

/// Runs `f` with this thread's activation scratch (grown to the largest request, then reused).
pub fn with_act_scratch<R>(f: impl FnOnce(&mut ActQ8) -> R) -> R {
    ACT.with(|c| f(&mut c.borrow_mut()))
}

// -----------------------------------------------------------------------------------------
// Kernels
// -----------------------------------------------------------------------------------------

/// A raw output pointer handed to the threads of one operation, each writing its own share.
#[derive(Clone, Copy)]
pub struct OutPtr(pub *mut f32);
impl OutPtr {
    /// The pointer `count` floats further on (not dereferenced here).
    pub fn offset(self, count: usize) -> OutPtr {
        OutPtr(self.0.wrapping_add(count))
    }
}

// SAFETY: only used to let threads write disjoint parts of one buffer that outlives the job.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// The CPU's vendor string (EBX, EDX, ECX of CPUID leaf 0) and family (leaf 1's base
/// family, plus its extended family when the base is 0xF).
#[cfg(target_arch = "x86_64")]
pub(crate) fn cpu_vendor_family() -> ([u8; 12], u32) {
    use std::arch::x86_64::__cpuid;
    // Leaves 0 and 1 exist on every x86-64 CPU.
    let (r0, r1) = (__cpuid(0), __cpuid(1));
    let mut vendor = [0u8; 12];
    for (chunk, reg) in vendor.chunks_exact_mut(4).zip([r0.ebx, r0.edx, r0.ecx]) {
        chunk.copy_from_slice(&reg.to_le_bytes());
    }
    let base = (r1.eax >> 8) & 0xF;
    let family = if base == 0xF {
        base + ((r1.eax >> 20) & 0xFF)
    } else {
        base
    };
    (vendor, family)
}

/// Whether this is an AMD family 19h CPU (Zen 3 and Zen 4; of them only Zen 4 has AVX-512,
/// and it executes each 512-bit operation as two 256-bit halves).
#[cfg(target_arch = "x86_64")]
fn splits_512_bit_ops() -> bool {
    cpu_vendor_family() == (*b"AuthenticAMD", 0x19)
}

#[cfg(not(target_arch = "x86_64"))]
fn splits_512_bit_ops() -> bool {
    false
}

/// Which of the x86 attention kernels' forms run (each gives the same bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionWidth {
    /// The 8-lane AVX2 forms.
    Ymm,
    /// The 16-lane AVX-512 forms.
    Zmm,
    /// The 16-lane forms on F32 and Q8_0 rows as stored, the 8-lane ones on F16 rows (with
    /// AVX-512 VL's 32 registers: sixteen FMA chains in flight) and on chunks of a Q8_0
    /// cache widened to f32 for a prompt.
    ZmmExceptF16OrWidened,
}

/// The vector kernels for one instruction set. Each entry point computes a share of an
/// operation so callers can split it over threads.
#[derive(Clone, Copy, Debug)]
pub struct Kernels {
    pub isa: Isa,
    /// Attention's forms (16-lane ones on [`Isa::Avx512Vnni`] only).
    attention_width: AttentionWidth,
}

impl Kernels {
    pub fn new(isa: Isa) -> Self {
        let isa = if isa.is_available() {
            isa
        } else {
            Isa::Portable
        };
        Self {
            isa,
            attention_width: isa.attention_width(),
        }
    }

    /// These kernels with attention in the forms `width` names, whatever this CPU's default
    /// (for tests and benchmarks). Only AVX-512 kernels have 16-lane forms; the others keep
    /// their own.
    pub fn with_attention_width(self, width: AttentionWidth) -> Self {
        Self {
            attention_width: if self.isa == Isa::Avx512Vnni {
                width
            } else {
                self.attention_width
            },
            ..self
        }
    }

    /// The forms attention runs.
    pub fn attention_width(&self) -> AttentionWidth {
        self.attention_width
    }

    /// Quantizes rows of `x` (each `cols` long) into the given split-form slices (`s`: −128
    /// × each block's sum of quants, `m`: each block's Q8_1 `s`, see [`ActQ8`]).
    pub fn quantize(&self, x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [i32], m: &mut [f32]) {
        let nb = x.len() / q8_0::BLOCK;
        assert!(q.len() >= x.len() && d.len() >= nb && s.len() >= nb && m.len() >= nb);
        match self.isa {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the ISA was checked at construction; sizes checked above.
            Isa::Avx2 | Isa::Avx512Vnni => unsafe { x86::quantize_rows(x, q, d, s, m) },
            #[cfg(target_arch = "aarch64")]
            // SAFETY: NEON is part of the AArch64 baseline; sizes checked above.
            Isa::Neon => unsafe { aarch64::quantize_rows(x, q, d, s, m) },
            _ => portable::quantize_rows(x, q, d, s, m),
        }
    }

    /// Quantizes `n` rows of `x` into `act` (grown as needed), on this thread.
    pub fn quantize_into(&self, x: &[f32], n: usize, cols: usize, act: &mut ActQ8) {
        act.reserve(n, cols);
        let nb = cols / q8_0::BLOCK;
        self.quantize(
            &x[..n * cols],
            &mut act.quants[..n * cols],
            &mut act.scales[..n * nb],
            &mut act.offsets[..n * nb],
            &mut act.sums[..n * nb],
        );
    }

    /// `out[t * ldo + r]` for tokens `t < n` and the rows of groups `g0..g1`.
    ///
    /// # Safety
    /// `out` must be valid for writes at those offsets and no other thread may access them
    /// during the call; `a` holds `n` rows of `w.cols` quants.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_q8(
        &self,
        w: &PackedQ8,
        a: &ActQ8Ref<'_>,
        n: usize,
        g0: usize,
        g1: usize,
        out: OutPtr,
        ldo: usize,
    ) {
        assert!(a.quants.len() >= n * w.cols && a.scales.len() >= n * w.nb && g1 <= w.groups);
        let isa = if w.fits(self.isa) {
            self.isa
        } else {
            Isa::Portable
        };
        // SAFETY (all arms): the ISA is available (checked at construction) and fits the
        // packing; the sizes were checked above; `out` is the caller's promise.
        unsafe {
            match isa {
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => packed_q8::x86::gemm_q8_avx2(w, a, n, g0, g1, out.0, ldo),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512Vnni => packed_q8::x86::gemm_q8_vnni(w, a, n, g0, g1, out.0, ldo),
                #[cfg(target_arch = "aarch64")]
                Isa::Neon => packed_q8::aarch64::gemm_q8_sdot(w, a, n, g0, g1, out.0, ldo),
                _ => packed_q8::portable::gemm_q8(w, a, n, g0, g1, out.0, ldo),
            }
        }
    }

    /// [`Kernels::gemm_q8`] for either packed form (a packed Q4_0 … Q5_1 matrix only where
    /// [`PackedLegacy::supported_on`] this instruction set, as [`Packed::of`] ensures).
    ///
    /// # Safety
    /// As for [`Kernels::gemm_q8`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_packed(
        &self,
        w: Packed<'_>,
        a: &ActQ8Ref<'_>,
        n: usize,
        g0: usize,
        g1: usize,
        out: OutPtr,
        ldo: usize,
    ) {
        match w {
            // SAFETY: the caller's contract.
            Packed::Q8(p) => unsafe { self.gemm_q8(p, a, n, g0, g1, out, ldo) },
            Packed::Legacy(p) => {
                assert!(
                    a.quants.len() >= n * p.cols
                        && a.scales.len() >= n * p.nb
                        && a.offsets.len() >= n * p.nb
                        && a.sums.len() >= n * p.nb
                        && g1 <= p.groups
                );
                // SAFETY: the ISA is available (checked at construction) and has kernels for
                // the layout; sizes checked above; `out` is the caller's promise.
                unsafe {
                    match self.isa {
                        #[cfg(target_arch = "x86_64")]
                        Isa::Avx512Vnni => {
                            packed_legacy::x86::gemm_legacy_vnni(p, a, n, g0, g1, out.0, ldo)
                        }
                        #[cfg(target_arch = "x86_64")]
                        Isa::Avx2 => {
                            packed_legacy::x86::gemm_legacy_avx2(p, a, n, g0, g1, out.0, ldo)
                        }
                        #[cfg(target_arch = "aarch64")]
                        Isa::Neon => {
                            packed_legacy::aarch64::gemm_legacy_sdot(p, a, n, g0, g1, out.0, ldo)
                        }
                        _ => panic!("no kernel for packed {} on {}", p.dtype(), self.isa.name()),
                    }
                }
            }
        }
    }
}

// -----------------------------------------------------------------------------------------
// The backend
// -----------------------------------------------------------------------------------------

/// Vector kernels on one thread, decorating a reference backend for everything else.
pub struct SimdBackend<B> {
    inner: B,
    k: Kernels,
    name: String,
}

impl<B: Backend> SimdBackend<B> {
    /// With the process's selected instruction set ([`Isa::selected`]).
    pub fn new(inner: B) -> Self {
        Self::with_isa(inner, Isa::selected())
    }

    /// With a given instruction set (the portable kernels if this CPU lacks it).
    pub fn with_isa(inner: B, isa: Isa) -> Self {
        let k = Kernels::new(isa);
        Self {
            inner,
            k,
            name: "simd".to_string(),
        }
    }

    pub fn kernels(&self) -> Kernels {
        self.k
    }

    /// This backend with attention in the forms `width` names
    /// ([`Kernels::with_attention_width`]).
    pub fn with_attention_width(mut self, width: AttentionWidth) -> Self {
        self.k = self.k.with_attention_width(width);
        self
    }

    pub fn inner(&self) -> &B {
        &self.inner
    }
}

/// Packs Q8_0 matrices (on the x86 and NEON kernels also Q4_0, Q5_0, Q4_1, Q5_1 and, see
/// [`PackedK`], Q2_K–Q6_K ones) for `k`'s instruction set (shared by the backends built on
/// `simd`), then releases the stored bytes' mapped pages: from here on every product and
/// row lookup of these backends reads the packed copy, so the weights are resident once.
/// The other quantized types are multiplied in their stored layout
/// ([`quants::QuantMatmul`]) and get no copy.
pub fn prepare_matrix(k: &Kernels, w: &mut Matrix) {
    if w.prepared.is_some() {
        return;
    }
    let packed: Option<Arc<dyn Any + Send + Sync>> = match w.dtype {
        GgmlType::Q8_0 => PackedQ8::pack(k.isa, w).map(|p| Arc::new(p) as _),
        t if PackedLegacy::packs(t) => PackedLegacy::pack(k.isa, w).map(|p| Arc::new(p) as _),
        t if PackedK::isa_has_kernels(k.isa, t) => {
            PackedK::pack(k.isa, w).map(|p| Arc::new(p) as _)
        }
        _ => None,
    };
    if let Some(p) = packed {
        w.prepared = Some(p);
        w.release_stored();
    }
}

impl<B: Backend> Backend for SimdBackend<B> {
    fn name(&self) -> &str {
        &self.name
    }

    fn supports(&self, dtype: GgmlType) -> bool {
        self.inner.supports(dtype)
    }

    fn prepare(&self, w: &mut Matrix) {
        self.inner.prepare(w);
        prepare_matrix(&self.k, w);
    }

    fn matmul(&self, w: &Matrix, x: &[f32], n: usize, out: &mut [f32]) {
        assert!(x.len() >= n * w.cols && out.len() >= n * w.rows);
        if let Some(p) = Packed::of(&self.k, w) {
            with_act_scratch(|act| {
                self.k.quantize_into(x, n, w.cols, act);
                let a = act.view(n, w.cols);
                // SAFETY: `out` holds n × rows floats (checked above) and is ours alone.
                unsafe {
                    self.k
                        .gemm_packed(p, &a, n, 0, p.groups(), OutPtr(out.as_mut_ptr()), w.rows)
                };
            });
            return;
        }
        if let Some(q) = quants::QuantMatmul::new(&self.k, w) {
            return q.run(w, x, n, out);
        }
        match w.dtype {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
                // SAFETY: as above.
                unsafe {
                    self.k
                        .gemm_float(w, x, n, 0, w.rows, OutPtr(out.as_mut_ptr()), w.rows)
                }
            }
            _ => self.inner.matmul(w, x, n, out),
        }
    }

    fn get_row(&self, w: &Matrix, row: usize, out: &mut [f32]) {
        // A packed (tied) embedding is looked up in its packed form: its stored pages were
        // released at load.
        if let Some(p) = PackedQ8::for_q8_0(w) {
            if p.dequantize_row(row, out) {
                return;
            }
        }
        if let Some(p) = PackedLegacy::of(w) {
            if p.dequantize_row(row, out) {
                return;
            }
        }
        if let Some(p) = PackedK::of(w) {
            if p.dequantize_row(row, out) {
                return;
            }
        }
        self.inner.get_row(w, row, out)
    }

    fn rms_norm(&self, x: &mut [f32], weight: &[f32], eps: f32) {
        self.k.rms_norm(x, weight, eps)
    }

    fn rope(&self, x: &mut [f32], n_heads: usize, head_dim: usize, pos0: usize, inv_freq: &[f32]) {
        self.k.rope(x, n_heads, head_dim, pos0, inv_freq)
    }

    fn attention(&self, shape: &AttentionShape, q: &[f32], kv: KvLayer<'_>, out: &mut [f32]) {
        let len = out.len();
        // SAFETY: one thread computes every item into `out`, which it borrows mutably.
        unsafe {
            self.k
                .attention(shape, q, kv, OutPtr(out.as_mut_ptr()), len, 0, usize::MAX)
        }
    }

    fn silu_mul(&self, gate: &mut [f32], up: &[f32]) {
        self.k.silu_mul(gate, up)
    }

    fn add(&self, x: &mut [f32], y: &[f32]) {
        self.k.add(x, y)
    }
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux"))]
mod tests {
    /// The vendor and family that choose attention's forms are those the kernel reports
    /// (Linux only: elsewhere there is nothing to compare against).
    #[test]
    fn cpu_vendor_and_family_are_as_the_kernel_reports_them() {
        let info = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
        let field = |name: &str| -> String {
            info.lines()
                .find_map(|l| {
                    let (key, value) = l.split_once(':')?;
                    (key.trim() == name).then(|| value.trim().to_string())
                })
                .unwrap_or_else(|| panic!("a {name} line"))
        };
        let (vendor, family) = super::cpu_vendor_family();
        assert_eq!(std::str::from_utf8(&vendor).unwrap(), field("vendor_id"));
        assert_eq!(family.to_string(), field("cpu family"));
        assert_eq!(
            super::splits_512_bit_ops(),
            field("vendor_id") == "AuthenticAMD" && field("cpu family") == "25"
        );
    }
}
