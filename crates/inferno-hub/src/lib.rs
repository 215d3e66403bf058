//! Models by name from the Hugging Face Hub: a reference such as
//! `Qwen/Qwen3-0.6B-GGUF:Q8_0` ([`reference`](mod@reference)) is resolved to a GGUF file of
//! the repository ([`quant`]), downloaded into the cache Python's `huggingface_hub` shares
//! ([`cache`], [`download`]) and opened from there like any local file. A split model's
//! parts all come down together.
//!
//! The environment is read as `huggingface_hub` reads it: `HF_ENDPOINT` (a mirror),
//! `HF_HOME` / `HF_HUB_CACHE` (the cache), `HF_TOKEN` or the token file `HF_TOKEN_PATH`
//! (default `$HF_HOME/token`, what `hf auth login` writes), and `HF_HUB_OFFLINE=1` (the cache
//! only, no network). A token file given on the command line comes before all of them.

pub mod cache;
pub mod download;
mod http;
pub mod quant;
pub mod reference;

use std::path::{Path, PathBuf};

use tracing::{info, warn};

pub use cache::{cached_models, hub_cache_dir, CachedModel, Removed};
pub use quant::RepoModel;
pub use reference::{ModelRef, ModelSpec};

/// The public Hub.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// Where and how to reach the Hub.
#[derive(Clone, Debug)]
pub struct HubOptions {
    /// The Hub's base URL (`HF_ENDPOINT`), without a trailing `/`.
    pub endpoint: String,
    /// The cache directory ([`hub_cache_dir`]).
    pub cache: PathBuf,
    /// The access token for gated and private repositories.
    pub token: Option<Token>,
    /// Use the cache only (`HF_HUB_OFFLINE`).
    pub offline: bool,
}

impl HubOptions {
    /// The options the environment gives, with the token read from `token_file` when one is
    /// named (`--hf-token-file`).
    pub fn from_env(token_file: Option<&Path>) -> Result<Self, HubError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let endpoint = var("HF_ENDPOINT")
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string())
            .trim_end_matches('/')
            .to_string();
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|error| HubError::Io {
                path: p.to_path_buf(),
                error,
            })
        };
        let token = match token_file {
            Some(p) => Some(read(p)?),
            None => match var("HF_TOKEN") {
                Some(t) => Some(t),
                None => {
                    let path = var("HF_TOKEN_PATH")
                        .map(PathBuf::from)
                        .unwrap_or_else(|| cache::hf_home().join("token"));
                    std::fs::read_to_string(path).ok()
                }
            },
        }
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .map(Token);
        let offline = var("HF_HUB_OFFLINE").is_some_and(|v| {
            matches!(
                v.trim().to_ascii_uppercase().as_str(),
                "1" | "ON" | "YES" | "TRUE"
            )
        });
        Ok(HubOptions {
            endpoint,
            cache: hub_cache_dir(),
            token,
            offline,
        })
    }
}

/// A Hub access token. It shows as `***` when printed, so no log line or error carries
/// it; only the Hub's client reads it (`Token::expose`).
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    pub fn new(token: impl Into<String>) -> Self {
        Token(token.into())
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(***)")
    }
}

/// What can go wrong getting a model from the Hub.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{0}")]
    Reference(String),

    #[error("{0}")]
    Select(String),

    #[error(
        "{repo} is gated: {}{message}",
        if *with_token {
            "the token given has no access to it; accept its conditions at "
        } else {
            "accept its conditions at "
        },
        message = gated_hint(endpoint, repo, *with_token, message)
    )]
    Gated {
        repo: String,
        endpoint: String,
        with_token: bool,
        message: String,
    },

    #[error("{what} was not found on {endpoint}{hint}")]
    NotFound {
        what: String,
        endpoint: String,
        hint: String,
    },

    #[error("{what}: the Hub answered HTTP {status} {message}")]
    Http {
        what: String,
        status: u16,
        message: String,
    },

    #[error(
        "cannot reach the Hub at {endpoint}: {error} (models already pulled run with \
         HF_HUB_OFFLINE=1)"
    )]
    Network { endpoint: String, error: String },

    #[error("{what} is not in the cache {}{why}", cache.display())]
    NotCached {
        what: String,
        cache: PathBuf,
        why: String,
    },

    #[error(
        "{file} does not match the sha256 the Hub lists (expected {expected}, got {actual}): \
         the download is corrupt and was removed; pull it again"
    )]
    Checksum {
        file: String,
        expected: String,
        actual: String,
    },

    #[error("cannot download {what}: {error}")]
    Download { what: String, error: String },

    #[error("{}: {error}", path.display())]
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
}

fn gated_hint(endpoint: &str, repo: &str, with_token: bool, message: &str) -> String {
    let how = if with_token {
        "and use a token of the account that did"
    } else {
        "then pass an access token of that account: set HF_TOKEN=hf_... or pass \
         --hf-token-file FILE (or log in with `hf auth login`)"
    };
    let said = if message.is_empty() {
        String::new()
    } else {
        format!(" (the Hub says: {message})")
    };
    format!("{endpoint}/{repo} {how}{said}")
}

/// A model pulled into the cache.
#[derive(Clone, Debug)]
pub struct Pulled {
    /// The first (or only) file, in the cache's snapshot.
    pub path: PathBuf,
    /// Every part, first first.
    pub parts: Vec<PathBuf>,
    pub repo: String,
    pub commit: String,
    pub model: RepoModel,
    /// Bytes downloaded now (0 when everything was cached).
    pub downloaded: u64,
}

/// A model file to open: `text` as a local path when it is one, else the model a Hub
/// reference names, pulled first when not cached.
pub fn resolve(text: &str, opts: &HubOptions) -> Result<PathBuf, HubError> {
    match ModelSpec::parse(text).map_err(HubError::Reference)? {
        ModelSpec::Local(path) => Ok(path),
        ModelSpec::Hub(r) => pull(&r, opts).map(|p| p.path),
    }
}

/// Makes the model `r` names present in the cache, downloading what is missing (or, offline,
/// finds it there).
pub fn pull(r: &ModelRef, opts: &HubOptions) -> Result<Pulled, HubError> {
    if opts.offline {
        return cached(r, opts, "(HF_HUB_OFFLINE is set, so nothing is downloaded)");
    }
    let client = http::Client::new(opts)?;
    let listing = match download::listing(&client, opts, &r.repo, r.revision()) {
        Ok(l) => l,
        Err(e @ HubError::Network { .. }) => {
            // As huggingface_hub does: what the cache has for this revision still runs.
            return match cached(r, opts, "") {
                Ok(p) => {
                    warn!(error = %e, model = %r, "the Hub is unreachable: using the cached copy");
                    Ok(p)
                }
                Err(_) => Err(e),
            };
        }
        Err(e) => return Err(e),
    };
    let names: Vec<&str> = listing.files.iter().map(|f| f.path.as_str()).collect();
    let found = quant::models(&names);
    let model = quant::select(&found, &r.repo, r.quant.as_deref(), r.file.as_deref())
        .map_err(HubError::Select)?
        .clone();
    let missing = model.missing_parts();
    if !missing.is_empty() {
        return Err(HubError::Select(format!(
            "{} is split into {} parts, but {} lacks {}",
            model.first(),
            model.expected_parts,
            r.repo,
            missing.join(", ")
        )));
    }
    let total: u64 = model
        .parts
        .iter()
        .filter_map(|p| listing.files.iter().find(|f| &f.path == p)?.size)
        .sum();
    info!(
        model = %r,
        file = %model.first(),
        parts = model.parts.len(),
        gib = format!("{:.2}", total as f64 / (1u64 << 30) as f64),
        commit = %listing.commit,
        "pulling"
    );
    let mut parts = Vec::with_capacity(model.parts.len());
    let mut downloaded = 0;
    for part in &model.parts {
        let file = listing
            .files
            .iter()
            .find(|f| &f.path == part)
            .ok_or_else(|| HubError::Select(format!("{} lacks {part}", r.repo)))?;
        let (path, n) = download::ensure_file(&client, opts, &r.repo, &listing.commit, file)?;
        downloaded += n;
        parts.push(path);
    }
    let rc = cache::RepoCache::new(&opts.cache, &r.repo);
    rc.write_ref(r.revision(), &listing.commit)
        .map_err(|error| HubError::Io {
            path: rc.dir().join("refs").join(r.revision()),
            error,
        })?;
    Ok(Pulled {
        path: parts[0].clone(),
        parts,
        repo: r.repo.clone(),
        commit: listing.commit,
        model,
        downloaded,
    })
}

/// The model `r` names, from the cache alone; `why` ends the error when it is not there.
pub fn cached(r: &ModelRef, opts: &HubOptions, why: &str) -> Result<Pulled, HubError> {
    let rc = cache::RepoCache::new(&opts.cache, &r.repo);
    let not_cached = |what: String, why: &str| HubError::NotCached {
        what,
        cache: opts.cache.clone(),
        why: if why.is_empty() {
            String::new()
        } else {
            format!(" {why}")
        },
    };
    let Some(commit) = rc.commit_for(r.revision()) else {
        return Err(not_cached(format!("{} at {}", r.repo, r.revision()), why));
    };
    let files = rc.snapshot_files(&commit);
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    let found = quant::models(&names);
    let model = quant::select(&found, &r.repo, r.quant.as_deref(), r.file.as_deref())
        .map_err(|e| not_cached(r.to_string(), format!("({e}) {why}").trim_end()))?
        .clone();
    let missing = model.missing_parts();
    if !missing.is_empty() {
        return Err(not_cached(
            format!("all of {r} (it lacks {})", missing.join(", ")),
            why,
        ));
    }
    let parts: Vec<PathBuf> = model
        .parts
        .iter()
        .map(|p| rc.snapshot_file(&commit, p))
        .collect();
    Ok(Pulled {
        path: parts[0].clone(),
        parts,
        repo: r.repo.clone(),
        commit,
        model,
        downloaded: 0,
    })
}

/// Removes the cached model `r` names; see [`cache::remove`].
pub fn remove(r: &ModelRef, opts: &HubOptions) -> Result<Removed, HubError> {
    let p = cached(r, opts, "")?;
    cache::remove(&opts.cache, &p.repo, &p.commit, &p.model).map_err(|error| HubError::Io {
        path: cache::RepoCache::new(&opts.cache, &p.repo).dir(),
        error,
    })
}
