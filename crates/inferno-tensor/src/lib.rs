//! Tensor element types and quantized block formats: their layouts, dequantization and dot
//! products, in plain scalar code that defines the numerics every faster kernel must match.

pub mod bytes;
pub mod dtype;
pub mod float;
pub mod k_quantize;
pub mod k_quants;
pub mod legacy;
pub mod matrix;
pub mod mixture;
pub mod q8_0;
#[doc(hidden)]
pub mod test_rng;

pub use bytes::TensorBytes;
pub use dtype::GgmlType;
pub use matrix::{Matrix, Vector};

/// Errors from tensor-level conversions.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error("tensor type {0} is not supported here")]
    UnsupportedType(GgmlType),
    #[error("{n} values do not fill whole {dtype} blocks")]
    PartialBlock { dtype: GgmlType, n: usize },
    #[error("expected {expected} bytes of {dtype} data for {n} values, got {got}")]
    SizeMismatch {
        dtype: GgmlType,
        n: usize,
        expected: usize,
        got: usize,
    },
    #[error("value {index} is not finite and cannot be stored as {dtype}")]
    NonFinite { dtype: GgmlType, index: usize },
}

/// Whether rows of this type can be dequantized and multiplied by the scalar code.
pub fn is_supported(dtype: GgmlType) -> bool {
    matches!(dtype, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) || quant_dot(dtype).is_some()
}

/// How a quantized weight type is multiplied: the activation row is first quantized to
/// `activation` with `quantize`, then each weight row is combined with it by `dot`, an
/// integer dot product per block scaled by the blocks' scales (llama.cpp's scheme).
///
/// The function pointers take whole blocks: `quantize(x, out)` needs `x.len()` a multiple of
/// the activation block size and `out` of [`GgmlType::row_size`] bytes; `dot(w_row, x_q)`
/// takes one weight row and the quantized activation row of the same length. Slices that
/// are too short are cut to whole blocks rather than read past, so callers that split a
/// matrix into row ranges (threads, tiles) can call them directly on validated shapes.
#[derive(Clone, Copy, Debug)]
pub struct QuantDot {
    pub weight: GgmlType,
    pub activation: GgmlType,
    pub quantize: QuantizeFn,
    pub dot: DotFn,
}

/// Quantizes a row of activations into the blocks of their type.
pub type QuantizeFn = fn(&[f32], &mut [u8]);
/// The dot product of a quantized weight row with a quantized activation row.
pub type DotFn = fn(&[u8], &[u8]) -> f32;

/// The integer-dot scheme for a quantized weight type; `None` for float types (multiplied
/// in f32) and for types this build cannot multiply.
pub fn quant_dot(weight: GgmlType) -> Option<QuantDot> {
    use GgmlType::*;
    let (activation, quantize, dot): (GgmlType, QuantizeFn, DotFn) = match weight {
        Q8_0 => (Q8_0, q8_0::quantize, q8_0::dot),
        Q4_0 => (Q8_0, q8_0::quantize, legacy::dot_q4_0_q8_0),
        Q5_0 => (Q8_0, q8_0::quantize, legacy::dot_q5_0_q8_0),
        Q4_1 => (Q8_1, legacy::quantize_q8_1, legacy::dot_q4_1_q8_1),
        Q5_1 => (Q8_1, legacy::quantize_q8_1, legacy::dot_q5_1_q8_1),
        Q2_K => (Q8_K, k_quants::quantize_q8_k, k_quants::dot_q2_k_q8_k),
        Q3_K => (Q8_K, k_quants::quantize_q8_k, k_quants::dot_q3_k_q8_k),
        Q4_K => (Q8_K, k_quants::quantize_q8_k, k_quants::dot_q4_k_q8_k),
        Q5_K => (Q8_K, k_quants::quantize_q8_k, k_quants::dot_q5_k_q8_k),
        Q6_K => (Q8_K, k_quants::quantize_q8_k, k_quants::dot_q6_k_q8_k),
        _ => return None,
    };
    Some(QuantDot {
        weight,
        activation,
        quantize,
        dot,
    })
}

/// The type activations are quantized to before multiplying with `weight`; `None` means
/// the float path (F32/F16/BF16 weights, f32 activations) or an unsupported type.
pub fn activation_type(weight: GgmlType) -> Option<GgmlType> {
    quant_dot(weight).map(|k| k.activation)
}

/// Quantizes the activation row `x` to `act` (Q8_0, Q8_1 or Q8_K) into `out`, which must
/// hold exactly `act.row_size(x.len())` bytes.
pub fn quantize_activation(act: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), TensorError> {
    let quantize: QuantizeFn = match act {
        GgmlType::Q8_0 => q8_0::quantize,
        GgmlType::Q8_1 => legacy::quantize_q8_1,
        GgmlType::Q8_K => k_quants::quantize_q8_k,
        other => return Err(TensorError::UnsupportedType(other)),
    };
    check_len(act, x.len(), out.len())?;
    quantize(x, out);
    Ok(())
}

/// Dot product of one `weight`-typed row with an activation row quantized by
/// [`quantize_activation`] to `activation_type(weight)`; both must hold the same number of
/// values.
pub fn vec_dot(weight: GgmlType, w_row: &[u8], x_q: &[u8]) -> Result<f32, TensorError> {
    let k = quant_dot(weight).ok_or(TensorError::UnsupportedType(weight))?;
    let blocks = w_row.len() / weight.type_size();
    let n = blocks * weight.block_size();
    check_len(weight, n, w_row.len())?;
    check_len(k.activation, n, x_q.len())?;
    Ok((k.dot)(w_row, x_q))
}

/// Errors unless `bytes` is exactly the size of `n` values of `dtype`.
fn check_len(dtype: GgmlType, n: usize, bytes: usize) -> Result<(), TensorError> {
    match dtype.row_size(n as u64) {
        Some(expected) if expected as usize == bytes => Ok(()),
        Some(expected) => Err(TensorError::SizeMismatch {
            dtype,
            n,
            expected: expected as usize,
            got: bytes,
        }),
        None => Err(TensorError::SizeMismatch {
            dtype,
            n,
            expected: 0,
            got: bytes,
        }),
    }
}

/// Stores f32 values as `dtype`: the float types; Q8_0, Q4_0, Q5_0 and Q5_1 (round-to-nearest, as
/// llama.cpp's reference quantizers); or Q4_K, Q5_K and Q6_K (searched scales, see
/// [`k_quantize`]). `vals.len()` must be a multiple of the type's block size, and the
/// quantized types refuse NaN and infinities.
pub fn encode(vals: &[f32], dtype: GgmlType) -> Result<Vec<u8>, TensorError> {
    let quantize: fn(&[f32], &mut [u8]) -> Result<(), TensorError> = match dtype {
        GgmlType::F32 => return Ok(float::f32_to_le_bytes(vals)),
        GgmlType::F16 => return Ok(float::f32_to_f16_bytes(vals)),
        GgmlType::BF16 => return Ok(float::f32_to_bf16_bytes(vals)),
        GgmlType::Q8_0 => |x, o| {
            q8_0::quantize(x, o);
            Ok(())
        },
        GgmlType::Q4_0 => |x, o| {
            legacy::quantize_q4_0(x, o);
            Ok(())
        },
        GgmlType::Q5_0 => |x, o| {
            legacy::quantize_q5_0(x, o);
            Ok(())
        },
        GgmlType::Q5_1 => |x, o| {
            legacy::quantize_q5_1(x, o);
            Ok(())
        },
        GgmlType::Q4_K => k_quantize::quantize_q4_k,
        GgmlType::Q5_K => k_quantize::quantize_q5_k,
        GgmlType::Q6_K => k_quantize::quantize_q6_k,
        other => return Err(TensorError::UnsupportedType(other)),
    };
    let n = vals.len();
    let Some(bytes) = dtype.row_size(n as u64) else {
        return Err(TensorError::PartialBlock { dtype, n });
    };
    if let Some(index) = vals.iter().position(|v| !v.is_finite()) {
        return Err(TensorError::NonFinite { dtype, index });
    }
    let mut out = vec![0u8; bytes as usize];
    quantize(vals, &mut out)?;
    Ok(out)
}

/// Whether [`encode`] can write `dtype`.
pub fn can_encode(dtype: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        dtype,
        F32 | F16 | BF16 | Q8_0 | Q4_0 | Q5_0 | Q5_1 | Q4_K | Q5_K | Q6_K
    )
}

/// llama.cpp's `general.file_type` code for a model whose matrices are all `dtype`, for the
/// float types and Q8_0 (the K-quant mixtures have their own codes, see
/// [`mixture::Scheme::file_type`]).
pub fn file_type(dtype: GgmlType) -> Option<u32> {
    match dtype {
        GgmlType::F32 => Some(0),
        GgmlType::F16 => Some(1),
        GgmlType::Q4_0 => Some(2),
        GgmlType::Q5_0 => Some(8),
        GgmlType::Q8_0 => Some(7),
        GgmlType::BF16 => Some(32),
        _ => None,
    }
}

/// Dequantizes `out.len()` values stored as `dtype` in `src`.
pub fn dequantize_row(dtype: GgmlType, src: &[u8], out: &mut [f32]) -> Result<(), TensorError> {
    let n = out.len();
    let expected = dtype
        .row_size(n as u64)
        .ok_or(TensorError::UnsupportedType(dtype))? as usize;
    if src.len() != expected {
        return Err(TensorError::SizeMismatch {
            dtype,
            n,
            expected,
            got: src.len(),
        });
    }
    match dtype {
        GgmlType::F32 => float::f32_from_le(src, out),
        GgmlType::F16 => float::f16_to_f32(src, out),
        GgmlType::BF16 => float::bf16_to_f32(src, out),
        GgmlType::Q8_0 => q8_0::dequantize(src, out),
        GgmlType::Q4_0 => legacy::dequantize_q4_0(src, out),
        GgmlType::Q4_1 => legacy::dequantize_q4_1(src, out),
        GgmlType::Q5_0 => legacy::dequantize_q5_0(src, out),
        GgmlType::Q5_1 => legacy::dequantize_q5_1(src, out),
        GgmlType::Q2_K => k_quants::dequantize_q2_k(src, out),
        GgmlType::Q3_K => k_quants::dequantize_q3_k(src, out),
        GgmlType::Q4_K => k_quants::dequantize_q4_k(src, out),
        GgmlType::Q5_K => k_quants::dequantize_q5_k(src, out),
        GgmlType::Q6_K => k_quants::dequantize_q6_k(src, out),
        other => return Err(TensorError::UnsupportedType(other)),
    }
    Ok(())
}
