//! The key/value cache of one sequence: allocated once for a fixed number of positions, it
//! knows how many of them hold the sequence's history so far. It lives where the executor
//! that fills it runs: host memory, or device memory on the `gpu` backend.
//!
//! Keys and values are each stored as one of the [`KvType`]s: F32 (exact), F16 (half the
//! bytes) or Q8_0 (blocks of 32 values with one f16 scale: 34 bytes per 32 values). New
//! rows are converted when they are stored; attention reads the stored type directly
//! ([`KvRows`]), with no widened copy of the cache.

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use inferno_tensor::q8_0;
use std::any::Any;

/// The element type of a KV cache's keys or values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvType {
    F32,
    F16,
    Q8_0,
}

/// Every KV cache type by its name (llama.cpp's `--cache-type-k` spellings).
pub const KV_TYPE_NAMES: &[&str] = &["f32", "f16", "q8_0"];

#[derive(Debug, thiserror::Error)]
pub enum KvTypeError {
    #[error("unknown KV cache type {0:?} (supported: f32, f16, q8_0)")]
    Unknown(String),
    #[error("a q8_0 KV cache needs a head size that is a multiple of 32, not {0}")]
    HeadSize(usize),
}

impl KvType {
    pub fn parse(name: &str) -> Result<Self, KvTypeError> {
        match name.trim().to_ascii_lowercase().as_str() {
            "f32" => Ok(KvType::F32),
            "f16" => Ok(KvType::F16),
            "q8_0" => Ok(KvType::Q8_0),
            other => Err(KvTypeError::Unknown(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
        }
    }

    /// Bytes one row of `n` values takes.
    pub fn row_bytes(self, n: usize) -> usize {
        match self {
            KvType::F32 => n * 4,
            KvType::F16 => n * 2,
            KvType::Q8_0 => n / q8_0::BLOCK * q8_0::BLOCK_BYTES,
        }
    }

    /// Whether rows of `head_dim` values can be stored in this type.
    pub fn check_head_dim(self, head_dim: usize) -> Result<(), KvTypeError> {
        match self {
            KvType::Q8_0 if !head_dim.is_multiple_of(q8_0::BLOCK) => {
                Err(KvTypeError::HeadSize(head_dim))
            }
            _ => Ok(()),
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What one position of a KV cache holds: keys and values of every layer's KV heads, rows
/// of `head_dim` values stored as `types` (keys, values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvShape {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub types: (KvType, KvType),
}

impl KvShape {
    /// Bytes one position takes (keys and values, every layer).
    pub fn bytes_per_token(&self) -> usize {
        self.n_layers
            * self.n_kv_heads
            * (self.types.0.row_bytes(self.head_dim) + self.types.1.row_bytes(self.head_dim))
    }
}

/// Keys or values of a KV cache as stored, row after row (`head_dim` values a row).
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    /// Q8_0 blocks, `head_dim / 32` blocks a row.
    Q8_0(&'a [u8]),
}

impl<'a> KvRows<'a> {
    pub fn kind(&self) -> KvType {
        match self {
            KvRows::F32(_) => KvType::F32,
            KvRows::F16(_) => KvType::F16,
            KvRows::Q8_0(_) => KvType::Q8_0,
        }
    }

    /// Rows `r0..r1` of `hd` values each.
    pub fn rows(self, r0: usize, r1: usize, hd: usize) -> KvRows<'a> {
        match self {
            KvRows::F32(s) => KvRows::F32(&s[r0 * hd..r1 * hd]),
            KvRows::F16(s) => KvRows::F16(&s[r0 * hd..r1 * hd]),
            KvRows::Q8_0(s) => {
                let rb = KvType::Q8_0.row_bytes(hd);
                KvRows::Q8_0(&s[r0 * rb..r1 * rb])
            }
        }
    }

    /// Row `r` as f32: the stored slice itself for F32, else widened into `buf` (exactly:
    /// F16 values and Q8_0's `q · scale` are what every kernel reads).
    pub fn row<'b>(&self, r: usize, hd: usize, buf: &'b mut [f32]) -> &'b [f32]
    where
        'a: 'b,
    {
        match *self {
            KvRows::F32(s) => &s[r * hd..(r + 1) * hd],
            KvRows::F16(s) => {
                // Exact (every f16 is an f32); vector instructions where the CPU has them.
                s[r * hd..(r + 1) * hd].convert_to_f32_slice(&mut buf[..hd]);
                &buf[..hd]
            }
            KvRows::Q8_0(s) => {
                let rb = KvType::Q8_0.row_bytes(hd);
                q8_0::dequantize(&s[r * rb..(r + 1) * rb], &mut buf[..hd]);
                &buf[..hd]
            }
        }
    }
}

/// One layer's keys and values, as attention reads them.
#[derive(Clone, Copy, Debug)]
pub struct KvLayer<'a> {
    pub k: KvRows<'a>,
    pub v: KvRows<'a>,
}

/// New rows for one layer's keys or values of one sequence (half of [`KvCache::store`]),
/// written by [`KvStore::run`]. The default value writes nothing.
#[derive(Default)]
pub struct KvStore<'a> {
    rows: Option<&'a mut HostRows>,
    /// `n_tokens × heads × head_dim` values.
    src: &'a [f32],
    pos0: usize,
    heads: usize,
    head_dim: usize,
    capacity: usize,
}

impl KvStore<'_> {
    /// Values it writes.
    pub fn len(&self) -> usize {
        if self.rows.is_some() {
            self.src.len()
        } else {
            0
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Converts the rows to the cache's type and writes them at their positions.
    pub fn run(&mut self) {
        let Some(rows) = self.rows.as_deref_mut() else {
            return;
        };
        let (hd, heads) = (self.head_dim, self.heads);
        if hd * heads == 0 {
            return;
        }
        for (t, x) in self.src.chunks_exact(hd * heads).enumerate() {
            for h in 0..heads {
                rows.put(
                    h * self.capacity + self.pos0 + t,
                    hd,
                    &x[h * hd..(h + 1) * hd],
                );
            }
        }
    }
}

/// One layer's keys or values in host memory, `[n_kv_heads][capacity]` rows. Every variant
/// is allocated zeroed (F16 as its bit patterns), so the pages of positions not yet written
/// are not resident.
enum HostRows {
    F32(Vec<f32>),
    F16(Vec<u16>),
    Q8_0(Vec<u8>),
}

impl HostRows {
    fn new(kind: KvType, rows: usize, hd: usize) -> Self {
        match kind {
            KvType::F32 => HostRows::F32(vec![0.0; rows * hd]),
            KvType::F16 => HostRows::F16(vec![0; rows * hd]),
            KvType::Q8_0 => HostRows::Q8_0(vec![0; rows * kind.row_bytes(hd)]),
        }
    }

    fn view(&self) -> KvRows<'_> {
        match self {
            HostRows::F32(v) => KvRows::F32(v),
            HostRows::F16(v) => KvRows::F16(v.reinterpret_cast()),
            HostRows::Q8_0(v) => KvRows::Q8_0(v),
        }
    }

    /// Stores `x` (`hd` values) as row `r`, converting to the stored type.
    fn put(&mut self, r: usize, hd: usize, x: &[f32]) {
        match self {
            HostRows::F32(v) => v[r * hd..(r + 1) * hd].copy_from_slice(x),
            HostRows::F16(v) => {
                // Rounded to nearest, ties to even, with F16C (or NEON) where the CPU has
                // it: the same bits as the scalar conversion, several times faster.
                v[r * hd..(r + 1) * hd]
                    .reinterpret_cast_mut::<f16>()
                    .convert_from_f32_slice(x);
            }
            HostRows::Q8_0(v) => {
                let rb = KvType::Q8_0.row_bytes(hd);
                q8_0::quantize(x, &mut v[r * rb..(r + 1) * rb]);
            }
        }
    }

    /// Copies rows `src_r0 .. src_r0 + n` of `src` (same type) to rows `dst_r0 ..`.
    fn copy_rows(&mut self, dst_r0: usize, src: &HostRows, src_r0: usize, n: usize, hd: usize) {
        fn copy<T: Copy>(d: &mut [T], s: &[T], d0: usize, s0: usize, len: usize) {
            d[d0..d0 + len].copy_from_slice(&s[s0..s0 + len]);
        }
        match (self, src) {
            (HostRows::F32(d), HostRows::F32(s)) => copy(d, s, dst_r0 * hd, src_r0 * hd, n * hd),
            (HostRows::F16(d), HostRows::F16(s)) => copy(d, s, dst_r0 * hd, src_r0 * hd, n * hd),
            (HostRows::Q8_0(d), HostRows::Q8_0(s)) => {
                let rb = KvType::Q8_0.row_bytes(hd);
                copy(d, s, dst_r0 * rb, src_r0 * rb, n * rb)
            }
            // Different types were ruled out by `same_shape`.
            _ => {}
        }
    }
}

/// Per layer, keys and values laid out `[n_kv_heads][capacity][head_dim]`, so one head's
/// history is contiguous for the attention kernel.
pub struct KvCache {
    capacity: usize,
    /// Positions `0..len` hold valid keys and values.
    len: usize,
    kv: KvShape,
    store: Store,
}

enum Store {
    Host { k: Vec<HostRows>, v: Vec<HostRows> },
    Device(Box<dyn DeviceKv>),
}

/// Keys and values held in a device's memory. The device that made the cache reads it back
/// through [`DeviceKv::as_any`]; the cache itself only copies prefixes between two of them,
/// so it knows no device.
pub trait DeviceKv: Send + Sync {
    /// Positions each layer holds.
    fn capacity(&self) -> usize;
    /// Copies the first `n` positions of every layer and head from `other` (same shape,
    /// checked by the caller); false, copying nothing, when `other` is another device's.
    fn copy_prefix_from(&mut self, other: &dyn DeviceKv, n: usize) -> bool;
    fn as_any(&self) -> &dyn Any;
}

impl KvCache {
    /// An F32 cache in host memory.
    pub fn new(n_layers: usize, n_kv_heads: usize, head_dim: usize, capacity: usize) -> Self {
        let shape = KvShape {
            n_layers,
            n_kv_heads,
            head_dim,
            types: (KvType::F32, KvType::F32),
        };
        Self::with_shape(shape, capacity)
    }

    /// A host cache of `capacity` positions of this shape (its types checked against the
    /// head size by the caller: [`KvType::check_head_dim`]).
    pub fn with_shape(kv: KvShape, capacity: usize) -> Self {
        let rows = kv.n_kv_heads * capacity;
        let layers = |t: KvType| {
            (0..kv.n_layers)
                .map(|_| HostRows::new(t, rows, kv.head_dim))
                .collect()
        };
        Self {
            capacity,
            len: 0,
            kv,
            store: Store::Host {
                k: layers(kv.types.0),
                v: layers(kv.types.1),
            },
        }
    }

    /// A cache whose keys and values live in device memory.
    pub(crate) fn on_device_memory(device: Box<dyn DeviceKv>, kv: KvShape) -> Self {
        Self {
            capacity: device.capacity(),
            len: 0,
            kv,
            store: Store::Device(device),
        }
    }

    /// Whether the keys and values live in device memory.
    pub fn on_device(&self) -> bool {
        matches!(self.store, Store::Device(_))
    }

    /// The device's cache, when this cache lives in device memory.
    pub(crate) fn device(&self) -> Option<&dyn DeviceKv> {
        match &self.store {
            Store::Device(kv) => Some(kv.as_ref()),
            Store::Host { .. } => None,
        }
    }

    /// The stored types of keys and values.
    pub fn types(&self) -> (KvType, KvType) {
        self.kv.types
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Positions that hold the sequence so far (the next token's position).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions still free.
    pub fn room(&self) -> usize {
        self.capacity - self.len
    }

    /// Forgets every position from `len` on (e.g. to keep only a shared prefix).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Forgets the whole sequence (the memory stays).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Marks `n` more positions as filled, once every layer has stored them.
    pub fn advance(&mut self, n: usize) {
        self.len = (self.len + n).min(self.capacity);
    }

    /// Layers, KV heads and head size.
    pub fn shape(&self) -> (usize, usize, usize) {
        (self.kv.n_layers, self.kv.n_kv_heads, self.kv.head_dim)
    }

    /// Whether `other` has the same layers, heads and types and lives in the same memory (so
    /// positions can be copied across).
    pub fn same_shape(&self, other: &KvCache) -> bool {
        self.kv == other.kv && self.on_device() == other.on_device()
    }

    /// Replaces this cache's contents with the first `n` positions of `other` (a shared
    /// prompt prefix): copying is far cheaper than recomputing them. Returns the positions
    /// copied, which is `n` capped by both capacities and `other`'s length; 0 when the
    /// shapes differ.
    pub fn copy_prefix_from(&mut self, other: &KvCache, n: usize) -> usize {
        if !self.same_shape(other) {
            self.len = 0;
            return 0;
        }
        let n = n.min(other.len).min(self.capacity);
        let (hd, heads, cap) = (self.kv.head_dim, self.kv.n_kv_heads, self.capacity);
        match (&mut self.store, &other.store) {
            (Store::Device(dst), Store::Device(src)) => {
                if !dst.copy_prefix_from(src.as_ref(), n) {
                    self.len = 0;
                    return 0;
                }
            }
            (Store::Host { k, v }, Store::Host { k: ok, v: ov }) => {
                for (dst, src) in [(k, ok), (v, ov)] {
                    for (dl, sl) in dst.iter_mut().zip(src.iter()) {
                        for h in 0..heads {
                            dl.copy_rows(h * cap, sl, h * other.capacity, n, hd);
                        }
                    }
                }
            }
            // Different memories were ruled out by `same_shape`.
            _ => return 0,
        }
        self.len = n;
        n
    }

    /// Stores `n_tokens` rows of keys and values (`n_tokens × n_kv_heads × head_dim`) at
    /// positions `pos0 ..`, converted to the cache's types.
    pub fn store(&mut self, layer: usize, pos0: usize, k: &[f32], v: &[f32]) {
        if let Some(parts) = self.store_parts(layer, pos0, k, v) {
            for mut p in parts {
                p.run();
            }
        }
    }

    /// [`KvCache::store`] as two parts, the keys' and the values', each run alone: a
    /// backend can spread the parts of a step's sequences over its threads. `None` for a
    /// device cache (the GPU kernels fill it; the host path never stores into it) or a
    /// layer it does not have.
    pub fn store_parts<'a>(
        &'a mut self,
        layer: usize,
        pos0: usize,
        k: &'a [f32],
        v: &'a [f32],
    ) -> Option<[KvStore<'a>; 2]> {
        let (heads, head_dim, capacity) = (self.kv.n_kv_heads, self.kv.head_dim, self.capacity);
        let Store::Host { k: kc, v: vc } = &mut self.store else {
            return None;
        };
        let (kl, vl) = (kc.get_mut(layer)?, vc.get_mut(layer)?);
        let part = |rows, src| KvStore {
            rows: Some(rows),
            src,
            pos0,
            heads,
            head_dim,
            capacity,
        };
        Some([part(kl, k), part(vl, v)])
    }

    /// Layer `layer`'s keys and values in host memory, `[n_kv_heads][capacity]` rows (empty
    /// for a device cache, which the host kernels never see: a step checks where its caches
    /// live before it starts).
    pub fn layer(&self, layer: usize) -> KvLayer<'_> {
        let empty = KvLayer {
            k: KvRows::F32(&[]),
            v: KvRows::F32(&[]),
        };
        let Store::Host { k, v } = &self.store else {
            return empty;
        };
        match (k.get(layer), v.get(layer)) {
            (Some(k), Some(v)) => KvLayer {
                k: k.view(),
                v: v.view(),
            },
            _ => empty,
        }
    }

    pub fn bytes(&self) -> usize {
        self.kv.bytes_per_token() * self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::{KvCache, KvLayer, KvRows, KvShape, KvType};

    fn shape(
        n_layers: usize,
        n_kv_heads: usize,
        head_dim: usize,
        types: (KvType, KvType),
    ) -> KvShape {
        KvShape {
            n_layers,
            n_kv_heads,
            head_dim,
            types,
        }
    }

    fn row(kv: KvRows<'_>, r: usize, hd: usize) -> Vec<f32> {
        let mut buf = vec![0.0; hd];
        kv.row(r, hd, &mut buf).to_vec()
    }

    #[test]
    fn prefix_copy_moves_every_head_across_capacities() {
        let (layers, heads, hd) = (2, 2, 32);
        for types in [
            (KvType::F32, KvType::F32),
            (KvType::F16, KvType::Q8_0),
            (KvType::Q8_0, KvType::F16),
        ] {
            let mut a = KvCache::with_shape(shape(layers, heads, hd, types), 4);
            for l in 0..layers {
                let k: Vec<f32> = (0..4 * heads * hd).map(|i| (l * 100 + i) as f32).collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                a.store(l, 0, &k, &v);
            }
            a.advance(4);
            let mut b = KvCache::with_shape(shape(layers, heads, hd, types), 9);
            assert_eq!(b.copy_prefix_from(&a, 3), 3);
            assert_eq!(b.len(), 3);
            for l in 0..layers {
                let (KvLayer { k: ak, v: av }, KvLayer { k: bk, v: bv }) = (a.layer(l), b.layer(l));
                for h in 0..heads {
                    for p in 0..3 {
                        assert_eq!(row(ak, h * 4 + p, hd), row(bk, h * 9 + p, hd));
                        assert_eq!(row(av, h * 4 + p, hd), row(bv, h * 9 + p, hd));
                    }
                }
            }
            // Never more than the source holds; never across types.
            a.truncate(2);
            assert_eq!(b.copy_prefix_from(&a, 3), 2);
            let mut other = KvCache::with_shape(shape(layers, heads, hd, (types.1, types.0)), 9);
            if types.0 != types.1 {
                assert_eq!(other.copy_prefix_from(&a, 2), 0);
            }
        }
    }

    #[test]
    fn stored_rows_read_back_as_their_type_rounds_them() {
        let hd = 64;
        let x: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        for (t, tol) in [
            (KvType::F32, 0.0),
            (KvType::F16, 2e-3),
            (KvType::Q8_0, 3.0 / 127.0),
        ] {
            let mut kv = KvCache::with_shape(shape(1, 1, hd, (t, t)), 2);
            kv.store(0, 1, &x, &x);
            let k = kv.layer(0).k;
            assert_eq!(k.kind(), t);
            let got = row(k, 1, hd);
            let err = got
                .iter()
                .zip(&x)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(err <= tol, "{t}: {err}");
            if t != KvType::F32 {
                assert!(err > 0.0, "{t} rounds");
            }
        }
        assert_eq!(KvType::Q8_0.row_bytes(64), 68);
        assert!(KvType::Q8_0.check_head_dim(48).is_err());
        assert_eq!(KvType::parse("Q8_0").unwrap(), KvType::Q8_0);
        assert!(KvType::parse("q4_0").is_err());
    }
}
