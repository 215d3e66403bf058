//! The GGUF file format: a validating reader that exposes metadata and zero-copy tensor bytes
//! over a memory map or an owned buffer, and a writer for GGUF v3 files.
//!
//! A model split into several files by llama.cpp's `gguf-split` (`NAME-00001-of-00003.gguf`
//! and so on) opens as one [`GgufFile`] from its first part: every part is memory-mapped
//! and each tensor's bytes come from the part that holds them (see [`split`]).
//!
//! The reader accepts little-endian GGUF versions 2 and 3 (which share one layout) and refuses
//! anything malformed with a [`GgufError`] naming the problem, the key or tensor and the byte
//! offset. Strings (keys, names and string values) must be valid UTF-8; a file with invalid
//! UTF-8 is refused rather than altered. Parsing never reads out of bounds, never panics, and
//! never reserves memory for a count that the remaining bytes cannot back.

mod error;
mod reader;
pub mod split;
mod value;
mod writer;

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use error::GgufError;
pub use inferno_tensor::bytes::{MappedFile, Storage, TensorBytes};
pub use inferno_tensor::GgmlType;
pub use value::Value;
pub use writer::GgufWriter;

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Data alignment used when a file has no `general.alignment` key.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest nesting of arrays inside a metadata value that the reader and writer accept.
pub const MAX_ARRAY_DEPTH: usize = 16;
/// Most dimensions a tensor may have.
pub const MAX_DIMS: usize = 4;

/// Where a tensor is and what it holds, as described by the file's tensor table.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// Shape in ggml order: `dims[0]` is the fastest-varying dimension (the row length).
    pub dims: Vec<u64>,
    pub dtype: GgmlType,
    /// Start of the tensor's bytes, relative to the data section.
    pub offset: u64,
    /// Size of the tensor's bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (saturating, though parsed tensors never overflow).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |acc, &d| acc.saturating_mul(d))
    }
}

/// A parsed and validated GGUF model, holding its bytes: one file, or every part of a split
/// model (the metadata from the first part, the tensors from all of them).
pub struct GgufFile {
    parts: Vec<Part>,
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    /// The index in `parts` of the file holding each tensor, in the order of `tensors`.
    tensor_part: Vec<usize>,
}

/// One file of a model: its bytes, where its data section starts and where it was read from.
struct Part {
    storage: Arc<Storage>,
    data_offset: u64,
    path: Option<PathBuf>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("parts", &self.parts.len())
            .field("file_size", &self.file_size())
            .field("metadata_entries", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset())
            .finish()
    }
}

/// Memory-maps the file at `path` read-only (an empty file is held as an empty buffer).
fn map_file(path: &Path) -> Result<Storage, std::io::Error> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    Ok(if len == 0 {
        // Some platforms refuse to map an empty file; it is invalid GGUF either way.
        Storage::Owned(Vec::new())
    } else {
        // SAFETY: the map is read-only and the file is treated as immutable while it is
        // open, as model files are. Another process truncating or rewriting the file in
        // the meantime is outside what this reader can defend against.
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        Storage::Mmap(MappedFile::new(map))
    })
}

impl GgufFile {
    /// Memory-maps and parses the file at `path` (read-only). When it is the first part of a
    /// split model, every other part is opened beside it (see [`split`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let storage = map_file(path).map_err(|error| GgufError::Io {
            path: path.to_path_buf(),
            error,
        })?;
        let parsed = reader::parse(&storage)?;
        match split::Split::of(&parsed)? {
            Some(s) if s.count > 1 => split::open_parts(path, storage, parsed, s),
            _ => Ok(Self::single(storage, parsed, Some(path.to_path_buf()))),
        }
    }

    /// Parses a GGUF file image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::from_storage(Storage::Owned(bytes))
    }

    /// Parses a GGUF file image from either kind of storage (one file: a split model's
    /// other parts are not looked for).
    pub fn from_storage(storage: Storage) -> Result<Self, GgufError> {
        let p = reader::parse(&storage)?;
        Ok(Self::single(storage, p, None))
    }

    /// Joins the parts of a split model held in memory, first part first, checked as
    /// [`GgufFile::open`] checks files (the labels name the parts in errors).
    pub fn from_split_bytes(parts: Vec<(String, Vec<u8>)>) -> Result<Self, GgufError> {
        let mut parsed = Vec::with_capacity(parts.len());
        for (label, bytes) in parts {
            let storage = Storage::Owned(bytes);
            let path = PathBuf::from(label);
            let p = reader::parse(&storage).map_err(|e| GgufError::in_part(&path, e))?;
            parsed.push((path, storage, p));
        }
        let mut joined = split::join(parsed)?;
        // Labels, not files.
        for part in &mut joined.parts {
            part.path = None;
        }
        Ok(joined)
    }

    fn single(storage: Storage, p: reader::Parsed, path: Option<PathBuf>) -> Self {
        let n = p.tensors.len();
        GgufFile {
            parts: vec![Part {
                storage: Arc::new(storage),
                data_offset: p.data_offset,
                path,
            }],
            version: p.version,
            alignment: p.alignment,
            metadata: p.metadata,
            key_index: p.key_index,
            tensors: p.tensors,
            tensor_index: p.tensor_index,
            tensor_part: vec![0; n],
        }
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data alignment in bytes (`general.alignment`, or 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// All metadata entries, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_owned()))
    }

    fn wrong_type(key: &str, expected: &'static str, found: &Value) -> GgufError {
        GgufError::WrongType {
            key: key.to_owned(),
            expected,
            found: found.describe(),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| Self::wrong_type(key, "string", v))
    }

    /// Any non-negative integer value.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.require(key)?;
        v.as_u64()
            .ok_or_else(|| Self::wrong_type(key, "non-negative integer", v))
    }

    /// Any integer value in `u32` range.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.require(key)?;
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| Self::wrong_type(key, "integer in u32 range", v))
    }

    /// Any numeric value, converted to `f32`.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.require(key)?;
        v.as_f32().ok_or_else(|| Self::wrong_type(key, "number", v))
    }

    pub fn get_array(&self, key: &str) -> Result<&[Value], GgufError> {
        let v = self.require(key)?;
        v.as_array()
            .ok_or_else(|| Self::wrong_type(key, "array", v))
    }

    /// The model architecture (`general.architecture`).
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The bytes of tensor `name`, without copying.
    pub fn tensor_data(&self, name: &str) -> Result<TensorBytes, GgufError> {
        let i = *self
            .tensor_index
            .get(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_owned()))?;
        let (info, part) = (&self.tensors[i], &self.parts[self.tensor_part[i]]);
        // Parsing checked that data_offset + offset + n_bytes lies within the part's
        // storage, so this view is always made.
        TensorBytes::within(
            Arc::clone(&part.storage),
            (part.data_offset + info.offset) as usize,
            info.n_bytes as usize,
        )
        .ok_or_else(|| GgufError::InvalidTensor {
            tensor: name.to_owned(),
            reason: "its bytes lie outside the file".into(),
        })
    }

    /// Start of the tensor data section, from the start of the (first) file.
    pub fn data_offset(&self) -> u64 {
        self.parts[0].data_offset
    }

    /// Bytes of the file, or of all the parts of a split model together.
    pub fn file_size(&self) -> u64 {
        self.parts.iter().map(|p| p.storage.len() as u64).sum()
    }

    /// The whole image of the (first) file.
    pub fn bytes(&self) -> &[u8] {
        &self.parts[0].storage
    }

    /// How many files the model was read from (more than one for a split model).
    pub fn part_count(&self) -> usize {
        self.parts.len()
    }

    /// The files the model was read from, first part first (empty for an image held in
    /// memory).
    pub fn paths(&self) -> Vec<&Path> {
        self.parts
            .iter()
            .filter_map(|p| p.path.as_deref())
            .collect()
    }

    /// Releases once more every range released so far ([`TensorBytes::release_resident`]),
    /// for a loader to call when it has read every tensor it needs from the map. A read
    /// fault may map a whole large page-cache folio (2 MiB), so reading one tensor (a norm
    /// widened to f32, the next matrix to repack) can bring back pages of a neighbour
    /// released before it. Returns how many ranges were released again.
    pub fn release_again(&self) -> usize {
        self.parts
            .iter()
            .map(|part| part.storage.release_again())
            .sum()
    }
}

#[cfg(test)]
mod tests;
