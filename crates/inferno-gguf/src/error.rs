//! The error type for reading, validating and writing GGUF files.

use std::path::PathBuf;

use inferno_tensor::GgmlType;

/// Everything that can go wrong with a GGUF file. Byte offsets are from the start of the file;
/// messages name the key or tensor involved so a user can tell what is broken without a hex
/// editor.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    // The OS error is in the message and deliberately not a `source`: printed as a chain
    // (`{:#}`), it would otherwise appear twice.
    #[error("cannot read GGUF file {}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },

    #[error("not a GGUF file: the first four bytes are not the magic \"GGUF\"")]
    NotGguf,

    #[error(
        "unsupported GGUF version {0}: only versions 2 and 3 are supported{note}",
        note = version_note(*.0)
    )]
    UnsupportedVersion(u32),

    #[error(
        "big-endian GGUF file (version field reads as {raw:#010x}): \
         only little-endian files are supported"
    )]
    BigEndian { raw: u32 },

    #[error("file truncated: {what} at offset {offset} runs past the end of the file")]
    Truncated { what: String, offset: u64 },

    #[error(
        "file truncated or corrupt: {what} at offset {offset} is {count}, which needs at least \
         {needed} bytes but only {remaining} remain"
    )]
    CountExceedsFile {
        what: String,
        count: u64,
        offset: u64,
        needed: u64,
        remaining: u64,
    },

    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },

    #[error("unknown metadata value type {id} for key '{key}' at offset {offset}")]
    UnknownValueType { key: String, id: u32, offset: u64 },

    #[error("invalid bool byte {byte} (must be 0 or 1) for key '{key}' at offset {offset}")]
    BadBool { key: String, byte: u8, offset: u64 },

    #[error("arrays nested deeper than {limit} levels for key '{key}' at offset {offset}")]
    NestingTooDeep {
        key: String,
        limit: usize,
        offset: u64,
    },

    #[error("duplicate metadata key '{key}' at offset {offset}")]
    DuplicateKey { key: String, offset: u64 },

    #[error("invalid general.alignment: {0} (must be a u32 that is a non-zero power of two)")]
    BadAlignment(String),

    #[error("duplicate tensor name '{name}' at offset {offset}")]
    DuplicateTensor { name: String, offset: u64 },

    #[error("tensor '{tensor}' has {n_dims} dimensions; GGUF allows 1 to 4")]
    BadDimCount { tensor: String, n_dims: u32 },

    #[error("tensor '{tensor}' has a zero-sized dimension (dims {dims:?})")]
    ZeroDim { tensor: String, dims: Vec<u64> },

    #[error("tensor '{tensor}' has unknown ggml type id {id}")]
    UnknownTensorType { tensor: String, id: u32 },

    #[error(
        "tensor '{tensor}': row length {row_len} (dims[0]) is not a multiple of the {dtype} \
         block size {block_size}"
    )]
    BadRowLength {
        tensor: String,
        row_len: u64,
        dtype: GgmlType,
        block_size: u64,
    },

    #[error("tensor '{tensor}': element count or byte size of dims {dims:?} overflows")]
    ShapeOverflow { tensor: String, dims: Vec<u64> },

    #[error(
        "tensor '{tensor}': data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },

    #[error(
        "tensor '{tensor}': data bytes {start}..{end} extend past the end of the file \
         ({file_size} bytes); the file is truncated or corrupt"
    )]
    TensorOutOfBounds {
        tensor: String,
        start: u64,
        end: u64,
        file_size: u64,
    },

    #[error(
        "tensors '{first}' and '{second}' have overlapping data (the first ends at data offset \
         {first_end}, the second starts at {second_start})"
    )]
    OverlappingTensors {
        first: String,
        second: String,
        first_end: u64,
        second_start: u64,
    },

    #[error("missing metadata key '{0}'")]
    MissingKey(String),

    #[error("metadata key '{key}' has the wrong type: expected {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },

    #[error("no tensor named '{0}'")]
    MissingTensor(String),

    #[error("tensor '{tensor}': data is {actual} bytes but its shape and type need {expected}")]
    TensorSizeMismatch {
        tensor: String,
        expected: u64,
        actual: u64,
    },

    #[error("tensor '{tensor}' cannot be written: {reason}")]
    InvalidTensor { tensor: String, reason: String },

    #[error("metadata key '{key}' cannot be written: {reason}")]
    InvalidValue { key: String, reason: String },

    #[error(
        "{} is part {no} of a model split into {count} files: open the first part{}",
        path.display(),
        first.as_ref().map(|f| format!(" ({})", f.display())).unwrap_or_default()
    )]
    NotFirstSplitPart {
        path: PathBuf,
        no: u64,
        count: u64,
        first: Option<PathBuf>,
    },

    #[error("part {no} of {count} of the split model is missing: cannot open {}: {error}", path.display())]
    MissingSplitPart {
        path: PathBuf,
        no: u64,
        count: u64,
        error: std::io::Error,
    },

    #[error("split model part {}: {reason}", path.display())]
    SplitPart { path: PathBuf, reason: String },

    #[error("split model part {}: {error}", path.display())]
    InPart {
        path: PathBuf,
        error: Box<GgufError>,
    },
}

impl GgufError {
    /// `error`, said of the split model part at `path`.
    pub(crate) fn in_part(path: &std::path::Path, error: GgufError) -> Self {
        GgufError::InPart {
            path: path.to_path_buf(),
            error: Box::new(error),
        }
    }
}

fn version_note(version: u32) -> &'static str {
    if version == 1 {
        " (version 1 files are obsolete; re-convert the model)"
    } else {
        ""
    }
}
