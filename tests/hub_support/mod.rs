//! A stand-in for the Hugging Face Hub on loopback, answering as the real one does (as
//! `huggingface_hub`'s `file_download.py` and `hf_api.py` expect), for `HF_ENDPOINT`:
//!
//! - `GET /api/models/USER/REPO[/revision/REV]?blobs=true`: the model-info JSON, with the
//!   commit (`sha`) and each file (`siblings`: `rfilename`, `size`, and for LFS files
//!   `lfs.sha256`, `lfs.size`);
//! - `GET|HEAD /USER/REPO/resolve/REV/FILE`: for an LFS file a `302 Found` to another origin
//!   (the storage host: `localhost` while the Hub is `127.0.0.1`, or [`Storage::OtherPort`]
//!   the same address on another port) with `X-Repo-Commit`, `X-Linked-Etag` (the quoted
//!   sha256), `X-Linked-Size` and `ETag`; a small non-LFS file (`README.md`) is answered
//!   directly;
//! - a renamed repository: its old name answers a relative `307` to the new one, on the Hub;
//! - the same under `/mirror/`, for an `HF_ENDPOINT` with a path;
//! - errors as the Hub sends them: `401` + `X-Error-Code: RepoNotFound` for an unknown
//!   repository (and for a private one without its token), `404` + `RevisionNotFound`,
//!   `401` + `GatedRepo` for a gated repository's file without a token, `403` with a token
//!   that has no access;
//! - the storage host: `GET /blob/SHA256` with `Range: bytes=A-[B]` (`206`,
//!   `Content-Range`), and faults the tests switch on: a body cut off after some bytes (the
//!   connection dropped), a corrupted body, a body held back until released.
//!
//! Every request is recorded (which host, path, `Range`, `Authorization`).

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// A repository the stand-in serves.
#[derive(Clone)]
pub struct RepoSpec {
    pub id: String,
    pub commit: String,
    /// Path in the repository and contents; `.gguf` files are LFS files.
    pub files: Vec<(String, Vec<u8>)>,
    /// A gated repository (or a private one): files need this bearer token.
    pub token: Option<String>,
    /// Private: the repository itself (its file list too) is hidden without the token.
    pub private: bool,
    /// An earlier name, redirected to this one.
    pub renamed_from: Option<String>,
}

/// Where the storage host that serves file bodies is, beside the Hub on `127.0.0.1`.
#[derive(Clone, Copy)]
pub enum Storage {
    /// `localhost`: another host name.
    OtherHost,
    /// `127.0.0.1` on another port: the same host name, another origin.
    OtherPort,
}

/// One request the stand-in answered.
#[derive(Clone, Debug)]
pub struct Seen {
    /// "hub" or "cdn".
    pub host: &'static str,
    pub method: String,
    pub path: String,
    /// The path as requested (a mirror's prefix included).
    pub requested: String,
    pub range: Option<String>,
    pub auth: Option<String>,
}

impl Seen {
    /// A request for a file's body (not the one-byte size probe).
    pub fn is_body(&self) -> bool {
        self.host == "cdn" && self.method == "GET" && self.range.as_deref() != Some("bytes=0-0")
    }

    /// The first byte a ranged request asked for (0 without a range).
    pub fn range_start(&self) -> u64 {
        self.range
            .as_deref()
            .and_then(|r| r.strip_prefix("bytes="))
            .and_then(|r| r.split('-').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

/// Faults of one file's body (by sha256).
#[derive(Clone, Default)]
pub struct Fault {
    /// This many body requests are cut off after `cut_after` bytes.
    pub cut_requests: usize,
    pub cut_after: usize,
    /// Every body has one byte flipped.
    pub corrupt: bool,
    /// Bodies wait until [`StandIn::release`].
    pub hold: bool,
}

#[derive(Default)]
struct Shared {
    repos: Vec<RepoSpec>,
    blobs: HashMap<String, Vec<u8>>,
    faults: HashMap<String, Fault>,
    seen: Vec<Seen>,
    cdn: String,
}

type St = Arc<(Mutex<Shared>, watch::Sender<bool>)>;

pub struct StandIn {
    state: St,
    pub endpoint: String,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        // Also from inside an async test, where a runtime may not block to shut down.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

pub fn sha256(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The git blob id of a small file (what the Hub gives as its ETag).
fn git_oid(bytes: &[u8]) -> String {
    let mut data = format!("blob {}\0", bytes.len()).into_bytes();
    data.extend_from_slice(bytes);
    ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &data)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn is_lfs(path: &str) -> bool {
    path.ends_with(".gguf")
}

impl StandIn {
    pub fn start_with(repos: Vec<RepoSpec>, storage: Storage) -> StandIn {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut shared = Shared::default();
        for r in &repos {
            for (path, bytes) in &r.files {
                if is_lfs(path) {
                    shared.blobs.insert(sha256(bytes), bytes.clone());
                }
            }
        }
        shared.repos = repos;
        let (release, _) = watch::channel(false);
        let state: St = Arc::new((Mutex::new(shared), release));
        // Bound here (the caller may be inside another runtime, where this one cannot
        // block), taken over by this runtime's tasks.
        let bind = || {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.set_nonblocking(true).unwrap();
            l
        };
        let (hub, cdn) = (bind(), bind());
        let (hub_addr, cdn_addr): (SocketAddr, SocketAddr) =
            (hub.local_addr().unwrap(), cdn.local_addr().unwrap());
        let cdn_host = match storage {
            Storage::OtherHost => "localhost",
            Storage::OtherPort => "127.0.0.1",
        };
        state.0.lock().unwrap().cdn = format!("http://{cdn_host}:{}", cdn_addr.port());
        let mut hub_app = Router::new();
        for prefix in ["", "/mirror"] {
            hub_app = hub_app
                .route(&format!("{prefix}/api/models/{{user}}/{{repo}}"), get(info))
                .route(
                    &format!("{prefix}/api/models/{{user}}/{{repo}}/revision/{{*rev}}"),
                    get(info),
                )
                .route(
                    &format!("{prefix}/{{user}}/{{repo}}/resolve/{{rev}}/{{*file}}"),
                    get(resolve).head(resolve),
                );
        }
        let hub_app = hub_app.with_state(state.clone());
        let cdn_app = Router::new()
            .route("/blob/{sha}", get(blob))
            .with_state(state.clone());
        for (listener, app) in [(hub, hub_app), (cdn, cdn_app)] {
            runtime.spawn(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app).await.unwrap()
            });
        }
        StandIn {
            state,
            endpoint: format!("http://{hub_addr}"),
            runtime: Some(runtime),
        }
    }

    pub fn set_fault(&self, bytes: &[u8], fault: Fault) {
        let mut s = self.state.0.lock().unwrap();
        s.faults.insert(sha256(bytes), fault);
    }

    /// Lets held bodies go.
    pub fn release(&self) {
        self.state.1.send_replace(true);
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.0.lock().unwrap().seen.clone()
    }

    /// The body requests for `bytes`' blob.
    pub fn bodies(&self, bytes: &[u8]) -> Vec<Seen> {
        let path = format!("/blob/{}", sha256(bytes));
        self.seen()
            .into_iter()
            .filter(|s| s.is_body() && s.path == path)
            .collect()
    }

    /// Waits (bounded) until `check` holds of the requests seen.
    pub fn wait_for(&self, what: &str, check: impl Fn(&[Seen]) -> bool) {
        for _ in 0..3000 {
            if check(&self.seen()) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("the stand-in Hub never saw {what}: {:#?}", self.seen());
    }
}

fn record(
    s: &St,
    host: &'static str,
    method: &Method,
    path: String,
    uri: &Uri,
    headers: &HeaderMap,
) {
    let h = |k: &str| {
        headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    s.0.lock().unwrap().seen.push(Seen {
        host,
        method: method.to_string(),
        path,
        requested: uri.path().to_string(),
        range: h("range"),
        auth: h("authorization"),
    });
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    Response::builder()
        .status(status)
        .header("X-Error-Code", code)
        .header("X-Error-Message", message)
        .header("Content-Type", "application/json")
        .body(Body::from(format!("{{\"error\":\"{message}\"}}")))
        .unwrap()
}

/// The repository `user/repo` names, as the Hub finds it: a renamed one's old name is a
/// relative redirect to the same path under the new name (`uri`'s path, with the new name
/// in place of the old), and a private one is not found without its token.
fn find_repo(
    s: &Shared,
    user: &str,
    repo: &str,
    rev: &str,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<RepoSpec, Box<Response>> {
    let id = format!("{user}/{repo}");
    let not_found = || {
        Box::new(error(
            StatusCode::UNAUTHORIZED,
            "RepoNotFound",
            "Repository not found",
        ))
    };
    if let Some(r) = s
        .repos
        .iter()
        .find(|r| r.renamed_from.as_deref() == Some(&id))
    {
        let to = uri
            .path()
            .replacen(&format!("/{id}/"), &format!("/{}/", r.id), 1);
        let to = match uri.query() {
            Some(q) => format!("{to}?{q}"),
            None => to,
        };
        return Err(Box::new(
            Response::builder()
                .status(StatusCode::TEMPORARY_REDIRECT)
                .header("Location", to)
                .body(Body::empty())
                .unwrap(),
        ));
    }
    let r = s
        .repos
        .iter()
        .find(|r| r.id == id)
        .cloned()
        .ok_or_else(not_found)?;
    if r.private && bearer(headers) != r.token.as_deref() {
        return Err(not_found());
    }
    if rev != "main" && rev != r.commit {
        return Err(Box::new(error(
            StatusCode::NOT_FOUND,
            "RevisionNotFound",
            &format!("Invalid rev id: {rev}"),
        )));
    }
    Ok(r)
}

/// The token an `Authorization: Bearer` header carries.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

async fn info(
    State(s): State<St>,
    method: Method,
    Path(p): Path<HashMap<String, String>>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let rev = p.get("rev").cloned().unwrap_or_else(|| "main".into());
    let path = format!("/api/models/{}/{}/revision/{rev}", p["user"], p["repo"]);
    record(&s, "hub", &method, path, &uri, &headers);
    let found = find_repo(
        &s.0.lock().unwrap(),
        &p["user"],
        &p["repo"],
        &rev,
        &uri,
        &headers,
    );
    let r = match found {
        Ok(r) => r,
        Err(e) => return *e,
    };
    let blobs = uri
        .query()
        .unwrap_or("")
        .split('&')
        .any(|kv| kv == "blobs=true" || kv == "blobs=True");
    let siblings: Vec<serde_json::Value> = r
        .files
        .iter()
        .map(|(path, bytes)| {
            let mut v = serde_json::json!({ "rfilename": path });
            if blobs {
                v["size"] = bytes.len().into();
                v["blobId"] = git_oid(bytes).into();
                if is_lfs(path) {
                    v["lfs"] = serde_json::json!({
                        "sha256": sha256(bytes), "size": bytes.len(), "pointerSize": 134
                    });
                }
            }
            v
        })
        .collect();
    let body = serde_json::json!({
        "_id": "0123456789abcdef01234567",
        "id": r.id,
        "modelId": r.id,
        "sha": r.commit,
        "private": r.private,
        "gated": if r.token.is_some() && !r.private { serde_json::json!("manual") } else { false.into() },
        "disabled": false,
        "tags": ["gguf"],
        "siblings": siblings,
    });
    Response::builder()
        .header("Content-Type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

async fn resolve(
    State(s): State<St>,
    method: Method,
    Path(p): Path<HashMap<String, String>>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let (rev, file) = (&p["rev"], &p["file"]);
    let path = format!("/{}/{}/resolve/{rev}/{file}", p["user"], p["repo"]);
    record(&s, "hub", &method, path, &uri, &headers);
    let (r, cdn) = {
        let shared = s.0.lock().unwrap();
        match find_repo(&shared, &p["user"], &p["repo"], rev, &uri, &headers) {
            Ok(r) => (r, shared.cdn.clone()),
            Err(e) => return *e,
        }
    };
    if let Some(token) = &r.token {
        match bearer(&headers) {
            None => {
                return error(
                    StatusCode::UNAUTHORIZED,
                    "GatedRepo",
                    &format!(
                        "Access to model {} is restricted. You must have access to it and be \
                         authenticated to access it. Please log in.",
                        r.id
                    ),
                )
            }
            Some(t) if t != token => {
                return error(
                    StatusCode::FORBIDDEN,
                    "GatedRepo",
                    &format!(
                        "Access to model {} is restricted and you are not in the authorized list.",
                        r.id
                    ),
                )
            }
            Some(_) => {}
        }
    }
    let Some((_, bytes)) = r.files.iter().find(|(f, _)| f == file) else {
        return error(
            StatusCode::NOT_FOUND,
            "EntryNotFound",
            &format!("{file} does not exist on \"{rev}\""),
        );
    };
    let b = Response::builder()
        .header("X-Repo-Commit", &r.commit)
        .header(
            "Access-Control-Expose-Headers",
            "X-Repo-Commit,X-Linked-Etag,X-Linked-Size",
        );
    if !is_lfs(file) {
        return b
            .header("ETag", format!("\"{}\"", git_oid(bytes)))
            .header("Content-Length", bytes.len())
            .body(if method == Method::HEAD {
                Body::empty()
            } else {
                Body::from(bytes.clone())
            })
            .unwrap();
    }
    let sha = sha256(bytes);
    b.status(StatusCode::FOUND)
        .header("Location", format!("{cdn}/blob/{sha}?expires=1"))
        .header("X-Linked-Etag", format!("\"{sha}\""))
        .header("X-Linked-Size", bytes.len())
        .header("ETag", format!("\"{}\"", git_oid(bytes)))
        .body(Body::empty())
        .unwrap()
}

/// `bytes=A-` or `bytes=A-B` (inclusive) within `len`.
fn parse_range(h: &str, len: usize) -> Option<(usize, usize)> {
    let (a, b) = h.strip_prefix("bytes=")?.split_once('-')?;
    let a: usize = a.parse().ok()?;
    let b: usize = if b.is_empty() {
        len.checked_sub(1)?
    } else {
        b.parse::<usize>().ok()?.min(len.checked_sub(1)?)
    };
    (a <= b).then_some((a, b))
}

async fn blob(
    State(s): State<St>,
    method: Method,
    Path(sha): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    record(&s, "cdn", &method, format!("/blob/{sha}"), &uri, &headers);
    let range = headers
        .get("range")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let is_body = range.as_deref() != Some("bytes=0-0");
    let (bytes, fault) = {
        let mut shared = s.0.lock().unwrap();
        let Some(bytes) = shared.blobs.get(&sha).cloned() else {
            return error(StatusCode::NOT_FOUND, "", "no such object");
        };
        let fault = shared.faults.get_mut(&sha);
        let f = fault.as_ref().map(|f| (*f).clone()).unwrap_or_default();
        // Each cut request uses up one.
        if let Some(f) = fault.filter(|f| is_body && f.cut_requests > 0) {
            f.cut_requests -= 1;
        }
        (bytes, f)
    };
    let mut data = bytes.clone();
    if fault.corrupt {
        let mid = data.len() / 2;
        data[mid] ^= 0x5a;
    }
    let (status, start, end) = match &range {
        Some(r) => match parse_range(r, data.len()) {
            Some((a, b)) => (StatusCode::PARTIAL_CONTENT, a, b + 1),
            None => {
                return Response::builder()
                    .status(StatusCode::RANGE_NOT_SATISFIABLE)
                    .header("Content-Range", format!("bytes */{}", data.len()))
                    .body(Body::empty())
                    .unwrap()
            }
        },
        None => (StatusCode::OK, 0, data.len()),
    };
    let part = Bytes::copy_from_slice(&data[start..end]);
    let mut b = Response::builder()
        .status(status)
        .header("Content-Length", end - start)
        .header("Accept-Ranges", "bytes")
        .header("ETag", format!("\"{sha}\""));
    if status == StatusCode::PARTIAL_CONTENT {
        b = b.header(
            "Content-Range",
            format!("bytes {start}-{}/{}", end - 1, data.len()),
        );
    }
    let cut = (is_body && fault.cut_requests > 0).then_some(fault.cut_after);
    let hold = (is_body && fault.hold).then(|| s.1.subscribe());
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    tokio::spawn(async move {
        if let Some(mut released) = hold {
            let _ = released.wait_for(|r| *r).await;
        }
        match cut {
            Some(n) => {
                let n = n.min(part.len());
                let _ = tx.send(Ok(part.slice(..n))).await;
                // The connection drops mid-file, once those bytes are on their way (an
                // aborted body discards what the server has not written yet).
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                let _ = tx
                    .send(Err(std::io::Error::other("connection dropped")))
                    .await;
            }
            None => {
                for chunk in part.chunks(64 * 1024) {
                    if tx.send(Ok(Bytes::copy_from_slice(chunk))).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    b.body(Body::from_stream(
        tokio_stream::wrappers::ReceiverStream::new(rx),
    ))
    .unwrap()
}
