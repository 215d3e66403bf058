//! Talking to the Hub: the model-info API for a repository's files (with each LFS file's
//! sha256 and size) and downloads through the `hf-hub` crate, which resumes an interrupted
//! file from its `.part`, retries, sends the token to the Hub's host only (not to the storage
//! host it redirects to) and writes the cache's blobs, snapshots and refs. Around it this
//! module adds what the crate lacks: the cross-process lock `huggingface_hub` uses, reuse of
//! a blob already cached under another commit, the sha256 check of every downloaded file,
//! progress as log lines when stderr is not a terminal, and errors that say what to do.

use std::fs;
use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};

use hf_hub::api::sync::{Api, ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};
use serde::Deserialize;
use serde_json::Value;
use tracing::{info, warn};

use super::cache::RepoCache;
use super::{HubError, HubOptions};

/// A file of a repository as the model-info API lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoFile {
    pub path: String,
    pub size: Option<u64>,
    /// The LFS object's sha256 (every GGUF file is stored in LFS).
    pub sha256: Option<String>,
}

/// A repository at one commit.
#[derive(Clone, Debug)]
pub struct Listing {
    pub commit: String,
    pub files: Vec<RepoFile>,
    /// The repository is private or gated: its files are only served with a token.
    pub needs_token: bool,
}

#[derive(Deserialize)]
struct InfoJson {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<SiblingJson>,
    #[serde(default)]
    private: bool,
    /// `false`, or the kind of gating (`"auto"`, `"manual"`).
    #[serde(default)]
    gated: Value,
}

#[derive(Deserialize)]
struct SiblingJson {
    rfilename: String,
    size: Option<u64>,
    lfs: Option<LfsJson>,
}

#[derive(Deserialize)]
struct LfsJson {
    sha256: String,
    size: Option<u64>,
}

/// The `hf-hub` client for these options (its own progress bar off: ours reports), sending
/// the token only `with_token`.
///
/// hf-hub sends its headers, the token among them, on the one-byte size probe it makes at
/// the host the Hub redirects a file to; huggingface_hub drops the token there. So files of
/// a public repository are downloaded without it, and only a private or gated repository's
/// downloads carry it.
pub(super) fn api(opts: &HubOptions, with_token: bool) -> Result<Api, HubError> {
    ApiBuilder::from_cache(Cache::new(opts.cache.clone()))
        .with_endpoint(opts.endpoint.clone())
        .with_token(opts.token.clone().filter(|_| with_token))
        .with_progress(false)
        // A dropped connection resumes from the bytes already written.
        .with_retries(3)
        .with_user_agent("inferno", env!("CARGO_PKG_VERSION"))
        .build()
        .map_err(|e| HubError::Download {
            what: "the Hub client".into(),
            error: e.to_string(),
        })
}

fn repo_at(repo: &str, revision: &str) -> Repo {
    Repo::with_revision(repo.to_string(), RepoType::Model, revision.to_string())
}

/// The files of `repo` at `revision`, from `GET /api/models/REPO/revision/REV?blobs=true`.
pub(super) fn listing(
    api: &Api,
    opts: &HubOptions,
    repo: &str,
    revision: &str,
) -> Result<Listing, HubError> {
    let response = api
        .repo(repo_at(repo, revision))
        .info_request()
        .query("blobs", "true")
        .call()
        .map_err(|e| http_error(e, opts, repo, &format!("revision {revision} of {repo}")))?;
    let text = response.into_string().map_err(|e| HubError::Network {
        endpoint: opts.endpoint.clone(),
        error: e.to_string(),
    })?;
    let info: InfoJson = serde_json::from_str(&text).map_err(|e| HubError::Download {
        what: format!("the file list of {repo}"),
        error: format!("the Hub's answer is not the model-info JSON expected: {e}"),
    })?;
    let commit = info.sha.ok_or_else(|| HubError::Download {
        what: format!("the file list of {repo}"),
        error: "the Hub's answer names no commit (sha)".into(),
    })?;
    let files = info
        .siblings
        .into_iter()
        .map(|s| RepoFile {
            size: s.lfs.as_ref().and_then(|l| l.size).or(s.size),
            sha256: s.lfs.map(|l| l.sha256.to_ascii_lowercase()),
            path: s.rfilename,
        })
        .collect();
    let needs_token = info.private || !matches!(info.gated, Value::Null | Value::Bool(false));
    Ok(Listing {
        commit,
        files,
        needs_token,
    })
}

/// An HTTP failure, said as the Hub means it (`X-Error-Code`, as `huggingface_hub` reads).
fn http_error(e: ureq::Error, opts: &HubOptions, repo: &str, what: &str) -> HubError {
    match e {
        ureq::Error::Status(status, response) => {
            let code = response.header("X-Error-Code").unwrap_or("").to_string();
            let message = response
                .header("X-Error-Message")
                .map(str::to_string)
                .unwrap_or_else(|| response.status_text().to_string());
            status_error(status, &code, &message, opts, repo, what)
        }
        ureq::Error::Transport(t) => HubError::Network {
            endpoint: opts.endpoint.clone(),
            error: t.to_string(),
        },
    }
}

fn status_error(
    status: u16,
    code: &str,
    message: &str,
    opts: &HubOptions,
    repo: &str,
    what: &str,
) -> HubError {
    match (status, code) {
        (_, "GatedRepo") | (403, _) => HubError::Gated {
            repo: repo.to_string(),
            endpoint: opts.endpoint.clone(),
            with_token: opts.token.is_some(),
            message: message.to_string(),
        },
        (_, "RepoNotFound") | (401, _) => HubError::NotFound {
            what: format!("the repository {repo}"),
            endpoint: opts.endpoint.clone(),
            hint: if opts.token.is_some() {
                " (or the token given cannot see it)".into()
            } else {
                " (a private repository needs a token: set HF_TOKEN or pass --hf-token-file)".into()
            },
        },
        (404, _) => HubError::NotFound {
            what: what.to_string(),
            endpoint: opts.endpoint.clone(),
            hint: String::new(),
        },
        _ => HubError::Http {
            what: what.to_string(),
            status,
            message: message.to_string(),
        },
    }
}

/// Makes `file` of `commit` present and checked in the cache, downloading it when needed;
/// returns its path in the snapshot and the bytes downloaded.
pub(super) fn ensure_file(
    api: &Api,
    opts: &HubOptions,
    repo: &str,
    commit: &str,
    file: &RepoFile,
) -> Result<(PathBuf, u64), HubError> {
    let rc = RepoCache::new(&opts.cache, repo);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |error| HubError::Io { path, error }
    };
    let pointer = rc.snapshot_file(commit, &file.path);
    let cached = |p: &Path| {
        fs::metadata(p).is_ok_and(|m| m.is_file() && file.size.is_none_or(|s| s == m.len()))
    };
    if cached(&pointer) {
        return Ok((pointer, 0));
    }
    // Files outside LFS have no sha256 to lock and check by; GGUF files are all in LFS.
    let Some(sha) = file.sha256.clone().filter(|s| is_sha256(s)) else {
        return Err(HubError::Download {
            what: file.path.clone(),
            error: "the Hub lists no sha256 for it (not an LFS file), so it cannot be checked"
                .into(),
        });
    };
    let lock_path = rc.lock_path(&sha);
    let _lock = rc
        .lock(
            &sha,
            || info!(file = %file.path, "waiting for another process downloading the same file"),
        )
        .map_err(io(&lock_path))?;
    // Whoever held the lock may have finished it.
    if cached(&pointer) {
        return Ok((pointer, 0));
    }
    let blob = rc.blob(&sha);
    if cached(&blob) {
        // Cached under another commit (or by Python): link it.
        rc.link(commit, &file.path, &sha).map_err(io(&pointer))?;
        return Ok((pointer, 0));
    }
    finish_complete_part(&rc, &sha, file)?;
    if cached(&blob) {
        rc.link(commit, &file.path, &sha).map_err(io(&pointer))?;
        return Ok((pointer, 0));
    }
    let commit_ref = rc.dir().join("refs").join(commit);
    let had_commit_ref = commit_ref.exists();
    let progress = Progress::new(&file.path);
    let api_repo = api.repo(repo_at(repo, commit));
    let got = match api_repo.download_with_progress(&file.path, progress) {
        Err(ApiError::InvalidResume) => {
            // A `.part` longer than the file: start it over.
            let _ = fs::remove_file(part_path(&blob));
            api_repo.download_with_progress(&file.path, Progress::new(&file.path))
        }
        other => other,
    };
    // hf-hub records the commit as a ref of its own name; huggingface_hub writes none. Its
    // own lock file beside the blob is not part of the cache's layout either (ours, in
    // .locks/, is held, so nobody else holds that one).
    if !had_commit_ref {
        let _ = fs::remove_file(&commit_ref);
    }
    let _ = fs::remove_file(blob.with_extension("lock"));
    let got = got.map_err(|e| api_error(e, opts, repo, &file.path))?;
    let downloaded = fs::metadata(&got).map(|m| m.len()).unwrap_or(0);
    verify(&rc, commit, file, &sha, &got)?;
    Ok((pointer, downloaded))
}

/// A `.part` file already holding every byte (a download stopped just before its rename) is
/// checked and kept, or removed; the crate would ask the server for the bytes past its end.
fn finish_complete_part(rc: &RepoCache, sha: &str, file: &RepoFile) -> Result<(), HubError> {
    let part = part_path(&rc.blob(sha));
    let (Ok(meta), Some(size)) = (fs::metadata(&part), file.size) else {
        return Ok(());
    };
    if meta.len() < size {
        return Ok(());
    }
    let io = |error| HubError::Io {
        path: part.clone(),
        error,
    };
    if meta.len() == size && sha256_file(&part).map_err(io)? == sha {
        fs::rename(&part, rc.blob(sha)).map_err(io)?;
    } else {
        fs::remove_file(&part).map_err(io)?;
    }
    Ok(())
}

/// Where `hf-hub` writes a blob while it downloads it.
fn part_path(blob: &Path) -> PathBuf {
    blob.with_extension("part")
}

/// Checks a downloaded file against the sha256 the Hub lists; a file that does not match is
/// removed (blob and snapshot entry) before the error is returned, so nothing uses it.
fn verify(
    rc: &RepoCache,
    commit: &str,
    file: &RepoFile,
    sha: &str,
    pointer: &Path,
) -> Result<(), HubError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |error| HubError::Io { path, error }
    };
    let blob = fs::canonicalize(pointer).map_err(io(pointer))?;
    info!(file = %file.path, "checking the sha256");
    let actual = sha256_file(&blob).map_err(io(&blob))?;
    if actual != sha {
        let _ = fs::remove_file(pointer);
        let _ = fs::remove_file(&blob);
        return Err(HubError::Checksum {
            file: file.path.clone(),
            expected: sha.to_string(),
            actual,
        });
    }
    // The crate names the blob by the ETag the download answered with; the cache names it
    // by the sha256, so a later pull (or Python) finds it.
    if fs::canonicalize(rc.blob(sha)).ok().as_ref() != Some(&blob) {
        fs::rename(&blob, rc.blob(sha)).map_err(io(&blob))?;
        rc.link(commit, &file.path, sha).map_err(io(pointer))?;
    }
    Ok(())
}

fn api_error(e: ApiError, opts: &HubOptions, repo: &str, file: &str) -> HubError {
    match e {
        ApiError::RequestError(e) => http_error(*e, opts, repo, &format!("{file} in {repo}")),
        ApiError::TooManyRetries(e) => match *e {
            ApiError::RequestError(e) => http_error(*e, opts, repo, &format!("{file} in {repo}")),
            e => HubError::Download {
                what: file.to_string(),
                error: format!("gave up after retries: {e}"),
            },
        },
        e => HubError::Download {
            what: file.to_string(),
            error: e.to_string(),
        },
    }
}

fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The sha256 of a file, in lower-case hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = fs::File::open(path)?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    Ok(ctx
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// A download's progress: a bar on a terminal, else a log line every tenth of the file.
struct Progress {
    file: String,
    bar: Option<indicatif::ProgressBar>,
    total: u64,
    done: u64,
    logged_tenths: u64,
}

impl Progress {
    fn new(file: &str) -> Self {
        Progress {
            file: file.to_string(),
            bar: None,
            total: 0,
            done: 0,
            logged_tenths: 0,
        }
    }
}

impl hf_hub::api::Progress for Progress {
    // Called at the start of every attempt; a resumed one then reports the bytes it has.
    fn init(&mut self, size: usize, _filename: &str) {
        self.total = size as u64;
        self.done = 0;
        if std::io::stderr().is_terminal() {
            let bar = self.bar.get_or_insert_with(|| {
                let bar = indicatif::ProgressBar::new(size as u64);
                if let Ok(style) = indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})",
                ) {
                    bar.set_style(style.progress_chars("=> "));
                }
                bar.set_message(self.file.clone());
                bar
            });
            bar.set_length(size as u64);
            bar.set_position(0);
        } else if self.logged_tenths == 0 {
            info!(
                file = %self.file,
                mib = format!("{:.1}", size as f64 / 1048576.0),
                "downloading"
            );
        }
    }

    fn update(&mut self, size: usize) {
        self.done += size as u64;
        if let Some(bar) = &self.bar {
            bar.set_position(self.done);
        } else if let Some(tenths) = (self.done * 10).checked_div(self.total) {
            if tenths > self.logged_tenths {
                self.logged_tenths = tenths;
                info!(file = %self.file, percent = tenths * 10, "downloading");
            }
        }
    }

    fn finish(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if self.done < self.total {
            warn!(
                file = %self.file,
                received = self.done,
                expected = self.total,
                "the download ended short of the file's size"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_of_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"abc").unwrap();
        // FIPS 180-2's example.
        assert_eq!(
            sha256_file(&p).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn the_hubs_status_codes_say_what_to_do() {
        let opts = HubOptions {
            endpoint: "https://hub.example".into(),
            cache: PathBuf::from("/nonexistent"),
            token: None,
            offline: false,
        };
        let e = status_error(401, "GatedRepo", "Access restricted", &opts, "u/r", "x");
        let text = e.to_string();
        assert!(
            text.contains("u/r is gated")
                && text.contains("HF_TOKEN")
                && text.contains("--hf-token-file"),
            "{text}"
        );
        let e = status_error(401, "RepoNotFound", "", &opts, "u/r", "x").to_string();
        assert!(
            e.contains("no repository u/r") || e.contains("the repository u/r"),
            "{e}"
        );
        let e = status_error(
            404,
            "RevisionNotFound",
            "",
            &opts,
            "u/r",
            "revision v9 of u/r",
        );
        assert!(e.to_string().contains("revision v9 of u/r"), "{e}");
        let with = HubOptions {
            token: Some("t".into()),
            ..opts
        };
        let e = status_error(403, "", "no access", &with, "u/r", "x").to_string();
        assert!(e.contains("the token given"), "{e}");
    }
}
