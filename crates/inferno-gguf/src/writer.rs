//! Serialization of GGUF v3 files from metadata and tensors held in memory.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::error::GgufError;
use super::reader::tensor_size;
use super::value::{type_id, Value};
use super::{DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH};
use inferno_tensor::GgmlType;

const ALIGNMENT_KEY: &str = "general.alignment";

/// Builds GGUF v3 files (synthetic models, the built-in demo model, test fixtures, fuzz seeds).
///
/// Metadata keeps insertion order; adding a key twice keeps its first position and the last
/// value, so the output never has duplicate keys. Tensor data is laid out in insertion order,
/// each tensor starting at a multiple of the alignment, with no padding after the last one.
pub struct GgufWriter {
    alignment: u32,
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
    /// First value `add` refused (key, reason); reported by `write_to` and `try_to_bytes`.
    rejected: Option<(String, String)>,
}

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    dtype: GgmlType,
    data: Vec<u8>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty writer with the default alignment of 32 bytes.
    pub fn new() -> Self {
        GgufWriter {
            alignment: DEFAULT_ALIGNMENT as u32,
            metadata: Vec::new(),
            tensors: Vec::new(),
            rejected: None,
        }
    }

    /// Sets the data alignment, recording it as `general.alignment` unless it is the default.
    /// A value that is not a power of two is rounded up to the next one (0 becomes 1), since
    /// readers reject anything else.
    pub fn set_alignment(&mut self, a: u32) {
        let a = a.max(1).checked_next_power_of_two().unwrap_or(1 << 31);
        self.alignment = a;
        if u64::from(a) == DEFAULT_ALIGNMENT {
            self.metadata.retain(|(k, _)| k != ALIGNMENT_KEY);
        } else {
            self.upsert(ALIGNMENT_KEY.to_owned(), Value::U32(a));
        }
    }

    /// The data alignment in bytes.
    pub fn alignment(&self) -> u32 {
        self.alignment
    }

    /// Adds a metadata entry (or replaces the value of an existing key in place).
    ///
    /// A value GGUF cannot encode (an array mixing element types, or arrays nested deeper than
    /// [`MAX_ARRAY_DEPTH`]) is left out; `write_to` and `try_to_bytes` then fail naming it. Use
    /// [`GgufWriter::try_add`] to get the error immediately.
    ///
    /// Adding `general.alignment` as a `u32` power of two also sets the layout alignment; any
    /// other value is written as given (useful for crafting invalid test files) while the layout
    /// keeps the current alignment.
    pub fn add(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        let key = key.into();
        if let Err(reason) = check_encodable(&value, 0) {
            if self.rejected.is_none() {
                self.rejected = Some((key, reason));
            }
            return self;
        }
        if key == ALIGNMENT_KEY {
            if let Value::U32(a) = value {
                if a.is_power_of_two() {
                    self.alignment = a;
                }
            }
        }
        self.upsert(key, value);
        self
    }

    /// Like [`GgufWriter::add`], but reports a value GGUF cannot encode instead of deferring it.
    pub fn try_add(
        &mut self,
        key: impl Into<String>,
        value: Value,
    ) -> Result<&mut Self, GgufError> {
        let key = key.into();
        check_encodable(&value, 0).map_err(|reason| GgufError::InvalidValue {
            key: key.clone(),
            reason,
        })?;
        Ok(self.add(key, value))
    }

    /// Adds a tensor. `dims` is in ggml order (`dims[0]` is the row length); `data` must be
    /// exactly the size the shape and type call for.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        dtype: GgmlType,
        data: Vec<u8>,
    ) -> Result<&mut Self, GgufError> {
        let name = name.into();
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(GgufError::InvalidTensor {
                tensor: name,
                reason: "a tensor with this name was already added".into(),
            });
        }
        let expected = tensor_size(&name, dims, dtype)?;
        if data.len() as u64 != expected {
            return Err(GgufError::TensorSizeMismatch {
                tensor: name,
                expected,
                actual: data.len() as u64,
            });
        }
        self.tensors.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            dtype,
            data,
        });
        Ok(self)
    }

    /// Serializes the whole file into one buffer. Values refused by `add` are not in it; see
    /// [`GgufWriter::try_to_bytes`].
    pub fn to_bytes(&self) -> Vec<u8> {
        let (mut out, offsets) = self.header();
        let data_start = out.len();
        let total = offsets
            .last()
            .zip(self.tensors.last())
            .map_or(0, |(off, t)| *off as usize + t.data.len());
        out.reserve(total);
        for (t, &off) in self.tensors.iter().zip(&offsets) {
            out.resize(data_start + off as usize, 0);
            out.extend_from_slice(&t.data);
        }
        out
    }

    /// Like [`GgufWriter::to_bytes`], but fails if `add` refused a value.
    pub fn try_to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        self.check_rejected()?;
        Ok(self.to_bytes())
    }

    /// Writes the file, streaming tensor data rather than assembling it in memory first.
    pub fn write_to(&self, path: impl AsRef<Path>) -> Result<(), GgufError> {
        let path = path.as_ref();
        self.check_rejected()?;
        let io_err = |error| GgufError::Io {
            path: path.to_path_buf(),
            error,
        };
        let file = File::create(path).map_err(io_err)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let (header, offsets) = self.header();
        w.write_all(&header).map_err(io_err)?;
        let zeros = [0u8; 256];
        let mut pos = 0u64;
        for (t, &off) in self.tensors.iter().zip(&offsets) {
            while pos < off {
                let n = (off - pos).min(zeros.len() as u64) as usize;
                w.write_all(&zeros[..n]).map_err(io_err)?;
                pos += n as u64;
            }
            w.write_all(&t.data).map_err(io_err)?;
            pos += t.data.len() as u64;
        }
        w.flush().map_err(io_err)
    }

    fn check_rejected(&self) -> Result<(), GgufError> {
        match &self.rejected {
            Some((key, reason)) => Err(GgufError::InvalidValue {
                key: key.clone(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    fn upsert(&mut self, key: String, value: Value) {
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.metadata.push((key, value)),
        }
    }

    /// Everything up to the data section (padding included), and each tensor's data offset.
    fn header(&self) -> (Vec<u8>, Vec<u64>) {
        let align = u64::from(self.alignment);
        let mut offsets = Vec::with_capacity(self.tensors.len());
        let mut next = 0u64;
        for t in &self.tensors {
            let off = next.next_multiple_of(align);
            offsets.push(off);
            next = off + t.data.len() as u64;
        }

        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            out.extend_from_slice(&value.type_id().to_le_bytes());
            put_value(&mut out, value);
        }
        for (t, off) in self.tensors.iter().zip(&offsets) {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.dtype.id().to_le_bytes());
            out.extend_from_slice(&off.to_le_bytes());
        }
        let padded = (out.len() as u64).next_multiple_of(align);
        out.resize(padded as usize, 0);
        (out, offsets)
    }
}

/// Checks that `value` can be written: arrays hold one element type and nest at most
/// [`MAX_ARRAY_DEPTH`] deep, the limit readers enforce.
fn check_encodable(value: &Value, depth: usize) -> Result<(), String> {
    let Value::Array(items) = value else {
        return Ok(());
    };
    if depth >= MAX_ARRAY_DEPTH {
        return Err(format!(
            "arrays nested deeper than {MAX_ARRAY_DEPTH} levels"
        ));
    }
    if let Some(first) = items.first() {
        let ty = first.type_id();
        if let Some(odd) = items.iter().find(|v| v.type_id() != ty) {
            return Err(format!(
                "array mixes element types {} and {}",
                first.type_name(),
                odd.type_name()
            ));
        }
        if ty == type_id::ARRAY {
            for item in items {
                check_encodable(item, depth + 1)?;
            }
        }
    }
    Ok(())
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Writes a value's payload (its type id is written by the caller).
fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => out.push(*v),
        Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => out.push(u8::from(*v)),
        Value::String(s) => put_str(out, s),
        Value::Array(items) => {
            // An empty array carries no elements, so readers may not care about its element
            // type; llama.cpp does for `tokenizer.ggml.merges` (strings), the one empty array
            // the model files here have.
            let elem_ty = items.first().map_or(type_id::STRING, Value::type_id);
            out.extend_from_slice(&elem_ty.to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}
