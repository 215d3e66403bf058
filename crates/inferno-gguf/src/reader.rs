//! Parsing and validation of a GGUF byte image. Every count and length is checked against the
//! bytes that remain before memory is reserved, so a crafted file can neither make the reader
//! allocate more than a small multiple of its own size nor read out of bounds.

use std::collections::HashMap;

use super::error::GgufError;
use super::value::{min_encoded_size, type_id, Value};
use super::{TensorInfo, DEFAULT_ALIGNMENT, MAGIC, MAX_ARRAY_DEPTH, MAX_DIMS};
use inferno_tensor::GgmlType;

/// Everything in a GGUF file except the tensor bytes themselves.
pub(crate) struct Parsed {
    pub version: u32,
    pub alignment: u64,
    pub metadata: Vec<(String, Value)>,
    pub key_index: HashMap<String, usize>,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
    pub data_offset: u64,
}

/// Fewest bytes one metadata entry can take: key length, value type, a one-byte value.
const MIN_KV_SIZE: u64 = 8 + 4 + 1;
/// Fewest bytes one tensor info can take: name length, n_dims, one dim, type, offset.
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 4 + 8 + 4 + 8;

/// A bounds-checked read position in the file image. Reads that would run past the end return
/// `None` without moving, so the caller can report the offset where the short item starts.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let bytes = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(bytes)
    }

    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N).and_then(|b| b.try_into().ok())
    }

    fn u8(&mut self) -> Option<u8> {
        self.array::<1>().map(|b| b[0])
    }

    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.array().map(u64::from_le_bytes)
    }

    /// Reads a little-endian scalar of `N` bytes, or reports `what` as truncated.
    fn scalar<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let offset = self.offset();
        self.array().ok_or_else(|| GgufError::Truncated {
            what: what(),
            offset,
        })
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit in what remains.
    fn check_count(
        &self,
        count: u64,
        min_size: u64,
        offset: u64,
        what: impl FnOnce() -> String,
    ) -> Result<usize, GgufError> {
        let needed = count.saturating_mul(min_size);
        let remaining = self.remaining();
        match usize::try_from(count) {
            Ok(n) if needed <= remaining => Ok(n),
            _ => Err(GgufError::CountExceedsFile {
                what: what(),
                count,
                offset,
                needed,
                remaining,
            }),
        }
    }

    /// Reads a GGUF string (u64 length + bytes), which must be valid UTF-8.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len_offset = self.offset();
        let len = u64::from_le_bytes(self.scalar(|| format!("length of {}", what()))?);
        let n = self.check_count(len, 1, len_offset, || format!("length of {}", what()))?;
        let bytes_offset = self.offset();
        // check_count guarantees the bytes are there.
        let bytes = self.take(n).ok_or_else(|| GgufError::Truncated {
            what: what(),
            offset: bytes_offset,
        })?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset: bytes_offset,
            }),
        }
    }
}

/// Parses and validates the header, metadata and tensor table of a GGUF file image, and checks
/// that every tensor's data lies inside `buf` without overlapping another.
pub(crate) fn parse(buf: &[u8]) -> Result<Parsed, GgufError> {
    if buf.len() < MAGIC.len() {
        // A short prefix of the magic is a truncated GGUF file; anything else is not GGUF.
        return Err(if MAGIC.starts_with(buf) {
            GgufError::Truncated {
                what: "header magic".into(),
                offset: 0,
            }
        } else {
            GgufError::NotGguf
        });
    }
    if buf[..MAGIC.len()] != MAGIC {
        return Err(GgufError::NotGguf);
    }
    let mut c = Cursor { buf, pos: 4 };

    let version = u32::from_le_bytes(c.scalar(|| "header version".into())?);
    match version {
        2 | 3 => {}
        // A big-endian writer stores small versions with their bytes swapped.
        v if (1..=3).contains(&v.swap_bytes()) => return Err(GgufError::BigEndian { raw: v }),
        v => return Err(GgufError::UnsupportedVersion(v)),
    }

    let tensor_count_offset = c.offset();
    let tensor_count = u64::from_le_bytes(c.scalar(|| "header tensor count".into())?);
    let kv_count_offset = c.offset();
    let kv_count = u64::from_le_bytes(c.scalar(|| "header metadata count".into())?);
    // The tensor count is checked once the metadata has been read, against what remains then.
    let kv_count = c.check_count(kv_count, MIN_KV_SIZE, kv_count_offset, || {
        "metadata key-value count".into()
    })?;

    let mut metadata = Vec::with_capacity(kv_count);
    let mut key_index = HashMap::with_capacity(kv_count);
    for i in 0..kv_count {
        let key_offset = c.offset();
        let key = c.string(&|| format!("key of metadata entry #{i}"))?;
        if key_index.contains_key(&key) {
            return Err(GgufError::DuplicateKey {
                key,
                offset: key_offset,
            });
        }
        let type_offset = c.offset();
        let ty = u32::from_le_bytes(c.scalar(|| format!("value type of metadata key '{key}'"))?);
        if min_encoded_size(ty).is_none() {
            return Err(GgufError::UnknownValueType {
                key,
                id: ty,
                offset: type_offset,
            });
        }
        let value = read_value(&mut c, ty, &key, 0)?;
        key_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }

    let alignment = match key_index.get("general.alignment").map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
        Some(other) => return Err(GgufError::BadAlignment(other.describe())),
    };

    let tensor_count = c.check_count(
        tensor_count,
        MIN_TENSOR_INFO_SIZE,
        tensor_count_offset,
        || "tensor count".into(),
    )?;
    let mut tensors = Vec::with_capacity(tensor_count);
    let mut tensor_index = HashMap::with_capacity(tensor_count);
    for i in 0..tensor_count {
        let info_offset = c.offset();
        let info = read_tensor_info(&mut c, i, alignment)?;
        if tensor_index.contains_key(&info.name) {
            return Err(GgufError::DuplicateTensor {
                name: info.name,
                offset: info_offset,
            });
        }
        tensor_index.insert(info.name.clone(), tensors.len());
        tensors.push(info);
    }

    let data_offset = c
        .offset()
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| GgufError::Truncated {
            what: "padding before the data section".into(),
            offset: c.offset(),
        })?;
    check_data_ranges(&tensors, data_offset, buf.len() as u64)?;

    Ok(Parsed {
        version,
        alignment,
        metadata,
        key_index,
        tensors,
        tensor_index,
        data_offset,
    })
}

/// Reads one value of on-disk type `ty` (already known to be valid). `depth` counts the arrays
/// enclosing this value, so crafted nesting cannot exhaust the stack.
fn read_value(c: &mut Cursor, ty: u32, key: &str, depth: usize) -> Result<Value, GgufError> {
    let what = || format!("value of metadata key '{key}'");
    Ok(match ty {
        type_id::U8 => Value::U8(u8::from_le_bytes(c.scalar(what)?)),
        type_id::I8 => Value::I8(i8::from_le_bytes(c.scalar(what)?)),
        type_id::U16 => Value::U16(u16::from_le_bytes(c.scalar(what)?)),
        type_id::I16 => Value::I16(i16::from_le_bytes(c.scalar(what)?)),
        type_id::U32 => Value::U32(u32::from_le_bytes(c.scalar(what)?)),
        type_id::I32 => Value::I32(i32::from_le_bytes(c.scalar(what)?)),
        type_id::U64 => Value::U64(u64::from_le_bytes(c.scalar(what)?)),
        type_id::I64 => Value::I64(i64::from_le_bytes(c.scalar(what)?)),
        type_id::F32 => Value::F32(f32::from_le_bytes(c.scalar(what)?)),
        type_id::F64 => Value::F64(f64::from_le_bytes(c.scalar(what)?)),
        type_id::BOOL => {
            let offset = c.offset();
            match c.u8() {
                Some(0) => Value::Bool(false),
                Some(1) => Value::Bool(true),
                Some(byte) => {
                    return Err(GgufError::BadBool {
                        key: key.to_owned(),
                        byte,
                        offset,
                    })
                }
                None => {
                    return Err(GgufError::Truncated {
                        what: what(),
                        offset,
                    })
                }
            }
        }
        type_id::STRING => Value::String(c.string(&what)?),
        type_id::ARRAY => {
            let offset = c.offset();
            if depth >= MAX_ARRAY_DEPTH {
                return Err(GgufError::NestingTooDeep {
                    key: key.to_owned(),
                    limit: MAX_ARRAY_DEPTH,
                    offset,
                });
            }
            let elem_ty = c.u32().ok_or_else(|| GgufError::Truncated {
                what: format!("array element type of metadata key '{key}'"),
                offset,
            })?;
            let Some(min_size) = min_encoded_size(elem_ty) else {
                return Err(GgufError::UnknownValueType {
                    key: key.to_owned(),
                    id: elem_ty,
                    offset,
                });
            };
            let count_offset = c.offset();
            let count = c.u64().ok_or_else(|| GgufError::Truncated {
                what: format!("array length of metadata key '{key}'"),
                offset: count_offset,
            })?;
            let n = c.check_count(count, min_size, count_offset, || {
                format!("array length of metadata key '{key}'")
            })?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(read_value(c, elem_ty, key, depth + 1)?);
            }
            Value::Array(items)
        }
        // Callers only pass ids that min_encoded_size accepted.
        _ => {
            return Err(GgufError::UnknownValueType {
                key: key.to_owned(),
                id: ty,
                offset: c.offset(),
            })
        }
    })
}

/// Reads and validates one tensor info: name, shape, type and data offset.
fn read_tensor_info(c: &mut Cursor, index: usize, alignment: u64) -> Result<TensorInfo, GgufError> {
    let name = c.string(&|| format!("name of tensor info #{index}"))?;
    let n_dims_offset = c.offset();
    let n_dims = c.u32().ok_or_else(|| GgufError::Truncated {
        what: format!("dimension count of tensor info '{name}'"),
        offset: n_dims_offset,
    })?;
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(GgufError::BadDimCount {
            tensor: name,
            n_dims,
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        let offset = c.offset();
        let d = c.u64().ok_or_else(|| GgufError::Truncated {
            what: format!("dimensions of tensor info '{name}'"),
            offset,
        })?;
        dims.push(d);
    }
    let type_offset = c.offset();
    let type_id = c.u32().ok_or_else(|| GgufError::Truncated {
        what: format!("type of tensor info '{name}'"),
        offset: type_offset,
    })?;
    let data_offset_pos = c.offset();
    let offset = c.u64().ok_or_else(|| GgufError::Truncated {
        what: format!("data offset of tensor info '{name}'"),
        offset: data_offset_pos,
    })?;

    let Some(dtype) = GgmlType::from_id(type_id) else {
        return Err(GgufError::UnknownTensorType {
            tensor: name,
            id: type_id,
        });
    };
    let n_bytes = tensor_size(&name, &dims, dtype)?;
    if offset % alignment != 0 {
        return Err(GgufError::MisalignedTensor {
            tensor: name,
            offset,
            alignment,
        });
    }
    Ok(TensorInfo {
        name,
        dims,
        dtype,
        offset,
        n_bytes,
    })
}

/// Byte size of a tensor of shape `dims` (ggml order) and type `dtype`, validating the shape.
pub(crate) fn tensor_size(name: &str, dims: &[u64], dtype: GgmlType) -> Result<u64, GgufError> {
    if dims.is_empty() || dims.len() > MAX_DIMS {
        return Err(GgufError::BadDimCount {
            tensor: name.to_owned(),
            n_dims: u32::try_from(dims.len()).unwrap_or(u32::MAX),
        });
    }
    if dims.contains(&0) {
        return Err(GgufError::ZeroDim {
            tensor: name.to_owned(),
            dims: dims.to_vec(),
        });
    }
    let overflow = || GgufError::ShapeOverflow {
        tensor: name.to_owned(),
        dims: dims.to_vec(),
    };
    // ggml counts elements in an i64, so anything past i64::MAX is unusable even if it fits u64.
    dims.iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| i64::try_from(n).is_ok())
        .ok_or_else(overflow)?;
    let row_len = dims[0];
    let row_bytes = dtype.row_size(row_len).ok_or_else(|| {
        let block_size = dtype.block_size() as u64;
        if !row_len.is_multiple_of(block_size) {
            GgufError::BadRowLength {
                tensor: name.to_owned(),
                row_len,
                dtype,
                block_size,
            }
        } else {
            overflow()
        }
    })?;
    dims[1..]
        .iter()
        .try_fold(row_bytes, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)
}

/// Checks that every tensor's bytes lie inside the file and that no two tensors share bytes.
fn check_data_ranges(
    tensors: &[TensorInfo],
    data_offset: u64,
    file_size: u64,
) -> Result<(), GgufError> {
    for t in tensors {
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(_), Some(end)) if end <= file_size => {}
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    tensor: t.name.clone(),
                    start: start.unwrap_or(u64::MAX),
                    end: end.unwrap_or(u64::MAX),
                    file_size,
                })
            }
        }
    }
    // Sorting by offset makes any overlap show up between neighbours.
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        // In bounds of the file, so these cannot overflow.
        let a_end = a.offset + a.n_bytes;
        if a_end > b.offset {
            return Err(GgufError::OverlappingTensors {
                first: a.name.clone(),
                second: b.name.clone(),
                first_end: a_end,
                second_start: b.offset,
            });
        }
    }
    Ok(())
}
