//! The OpenAI-compatible HTTP API beside gRPC, over the same engine ([`Core`]):
//! `/v1/chat/completions` ([`chat`]), `/v1/completions` ([`completions`]), `/v1/responses`
//! ([`responses`], with its kept responses at `/v1/responses/{id}` and their input items),
//! `/v1/models`,
//! `/tokenize`, `/detokenize`, `/health`, `/metrics` and `/openapi.json` ([`misc`]), with
//! OpenAI's error bodies ([`error`]) and wire types ([`wire`]). The handlers only convert:
//! requests go through the engine's planner, replies through [`crate::engine::reply`].
//!
//! Connections come from the same accept loop as gRPC's ([`super::conn`]: the connection
//! cap, handshake and idle timeouts), optionally through TLS, and are served by hyper
//! (HTTP/1.1 and HTTP/2). The bearer token guards everything but the probes, the metrics
//! and the API's description. Every request gets an id (`X-Request-Id`, the client's when
//! it sends a valid one) and a tracing span; bodies are read up to `--max-message-bytes`
//! (413 past it) within the handshake timeout (408 past it).

pub mod chat;
pub mod completions;
pub mod error;
mod generate;
pub mod misc;
pub mod responses;
pub mod wire;

use super::auth::{AuthError, BearerAuth};
use super::conn::{Conn, TrackedBody};
use super::core::Core;
use crate::engine::plan;
use crate::engine::{Protocol, Served};
use axum::extract::{FromRequest, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use error::ApiError;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use serde::de::DeserializeOwned;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt;
use tower_service::Service;
use tracing::{debug, Instrument};

/// The header that carries a request's id, in and out.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// How often an HTTP/2 connection is pinged (as gRPC's are).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);

/// What the HTTP handlers share.
pub struct HttpState {
    pub core: Arc<Core>,
    pub auth: BearerAuth,
    /// The model's id in the API (`--served-model-name`); `None`: the file's
    /// `general.name`, else its file stem.
    pub served_model_name: Option<String>,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// How long a request's body may take to arrive.
    pub body_timeout: Duration,
    /// Whether the server is draining (shutting down).
    pub draining: watch::Receiver<bool>,
    /// When the server started (Unix seconds): the model's `created`.
    pub started: u64,
    /// The Responses API's kept responses.
    pub responses: Arc<responses::store::ResponseStore>,
}

impl HttpState {
    /// The id the API gives the served model.
    pub fn model_id(&self, served: &Served) -> String {
        model_id(self.served_model_name.as_deref(), served)
    }

    /// The model is loaded and the server not draining.
    pub fn ready(&self) -> bool {
        self.core.served().is_ok() && !*self.draining.borrow()
    }

    /// The loaded model, for a request that needs it; 503 while loading or draining.
    fn serving(&self) -> Result<Arc<Served>, ApiError> {
        let served = self.core.served()?;
        if *self.draining.borrow() || self.core.engine.is_closed() {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        Ok(served)
    }

    /// Checks a request's `model` field: absent or empty, or the served model's id.
    fn check_model(&self, served: &Served, asked: Option<&str>) -> Result<String, ApiError> {
        let id = self.model_id(served);
        match asked {
            None | Some("") => Ok(id),
            Some(a) if a == id => Ok(id),
            Some(a) => Err(ApiError::model_not_found(a, &id)),
        }
    }

    /// Counts a call refused with `e` in `inferno_requests_total`.
    fn count_error(&self, method: &'static str, e: &ApiError) {
        self.core
            .metrics
            .request(Protocol::Http, method, e.code_name());
    }

    /// Counts a call answered in `inferno_requests_total`.
    fn count_ok(&self, method: &'static str) {
        self.core.metrics.request(Protocol::Http, method, "OK");
    }
}

/// The id of the served model: the configured name, else the file's `general.name`, else
/// its file name without the `.gguf`.
pub fn model_id(configured: Option<&str>, served: &Served) -> String {
    if let Some(n) = configured.filter(|n| !n.is_empty()) {
        return n.to_string();
    }
    let d = &served.description;
    if let Some(n) = &d.general_name {
        return n.clone();
    }
    d.name.strip_suffix(".gguf").unwrap_or(&d.name).to_string()
}

/// A request's id: the client's `X-Request-Id` when valid, else a new one.
#[derive(Clone, Debug)]
pub struct RequestId(pub String);

/// The API's routes.
pub fn router(state: Arc<HttpState>) -> Router {
    let guarded = Router::new()
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/input_tokens", post(responses::input_tokens))
        .route(
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        )
        .route(
            "/v1/responses/{id}/input_items",
            get(responses::input_items),
        )
        .route("/v1/models", get(misc::models))
        .route("/v1/models/{id}", get(misc::model))
        .route("/tokenize", post(misc::tokenize))
        .route("/detokenize", post(misc::detokenize))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            require_token,
        ));
    let open = Router::new()
        .route("/health", get(misc::health))
        .route("/healthz", get(misc::healthz))
        .route("/metrics", get(misc::metrics))
        .route("/openapi.json", get(misc::openapi));
    guarded
        .merge(open)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn(request_context))
        .with_state(state)
}

/// The routes of the separate metrics address (`--metrics-addr`): `/metrics`, `/healthz`
/// and a pointer at `/`. Each connection answers one request, then closes.
pub fn metrics_router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/", get(misc::metrics_index))
        .route("/metrics", get(misc::metrics))
        .route("/healthz", get(misc::healthz))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::map_response(|mut r: Response| async move {
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            r
        }))
        .with_state(state)
}

async fn not_found(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no such endpoint: {} {}", req.method(), req.uri().path()),
    )
    .code("not_found")
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not take {}", req.uri().path(), req.method()),
    )
}

/// Gives each request its id and span, and the response its `X-Request-Id`.
async fn request_context(mut req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(REQUEST_ID_HEADER)
        .map(|v| v.to_str().map(str::to_string));
    let id = match given {
        None => plan::new_request_id(),
        Some(Ok(id)) if plan::check_request_id(&id).is_ok() && !id.is_empty() => id,
        Some(_) => {
            let e = plan::PlanError::RequestIdCharacters;
            return ApiError::invalid(REQUEST_ID_HEADER, e.to_string()).into_response();
        }
    };
    let span = tracing::info_span!(
        "http_request",
        request_id = %id,
        method = %req.method(),
        path = %req.uri().path(),
    );
    req.extensions_mut().insert(RequestId(id.clone()));
    let mut resp = next.run(req).instrument(span).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    resp
}

/// The bearer-token check, with the body OpenAI's clients expect.
async fn require_token(State(state): State<Arc<HttpState>>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match state.auth.check(given) {
        Ok(()) => next.run(req).await,
        Err(e) => {
            let message = match e {
                AuthError::Invalid => "invalid bearer token",
                AuthError::Missing => {
                    "missing bearer token: send the header `Authorization: Bearer <token>`"
                }
            };
            let err = ApiError::new(StatusCode::UNAUTHORIZED, message).code("invalid_api_key");
            state
                .core
                .metrics
                .request(Protocol::Http, "Auth", err.code_name());
            let mut resp = err.into_response();
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            resp
        }
    }
}

/// A request body type: parsed from JSON, naming the field that does not fit.
pub trait ParseBody: Sized {
    fn parse(body: &[u8]) -> Result<Self, ApiError>;
}

macro_rules! parse_plain {
    ($($t:ty),*) => {$(
        impl ParseBody for $t {
            fn parse(body: &[u8]) -> Result<Self, ApiError> {
                let (r, ignored) = parse_json(body)?;
                log_ignored(&ignored);
                Ok(r)
            }
        }
    )*};
}
parse_plain!(wire::TokenizeRequest, wire::DetokenizeRequest);

// The generation requests' shared fields are a struct of their own, read from the same
// body: serde's flattening would lose the path of a field that does not fit.
macro_rules! parse_with_sampling {
    ($($t:ty),*) => {$(
        impl ParseBody for $t {
            fn parse(body: &[u8]) -> Result<Self, ApiError> {
                let (mut r, own) = parse_json::<Self>(body)?;
                let (sampling, shared) = parse_json(body)?;
                r.sampling = sampling;
                log_ignored(&ignored_by_both(&own, &shared));
                Ok(r)
            }
        }
    )*};
}
parse_with_sampling!(
    wire::ChatRequest,
    wire::CompletionRequest,
    responses::wire::ResponsesRequest
);

/// Says which fields of a request were not read, as vLLM does, so that a misspelt or
/// unsupported field is seen in the log rather than silently ignored.
fn log_ignored(ignored: &[String]) {
    if !ignored.is_empty() {
        tracing::info!(fields = ?ignored, "request fields this server does not know were ignored");
    }
}

/// The fields neither of two structs read from one body took: each reads the other's
/// fields whole as unknown, so a path one ignored counts when the other ignored its
/// top-level field too.
fn ignored_by_both(first: &[String], second: &[String]) -> Vec<String> {
    let top = |path: &str| path.split('.').next().unwrap_or(path).to_string();
    let mut out: Vec<String> = first
        .iter()
        .filter(|p| second.contains(&top(p)))
        .chain(second.iter().filter(|p| first.contains(&top(p))))
        .cloned()
        .collect();
    out.sort();
    // A field both structs lack is named by both.
    out.dedup();
    out
}

/// A JSON request body, read within the size and time limits and deserialized with the
/// path of a field that does not fit named in the error.
pub struct JsonBody<T>(pub T);

impl<T: ParseBody> FromRequest<Arc<HttpState>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<HttpState>) -> Result<Self, ApiError> {
        let limit = state.max_body_bytes;
        let too_large = |n: String| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the request body is {n} bytes, over the server's limit of {limit} bytes \
                     (--max-message-bytes)"
                ),
            )
            .code("request_too_large")
        };
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if let Some(n) = declared.filter(|&n| n > limit as u64) {
            return Err(too_large(n.to_string()));
        }
        let read = async {
            let mut body = Vec::with_capacity(declared.unwrap_or(0).min(limit as u64) as usize);
            let mut stream = req.into_body().into_data_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| {
                    ApiError::invalid("body", format!("cannot read the request body: {e}"))
                })?;
                if body.len() + chunk.len() > limit {
                    return Err(too_large("more than that".into()));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(body)
        };
        let body = tokio::time::timeout(state.body_timeout, read)
            .await
            .map_err(|_| {
                ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the request body did not arrive within {:?} (--handshake-timeout)",
                        state.body_timeout
                    ),
                )
                .code("request_timeout")
            })??;
        T::parse(&body).map(JsonBody)
    }
}

/// Deserializes a body, naming the field that does not fit; returns it with the paths of
/// the fields it has no place for.
fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<(T, Vec<String>), ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let mut ignored = Vec::new();
    let read = {
        // `?` marks where the path went through an `Option`: no field of the request's.
        let mut note = |path: serde_ignored::Path<'_>| {
            let path = path.to_string();
            ignored.push(
                path.split('.')
                    .filter(|s| *s != "?")
                    .collect::<Vec<_>>()
                    .join("."),
            )
        };
        serde_path_to_error::deserialize(serde_ignored::Deserializer::new(&mut de, &mut note))
    };
    let value = read
        .map_err(|e| (e.path().to_string(), e.into_inner()))
        .and_then(|v| de.end().map(|()| v).map_err(|e| (".".to_string(), e)))
        .map(|v| (v, ignored));
    value.map_err(|(path, inner)| {
        if inner.is_syntax() || inner.is_eof() || path == "." {
            let what = if inner.is_syntax() || inner.is_eof() {
                "the request body is not valid JSON"
            } else {
                "the request body does not fit the endpoint's request"
            };
            let mut err = ApiError::new(StatusCode::BAD_REQUEST, format!("{what}: {inner}"));
            if let Some(field) = missing_field(&inner.to_string()) {
                err = err.param(field);
            }
            err
        } else {
            let message = match untagged_hint(&inner.to_string()) {
                Some(want) => format!("{path} must be {want}"),
                None => format!("{path}: {inner}"),
            };
            ApiError::invalid(path, message)
        }
    })
}

/// What a field of several forms takes, for serde's "did not match any variant" error.
fn untagged_hint(message: &str) -> Option<&'static str> {
    let name = message
        .strip_prefix("data did not match any variant of untagged enum ")?
        .split_whitespace()
        .next()?;
    Some(match name {
        "Content" => "a string or a list of text parts",
        "Stop" => "a string or a list of strings",
        "ToolChoiceIn" => {
            "\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": \
             {\"name\": ...}}"
        }
        "PromptIn" => "a string, a list of strings, a list of token ids or a list of such lists",
        _ => return None,
    })
}

/// The field a "missing field `x`" error names.
fn missing_field(message: &str) -> Option<String> {
    let rest = message.strip_prefix("missing field `")?;
    Some(rest.split('`').next()?.to_string())
}

/// Serves HTTP on the connections `incoming` delivers (through `tls` when given) until
/// `close` turns true; then stops taking connections and lets the open ones finish what
/// they are doing, for at most `grace`.
pub(crate) async fn serve(
    mut incoming: mpsc::Receiver<Result<Conn, std::io::Error>>,
    app: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    header_timeout: Duration,
    mut close: watch::Receiver<bool>,
    grace: Duration,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(KEEPALIVE_INTERVAL);
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let conn = tokio::select! {
            c = incoming.recv() => match c {
                Some(Ok(c)) => c,
                Some(Err(e)) => {
                    debug!(error = %e, "accepting an HTTP connection failed");
                    continue;
                }
                None => break,
            },
            _ = close.wait_for(|c| *c) => break,
        };
        // Reap finished connection tasks as new ones come.
        while conns.try_join_next().is_some() {}
        let info = {
            use tonic::transport::server::Connected;
            conn.connect_info()
        };
        let app = app.clone();
        let builder = Arc::clone(&builder);
        let watcher = graceful.watcher();
        let tls = tls.clone();
        conns.spawn(async move {
            let svc = hyper::service::service_fn(
                move |mut req: hyper::Request<hyper::body::Incoming>| {
                    let open = info.open_request();
                    req.extensions_mut().insert(info.clone());
                    let mut app = app.clone();
                    async move {
                        let resp = match app.call(req).await {
                            Ok(r) => r,
                            Err(e) => match e {},
                        };
                        Ok::<_, Infallible>(resp.map(|inner| TrackedBody { inner, _open: open }))
                    }
                },
            );
            let served = match tls {
                Some(acceptor) => match acceptor.accept(conn).await {
                    Ok(io) => {
                        watcher
                            .watch(builder.serve_connection_with_upgrades(TokioIo::new(io), svc))
                            .await
                    }
                    Err(e) => {
                        debug!(error = %e, "TLS handshake failed");
                        return;
                    }
                },
                None => {
                    watcher
                        .watch(builder.serve_connection_with_upgrades(TokioIo::new(conn), svc))
                        .await
                }
            };
            if let Err(e) = served {
                debug!(error = %e, "HTTP connection ended with an error");
            }
        });
    }
    // The listener closes with the channel.
    drop(incoming);
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        debug!("HTTP connections still open after the grace period; closing them");
    }
    conns.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unknown<T: DeserializeOwned>(body: serde_json::Value) -> Vec<String> {
        let body = body.to_string();
        let (_, own) = parse_json::<T>(body.as_bytes()).unwrap();
        let (_, shared) = parse_json::<wire::Sampling>(body.as_bytes()).unwrap();
        ignored_by_both(&own, &shared)
    }

    /// The fields neither part of a request reads are found, nested ones by their path,
    /// and none that either part reads.
    #[test]
    fn fields_no_part_of_a_request_reads_are_named() {
        let chat = serde_json::json!({
            "messages": [{"role": "user", "content": "x", "name": "ada"}],
            "max_tokens": 3, "temperature": 0, "tools": [], "frobnicate": {"a": 1},
            "structured_outputs": {"regex": "a", "whitespace_pattern": "b"},
        });
        assert_eq!(
            unknown::<wire::ChatRequest>(chat),
            [
                "frobnicate",
                "messages.0.name",
                "structured_outputs.whitespace_pattern"
            ]
        );
        let known = serde_json::json!({"prompt": "x", "echo": true, "top_k": 2, "stream": false,
                                       "stream_options": {"include_usage": true}});
        assert!(unknown::<wire::CompletionRequest>(known).is_empty());
        let responses = serde_json::json!({"input": [{"role": "user", "content": "x", "z": 1}],
                                           "max_output_tokens": 4, "service_tier": "auto"});
        assert_eq!(
            unknown::<responses::wire::ResponsesRequest>(responses),
            ["service_tier"]
        );
        let (_, plain) =
            parse_json::<wire::DetokenizeRequest>(br#"{"tokens": [1], "with_pieces": true}"#)
                .unwrap();
        assert_eq!(plain, ["with_pieces"]);
    }
}
