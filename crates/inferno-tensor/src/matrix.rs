//! A 2-D weight matrix kept in its stored layout (plain floats or quantized blocks).

use super::{GgmlType, TensorBytes};
use std::any::Any;
use std::sync::Arc;

/// `rows` rows of `cols` values each, row-major, as stored in the GGUF file: for a linear
/// layer `rows` is the output size and `cols` the input size.
#[derive(Clone)]
pub struct Matrix {
    pub name: String,
    pub dtype: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: TensorBytes,
    /// A backend's own copy of the weights in the layout its kernels want (e.g. the SIMD
    /// backends' interleaved Q8_0), made once at load by `Backend::prepare`. `data` stays
    /// the reference and stays readable, but a backend whose kernels read only the copy
    /// releases its mapped pages ([`Matrix::release_stored`]) so the weights are resident
    /// once.
    pub prepared: Option<Arc<dyn Any + Send + Sync>>,
}

impl Matrix {
    /// Bytes in one row.
    pub fn row_bytes(&self) -> usize {
        // Shapes are validated when the matrix is built, so the row size exists.
        self.dtype.row_size(self.cols as u64).unwrap_or(0) as usize
    }

    pub fn row(&self, r: usize) -> &[u8] {
        let rb = self.row_bytes();
        &self.data.as_slice()[r * rb..(r + 1) * rb]
    }

    pub fn bytes(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// Drops the stored bytes' pages from resident memory (see
    /// [`TensorBytes::release_resident`]), for a backend's `prepare` once `prepared` holds
    /// a copy that every kernel of that backend reads instead of `data`. `data` stays valid:
    /// reading it again (another backend, a test) faults the pages back in from the file.
    /// Returns whether anything was released (only memory-mapped files release).
    pub fn release_stored(&self) -> bool {
        self.data.release_resident()
    }
}

impl std::fmt::Debug for Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Matrix({} {} [{} x {}])",
            self.name, self.dtype, self.rows, self.cols
        )
    }
}

/// A 1-D tensor of f32 values (a norm's gains, a bias), widened from its stored type at load.
#[derive(Clone, Default)]
pub struct Vector {
    pub name: String,
    pub data: Vec<f32>,
    /// A device's own copy of the values (e.g. a GPU buffer), made once at load.
    pub prepared: Option<Arc<dyn Any + Send + Sync>>,
}

impl Vector {
    pub fn new(name: impl Into<String>, data: Vec<f32>) -> Self {
        Self {
            name: name.into(),
            data,
            prepared: None,
        }
    }
}

impl std::ops::Deref for Vector {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        &self.data
    }
}

impl std::fmt::Debug for Vector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Vector({} [{}])", self.name, self.data.len())
    }
}
