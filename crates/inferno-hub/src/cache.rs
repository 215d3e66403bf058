//! The Hugging Face cache on disk, laid out as Python's `huggingface_hub` lays it out, so
//! either side reuses what the other downloaded:
//!
//! ```text
//! $HF_HUB_CACHE (default $HF_HOME/hub, $HF_HOME default ~/.cache/huggingface)
//! ├── models--USER--REPO/
//! │   ├── blobs/<sha256 of an LFS file>           the bytes, once
//! │   ├── refs/<branch or tag>                    the commit it points to
//! │   └── snapshots/<commit>/<path in the repo>   a relative symlink to its blob
//! └── .locks/models--USER--REPO/<sha256>.lock     held while a blob is being written
//! ```
//!
//! The lock files are the ones `huggingface_hub` takes (it locks them with `flock`, as
//! [`std::fs::File::lock`] does on Unix), so a Python download of the same file waits too.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use super::quant::{models, RepoModel};

/// The cache directory: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
/// `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`, as
/// `huggingface_hub` resolves it.
pub fn hub_cache_dir() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(dir) = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")) {
        return expand_home(PathBuf::from(dir));
    }
    hf_home().join("hub")
}

/// `HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
pub fn hf_home() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(home) = var("HF_HOME") {
        return expand_home(PathBuf::from(home));
    }
    let cache = var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| home_dir().join(".cache"));
    cache.join("huggingface")
}

fn home_dir() -> PathBuf {
    std::env::var_os("HOME")
        .or_else(|| std::env::var_os("USERPROFILE"))
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `~/x` as the shell would expand it (Python's `expanduser`).
fn expand_home(p: PathBuf) -> PathBuf {
    match p.strip_prefix("~") {
        Ok(rest) => home_dir().join(rest),
        Err(_) => p,
    }
}

/// `models--USER--REPO`.
pub fn repo_folder(repo: &str) -> String {
    format!("models--{}", repo.replace('/', "--"))
}

/// A full commit hash (40 hexadecimal digits).
pub fn is_commit(rev: &str) -> bool {
    rev.len() == 40 && rev.bytes().all(|b| b.is_ascii_hexdigit())
}

/// One repository's folder in the cache.
#[derive(Clone, Debug)]
pub struct RepoCache {
    cache: PathBuf,
    folder: String,
}

impl RepoCache {
    pub fn new(cache: &Path, repo: &str) -> Self {
        RepoCache {
            cache: cache.to_path_buf(),
            folder: repo_folder(repo),
        }
    }

    pub fn dir(&self) -> PathBuf {
        self.cache.join(&self.folder)
    }

    /// The commit a revision points to here: a commit itself when its snapshot is cached,
    /// else what `refs/<revision>` holds.
    pub fn commit_for(&self, revision: &str) -> Option<String> {
        if is_commit(revision) && self.snapshot_dir(revision).is_dir() {
            return Some(revision.to_string());
        }
        let text = fs::read_to_string(self.dir().join("refs").join(revision)).ok()?;
        let commit = text.trim();
        (!commit.is_empty()).then(|| commit.to_string())
    }

    /// Records that `revision` points to `commit` (nothing for a revision that is the commit,
    /// as `huggingface_hub` does).
    pub fn write_ref(&self, revision: &str, commit: &str) -> io::Result<()> {
        if revision == commit {
            return Ok(());
        }
        let path = self.dir().join("refs").join(revision);
        if fs::read_to_string(&path).is_ok_and(|c| c.trim() == commit) {
            return Ok(());
        }
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        // Written aside and renamed, so a reader never sees half a hash.
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        fs::write(&tmp, commit)?;
        fs::rename(&tmp, &path)
    }

    /// The refs (branches, tags) that point to `commit`.
    pub fn refs_to(&self, commit: &str) -> Vec<String> {
        let mut out = Vec::new();
        let refs = self.dir().join("refs");
        for (name, path) in walk_files(&refs) {
            if fs::read_to_string(&path).is_ok_and(|c| c.trim() == commit) {
                out.push(name);
            }
        }
        out.sort();
        out
    }

    pub fn snapshot_dir(&self, commit: &str) -> PathBuf {
        self.dir().join("snapshots").join(commit)
    }

    /// Where file `file` of `commit` lives in the cache.
    pub fn snapshot_file(&self, commit: &str, file: &str) -> PathBuf {
        let mut p = self.snapshot_dir(commit);
        p.extend(file.split('/'));
        p
    }

    /// Every file of a cached snapshot, as (path in the repository, path here), sorted.
    pub fn snapshot_files(&self, commit: &str) -> Vec<(String, PathBuf)> {
        walk_files(&self.snapshot_dir(commit))
    }

    /// The commits with a snapshot here.
    pub fn snapshots(&self) -> Vec<String> {
        let mut out: Vec<String> = fs::read_dir(self.dir().join("snapshots"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_dir())
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .collect();
        out.sort();
        out
    }

    pub fn blob(&self, sha256: &str) -> PathBuf {
        self.dir().join("blobs").join(sha256)
    }

    /// Points `snapshots/<commit>/<file>` at `blobs/<sha256>` with a relative symlink, as
    /// `huggingface_hub` does (a copy where symlinks are unavailable).
    pub fn link(&self, commit: &str, file: &str, sha256: &str) -> io::Result<PathBuf> {
        let pointer = self.snapshot_file(commit, file);
        if let Some(dir) = pointer.parent() {
            fs::create_dir_all(dir)?;
        }
        if fs::symlink_metadata(&pointer).is_ok() {
            fs::remove_file(&pointer)?;
        }
        // From snapshots/<commit>/<dirs of file>/ back up to the repository folder.
        let depth = 2 + file.matches('/').count();
        let mut target = PathBuf::new();
        for _ in 0..depth {
            target.push("..");
        }
        target.push("blobs");
        target.push(sha256);
        #[cfg(unix)]
        std::os::unix::fs::symlink(&target, &pointer)?;
        #[cfg(not(unix))]
        fs::copy(self.blob(sha256), &pointer).map(|_| ())?;
        Ok(pointer)
    }

    /// The lock file guarding the blob `sha256` (`.locks/models--USER--REPO/<sha256>.lock`).
    pub fn lock_path(&self, sha256: &str) -> PathBuf {
        self.cache
            .join(".locks")
            .join(&self.folder)
            .join(format!("{sha256}.lock"))
    }

    /// Takes the blob's lock, waiting for another process that holds it; `waiting` is called
    /// once before a wait.
    pub fn lock(&self, sha256: &str, waiting: impl FnOnce()) -> io::Result<File> {
        let path = self.lock_path(sha256);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
        }
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        match file.try_lock() {
            Ok(()) => Ok(file),
            Err(fs::TryLockError::WouldBlock) => {
                waiting();
                file.lock()?;
                Ok(file)
            }
            Err(fs::TryLockError::Error(e)) => Err(e),
        }
    }
}

/// Every regular file (or link to one) under `root`, as (path relative to it with `/`, path).
fn walk_files(root: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let mut stack = vec![(String::new(), root.to_path_buf())];
    while let Some((prefix, dir)) = stack.pop() {
        for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let path = entry.path();
            // Follows the snapshot's symlinks: a link to a missing blob is left out.
            match fs::metadata(&path) {
                Ok(m) if m.is_dir() => stack.push((rel, path)),
                Ok(m) if m.is_file() => out.push((rel, path)),
                _ => {}
            }
        }
    }
    out.sort();
    out
}

/// A GGUF model found in the cache.
#[derive(Clone, Debug)]
pub struct CachedModel {
    /// A reference that names it (`USER/REPO:QUANT`, or `USER/REPO/FILE.gguf` where the
    /// quantization does not single it out; `@REV` where `main` is not this commit).
    pub reference: String,
    pub repo: String,
    pub commit: String,
    pub model: RepoModel,
    /// Bytes of its cached parts.
    pub size: u64,
    /// Its first part.
    pub path: PathBuf,
}

impl CachedModel {
    /// Every part is cached.
    pub fn complete(&self) -> bool {
        self.model.parts.len() == self.model.expected_parts
    }
}

/// The repository a cache folder holds (`models--USER--REPO`); `None` for other folders.
fn repo_of_folder(folder: &str) -> Option<String> {
    let rest = folder.strip_prefix("models--")?;
    let (user, repo) = rest.split_once("--")?;
    Some(format!("{user}/{repo}"))
}

/// Every GGUF model in the cache, by repository then commit.
pub fn cached_models(cache: &Path) -> Vec<CachedModel> {
    let mut folders: Vec<String> = fs::read_dir(cache)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    folders.sort();
    let mut out = Vec::new();
    for folder in folders {
        let Some(repo) = repo_of_folder(&folder) else {
            continue;
        };
        let rc = RepoCache::new(cache, &repo);
        let main = rc.commit_for(super::reference::DEFAULT_REVISION);
        for commit in rc.snapshots() {
            let files = rc.snapshot_files(&commit);
            let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
            let found = models(&names);
            let refs = rc.refs_to(&commit);
            let rev = if main.as_deref() == Some(commit.as_str()) {
                String::new()
            } else {
                format!(
                    "@{}",
                    refs.first().cloned().unwrap_or_else(|| commit.clone())
                )
            };
            for m in &found {
                let unique = m.quant.as_ref().is_some_and(|q| {
                    found.iter().filter(|o| o.quant.as_ref() == Some(q)).count() == 1
                });
                let reference = match (&m.quant, unique) {
                    (Some(q), true) => format!("{repo}:{q}{rev}"),
                    _ => format!("{repo}/{}{rev}", m.first()),
                };
                let size = m
                    .parts
                    .iter()
                    .filter_map(|p| fs::metadata(rc.snapshot_file(&commit, p)).ok())
                    .map(|md| md.len())
                    .sum();
                out.push(CachedModel {
                    reference,
                    repo: repo.clone(),
                    commit: commit.clone(),
                    model: m.clone(),
                    size,
                    path: rc.snapshot_file(&commit, m.first()),
                });
            }
        }
    }
    out
}

/// What [`remove`] took away.
#[derive(Debug, Default)]
pub struct Removed {
    /// Snapshot entries removed.
    pub files: Vec<PathBuf>,
    /// Bytes of the blobs deleted (those no other snapshot file points to).
    pub bytes: u64,
}

/// Removes the files of `model` from snapshot `commit` of `repo`, and each blob no other
/// snapshot file still points to; then folders left empty, and the repository's folder when
/// no snapshot is left in it.
pub fn remove(cache: &Path, repo: &str, commit: &str, model: &RepoModel) -> io::Result<Removed> {
    let rc = RepoCache::new(cache, repo);
    let mut removed = Removed::default();
    let mut blobs = Vec::new();
    for part in &model.parts {
        let pointer = rc.snapshot_file(commit, part);
        let Ok(meta) = fs::symlink_metadata(&pointer) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            if let Ok(blob) = fs::canonicalize(&pointer) {
                blobs.push(blob);
            }
        } else {
            // A copy (where symlinks are unavailable) is its own storage.
            removed.bytes += meta.len();
        }
        fs::remove_file(&pointer)?;
        removed.files.push(pointer);
    }
    // Blobs still pointed to by another snapshot stay.
    let still_used: Vec<PathBuf> = rc
        .snapshots()
        .iter()
        .flat_map(|c| rc.snapshot_files(c))
        .filter_map(|(_, p)| fs::canonicalize(p).ok())
        .collect();
    for blob in blobs {
        if still_used.contains(&blob) {
            continue;
        }
        removed.bytes += fs::metadata(&blob).map(|m| m.len()).unwrap_or(0);
        fs::remove_file(&blob)?;
    }
    // Empty folders, from the removed files up to the snapshot.
    for file in &removed.files {
        let mut dir = file.parent();
        while let Some(d) = dir.filter(|d| d.starts_with(rc.dir().join("snapshots"))) {
            if fs::remove_dir(d).is_err() {
                break;
            }
            dir = d.parent();
        }
    }
    if rc.snapshots().is_empty() {
        fs::remove_dir_all(rc.dir())?;
        let _ = fs::remove_dir_all(cache.join(".locks").join(repo_folder(repo)));
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folder_names_and_commits() {
        assert_eq!(
            repo_folder("Qwen/Qwen3-0.6B-GGUF"),
            "models--Qwen--Qwen3-0.6B-GGUF"
        );
        assert_eq!(
            repo_of_folder("models--Qwen--Qwen3-0.6B-GGUF").as_deref(),
            Some("Qwen/Qwen3-0.6B-GGUF")
        );
        assert_eq!(repo_of_folder("datasets--a--b"), None);
        assert!(is_commit("0123456789abcdef0123456789abcdef01234567"));
        assert!(!is_commit("main"));
    }

    #[cfg(unix)]
    #[test]
    fn links_refs_listing_and_removal() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path();
        let rc = RepoCache::new(cache, "u/r");
        let commit = "a".repeat(40);
        let sha = "b".repeat(64);
        std::fs::create_dir_all(rc.dir().join("blobs")).unwrap();
        std::fs::write(rc.blob(&sha), b"GGUF0123").unwrap();
        let p = rc.link(&commit, "sub/m-Q8_0.gguf", &sha).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"GGUF0123");
        assert_eq!(
            std::fs::read_link(&p).unwrap(),
            Path::new("../../../blobs").join(&sha)
        );
        rc.write_ref("main", &commit).unwrap();
        assert_eq!(rc.commit_for("main"), Some(commit.clone()));
        assert_eq!(rc.commit_for(&commit), Some(commit.clone()));
        assert_eq!(rc.commit_for("v2"), None);
        assert_eq!(rc.refs_to(&commit), ["main"]);

        let listed = cached_models(cache);
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].reference, "u/r:Q8_0");
        assert_eq!(listed[0].size, 8);
        assert_eq!(listed[0].path, p);

        // A second snapshot sharing the blob keeps it when the first is removed.
        let other = "c".repeat(40);
        rc.link(&other, "m-Q8_0.gguf", &sha).unwrap();
        let listed = cached_models(cache);
        assert_eq!(listed[1].reference, format!("u/r:Q8_0@{other}"));
        let r = remove(cache, "u/r", &commit, &listed[0].model).unwrap();
        assert_eq!(r.files, std::slice::from_ref(&p));
        assert_eq!(r.bytes, 0);
        assert!(rc.blob(&sha).exists());
        assert!(!rc.snapshot_dir(&commit).exists());
        let r = remove(cache, "u/r", &other, &listed[1].model).unwrap();
        assert_eq!(r.bytes, 8);
        assert!(!rc.dir().exists());
    }

    #[test]
    fn a_held_lock_makes_the_next_taker_wait() {
        let dir = tempfile::tempdir().unwrap();
        let rc = RepoCache::new(dir.path(), "u/r");
        let held = rc.lock("x", || panic!("nobody holds it yet")).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let rc2 = rc.clone();
        let t = std::thread::spawn(move || {
            let _l = rc2.lock("x", || tx.send(()).unwrap()).unwrap();
        });
        // The second taker reports that it waits, and gets the lock once it is dropped.
        rx.recv().unwrap();
        drop(held);
        t.join().unwrap();
    }
}
