//! The bytes of a tensor ([`TensorBytes`]): a zero-copy view into the storage that holds
//! them (a read-only memory map of a model file, or an owned buffer), kept alive by the view.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// Backing bytes of tensors (a GGUF file's): a read-only memory map or an owned buffer.
pub enum Storage {
    Mmap(MappedFile),
    Owned(Vec<u8>),
}

/// A read-only memory map of a GGUF file, with the byte ranges whose pages were released
/// from resident memory ([`TensorBytes::release_resident`]), so they can be released again
/// once loading is over (`GgufFile::release_again`).
pub struct MappedFile {
    map: memmap2::Mmap,
    released: std::sync::Mutex<Vec<(usize, usize)>>,
}

impl MappedFile {
    pub fn new(map: memmap2::Mmap) -> Self {
        MappedFile {
            map,
            released: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Drops the pages of `offset..offset + len` (page-aligned, inside the map) from the
    /// process's resident memory.
    #[cfg(unix)]
    fn advise_dont_need(&self, offset: usize, len: usize) -> bool {
        // SAFETY: MADV_DONTNEED on a read-only, file-backed shared mapping only drops the
        // process's page-table entries: the next access re-reads the same bytes from the
        // file (or the page cache), so every outstanding borrow of the mapping still sees the
        // contents it saw before. The callers pass ranges inside the mapping.
        unsafe {
            self.map
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len)
        }
        .is_ok()
    }

    /// The released ranges, however a panicking holder left the lock.
    #[cfg_attr(not(unix), allow(dead_code))]
    fn released(&self) -> std::sync::MutexGuard<'_, Vec<(usize, usize)>> {
        self.released.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Deref for Storage {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => &m.map,
            Storage::Owned(v) => v,
        }
    }
}

impl Storage {
    /// Releases once more every range of this storage released so far
    /// ([`TensorBytes::release_resident`]); see `GgufFile::release_again`. Returns how many
    /// ranges were released again (none for owned storage).
    pub fn release_again(&self) -> usize {
        match self {
            #[cfg(unix)]
            Storage::Mmap(map) => {
                // Advising takes no lock, so the list is read under its own.
                map.released()
                    .iter()
                    .filter(|&&(offset, len)| map.advise_dont_need(offset, len))
                    .count()
            }
            _ => 0,
        }
    }
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            Storage::Mmap(_) => "Mmap",
            Storage::Owned(_) => "Owned",
        };
        write!(f, "Storage::{kind}({} bytes)", self.len())
    }
}

/// Zero-copy view of a tensor's bytes that keeps the storage alive.
#[derive(Clone)]
pub struct TensorBytes {
    storage: Arc<Storage>,
    start: usize,
    len: usize,
}

impl TensorBytes {
    /// The `len` bytes of `storage` from `start` (a tensor of a GGUF file); `None` when the
    /// range does not lie within the storage, so every view stays inside its mapping.
    pub fn within(storage: Arc<Storage>, start: usize, len: usize) -> Option<Self> {
        let end = start.checked_add(len)?;
        (end <= storage.len()).then_some(TensorBytes {
            storage,
            start,
            len,
        })
    }

    pub fn as_slice(&self) -> &[u8] {
        // Ranges are validated against the storage when the view is made.
        &self.storage[self.start..self.start + self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops this tensor's pages from the process's resident memory when they come from a
    /// memory-mapped file, for a backend that has made its own copy of the values (a
    /// repacked layout) and no longer reads these bytes. Returns whether anything was
    /// released.
    ///
    /// Only whole pages inside the tensor's byte range are released (a page shared with a
    /// neighbouring tensor stays). The mapping is read-only and file-backed, so the bytes
    /// never change: a later read simply faults the page back in from the file. Owned
    /// storage (a whole file image read into memory, or one buffer per tensor that other
    /// clones may share) is kept, and so is everything on platforms without `madvise`.
    pub fn release_resident(&self) -> bool {
        match &*self.storage {
            #[cfg(unix)]
            Storage::Mmap(map) => {
                // `page_interior` keeps the range within this view, which is within the map.
                let Some((offset, len)) = page_interior(self.start, self.len, page_size()) else {
                    return false;
                };
                let done = map.advise_dont_need(offset, len);
                if done {
                    map.released().push((offset, len));
                }
                done
            }
            _ => false,
        }
    }

    /// `len` bytes from `start` of this view, sharing its storage (an expert of a stacked
    /// 3-D tensor, still memory-mapped); `None` past the end.
    pub fn slice(&self, start: usize, len: usize) -> Option<Self> {
        let end = start.checked_add(len)?;
        (end <= self.len).then(|| TensorBytes {
            storage: Arc::clone(&self.storage),
            start: self.start + start,
            len,
        })
    }

    /// Owned bytes, e.g. for repacked or synthetic weights.
    pub fn from_vec(v: Vec<u8>) -> Self {
        let len = v.len();
        TensorBytes {
            storage: Arc::new(Storage::Owned(v)),
            start: 0,
            len,
        }
    }
}

/// The page-aligned part of the byte range `start..start + len` of a page-aligned mapping,
/// as (offset, length); `None` when it holds no whole page.
#[cfg_attr(not(unix), allow(dead_code))]
fn page_interior(start: usize, len: usize, page: usize) -> Option<(usize, usize)> {
    if page == 0 {
        return None;
    }
    let first = start.div_ceil(page).checked_mul(page)?;
    let end = (start.checked_add(len)? / page) * page;
    (end > first).then(|| (first, end - first))
}

/// The system's page size (mappings start on a page boundary).
#[cfg(unix)]
fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions; it returns -1 where the value is unknown.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).unwrap_or(0)
}

impl Deref for TensorBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for TensorBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl fmt::Debug for TensorBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TensorBytes({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_bytes_from_vec() {
        let t = TensorBytes::from_vec(vec![1, 2, 3]);
        assert_eq!(t.as_slice(), &[1, 2, 3]);
        assert_eq!(t.len(), 3);
        let e = TensorBytes::from_vec(Vec::new());
        assert!(e.is_empty());
        assert_eq!(format!("{t:?}"), "TensorBytes(3 bytes)");
    }

    #[test]
    fn page_interior_keeps_only_whole_pages_inside_the_range() {
        assert_eq!(page_interior(0, 8192, 4096), Some((0, 8192)));
        assert_eq!(page_interior(1, 8192, 4096), Some((4096, 4096)));
        assert_eq!(page_interior(100, 4000, 4096), None);
        assert_eq!(page_interior(4096, 4095, 4096), None);
        assert_eq!(page_interior(4000, 20000, 4096), Some((4096, 16384)));
        assert_eq!(page_interior(0, 100, 0), None);
    }
}
