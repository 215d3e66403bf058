//! The endpoints beside generation: `/v1/models` and `/v1/models/{id}` (the served model
//! and its context window), `/tokenize` and `/detokenize` (as llama-server names and
//! shapes them), and the probes and metrics: `/health` (200 once the model is loaded and
//! while not draining, else 503 with an error body), `/healthz` (the same, in plain text)
//! and `/metrics` (Prometheus' text format); and `/openapi.json`, the API's OpenAPI 3.0
//! description (`openapi.json` beside this file), for clients and for fuzzers.

use super::error::ApiError;
use super::wire;
use super::{HttpState, JsonBody};
use crate::engine::plan;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use std::sync::Arc;

/// Counts a call and answers it.
pub(super) fn answer<T: IntoResponse>(
    state: &HttpState,
    method: &'static str,
    r: Result<T, ApiError>,
) -> Response {
    match r {
        Ok(v) => {
            state.count_ok(method);
            v.into_response()
        }
        Err(e) => {
            state.count_error(method, &e);
            e.into_response()
        }
    }
}

fn model_entry(state: &HttpState) -> Result<wire::Model, ApiError> {
    let served = state.core.served()?;
    Ok(wire::Model {
        id: state.model_id(&served),
        object: "model",
        created: state.started,
        owned_by: "inferno",
        max_model_len: served.limits.ctx as u64,
    })
}

pub async fn models(State(state): State<Arc<HttpState>>) -> Response {
    let r = model_entry(&state).map(|m| {
        Json(wire::ModelList {
            object: "list",
            data: vec![m],
        })
    });
    answer(&state, "GetModelInfo", r)
}

pub async fn model(State(state): State<Arc<HttpState>>, Path(id): Path<String>) -> Response {
    let r = model_entry(&state).and_then(|m| {
        if m.id == id {
            Ok(Json(m))
        } else {
            Err(ApiError::model_not_found(&id, &m.id))
        }
    });
    answer(&state, "GetModelInfo", r)
}

/// llama-server's tokenize (a text) and vLLM's (a text as `prompt`, or a conversation: the
/// tokens a chat request would be prompted with).
pub async fn tokenize(
    State(state): State<Arc<HttpState>>,
    body: Result<JsonBody<wire::TokenizeRequest>, ApiError>,
) -> Response {
    let r = async {
        let JsonBody(req) = body?;
        let served = state.core.served()?;
        let s2 = Arc::clone(&served);
        let tokens = match (req.content, req.messages) {
            (Some(_), Some(_)) => {
                return Err(ApiError::invalid(
                    "messages",
                    "give content (or prompt) or messages, not both",
                ))
            }
            (None, None) => {
                return Err(ApiError::invalid(
                    "content",
                    "give the text to tokenize as content (or prompt), or messages",
                ))
            }
            (Some(content), None) => {
                plan::check_text_bytes("text", content.len(), state.core.max_text_bytes).map_err(
                    |e| {
                        super::error::plan_error(e, super::error::Endpoint::Completions)
                            .param("content")
                    },
                )?;
                let parse_special = req.parse_special.unwrap_or(true);
                let ids = state
                    .core
                    .cpu_job(move || s2.tokenizer.encode(&content, parse_special))
                    .await?
                    .map_err(|e| ApiError::invalid("content", format!("cannot tokenize: {e}")))?;
                let tok = &served.tokenizer;
                let mut tokens = Vec::with_capacity(ids.len() + 1);
                if req.add_special.unwrap_or(false) {
                    tokens.extend(tok.bos_id().filter(|_| tok.add_bos()));
                }
                tokens.extend(ids);
                tokens
            }
            (None, Some(messages)) => {
                let prompt = super::chat::chat_prompt(
                    messages,
                    req.tools,
                    req.chat_template_kwargs,
                    req.add_generation_prompt,
                    req.continue_final_message,
                )?;
                let endpoint = super::error::Endpoint::Chat;
                super::generate::prompt_tokens(&state, &served, &prompt, endpoint).await?
            }
        };
        let tok = &served.tokenizer;
        let text =
            |id: u32| String::from_utf8_lossy(tok.token_bytes(id).unwrap_or_default()).into_owned();
        let token_strs = req
            .return_token_strs
            .unwrap_or(false)
            .then(|| tokens.iter().map(|&id| text(id)).collect());
        let count = tokens.len();
        let tokens = if req.with_pieces.unwrap_or(false) {
            wire::Tokens::Pieces(
                tokens
                    .into_iter()
                    .map(|id| wire::Piece {
                        id,
                        piece: text(id),
                    })
                    .collect(),
            )
        } else {
            wire::Tokens::Ids(tokens)
        };
        Ok(Json(wire::TokenizeResponse {
            tokens,
            count,
            max_model_len: served.limits.ctx,
            token_strs,
        }))
    }
    .await;
    answer(&state, "Tokenize", r)
}

pub async fn detokenize(
    State(state): State<Arc<HttpState>>,
    body: Result<JsonBody<wire::DetokenizeRequest>, ApiError>,
) -> Response {
    let r = async {
        let JsonBody(req) = body?;
        let served = state.core.served()?;
        let content = state
            .core
            .cpu_job(move || served.tokenizer.decode(&req.tokens, false))
            .await?
            .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
        Ok(Json(wire::DetokenizeResponse { content }))
    }
    .await;
    answer(&state, "Detokenize", r)
}

/// Why the server is not ready, if it is not.
fn not_ready(state: &HttpState) -> Option<ApiError> {
    if let Err(e) = state.core.served() {
        return Some(e.into());
    }
    (!state.ready()).then(|| ApiError::unavailable("the server is shutting down"))
}

pub async fn health(State(state): State<Arc<HttpState>>) -> Response {
    match not_ready(&state) {
        None => Json(json!({"status": "ok"})).into_response(),
        Some(e) => e.into_response(),
    }
}

pub async fn healthz(State(state): State<Arc<HttpState>>) -> Response {
    let plain = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    match not_ready(&state) {
        None => (StatusCode::OK, plain, "ok\n").into_response(),
        Some(_) => (StatusCode::SERVICE_UNAVAILABLE, plain, "not serving\n").into_response(),
    }
}

pub async fn metrics(State(state): State<Arc<HttpState>>) -> Response {
    let engine = &state.core.engine;
    let text = state
        .core
        .metrics
        .render(engine.queue_depth(), engine.queue_capacity());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

pub async fn metrics_index() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "inferno metrics: see /metrics (and /healthz)\n",
    )
        .into_response()
}

/// The API's OpenAPI description, as committed beside this module.
pub const OPENAPI: &str = include_str!("openapi.json");

pub async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

#[cfg(test)]
mod tests {
    use super::OPENAPI;
    use serde_json::Value;

    /// The description parses, names this version, and lists the error body every failing
    /// status carries.
    #[test]
    fn the_description_is_valid_json_for_this_version() {
        let spec: Value = serde_json::from_str(OPENAPI).expect("openapi.json parses");
        assert_eq!(spec["info"]["version"], env!("CARGO_PKG_VERSION"));
        let paths = spec["paths"].as_object().unwrap();
        for (path, ops) in paths {
            for (method, op) in ops.as_object().unwrap() {
                for (status, r) in op["responses"].as_object().unwrap() {
                    if status.starts_with('4') || status == "503" || status == "504" {
                        let schema = &r["content"]["application/json"]["schema"]["$ref"];
                        assert!(
                            schema == "#/components/schemas/Error" || path == "/healthz",
                            "{method} {path} {status}: {r}"
                        );
                    }
                }
            }
        }
    }
}
