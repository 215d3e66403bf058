//! Getting a repository's files from the Hub: the model-info API for its file list (with
//! each LFS file's sha256 and size), and each file's download into the cache that
//! `huggingface_hub` shares: its cross-process lock, reuse of a blob already cached under
//! another commit, a `.incomplete` file resumed after a dropped connection, the sha256 check
//! of every download, progress as log lines when stderr is not a terminal, and errors that
//! say what to do. The requests go through the `http` module, which keeps the token on the
//! Hub's own origin.

use std::fs;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tracing::{info, warn};
use url::Url;

use super::cache::RepoCache;
use super::http::{Client, Follow, SendError};
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
}

#[derive(Deserialize)]
struct InfoJson {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<SiblingJson>,
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

/// The files of `repo` at `revision`, from `GET /api/models/REPO/revision/REV?blobs=true`.
pub(super) fn listing(
    client: &Client,
    opts: &HubOptions,
    repo: &str,
    revision: &str,
) -> Result<Listing, HubError> {
    let what = format!("revision {revision} of {repo}");
    let mut url = client.hub_url(
        ["api", "models"]
            .into_iter()
            .chain(repo.split('/'))
            .chain(["revision", revision]),
    );
    url.query_pairs_mut().append_pair("blobs", "true");
    let reply = client
        .send("GET", url, &[], Follow::All)
        .map_err(|e| e.into_hub_error(client, opts, repo, &what))?;
    let text = reply
        .response
        .into_string()
        .map_err(|e| HubError::Network {
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
    Ok(Listing { commit, files })
}

/// Makes `file` of `commit` present and checked in the cache, downloading it when needed;
/// returns its path in the snapshot and the bytes downloaded.
pub(super) fn ensure_file(
    client: &Client,
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
    if !cached(&blob) {
        let part = incomplete_path(&blob);
        if let Some(dir) = part.parent() {
            fs::create_dir_all(dir).map_err(io(dir))?;
        }
        let downloaded = Fetch {
            client,
            opts,
            repo,
            commit,
            file,
            sha: &sha,
            part: &part,
        }
        .run()?;
        check_sha256(file, &sha, &part)?;
        fs::rename(&part, &blob).map_err(io(&part))?;
        rc.link(commit, &file.path, &sha).map_err(io(&pointer))?;
        return Ok((pointer, downloaded));
    }
    // Cached under another commit (or by Python): link it.
    rc.link(commit, &file.path, &sha).map_err(io(&pointer))?;
    Ok((pointer, 0))
}

/// Where a blob is written while it downloads: `huggingface_hub`'s name, so either side
/// resumes what the other left.
fn incomplete_path(blob: &Path) -> PathBuf {
    blob.with_extension("incomplete")
}

/// Checks a downloaded file against the sha256 the Hub lists; one that does not match is
/// removed before the error is returned, so nothing uses it and the next pull starts over.
fn check_sha256(file: &RepoFile, sha: &str, path: &Path) -> Result<(), HubError> {
    info!(file = %file.path, "checking the sha256");
    let actual = sha256_file(path).map_err(|error| HubError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    if actual != sha {
        let _ = fs::remove_file(path);
        return Err(HubError::Checksum {
            file: file.path.clone(),
            expected: sha.to_string(),
            actual,
        });
    }
    Ok(())
}

/// Tries of one file's body: the first and this many more, each resuming where the last
/// stopped (as `huggingface_hub` retries).
const RETRIES: u32 = 3;

/// One file's download into its `.incomplete` file: where the Hub says the body is, then
/// the body from the first byte not yet written, retried after a dropped connection.
struct Fetch<'a> {
    client: &'a Client,
    opts: &'a HubOptions,
    repo: &'a str,
    commit: &'a str,
    file: &'a RepoFile,
    sha: &'a str,
    part: &'a Path,
}

/// Why a try of a body failed.
enum Failed {
    /// Worth another try: a dropped or stalled connection, a short body, a server error.
    /// `relocate` asks the Hub again where the body is (a signed storage URL can expire).
    Retry { error: String, relocate: bool },
    /// Another try would fail the same way.
    Final(HubError),
}

impl Fetch<'_> {
    /// The bytes downloaded.
    fn run(&self) -> Result<u64, HubError> {
        let mut progress = Progress::new(&self.file.path);
        let mut body: Option<(Url, Option<u64>)> = None;
        let mut downloaded = 0;
        let mut tries = 0;
        loop {
            let (url, size) = match &body {
                Some(b) => b.clone(),
                None => body.insert(self.locate()?).clone(),
            };
            let size = self.file.size.or(size);
            match self.body(&url, size, &mut progress, &mut downloaded) {
                Ok(()) => {
                    progress.finish();
                    return Ok(downloaded);
                }
                Err(Failed::Final(e)) => return Err(e),
                Err(Failed::Retry { error, relocate }) if tries < RETRIES => {
                    tries += 1;
                    warn!(file = %self.file.path, %error, "the download failed; trying again");
                    if relocate {
                        body = None;
                    }
                    std::thread::sleep(Duration::from_millis(300 << tries));
                }
                Err(Failed::Retry { error, .. }) => {
                    return Err(HubError::Download {
                        what: self.file.path.clone(),
                        error: format!(
                            "gave up after {} tries ({error}); what arrived is kept for the \
                             next pull to resume",
                            RETRIES + 1
                        ),
                    })
                }
            }
        }
    }

    /// Asks the Hub where the body is (`HEAD resolve/COMMIT/FILE`, as `huggingface_hub`
    /// asks): the storage URL its redirect names, or the Hub itself for a file it serves;
    /// and the size it gives. Checks that it is the commit and the object listed.
    fn locate(&self) -> Result<(Url, Option<u64>), HubError> {
        let what = format!("{} in {}", self.file.path, self.repo);
        let url = self.client.hub_url(
            self.repo
                .split('/')
                .chain(["resolve", self.commit])
                .chain(self.file.path.split('/')),
        );
        let reply = self
            .client
            .send("HEAD", url, &[IDENTITY], Follow::SameOrigin)
            .map_err(|e| e.into_hub_error(self.client, self.opts, self.repo, &what))?;
        let differs = |what_differs: &str, listed: &str, served: &str| HubError::Download {
            what: what.clone(),
            error: format!(
                "the Hub lists {what_differs} {listed} but serves {served}; pull again, or \
                 name the commit with @REVISION"
            ),
        };
        if let Some(served) = reply.header("X-Repo-Commit") {
            if served != self.commit {
                return Err(differs("commit", self.commit, served));
            }
        }
        // An LFS file's ETag is its sha256 (`X-Linked-Etag` on a redirect).
        let etag = reply
            .header("X-Linked-Etag")
            .or_else(|| reply.header("ETag"))
            .map(|e| {
                e.trim_start_matches("W/")
                    .trim_matches('"')
                    .to_ascii_lowercase()
            });
        if let Some(etag) = etag.filter(|e| is_sha256(e)) {
            if etag != self.sha {
                return Err(differs("the object", self.sha, &etag));
            }
        }
        let size = reply
            .header("X-Linked-Size")
            .or_else(|| reply.header("Content-Length"))
            .and_then(|s| s.parse().ok());
        let at = if reply.is_redirect() {
            reply.location().ok_or_else(|| HubError::Download {
                what: what.clone(),
                error: "the Hub's redirect names no usable Location".into(),
            })?
        } else {
            reply.url
        };
        Ok((at, size))
    }

    /// One try: the body from the first missing byte, appended to the `.incomplete` file.
    fn body(
        &self,
        url: &Url,
        size: Option<u64>,
        progress: &mut Progress,
        downloaded: &mut u64,
    ) -> Result<(), Failed> {
        let io = |error| {
            Failed::Final(HubError::Io {
                path: self.part.to_path_buf(),
                error,
            })
        };
        let mut out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.part)
            .map_err(io)?;
        let mut have = out.metadata().map_err(io)?.len();
        if size.is_some_and(|s| have > s) {
            // Longer than the file: not a start of it.
            out.set_len(0).map_err(io)?;
            have = 0;
        }
        if size == Some(have) {
            // Every byte arrived before a rename that did not happen.
            return Ok(());
        }
        let range = format!("bytes={have}-");
        let reply = match self.client.send(
            "GET",
            url.clone(),
            &[("Range", range.as_str()), IDENTITY],
            Follow::All,
        ) {
            Ok(r) => r,
            Err(SendError::Status(416, _)) if have > 0 => {
                // The server has no such range: what is kept is not a start of the file.
                out.set_len(0).map_err(io)?;
                return Err(Failed::Retry {
                    error: "the server refused to resume; starting over".into(),
                    relocate: false,
                });
            }
            Err(e) => return Err(self.failed(e)),
        };
        match reply.response.status() {
            206 => {
                let start = reply
                    .header("Content-Range")
                    .and_then(|r| r.strip_prefix("bytes "))
                    .and_then(|r| r.split('-').next())
                    .and_then(|n| n.parse::<u64>().ok());
                if start != Some(have) {
                    out.set_len(0).map_err(io)?;
                    return Err(Failed::Retry {
                        error: format!("asked for {range}, got another range; starting over"),
                        relocate: false,
                    });
                }
            }
            // The whole file: what was kept goes.
            200 => {
                out.set_len(0).map_err(io)?;
                have = 0;
            }
            status => {
                return Err(Failed::Retry {
                    error: format!("unexpected HTTP {status} for the file's body"),
                    relocate: true,
                })
            }
        }
        progress.start(size, have);
        let mut reader = reply.response.into_reader();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(Failed::Retry {
                        error: e.to_string(),
                        relocate: false,
                    })
                }
            };
            out.write_all(&buf[..n]).map_err(io)?;
            have += n as u64;
            *downloaded += n as u64;
            progress.advance(n as u64);
        }
        match size {
            Some(s) if have < s => Err(Failed::Retry {
                error: format!("the connection closed after {have} of {s} bytes"),
                relocate: false,
            }),
            _ => Ok(()),
        }
    }
}

impl Fetch<'_> {
    /// Whether a request that failed is worth another try.
    fn failed(&self, e: SendError) -> Failed {
        match e {
            SendError::Transport(error) => Failed::Retry {
                error,
                relocate: false,
            },
            // The storage host refuses, or a server fails: the Hub may name another place.
            SendError::Status(status, reply)
                if !self.client.is_hub(&reply.url) || status >= 500 =>
            {
                Failed::Retry {
                    error: format!(
                        "HTTP {status} from {}",
                        reply.url.host_str().unwrap_or("the server")
                    ),
                    relocate: true,
                }
            }
            e => {
                Failed::Final(e.into_hub_error(self.client, self.opts, self.repo, &self.file.path))
            }
        }
    }
}

/// Downloads ask for the bytes as stored: a compressed body would not resume by offset.
const IDENTITY: (&str, &str) = ("Accept-Encoding", "identity");

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
    total: Option<u64>,
    done: u64,
    logged_tenths: u64,
}

impl Progress {
    fn new(file: &str) -> Self {
        Progress {
            file: file.to_string(),
            bar: None,
            total: None,
            done: 0,
            logged_tenths: 0,
        }
    }

    /// A try begins with `done` bytes of `total` already there.
    fn start(&mut self, total: Option<u64>, done: u64) {
        self.total = total;
        self.done = done;
        if std::io::stderr().is_terminal() {
            let bar = self.bar.get_or_insert_with(|| {
                let bar = indicatif::ProgressBar::new(total.unwrap_or(0));
                if let Ok(style) = indicatif::ProgressStyle::with_template(
                    "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} ({eta})",
                ) {
                    bar.set_style(style.progress_chars("=> "));
                }
                bar.set_message(self.file.clone());
                bar
            });
            if let Some(t) = total {
                bar.set_length(t);
            }
            bar.set_position(done);
        } else if self.logged_tenths == 0 {
            info!(
                file = %self.file,
                mib = format!("{:.1}", total.unwrap_or(0) as f64 / 1048576.0),
                resumed_at = done,
                "downloading"
            );
        }
    }

    fn advance(&mut self, n: u64) {
        self.done += n;
        if let Some(bar) = &self.bar {
            bar.set_position(self.done);
        } else if let Some(tenths) = self.total.and_then(|t| (self.done * 10).checked_div(t)) {
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
}
