//! Tensor element types and quantized block formats: their layouts, dequantization and dot
//! products, in plain scalar code that defines the numerics every faster kernel must match.

pub mod dtype;
pub mod float;
pub mod matrix;
pub mod q8_0;

pub use dtype::GgmlType;
pub use matrix::Matrix;

/// Errors from tensor-level conversions.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error("tensor type {0} is not supported here")]
    UnsupportedType(GgmlType),
    #[error("expected {expected} bytes of {dtype} data for {n} values, got {got}")]
    SizeMismatch {
        dtype: GgmlType,
        n: usize,
        expected: usize,
        got: usize,
    },
}

/// Whether rows of this type can be dequantized and multiplied by the scalar code.
pub fn is_supported(dtype: GgmlType) -> bool {
    matches!(
        dtype,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q8_0
    )
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
        other => return Err(TensorError::UnsupportedType(other)),
    }
    Ok(())
}
