//! The HTTP API's errors, in OpenAI's shape: a status and `{"error": {"message", "type",
//! "param", "code"}}`, with `Retry-After` on 429. Each planner or engine error keeps its
//! own text; the param is the request field it concerns, in the API's spelling.

use crate::engine::plan::{Field, PlanError};
use crate::engine::JobError;
use crate::server::core::{CpuJobError, NotReady};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Seconds a client is asked to wait before retrying a request refused for a full queue.
const RETRY_AFTER_SECS: u64 = 1;

/// An error response.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// A 400 about `param`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message).param(param)
    }

    pub fn param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// OpenAI's error `type` for the status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// The gRPC status code name the response stands for, as `inferno_requests_total`
    /// counts both front-ends' outcomes.
    pub fn code_name(&self) -> &'static str {
        code_name(self.status)
    }

    /// The body, as a stream's error event carries it too.
    pub fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message).code("unavailable")
    }

    pub fn queue_full(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, message).code("queue_full")
    }

    pub fn model_not_found(asked: &str, served: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            format!("the model {asked:?} does not exist; this server serves {served:?}"),
        )
        .param("model")
        .code("model_not_found")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        resp
    }
}

impl From<NotReady> for ApiError {
    fn from(e: NotReady) -> Self {
        ApiError::unavailable(e.to_string())
    }
}

impl From<CpuJobError> for ApiError {
    fn from(e: CpuJobError) -> Self {
        match e {
            CpuJobError::ShuttingDown => ApiError::unavailable(e.to_string()),
            CpuJobError::Failed(_) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
            }
        }
    }
}

impl From<JobError> for ApiError {
    fn from(e: JobError) -> Self {
        match e {
            JobError::DeadlineExceeded => ApiError::new(StatusCode::GATEWAY_TIMEOUT, e.to_string()),
            JobError::ShuttingDown => ApiError::unavailable(e.to_string()),
            JobError::InvalidArgument(m) => ApiError::new(StatusCode::BAD_REQUEST, m),
            JobError::Internal(_) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
            }
        }
    }
}

/// The gRPC status code name an HTTP status stands for (`inferno_requests_total` counts both
/// front-ends' outcomes by it; `inferno loadtest` reports HTTP statuses by it).
pub fn code_name(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "INVALID_ARGUMENT",
        StatusCode::UNAUTHORIZED => "UNAUTHENTICATED",
        StatusCode::NOT_FOUND => "NOT_FOUND",
        StatusCode::REQUEST_TIMEOUT | StatusCode::GATEWAY_TIMEOUT => "DEADLINE_EXCEEDED",
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::TOO_MANY_REQUESTS => "RESOURCE_EXHAUSTED",
        StatusCode::SERVICE_UNAVAILABLE => "UNAVAILABLE",
        StatusCode::METHOD_NOT_ALLOWED => "UNIMPLEMENTED",
        s if s.is_success() => "OK",
        _ => "INTERNAL",
    }
}

/// How an endpoint spells the planner's fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
    Responses,
}

/// The API's name of a planner field.
pub fn param_name(field: &Field, endpoint: Endpoint) -> String {
    match field {
        Field::Prompt => match endpoint {
            Endpoint::Chat => "messages".into(),
            Endpoint::Completions => "prompt".into(),
            Endpoint::Responses => "input".into(),
        },
        // The Responses API's tools are flat, and its conversation is built from several
        // fields (instructions, the kept response, the input), so a message's index names
        // no one item.
        Field::ToolName { tool } if endpoint == Endpoint::Responses => {
            format!("tools[{tool}].name")
        }
        Field::ToolParameters { tool } if endpoint == Endpoint::Responses => {
            format!("tools[{tool}].parameters")
        }
        Field::ToolCallArguments { .. } if endpoint == Endpoint::Responses => "input".into(),
        Field::ToolName { tool } => format!("tools[{tool}].function.name"),
        Field::ToolParameters { tool } => format!("tools[{tool}].function.parameters"),
        Field::ToolCallArguments { message, call } => {
            format!("messages[{message}].tool_calls[{call}].function.arguments")
        }
        Field::Logprobs => match endpoint {
            Endpoint::Chat | Endpoint::Responses => "top_logprobs".into(),
            Endpoint::Completions => "logprobs".into(),
        },
        Field::Sampling("repeat_penalty") => "repetition_penalty".into(),
        Field::RequestId => "X-Request-Id".into(),
        other => other.to_string(),
    }
}

/// A planner error as a response: 413 for a text over the tokenizing limit, else 400,
/// naming the field.
pub fn plan_error(e: PlanError, endpoint: Endpoint) -> ApiError {
    let status = match e {
        PlanError::TextTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        _ => StatusCode::BAD_REQUEST,
    };
    let code = match e {
        PlanError::Request(
            crate::engine::RequestError::PromptExceedsContext { .. }
            | crate::engine::RequestError::ExceedsContext { .. },
        ) => Some("context_length_exceeded"),
        _ => None,
    };
    let mut err = ApiError::new(status, e.to_string());
    err.param = e.field().map(|f| param_name(&f, endpoint));
    err.code = code;
    err
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_openais_shape_and_429_says_when_to_retry() {
        let e = ApiError::invalid("temperature", "bad");
        assert_eq!(
            e.body(),
            json!({"error": {"message": "bad", "type": "invalid_request_error",
                             "param": "temperature", "code": null}})
        );
        assert_eq!(e.code_name(), "INVALID_ARGUMENT");
        let r = ApiError::queue_full("full").into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let nf = ApiError::model_not_found("gpt-4", "demo");
        assert_eq!(nf.body()["error"]["code"], "model_not_found");
        assert_eq!(nf.status, StatusCode::NOT_FOUND);
    }

    #[test]
    fn planner_fields_take_the_apis_names() {
        let e = plan_error(
            PlanError::BadToolName {
                index: 2,
                name: "a b".into(),
            },
            Endpoint::Chat,
        );
        assert_eq!(e.param.as_deref(), Some("tools[2].function.name"));
        assert!(e.message.contains("tools[2].name must be"), "{}", e.message);
        let e = plan_error(
            PlanError::Request(crate::engine::RequestError::TooManyLogprobs(30)),
            Endpoint::Completions,
        );
        assert_eq!(e.param.as_deref(), Some("logprobs"));
        let e = plan_error(
            PlanError::TextTooLarge {
                what: "prompt",
                bytes: 9,
                max: 4,
            },
            Endpoint::Chat,
        );
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(e.param.as_deref(), Some("messages"));
    }
}
