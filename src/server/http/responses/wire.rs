//! The Responses API's bodies, field for field as the official `openai` Python package types
//! them (`openai/types/responses/response_create_params.py`, `response.py`,
//! `response_output_message.py`, `response_function_tool_call.py`,
//! `response_reasoning_item.py`, `response_usage.py`). `input`, `tools`, `tool_choice` and
//! `text.format` come in many shapes, of which this server takes some: they are read as
//! JSON values and converted by hand (`super::convert`), so that a refusal names the exact
//! item. The sampling fields shared with the other endpoints (`temperature`, `top_p`,
//! `seed` and the vLLM extensions) are read from the same body as [`Sampling`].

use crate::server::http::wire::{Sampling, TokenLogprob};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `POST /v1/responses`.
#[derive(Debug, Deserialize)]
pub struct ResponsesRequest {
    /// A user message's text, or a list of input items.
    pub input: Value,
    /// Read from the same body on its own.
    #[serde(skip)]
    pub sampling: Sampling,
    /// A system message put before the conversation (not carried over to a response that
    /// continues this one).
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub text: Option<TextConfig>,
    #[serde(default)]
    pub reasoning: Option<ReasoningConfig>,
    /// Extra output to include; this server knows `message.output_text.logprobs`.
    #[serde(default)]
    pub include: Option<Vec<String>>,
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    /// Keep the response for `previous_response_id` and `GET /v1/responses/{id}`; unset:
    /// keep it (OpenAI's default).
    #[serde(default)]
    pub store: Option<bool>,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    /// Refused when true: responses are generated while the request waits.
    #[serde(default)]
    pub background: Option<bool>,
    /// OpenAI's server-side conversations: not served (refused).
    #[serde(default)]
    pub conversation: Option<Value>,
    /// OpenAI's stored prompt templates: not served (refused).
    #[serde(default)]
    pub prompt: Option<Value>,
    /// `disabled` (the default): a conversation too long for the context is refused.
    /// `auto`: its oldest turns are dropped until it fits (the instructions stay).
    #[serde(default)]
    pub truncation: Option<String>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default)]
    pub user: Option<String>,
    /// Variables for the chat template (vLLM's extension, as on chat completions).
    #[serde(default)]
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// Report a `<think>` section as a reasoning item; unset: when the model thinks (as on
    /// chat completions).
    #[serde(default)]
    pub separate_reasoning: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
pub struct TextConfig {
    /// `{"type": "text"}`, `{"type": "json_object"}` or `{"type": "json_schema", "name",
    /// "schema", "strict"}`.
    #[serde(default)]
    pub format: Option<Value>,
    #[serde(default)]
    pub verbosity: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize, Clone)]
pub struct ReasoningConfig {
    /// Passed to the chat template as `reasoning_effort`, as on chat completions.
    #[serde(default)]
    pub effort: Option<String>,
    /// Summaries are not made; reported back as asked.
    #[serde(default)]
    pub summary: Option<String>,
}

/// Text the model wrote, with its tokens' logprobs when asked for.
#[derive(Clone, Debug, Serialize)]
pub struct OutputText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
    pub annotations: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<TokenLogprob>>,
}

impl OutputText {
    pub fn new(text: String, logprobs: Option<Vec<TokenLogprob>>) -> Self {
        Self {
            kind: "output_text",
            text,
            annotations: Vec::new(),
            logprobs,
        }
    }
}

/// A thinking model's reasoning, as text.
#[derive(Clone, Debug, Serialize)]
pub struct ReasoningText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
}

impl ReasoningText {
    pub fn new(text: String) -> Self {
        Self {
            kind: "reasoning_text",
            text,
        }
    }
}

/// One item of a response's `output`.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Reasoning {
        id: String,
        summary: Vec<Value>,
        content: Vec<ReasoningText>,
        status: &'static str,
    },
    Message {
        id: String,
        status: &'static str,
        role: &'static str,
        content: Vec<OutputText>,
    },
    FunctionCall {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
        status: &'static str,
    },
}

#[derive(Clone, Debug, Serialize)]
pub struct InputTokensDetails {
    pub cached_tokens: u64,
    pub cache_write_tokens: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u64,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct IncompleteDetails {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct ResponseError {
    pub code: &'static str,
    pub message: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct TextOut {
    pub format: Value,
}

/// A `response`: what the request asked for, echoed, and what the model answered.
#[derive(Clone, Debug, Serialize)]
pub struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    /// `in_progress`, `completed`, `incomplete` or `failed`.
    pub status: &'static str,
    pub completed_at: Option<u64>,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub reasoning: Option<ReasoningConfig>,
    pub store: bool,
    pub temperature: f32,
    pub text: TextOut,
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub top_p: f32,
    pub top_logprobs: u32,
    pub truncation: &'static str,
    pub background: bool,
    pub usage: Option<Usage>,
    pub user: Option<String>,
    pub metadata: Map<String, Value>,
}

/// The answer to `DELETE /v1/responses/{id}`.
#[derive(Debug, Serialize)]
pub struct Deleted {
    pub id: String,
    pub object: &'static str,
    pub deleted: bool,
}

/// `POST /v1/responses/input_tokens`'s answer.
#[derive(Debug, Serialize)]
pub struct InputTokens {
    pub object: &'static str,
    pub input_tokens: usize,
}
