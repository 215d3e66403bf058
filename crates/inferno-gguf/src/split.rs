//! Models split across several GGUF files, as llama.cpp's `gguf-split` writes them: parts
//! named `PREFIX-00001-of-00003.gguf`, `PREFIX-00002-of-00003.gguf`, ..., each a complete
//! GGUF file holding some of the tensors. The first part carries the model's metadata; every
//! part carries `split.no` (its index from 0), `split.count` and `split.tensors.count` (the
//! tensors of all parts together). llama.cpp opens a split model from its first part and
//! finds the others by name; so does [`super::GgufFile::open`], checking each part's
//! `split.no` and `split.count`, that no tensor name repeats across parts and that the
//! tensors add up to `split.tensors.count`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::reader::Parsed;
use super::{map_file, GgufError, GgufFile, Part, Storage, Value};

/// Index of a part, from 0 (the first part is 0; file names count from 1).
pub const KEY_NO: &str = "split.no";
/// How many parts the model has.
pub const KEY_COUNT: &str = "split.count";
/// How many tensors all the parts hold together.
pub const KEY_TENSORS: &str = "split.tensors.count";

/// Where a file sits in a split model, from its metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    /// This part's index, from 0.
    pub no: u64,
    /// How many parts there are.
    pub count: u64,
    /// Tensors in all parts together, when the file says.
    pub tensors: Option<u64>,
}

impl Split {
    /// The split keys of a parsed file; `None` when it has no `split.count` (an ordinary
    /// file).
    pub(crate) fn of(p: &Parsed) -> Result<Option<Self>, GgufError> {
        let get = |key: &str| p.key_index.get(key).map(|&i| &p.metadata[i].1);
        let int = |key: &str, v: &Value| {
            v.as_u64().ok_or_else(|| GgufError::WrongType {
                key: key.to_owned(),
                expected: "non-negative integer",
                found: v.describe(),
            })
        };
        let Some(count) = get(KEY_COUNT) else {
            return Ok(None);
        };
        let count = int(KEY_COUNT, count)?;
        let no = match get(KEY_NO) {
            Some(v) => int(KEY_NO, v)?,
            None if count <= 1 => 0,
            None => return Err(GgufError::MissingKey(KEY_NO.into())),
        };
        let tensors = get(KEY_TENSORS).map(|v| int(KEY_TENSORS, v)).transpose()?;
        Ok(Some(Split { no, count, tensors }))
    }
}

/// The path of part `no` (from 0) of `count`, for a split model whose part `at` (from 0)
/// is `path`: the `-NNNNN-of-MMMMM.gguf` ending of the name is rewritten, as llama.cpp
/// does. `None` when `path` does not end as part `at` of `count` should.
pub fn part_path(path: &Path, at: u64, count: u64, no: u64) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    let ending = format!("-{:05}-of-{:05}.gguf", at + 1, count);
    let prefix = name.strip_suffix(&ending)?;
    if prefix.is_empty() {
        return None;
    }
    Some(path.with_file_name(format!("{prefix}-{:05}-of-{count:05}.gguf", no + 1)))
}

/// Recognises a split part's file name: `(prefix, no from 0, count)` for
/// `PREFIX-00002-of-00003.gguf`. Any directories before the name stay in the prefix.
pub fn parse_part_name(name: &str) -> Option<(&str, u64, u64)> {
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(count) || !digits(no) || prefix.is_empty() {
        return None;
    }
    let (no, count): (u64, u64) = (no.parse().ok()?, count.parse().ok()?);
    (no >= 1 && no <= count).then_some((prefix, no - 1, count))
}

/// Opens every other part of the split model whose first part is `first` (already mapped
/// and parsed) and joins them.
pub(crate) fn open_parts(
    first: &Path,
    storage: Storage,
    parsed: Parsed,
    split: Split,
) -> Result<GgufFile, GgufError> {
    if split.no != 0 {
        return Err(GgufError::NotFirstSplitPart {
            path: first.to_path_buf(),
            no: split.no + 1,
            count: split.count,
            first: part_path(first, split.no, split.count, 0),
        });
    }
    if split.count > u64::from(u16::MAX) {
        return Err(GgufError::SplitPart {
            path: first.to_path_buf(),
            reason: format!(
                "{KEY_COUNT} is {}, more parts than a split has",
                split.count
            ),
        });
    }
    let Some(_) = part_path(first, 0, split.count, 0) else {
        return Err(GgufError::SplitPart {
            path: first.to_path_buf(),
            reason: format!(
                "it is the first of {} parts, but its name does not end in -00001-of-{:05}.gguf, \
                 so the other parts cannot be found",
                split.count, split.count
            ),
        });
    };
    let mut parts = vec![(first.to_path_buf(), storage, parsed)];
    for no in 1..split.count {
        // part_path succeeded for part 0 above, so it does for every part.
        let path = part_path(first, 0, split.count, no).unwrap_or_default();
        let storage = map_file(&path).map_err(|error| GgufError::MissingSplitPart {
            path: path.clone(),
            no: no + 1,
            count: split.count,
            error,
        })?;
        let p = super::reader::parse(&storage).map_err(|e| GgufError::in_part(&path, e))?;
        parts.push((path, storage, p));
    }
    join(parts)
}

/// What the first part alone gives a split model: version, alignment, metadata and its index.
type FirstPart = (u32, u64, Vec<(String, Value)>, HashMap<String, usize>);

/// Joins parsed parts, first part first: checks each part's place and the tensor count,
/// and takes the metadata from the first part.
pub(crate) fn join(parts: Vec<(PathBuf, Storage, Parsed)>) -> Result<GgufFile, GgufError> {
    let given = parts.len() as u64;
    // What the first part says; every other part must agree.
    let mut count = 0;
    let mut tensors = Vec::new();
    let mut tensor_part: Vec<usize> = Vec::new();
    let mut tensor_index: HashMap<String, usize> = HashMap::new();
    // Which part each tensor came from, for the error naming a repeated one.
    let mut files: Vec<PathBuf> = Vec::with_capacity(parts.len());
    let mut out_parts = Vec::with_capacity(parts.len());
    let mut first: Option<FirstPart> = None;
    let mut expected_tensors = None;
    for (i, (path, storage, p)) in parts.into_iter().enumerate() {
        let bad = |reason: String| GgufError::SplitPart {
            path: path.clone(),
            reason,
        };
        let Some(split) = Split::of(&p).map_err(|e| GgufError::in_part(&path, e))? else {
            return Err(bad(format!(
                "it has no {KEY_COUNT} key: it is not part {} of a split model",
                i + 1
            )));
        };
        if i == 0 {
            count = split.count;
        }
        if split.count != count {
            return Err(bad(format!(
                "it says the model has {} parts ({KEY_COUNT}), the first part says {count}",
                split.count
            )));
        }
        if split.no != i as u64 {
            return Err(bad(format!(
                "it is part {} of the split ({KEY_NO} = {}), expected part {}",
                split.no + 1,
                split.no,
                i + 1
            )));
        }
        if i == 0 {
            expected_tensors = split.tensors;
        }
        for t in p.tensors {
            if let Some(&j) = tensor_index.get(&t.name) {
                return Err(bad(format!(
                    "tensor '{}' is also in {}",
                    t.name,
                    files[tensor_part[j]].display()
                )));
            }
            tensor_index.insert(t.name.clone(), tensors.len());
            tensor_part.push(i);
            tensors.push(t);
        }
        files.push(path.clone());
        if i == 0 {
            first = Some((p.version, p.alignment, p.metadata, p.key_index));
        }
        out_parts.push(Part {
            storage: Arc::new(storage),
            data_offset: p.data_offset,
            path: Some(path),
        });
    }
    if given != count {
        return Err(GgufError::SplitPart {
            path: files.first().cloned().unwrap_or_default(),
            reason: format!("it says the model has {count} parts ({KEY_COUNT}), {given} given"),
        });
    }
    let Some((version, alignment, metadata, key_index)) = first else {
        return Err(GgufError::SplitPart {
            path: PathBuf::new(),
            reason: "a split model needs at least one part".into(),
        });
    };
    if let Some(n) = expected_tensors.filter(|&n| n != tensors.len() as u64) {
        return Err(GgufError::SplitPart {
            path: files[0].clone(),
            reason: format!(
                "{KEY_TENSORS} is {n}, but the {count} parts hold {} tensors",
                tensors.len()
            ),
        });
    }
    Ok(GgufFile {
        parts: out_parts,
        version,
        alignment,
        metadata,
        key_index,
        tensors,
        tensor_index,
        tensor_part,
    })
}
