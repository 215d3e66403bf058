//! The OpenAI API's request and response bodies, field for field as the official `openai`
//! Python package types them (`openai/types/chat/completion_create_params.py`,
//! `chat_completion.py`, `chat_completion_chunk.py`, `completion.py`, `model.py`), plus
//! the extensions vLLM and llama-server accept (`top_k`, `min_p`, `repetition_penalty`,
//! `ignore_eos`, `min_tokens`, `stop_token_ids`, `regex`, `grammar`, `structured_outputs`
//! and the `guided_*` fields it replaced, `chat_template_kwargs`, `add_generation_prompt`,
//! `continue_final_message`, `separate_reasoning`) and
//! llama-server's `/tokenize` and `/detokenize`. Fields a request may carry that are not
//! listed here are ignored, as vLLM and llama-server ignore them, and named in the log
//! (`super::log_ignored`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `stop`: one string or a list.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// What both generation endpoints take besides their prompt. The sampling numbers are read
/// as `f64`, as JSON has them, and checked before they are narrowed (see
/// [`crate::sampling::check_number`]).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Sampling {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub stop: Option<Stop>,
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    #[serde(default)]
    pub n: Option<u32>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Token id (a decimal string, as JSON keys are) to a bias in [-100, 100] added to its
    /// logit before sampling.
    #[serde(default)]
    pub logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    // Extensions (vLLM, llama-server).
    /// Keep the k most likely tokens; 0 or negative: off.
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub min_p: Option<f64>,
    #[serde(default)]
    pub repetition_penalty: Option<f64>,
    #[serde(default)]
    pub ignore_eos: Option<bool>,
    /// Tokens generated before end-of-generation or a stop token may end the output.
    #[serde(default)]
    pub min_tokens: Option<u32>,
    /// Token ids that end the output when generated.
    #[serde(default)]
    pub stop_token_ids: Option<Vec<u32>>,
    /// The output matches this regular expression.
    #[serde(default)]
    pub regex: Option<String>,
    /// The output is a sentence of this Lark grammar (llguidance's dialect).
    #[serde(default)]
    pub grammar: Option<String>,
    /// vLLM's constraints on the output, one at most.
    #[serde(default)]
    pub structured_outputs: Option<StructuredOutputs>,
    /// vLLM's earlier spellings of `structured_outputs`' fields.
    #[serde(default)]
    pub guided_json: Option<Value>,
    #[serde(default)]
    pub guided_regex: Option<String>,
    #[serde(default)]
    pub guided_choice: Option<Vec<String>>,
    #[serde(default)]
    pub guided_grammar: Option<String>,
    /// vLLM's logprobs of the prompt's tokens, which the engine does not compute (refused
    /// unless null).
    #[serde(default)]
    pub prompt_logprobs: Option<u32>,
    /// vLLM's beam search, not served (refused when true).
    #[serde(default)]
    pub use_beam_search: Option<bool>,
    /// Decode without speculation even where the server speculates (the tokens are the
    /// same either way; only the speed differs).
    #[serde(default)]
    pub disable_speculation: Option<bool>,
}

/// vLLM's `structured_outputs`: a JSON schema (an object, or its JSON text), any JSON
/// object, a regular expression, one of a list of strings, or a grammar (llguidance's Lark
/// dialect here).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct StructuredOutputs {
    #[serde(default)]
    pub json: Option<Value>,
    #[serde(default)]
    pub json_object: Option<bool>,
    #[serde(default)]
    pub regex: Option<String>,
    #[serde(default)]
    pub choice: Option<Vec<String>>,
    #[serde(default)]
    pub grammar: Option<String>,
    /// Not supported; refused rather than ignored.
    #[serde(default)]
    pub structural_tag: Option<Value>,
}

/// A message's content: text, or a list of parts of which only text ones are supported.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct FunctionCallIn {
    pub name: String,
    /// JSON text, as the model wrote it (OpenAI sends it as a string).
    pub arguments: String,
}

#[derive(Debug, Deserialize)]
pub struct ToolCallIn {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    pub function: FunctionCallIn,
}

#[derive(Debug, Deserialize)]
pub struct MessageIn {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCallIn>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct FunctionIn {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct ToolIn {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub function: Option<FunctionIn>,
}

#[derive(Debug, Deserialize)]
pub struct NamedFunction {
    pub name: String,
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"` or a named function.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ToolChoiceIn {
    Mode(String),
    Named {
        #[serde(rename = "type")]
        kind: String,
        function: NamedFunction,
    },
}

#[derive(Debug, Deserialize)]
pub struct JsonSchemaIn {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub schema: Option<Value>,
    #[serde(default)]
    pub strict: Option<bool>,
}

#[derive(Debug, Deserialize)]
pub struct ResponseFormatIn {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub json_schema: Option<JsonSchemaIn>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<MessageIn>,
    /// Read from the same body on its own (see [`Sampling`]'s users), so that a field of it
    /// that does not fit is named.
    #[serde(skip)]
    pub sampling: Sampling,
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    #[serde(default)]
    pub logprobs: Option<bool>,
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    #[serde(default)]
    pub tools: Option<Vec<ToolIn>>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoiceIn>,
    /// Whether the reply may hold more than one tool call; unset: it may.
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub response_format: Option<ResponseFormatIn>,
    /// Variables for the chat template (vLLM's): `enable_thinking`, and any other the
    /// template reads, in their order.
    #[serde(default)]
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// Whether the rendered chat ends with an assistant turn opened (vLLM's); unset: it
    /// does unless `continue_final_message`.
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    /// Leave the final message open for the model to continue it (vLLM's).
    #[serde(default)]
    pub continue_final_message: Option<bool>,
    /// OpenAI's effort for reasoning models: passed to the chat template as
    /// `reasoning_effort`, as vLLM passes it (templates that read it, e.g. gpt-oss's).
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    /// OpenAI's deprecated form of `tools`; refused (with `function_call`), not ignored.
    #[serde(default)]
    pub functions: Option<Vec<Value>>,
    #[serde(default)]
    pub function_call: Option<Value>,
    /// Report a `<think>` section as `reasoning_content`; unset: when the model thinks.
    #[serde(default)]
    pub separate_reasoning: Option<bool>,
}

/// `prompt` of `/v1/completions`: a string, strings, token ids, or lists of token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum PromptIn {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptIn,
    /// Read from the same body on its own.
    #[serde(skip)]
    pub sampling: Sampling,
    #[serde(default)]
    pub echo: Option<bool>,
    #[serde(default)]
    pub logprobs: Option<u32>,
    #[serde(default)]
    pub suffix: Option<String>,
    #[serde(default)]
    pub best_of: Option<u32>,
}

#[derive(Debug, Serialize)]
pub struct PromptTokensDetails {
    pub cached_tokens: u64,
}

/// Speculative decoding's draft tokens, under OpenAI's names for predicted tokens: those the
/// model's own picks confirmed, and those it rejected.
#[derive(Debug, Serialize)]
pub struct CompletionTokensDetails {
    pub accepted_prediction_tokens: u64,
    pub rejected_prediction_tokens: u64,
}

#[derive(Debug, Serialize)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    pub prompt_tokens_details: PromptTokensDetails,
    pub completion_tokens_details: CompletionTokensDetails,
}

#[derive(Clone, Debug, Serialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Serialize)]
pub struct ChoiceLogprobs {
    pub content: Vec<TokenLogprob>,
}

#[derive(Debug, Serialize)]
pub struct FunctionCallOut {
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Serialize)]
pub struct ToolCallOut {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCallOut,
}

#[derive(Debug, Serialize)]
pub struct MessageOut {
    pub role: &'static str,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallOut>,
}

#[derive(Debug, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: MessageOut,
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: &'static str,
}

/// A `chat.completion`.
#[derive(Debug, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    pub system_fingerprint: String,
}

#[derive(Debug, Serialize)]
pub struct FunctionDelta {
    pub name: String,
    pub arguments: String,
}

#[derive(Debug, Serialize)]
pub struct ToolCallDelta {
    pub index: u32,
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionDelta,
}

#[derive(Debug, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

#[derive(Debug, Serialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub logprobs: Option<ChoiceLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// A `chat.completion.chunk`.
#[derive(Debug, Serialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    pub system_fingerprint: String,
}

/// The legacy completions' logprobs.
#[derive(Debug, Default, Serialize)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<serde_json::Map<String, Value>>,
    pub text_offset: Vec<usize>,
}

#[derive(Debug, Serialize)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// A `text_completion` (whole, or one streamed chunk of it).
#[derive(Debug, Serialize)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    pub system_fingerprint: String,
}

/// A `model` of `/v1/models`.
#[derive(Debug, Serialize)]
pub struct Model {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// The context window served (vLLM's name for it).
    pub max_model_len: u64,
}

#[derive(Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<Model>,
}

/// `POST /tokenize`, as llama-server takes it.
#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    /// A text (llama-server's `content`, vLLM's `prompt`).
    #[serde(default, alias = "prompt")]
    pub content: Option<String>,
    /// Or a conversation (vLLM's): the tokens a chat request with these messages, tools
    /// and template options would be prompted with.
    #[serde(default)]
    pub messages: Option<Vec<MessageIn>>,
    #[serde(default)]
    pub tools: Option<Vec<ToolIn>>,
    #[serde(default)]
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    pub add_generation_prompt: Option<bool>,
    #[serde(default)]
    pub continue_final_message: Option<bool>,
    /// With a text: add the model's BOS token where its tokenizer adds one.
    #[serde(default, alias = "add_special_tokens")]
    pub add_special: Option<bool>,
    /// Treat special-token text such as `<|im_start|>` as the token (default true).
    #[serde(default)]
    pub parse_special: Option<bool>,
    /// Return each token's text beside its id.
    #[serde(default)]
    pub with_pieces: Option<bool>,
    /// Also return each token's text as a list of strings (vLLM's `token_strs`).
    #[serde(default)]
    pub return_token_strs: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct Piece {
    pub id: u32,
    pub piece: String,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Tokens {
    Ids(Vec<u32>),
    Pieces(Vec<Piece>),
}

#[derive(Debug, Serialize)]
pub struct TokenizeResponse {
    pub tokens: Tokens,
    /// How many tokens (vLLM's).
    pub count: usize,
    /// The context window of a sequence (vLLM's).
    pub max_model_len: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_strs: Option<Vec<String>>,
}

/// `POST /detokenize`.
#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    pub tokens: Vec<u32>,
}

#[derive(Debug, Serialize)]
pub struct DetokenizeResponse {
    pub content: String,
}
