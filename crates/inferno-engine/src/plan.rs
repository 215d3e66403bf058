//! Planning a generation request from what a client states, in plain Rust types that every
//! front-end converts its wire format to (the gRPC service, the OpenAI-compatible HTTP API,
//! the command line): a prompt (text, token ids, or chat messages with tool calls and tool
//! results), the tools the model may call and how ([`ToolChoice`]), a response format, the
//! reasoning options, sampling, stop strings and limits ([`GenerateSpec`]).
//!
//! [`plan_prompt`] turns the prompt side into what the engine takes (a rendered chat with
//! its tools, the grammar a required tool call implies); [`prepare`] checks everything,
//! tokenizes and builds a request ready for the queue ([`Prepared`]). Every refusal is a
//! [`PlanError`] that knows the request field it concerns ([`Field`]), so a front-end can
//! point at it in its own terms without rewriting the message.

use super::request::{self, Prompt, RequestError, Served};
use super::GenerateOptions;
use inferno_sampling::constraint::{tool_call_grammar, ConstraintError, ResponseFormat};
use inferno_sampling::{SamplingError, SamplingParams};
use inferno_tokenizer::chat::RESERVED_TEMPLATE_VARIABLES;
use inferno_tokenizer::reasoning::{ReasoningParser, ReplyParser};
use inferno_tokenizer::{ChatEnding, ChatMessage, TemplateArgs};
use serde_json::{json, Value};
use std::fmt;
use std::time::Duration;

/// The longest request id accepted.
pub const MAX_REQUEST_ID_BYTES: usize = 128;

/// One turn of a conversation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    pub content: String,
    /// assistant: the tools it called in this turn.
    pub tool_calls: Vec<ToolCall>,
    /// tool: the id of the call whose result this message carries (empty: none).
    pub tool_call_id: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            ..Self::default()
        }
    }
}

/// A call of a tool, as the model made it (and as a client sends it back).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments: a JSON object, as text.
    pub arguments: String,
}

/// A function the model may call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: String,
    /// A JSON schema (an object, as JSON text) of the arguments; empty: any object.
    pub parameters: String,
}

/// Whether and which tools the model may call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No tools: not shown to the model, its text not parsed for calls.
    None,
    /// Exactly one call of some tool (grammar-constrained).
    Required,
    /// Exactly one call of this tool (grammar-constrained).
    Function(String),
}

/// What the model is prompted with.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// Raw text, tokenized as is (special-token text such as `<|im_start|>` is parsed).
    Text(String),
    /// Token ids, used as given (no BOS is added).
    Tokens(Vec<u32>),
    /// A conversation, rendered with the model's chat template (an assistant turn opened,
    /// unless [`PromptSpec::ending`] says otherwise).
    Messages(Vec<Message>),
}

/// The prompt side of a request: what [`plan_prompt`] needs.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptSpec {
    pub input: Input,
    /// With messages: tools the model may call.
    pub tools: Vec<Tool>,
    pub tool_choice: ToolChoice,
    /// What the output must be; `None`: free text.
    pub response_format: Option<ResponseFormat>,
    /// With messages: ask a thinking model to think (`true`) or not; `None`: the template's
    /// default.
    pub enable_thinking: Option<bool>,
    /// With tools: whether the reply may hold more than one call (OpenAI's
    /// `parallel_tool_calls`); when not, the first call alone is reported.
    pub parallel_tool_calls: bool,
    /// With messages: whether an assistant turn is opened after them, or the final message
    /// is left open for the model to continue (vLLM's `add_generation_prompt` and
    /// `continue_final_message`).
    pub ending: ChatEnding,
    /// With messages: more variables for the chat template, a JSON object's text (vLLM's
    /// `chat_template_kwargs`); none may be one the renderer sets.
    pub template_kwargs: Option<String>,
}

impl PromptSpec {
    pub fn new(input: Input) -> Self {
        Self {
            input,
            tools: Vec::new(),
            tool_choice: ToolChoice::Auto,
            response_format: None,
            enable_thinking: None,
            parallel_tool_calls: true,
            ending: ChatEnding::AssistantTurn,
            template_kwargs: None,
        }
    }

    /// Bytes of text the request asks to tokenize (prompt or messages, tool-call
    /// arguments, tool descriptions and schemas), for the server's tokenizing limit.
    pub fn text_bytes(&self) -> usize {
        let input = match &self.input {
            Input::Text(t) => t.len(),
            Input::Tokens(_) => 0,
            Input::Messages(ms) => ms
                .iter()
                .map(|m| {
                    m.content.len()
                        + m.tool_calls
                            .iter()
                            .map(|c| c.arguments.len())
                            .sum::<usize>()
                })
                .sum(),
        };
        input
            + self.template_kwargs.as_ref().map_or(0, String::len)
            + self
                .tools
                .iter()
                .map(|t| t.description.len() + t.parameters.len())
                .sum::<usize>()
    }

    /// Bytes of the response format's schema, regex or grammar.
    pub fn format_bytes(&self) -> usize {
        match &self.response_format {
            Some(
                ResponseFormat::JsonSchema(t) | ResponseFormat::Regex(t) | ResponseFormat::Lark(t),
            ) => t.len(),
            Some(ResponseFormat::JsonObject) | None => 0,
        }
    }
}

/// A whole generation request.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateSpec {
    pub prompt: PromptSpec,
    /// `None`: the server's default, shortened to what fits.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    /// Stop when the text contains one of these (not included in the output).
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// Stop (successfully) once the generation has run this long.
    pub time_limit: Option<Duration>,
    /// Alternatives to report per token (0 = no logprobs).
    pub logprobs: usize,
    /// Report a `<think>` section apart from the answer.
    pub separate_reasoning: bool,
    /// The client's id for the request; empty: one is assigned.
    pub request_id: String,
    /// Whether the request may speculate when the server does (never changes the tokens).
    pub speculate: bool,
    /// Tokens generated before end-of-generation or a stop token may end the output.
    pub min_tokens: usize,
    /// Tokens that end the output when generated.
    pub stop_token_ids: Vec<u32>,
}

impl GenerateSpec {
    pub fn new(prompt: PromptSpec) -> Self {
        Self {
            prompt,
            max_tokens: None,
            sampling: SamplingParams::default(),
            stop: Vec::new(),
            ignore_eos: false,
            time_limit: None,
            logprobs: 0,
            separate_reasoning: false,
            request_id: String::new(),
            speculate: true,
            min_tokens: 0,
            stop_token_ids: Vec::new(),
        }
    }
}

/// The request field an error concerns, named as the requests of every front-end name it
/// (a front-end whose field is spelled differently maps it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Field {
    /// The prompt, or the messages of a chat.
    Prompt,
    Messages,
    MessageRole {
        message: usize,
    },
    ToolCallArguments {
        message: usize,
        call: usize,
    },
    Tools,
    ToolName {
        tool: usize,
    },
    ToolParameters {
        tool: usize,
    },
    ToolChoice,
    ResponseFormat,
    /// The chat template's further variables, or one of them.
    ChatTemplateKwargs {
        key: Option<String>,
    },
    AddGenerationPrompt,
    ContinueFinalMessage,
    MaxTokens,
    /// The alternatives asked for per token.
    Logprobs,
    Stop,
    StopTokenIds,
    MinTokens,
    /// A sampling parameter, by its engine name (`temperature`, `top_p`, `repeat_penalty`...).
    Sampling(&'static str),
    RequestId,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Prompt => f.write_str("prompt"),
            Field::Messages => f.write_str("messages"),
            Field::MessageRole { message } => write!(f, "messages[{message}].role"),
            Field::ToolCallArguments { message, call } => {
                write!(f, "messages[{message}].tool_calls[{call}].arguments")
            }
            Field::Tools => f.write_str("tools"),
            Field::ToolName { tool } => write!(f, "tools[{tool}].name"),
            Field::ToolParameters { tool } => write!(f, "tools[{tool}].parameters"),
            Field::ToolChoice => f.write_str("tool_choice"),
            Field::ResponseFormat => f.write_str("response_format"),
            Field::ChatTemplateKwargs { key: None } => f.write_str("chat_template_kwargs"),
            Field::ChatTemplateKwargs { key: Some(key) } => {
                write!(f, "chat_template_kwargs.{key}")
            }
            Field::AddGenerationPrompt => f.write_str("add_generation_prompt"),
            Field::ContinueFinalMessage => f.write_str("continue_final_message"),
            Field::MaxTokens => f.write_str("max_tokens"),
            Field::Logprobs => f.write_str("logprobs"),
            Field::Stop => f.write_str("stop"),
            Field::StopTokenIds => f.write_str("stop_token_ids"),
            Field::MinTokens => f.write_str("min_tokens"),
            Field::Sampling(name) => f.write_str(name),
            Field::RequestId => f.write_str("request_id"),
        }
    }
}

/// What is wrong with JSON text a field must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JsonProblem {
    Invalid(String),
    NotObject,
}

impl fmt::Display for JsonProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JsonProblem::Invalid(e) => write!(f, "is not valid JSON: {e}"),
            JsonProblem::NotObject => f.write_str("must be a JSON object"),
        }
    }
}

/// Why a request cannot be served as stated; each is the client's doing.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum PlanError {
    #[error("messages is empty: give at least one message")]
    NoMessages,
    #[error("request_id is longer than {MAX_REQUEST_ID_BYTES} bytes")]
    RequestIdTooLong,
    // The id is written to the logs: a newline or an escape code in it could forge lines.
    #[error(
        "request_id may hold only printable ASCII characters (letters, digits, punctuation \
         and spaces)"
    )]
    RequestIdCharacters,
    #[error("tool_choice names the function {0:?}, which is not among the tools")]
    UnknownToolChoice(String),
    #[error("tool_choice is required but no tools are given")]
    RequiredWithoutTools,
    #[error("tools need a chat request (messages), not a raw prompt")]
    ToolsWithoutMessages,
    #[error("{0} applies to a chat request (messages), not a raw prompt")]
    ChatOptionWithoutMessages(Field),
    #[error(
        "chat_template_kwargs may not set {0:?}: the server sets it (give enable_thinking, \
         add_generation_prompt or continue_final_message as their own fields)"
    )]
    ReservedTemplateVariable(String),
    #[error(
        "continue_final_message continues the final message, so add_generation_prompt (a new \
         assistant turn) cannot be true with it"
    )]
    ContinueWithGenerationPrompt,
    #[error("response_format cannot be combined with a required or named tool_choice")]
    FormatWithForcedTool,
    #[error("tools[{index}].name must be letters, digits, '_', '-' or '.' (got {name:?})")]
    BadToolName { index: usize, name: String },
    #[error("{field} {problem}")]
    Json { field: Field, problem: JsonProblem },
    #[error("the {what} is {bytes} bytes; at most {max} may be tokenized (--max-text-bytes)")]
    TextTooLarge {
        what: &'static str,
        bytes: usize,
        max: usize,
    },
    #[error(transparent)]
    Request(#[from] RequestError),
}

impl PlanError {
    /// The request field the error concerns, where it is one field.
    pub fn field(&self) -> Option<Field> {
        Some(match self {
            PlanError::NoMessages => Field::Messages,
            PlanError::RequestIdTooLong | PlanError::RequestIdCharacters => Field::RequestId,
            PlanError::UnknownToolChoice(_) | PlanError::RequiredWithoutTools => Field::ToolChoice,
            PlanError::ToolsWithoutMessages => Field::Tools,
            PlanError::ChatOptionWithoutMessages(field) => field.clone(),
            PlanError::ContinueWithGenerationPrompt => Field::ContinueFinalMessage,
            PlanError::ReservedTemplateVariable(key) => Field::ChatTemplateKwargs {
                key: Some(key.clone()),
            },
            PlanError::FormatWithForcedTool => Field::ResponseFormat,
            PlanError::BadToolName { index, .. } => Field::ToolName { tool: *index },
            PlanError::Json { field, .. } => field.clone(),
            PlanError::TextTooLarge { what, .. } => match *what {
                "response_format" => Field::ResponseFormat,
                _ => Field::Prompt,
            },
            PlanError::Request(e) => return request_field(e),
        })
    }
}

/// The field a build error concerns.
fn request_field(e: &RequestError) -> Option<Field> {
    use RequestError as E;
    Some(match e {
        E::NoMaxTokens | E::ExceedsContext { .. } | E::ExceedsKvCache { .. } => Field::MaxTokens,
        E::TooManyLogprobs(_) => Field::Logprobs,
        E::TooManyStops(_) | E::StopLength(_) => Field::Stop,
        E::Sampling(SamplingError::Invalid { field, .. }) => Field::Sampling(field),
        E::LogitBiasToken { .. } => Field::Sampling("logit_bias"),
        E::StopTokenOutOfRange { .. } | E::TooManyStopTokens(_) => Field::StopTokenIds,
        E::MinTokensAboveMax { .. } => Field::MinTokens,
        E::Sampling(
            SamplingError::NonFiniteLogits { .. }
            | SamplingError::MissingRows { .. }
            | SamplingError::Constraint(_),
        ) => return None,
        E::ResponseFormat(_) => Field::ResponseFormat,
        E::UnknownRole { index, .. } => Field::MessageRole { message: *index },
        E::Template(_) => Field::Messages,
        E::Tokenize(_)
        | E::Empty
        | E::TokenOutOfRange { .. }
        | E::PromptExceedsContext { .. }
        | E::PromptExceedsKvCache { .. } => Field::Prompt,
    })
}

impl From<ConstraintError> for PlanError {
    fn from(e: ConstraintError) -> Self {
        PlanError::Request(RequestError::ResponseFormat(e))
    }
}

/// How a request lets the model use its tools, once checked.
#[derive(Clone, Debug, PartialEq)]
enum ToolMode {
    /// No tools (none given, or tool_choice none).
    Off,
    Auto,
    Required,
    Named(String),
}

fn tool_mode(spec: &PromptSpec) -> Result<ToolMode, PlanError> {
    let mode = match &spec.tool_choice {
        ToolChoice::Auto => ToolMode::Auto,
        ToolChoice::None => ToolMode::Off,
        ToolChoice::Required => ToolMode::Required,
        ToolChoice::Function(name) => {
            if !spec.tools.iter().any(|t| t.name == *name) {
                return Err(PlanError::UnknownToolChoice(name.clone()));
            }
            ToolMode::Named(name.clone())
        }
    };
    if spec.tools.is_empty() {
        return match mode {
            ToolMode::Required => Err(PlanError::RequiredWithoutTools),
            _ => Ok(ToolMode::Off),
        };
    }
    if !matches!(spec.input, Input::Messages(_)) {
        return Err(PlanError::ToolsWithoutMessages);
    }
    if spec.response_format.is_some() && matches!(mode, ToolMode::Required | ToolMode::Named(_)) {
        return Err(PlanError::FormatWithForcedTool);
    }
    Ok(mode)
}

/// Parses JSON text that must be an object (a schema, a call's arguments).
fn json_object(field: Field, text: &str) -> Result<Value, PlanError> {
    let v: Value = serde_json::from_str(text).map_err(|e| PlanError::Json {
        field: field.clone(),
        problem: JsonProblem::Invalid(e.to_string()),
    })?;
    if !v.is_object() {
        return Err(PlanError::Json {
            field,
            problem: JsonProblem::NotObject,
        });
    }
    Ok(v)
}

/// The tools as the chat template takes them (`transformers`' shape), and the schema of
/// one call of any tool `mode` allows.
fn tools_json(tools: &[Tool], mode: &ToolMode) -> Result<(Value, Value), PlanError> {
    let mut shown = Vec::with_capacity(tools.len());
    let mut calls = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        if t.name.is_empty()
            || !t
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        {
            return Err(PlanError::BadToolName {
                index: i,
                name: t.name.clone(),
            });
        }
        let parameters = if t.parameters.is_empty() {
            json!({"type": "object", "properties": {}})
        } else {
            json_object(Field::ToolParameters { tool: i }, &t.parameters)?
        };
        if matches!(mode, ToolMode::Required) || *mode == ToolMode::Named(t.name.clone()) {
            calls.push(json!({
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": false,
            }));
        }
        shown.push(json!({
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": parameters},
        }));
    }
    let call = if calls.len() == 1 {
        calls.pop().unwrap_or(Value::Null)
    } else {
        json!({ "anyOf": calls })
    };
    Ok((Value::Array(shown), call))
}

/// A message as the chat template takes it, with its tool calls or call id.
fn message_json(i: usize, m: &Message) -> Result<Value, PlanError> {
    let mut v = serde_json::Map::new();
    v.insert("role".into(), Value::from(m.role.clone()));
    v.insert("content".into(), Value::from(m.content.clone()));
    if !m.tool_calls.is_empty() {
        let calls = m
            .tool_calls
            .iter()
            .enumerate()
            .map(|(j, c)| {
                let field = Field::ToolCallArguments {
                    message: i,
                    call: j,
                };
                let arguments = json_object(field, &c.arguments)?;
                Ok(json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": arguments},
                }))
            })
            .collect::<Result<Vec<_>, PlanError>>()?;
        v.insert("tool_calls".into(), Value::Array(calls));
    }
    if !m.tool_call_id.is_empty() {
        v.insert("tool_call_id".into(), Value::from(m.tool_call_id.clone()));
    }
    Ok(Value::Object(v))
}

/// What the engine gets of a request's prompt: the prompt itself (a chat rendered with
/// its tools and tool turns through the model's template), the response format (the
/// request's, or a required or named tool call's grammar), and whether the output is
/// parsed for tool calls.
#[derive(Clone, Debug)]
pub struct PromptPlan {
    pub prompt: Prompt,
    pub response_format: Option<ResponseFormat>,
    pub tools: bool,
}

/// Checks and converts a request's prompt, messages, tools, tool choice and response
/// format.
pub fn plan_prompt(spec: &PromptSpec) -> Result<PromptPlan, PlanError> {
    let mode = tool_mode(spec)?;
    let mut response_format = spec.response_format.clone();
    if !matches!(spec.input, Input::Messages(_)) {
        let chat_only = match spec.ending {
            ChatEnding::ContinueFinal => Some(Field::ContinueFinalMessage),
            ChatEnding::Closed => Some(Field::AddGenerationPrompt),
            ChatEnding::AssistantTurn => spec
                .template_kwargs
                .as_ref()
                .map(|_| Field::ChatTemplateKwargs { key: None }),
        };
        if let Some(field) = chat_only {
            return Err(PlanError::ChatOptionWithoutMessages(field));
        }
    }
    let template = TemplateArgs {
        ending: spec.ending,
        enable_thinking: spec.enable_thinking,
        kwargs: spec
            .template_kwargs
            .as_deref()
            .map(checked_template_kwargs)
            .transpose()?,
    };
    let prompt = match &spec.input {
        Input::Text(text) => Prompt::Text {
            text: text.clone(),
            parse_special: true,
        },
        Input::Tokens(ids) => Prompt::Tokens(ids.clone()),
        Input::Messages(messages) if messages.is_empty() => return Err(PlanError::NoMessages),
        Input::Messages(messages) => {
            let with_tool_fields = messages
                .iter()
                .any(|m| !m.tool_calls.is_empty() || !m.tool_call_id.is_empty());
            if mode == ToolMode::Off && !with_tool_fields {
                Prompt::Chat {
                    messages: messages
                        .iter()
                        .map(|m| ChatMessage::new(m.role.clone(), m.content.clone()))
                        .collect(),
                    template,
                }
            } else {
                if let Some((index, m)) = messages
                    .iter()
                    .enumerate()
                    .find(|(_, m)| !request::ROLES.contains(&m.role.as_str()))
                {
                    return Err(RequestError::UnknownRole {
                        index,
                        role: m.role.clone(),
                    }
                    .into());
                }
                let rendered = messages
                    .iter()
                    .enumerate()
                    .map(|(i, m)| message_json(i, m))
                    .collect::<Result<Vec<_>, PlanError>>()?;
                let tools = if mode == ToolMode::Off {
                    None
                } else {
                    let (shown, call) = tools_json(&spec.tools, &mode)?;
                    if matches!(mode, ToolMode::Required | ToolMode::Named(_)) {
                        response_format = Some(tool_call_grammar(&call));
                    }
                    Some(shown.to_string())
                };
                Prompt::ChatJson {
                    messages: Value::Array(rendered).to_string(),
                    tools,
                    template,
                }
            }
        }
    };
    Ok(PromptPlan {
        prompt,
        response_format,
        tools: mode != ToolMode::Off,
    })
}

/// How a chat's rendering ends, from vLLM's two switches: `add_generation_prompt` (unset:
/// true unless the final message is continued) and `continue_final_message`.
pub fn chat_ending(
    add_generation_prompt: Option<bool>,
    continue_final_message: bool,
) -> Result<ChatEnding, PlanError> {
    match (add_generation_prompt, continue_final_message) {
        (Some(true), true) => Err(PlanError::ContinueWithGenerationPrompt),
        (_, true) => Ok(ChatEnding::ContinueFinal),
        (Some(false), false) => Ok(ChatEnding::Closed),
        (_, false) => Ok(ChatEnding::AssistantTurn),
    }
}

/// The chat template's further variables as given (JSON text), once they are known to be
/// a JSON object that sets none of the variables the renderer sets.
fn checked_template_kwargs(text: &str) -> Result<String, PlanError> {
    let field = Field::ChatTemplateKwargs { key: None };
    let value: Value = serde_json::from_str(text).map_err(|e| PlanError::Json {
        field: field.clone(),
        problem: JsonProblem::Invalid(e.to_string()),
    })?;
    let Value::Object(map) = value else {
        return Err(PlanError::Json {
            field,
            problem: JsonProblem::NotObject,
        });
    };
    if let Some(key) = map
        .keys()
        .find(|k| RESERVED_TEMPLATE_VARIABLES.contains(&k.as_str()))
    {
        return Err(PlanError::ReservedTemplateVariable(key.clone()));
    }
    Ok(text.to_owned())
}

/// Refuses a text of `bytes` bytes to tokenize (`what`: "text", "prompt") over `max`.
pub fn check_text_bytes(what: &'static str, bytes: usize, max: usize) -> Result<(), PlanError> {
    if bytes > max {
        return Err(PlanError::TextTooLarge { what, bytes, max });
    }
    Ok(())
}

/// Refuses a request whose text (prompt, messages, tools) or response format is larger
/// than `max` bytes, before any of it is parsed or tokenized.
pub fn check_text_size(spec: &PromptSpec, max: usize) -> Result<(), PlanError> {
    check_text_bytes("prompt", spec.text_bytes(), max)?;
    check_text_bytes("response_format", spec.format_bytes(), max)
}

/// Checks a request id: at most [`MAX_REQUEST_ID_BYTES`] of printable ASCII.
pub fn check_request_id(id: &str) -> Result<(), PlanError> {
    if id.len() > MAX_REQUEST_ID_BYTES {
        return Err(PlanError::RequestIdTooLong);
    }
    if !id.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
        return Err(PlanError::RequestIdCharacters);
    }
    Ok(())
}

/// A new random request id.
pub fn new_request_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Whether the served model is a thinking one: its chat template deals with a `<think>`
/// section (Qwen3's and the DeepSeek-R1 distills' templates do).
pub fn thinks(served: &Served) -> bool {
    served.chat_template.source().contains("<think>")
}

/// A checked request, ready for the queue.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub request_id: String,
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    pub logprobs: usize,
    /// Splits the output into reasoning, text and tool calls as the request asks (a fresh
    /// parser: clone it for each sequence generated for the request).
    pub reply: ReplyParser,
    /// Whether the reply may hold more than one tool call ([`PromptSpec`]'s).
    pub parallel_tool_calls: bool,
}

/// Checks a request, renders and tokenizes its prompt and resolves its limits against
/// what the server serves.
pub fn prepare(
    spec: GenerateSpec,
    served: &Served,
    default_max_tokens: usize,
) -> Result<Prepared, PlanError> {
    check_request_id(&spec.request_id)?;
    let parallel_tool_calls = spec.prompt.parallel_tool_calls;
    let plan = plan_prompt(&spec.prompt)?;
    let built = served.build(
        request::Request {
            prompt: plan.prompt,
            max_tokens: spec.max_tokens,
            sampling: spec.sampling,
            stop: spec.stop,
            ignore_eos: spec.ignore_eos,
            time_limit: spec.time_limit,
            logprobs: spec.logprobs,
            response_format: plan.response_format,
            speculate: spec.speculate,
            min_tokens: spec.min_tokens,
            stop_token_ids: spec.stop_token_ids,
        },
        default_max_tokens,
    )?;
    let request_id = if spec.request_id.is_empty() {
        new_request_id()
    } else {
        spec.request_id
    };
    let reasoning = spec.separate_reasoning.then(|| {
        // A few tokens are enough to see whether the prompt ends in an open `<think>`.
        let tail = &built.prompt[built.prompt.len().saturating_sub(8)..];
        let text = served.tokenizer.decode(tail, false).unwrap_or_default();
        ReasoningParser::after_prompt(&text)
    });
    Ok(Prepared {
        request_id,
        prompt: built.prompt,
        options: built.options,
        logprobs: built.logprobs,
        reply: ReplyParser::new(reasoning, plan.tools),
        parallel_tool_calls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tool conversations render as transformers renders the same conversation (the
    /// `tools_and_tool_calls` fixture of `tests/fixtures/tokenizer`, made by
    /// `gen_tokenizer_fixture.py` with the Qwen3 template).
    #[test]
    fn tool_requests_render_as_transformers_renders_them() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/tokenizer"
        );
        let raw = std::fs::read_to_string(format!("{dir}/chat.json")).unwrap();
        let file: Value = serde_json::from_str(&raw).unwrap();
        let conv = file["conversations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "tools_and_tool_calls")
            .unwrap();
        let gguf = inferno_gguf::GgufFile::open(format!("{dir}/qwen3-vocab.gguf")).unwrap();
        let template = inferno_tokenizer::ChatTemplate::for_model(&gguf);
        let messages: Vec<Message> = conv["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| Message {
                role: m["role"].as_str().unwrap().into(),
                content: m["content"].as_str().unwrap().into(),
                tool_calls: m["tool_calls"]
                    .as_array()
                    .map(|calls| {
                        calls
                            .iter()
                            .map(|c| ToolCall {
                                id: "call_1".into(),
                                name: c["function"]["name"].as_str().unwrap().into(),
                                arguments: c["function"]["arguments"].to_string(),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                tool_call_id: String::new(),
            })
            .collect();
        let tools: Vec<Tool> = conv["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(fixture_tool)
            .collect();
        let messages: Vec<Value> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| message_json(i, m).unwrap())
            .collect();
        let (shown, _) = tools_json(&tools, &ToolMode::Auto).unwrap();
        let rendered = template
            .render_json(
                &Value::Array(messages).to_string(),
                Some(&shown.to_string()),
                conv["add_generation_prompt"].as_bool().unwrap(),
                None,
            )
            .unwrap();
        assert_eq!(rendered, conv["rendered"].as_str().unwrap());
    }

    /// Tool conversations as the APIs send them (assistant turns with tool_calls, tool
    /// messages with tool_call_id) render through Qwen2.5-Coder's template as transformers
    /// renders them, byte for byte (`tests/fixtures/chat_tools`, made by
    /// `gen_chat_tools_fixture.py`): tools, calls and arguments keep their keys' order.
    #[test]
    fn tool_conversations_render_as_transformers_renders_them_with_qwen25s_template() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/chat_tools/qwen2.5-coder-tools.json"
        );
        let file: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let template =
            inferno_tokenizer::ChatTemplate::new(file["chat_template"].as_str().unwrap()).unwrap();
        let convs = file["conversations"].as_array().unwrap();
        assert_eq!(convs.len(), 3);
        for conv in convs {
            let name = conv["name"].as_str().unwrap();
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            let mut spec = PromptSpec::new(Input::Messages(
                conv["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| Message {
                        role: text(&m["role"]),
                        content: text(&m["content"]),
                        tool_calls: m["tool_calls"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|c| ToolCall {
                                id: text(&c["id"]),
                                name: text(&c["function"]["name"]),
                                arguments: c["function"]["arguments"].to_string(),
                            })
                            .collect(),
                        tool_call_id: text(&m["tool_call_id"]),
                    })
                    .collect(),
            ));
            spec.tools = conv["tools"]
                .as_array()
                .unwrap()
                .iter()
                .map(fixture_tool)
                .collect();
            let plan = plan_prompt(&spec).unwrap();
            assert!(plan.tools && plan.response_format.is_none(), "{name}");
            let Prompt::ChatJson {
                messages,
                tools,
                template: args,
            } = plan.prompt
            else {
                panic!("{name}: not a chat with tools");
            };
            let rendered = template
                .render_json_with(&messages, tools.as_deref(), &args)
                .unwrap();
            assert_eq!(rendered, conv["rendered"].as_str().unwrap(), "{name}");
        }
    }

    /// A tool as the fixtures write it (OpenAI's `{"type": "function", "function": …}`).
    fn fixture_tool(t: &Value) -> Tool {
        Tool {
            name: t["function"]["name"].as_str().unwrap().into(),
            description: t["function"]["description"].as_str().unwrap().into(),
            parameters: t["function"]["parameters"].to_string(),
        }
    }

    /// Chats rendered with no assistant turn opened, with the final message continued (a
    /// prefilled reply) and with further template variables come out as transformers
    /// renders them (`tests/fixtures/chat_tools/chat-endings.json`, made by
    /// `gen_chat_tools_fixture.py`), through the template alone and through the planner
    /// where the messages fit its types; what transformers refuses is refused.
    #[test]
    fn chat_endings_and_template_variables_render_as_transformers_renders_them() {
        use inferno_tokenizer::ChatTemplate;
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/chat_tools/chat-endings.json"
        );
        let file: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let template = |name: &str| {
            let special = &file["special_tokens"][name];
            let token = |k: &str| special[k].as_str().map(str::to_owned);
            ChatTemplate::new(file["templates"][name].as_str().unwrap())
                .unwrap()
                .with_special_tokens(token("bos_token"), token("eos_token"))
        };
        let convs = file["conversations"].as_array().unwrap();
        assert_eq!(convs.len(), 13);
        let (mut planned, mut refused) = (0, 0);
        for conv in convs {
            let name = conv["name"].as_str().unwrap();
            let t = template(conv["template"].as_str().unwrap());
            let ending = chat_ending(
                conv["generation_prompt"].as_bool(),
                conv["continue"].as_bool().unwrap(),
            )
            .unwrap();
            let kwargs = conv.get("kwargs").map(Value::to_string);
            let args = TemplateArgs {
                ending,
                enable_thinking: None,
                kwargs: kwargs.clone(),
            };
            let tools = conv.get("tools").map(Value::to_string);
            let direct = t.render_json_with(&conv["messages"].to_string(), tools.as_deref(), &args);
            let Some(want) = conv["rendered"].as_str() else {
                let e = direct.unwrap_err().to_string();
                assert!(
                    e.contains("continue_final_message is set but"),
                    "{name}: {e}"
                );
                refused += 1;
                continue;
            };
            assert_eq!(direct.unwrap(), want, "{name}: the template alone");

            // The planner's path, where every content is text.
            let messages: Option<Vec<Message>> = conv["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    Some(Message {
                        role: m["role"].as_str()?.into(),
                        content: m["content"].as_str()?.into(),
                        tool_calls: m["tool_calls"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|c| ToolCall {
                                id: c["id"].as_str().unwrap().into(),
                                name: c["function"]["name"].as_str().unwrap().into(),
                                arguments: c["function"]["arguments"].to_string(),
                            })
                            .collect(),
                        tool_call_id: m["tool_call_id"].as_str().unwrap_or_default().into(),
                    })
                })
                .collect();
            let Some(messages) = messages else {
                continue;
            };
            let mut spec = PromptSpec::new(Input::Messages(messages));
            spec.ending = ending;
            spec.template_kwargs = kwargs;
            spec.tools = conv["tools"]
                .as_array()
                .into_iter()
                .flatten()
                .map(fixture_tool)
                .collect();
            let rendered = match plan_prompt(&spec).unwrap().prompt {
                Prompt::Chat { messages, template } => t.render_with(&messages, &template),
                Prompt::ChatJson {
                    messages,
                    tools,
                    template,
                } => t.render_json_with(&messages, tools.as_deref(), &template),
                other => panic!("{name}: {other:?}"),
            };
            assert_eq!(rendered.unwrap(), want, "{name}: through the planner");
            planned += 1;
        }
        assert_eq!((planned, refused), (10, 2));
    }

    /// The chat-only options are refused on a raw prompt, and the template variables may
    /// not set what the renderer sets, each naming its field.
    #[test]
    fn chat_options_are_checked_and_name_their_field() {
        assert_eq!(
            chat_ending(Some(true), true).unwrap_err().field(),
            Some(Field::ContinueFinalMessage)
        );
        assert_eq!(chat_ending(None, true).unwrap(), ChatEnding::ContinueFinal);
        assert_eq!(chat_ending(Some(false), false).unwrap(), ChatEnding::Closed);
        assert_eq!(chat_ending(None, false).unwrap(), ChatEnding::AssistantTurn);
        let text = |f: &dyn Fn(&mut PromptSpec)| {
            let mut spec = PromptSpec::new(Input::Text("hi".into()));
            f(&mut spec);
            plan_prompt(&spec).unwrap_err()
        };
        let e = text(&|s| s.ending = ChatEnding::ContinueFinal);
        assert_eq!(e.field(), Some(Field::ContinueFinalMessage));
        assert_eq!(
            e.to_string(),
            "continue_final_message applies to a chat request (messages), not a raw prompt"
        );
        let e = text(&|s| s.ending = ChatEnding::Closed);
        assert_eq!(e.field(), Some(Field::AddGenerationPrompt));
        let e = text(&|s| s.template_kwargs = Some("{}".into()));
        assert_eq!(e.field(), Some(Field::ChatTemplateKwargs { key: None }));
        let chat = |kwargs: &str| {
            let mut spec = PromptSpec::new(Input::Messages(vec![Message::new("user", "hi")]));
            spec.template_kwargs = Some(kwargs.into());
            plan_prompt(&spec).map(|p| p.prompt)
        };
        for reserved in RESERVED_TEMPLATE_VARIABLES {
            let e = chat(&format!("{{\"ok\": 1, \"{reserved}\": true}}")).unwrap_err();
            assert_eq!(
                e.field().unwrap().to_string(),
                format!("chat_template_kwargs.{reserved}")
            );
        }
        for (bad, problem) in [("[1]", "must be a JSON object"), ("{", "is not valid JSON")] {
            let e = chat(bad).unwrap_err();
            assert_eq!(e.field(), Some(Field::ChatTemplateKwargs { key: None }));
            assert!(e.to_string().contains(problem), "{e}");
        }
        let Prompt::Chat { template, .. } = chat(r#"{"b": 1, "a": 2}"#).unwrap() else {
            panic!("not a plain chat");
        };
        assert_eq!(template.kwargs.as_deref(), Some(r#"{"b": 1, "a": 2}"#));
    }

    fn chat_with_tools() -> PromptSpec {
        let mut spec = PromptSpec::new(Input::Messages(vec![Message::new("user", "hi")]));
        spec.tools = vec![Tool {
            name: "get_time".into(),
            description: "the time".into(),
            parameters: r#"{"type":"object","properties":{"tz":{"type":"string"}}}"#.into(),
        }];
        spec
    }

    type Change = Box<dyn Fn(&mut PromptSpec)>;

    /// Each refusal names the field it concerns.
    #[test]
    fn errors_know_their_field() {
        let cases: Vec<(Change, Field, &str)> = vec![
            (
                Box::new(|s| s.tool_choice = ToolChoice::Function("nope".into())),
                Field::ToolChoice,
                "tool_choice names the function \"nope\"",
            ),
            (
                Box::new(|s| {
                    s.tools.clear();
                    s.tool_choice = ToolChoice::Required;
                }),
                Field::ToolChoice,
                "no tools are given",
            ),
            (
                Box::new(|s| s.input = Input::Text("raw".into())),
                Field::Tools,
                "messages",
            ),
            (
                Box::new(|s| {
                    s.tool_choice = ToolChoice::Required;
                    s.response_format = Some(ResponseFormat::JsonObject);
                }),
                Field::ResponseFormat,
                "response_format cannot be combined",
            ),
            (
                Box::new(|s| s.tools[0].name = "a b".into()),
                Field::ToolName { tool: 0 },
                "tools[0].name must be",
            ),
            (
                Box::new(|s| s.tools[0].parameters = "[1]".into()),
                Field::ToolParameters { tool: 0 },
                "tools[0].parameters must be a JSON object",
            ),
            (
                Box::new(|s| {
                    s.input = Input::Messages(vec![Message {
                        role: "assistant".into(),
                        tool_calls: vec![ToolCall {
                            id: "x".into(),
                            name: "get_time".into(),
                            arguments: "{oops".into(),
                        }],
                        ..Message::default()
                    }])
                }),
                Field::ToolCallArguments {
                    message: 0,
                    call: 0,
                },
                "messages[0].tool_calls[0].arguments is not valid JSON",
            ),
            (
                Box::new(|s| s.input = Input::Messages(vec![Message::new("wizard", "hi")])),
                Field::MessageRole { message: 0 },
                "unknown role \"wizard\" in messages[0]",
            ),
            (
                Box::new(|s| s.input = Input::Messages(Vec::new())),
                Field::Messages,
                "messages is empty",
            ),
        ];
        for (change, field, says) in cases {
            let mut spec = chat_with_tools();
            change(&mut spec);
            let e = plan_prompt(&spec).unwrap_err();
            assert_eq!(e.field(), Some(field), "{e}");
            assert!(e.to_string().contains(says), "{e} lacks {says:?}");
        }
        assert_eq!(
            check_request_id("a\nb").unwrap_err().field(),
            Some(Field::RequestId)
        );
        let e = check_text_size(&chat_with_tools(), 4).unwrap_err();
        assert_eq!(e.field(), Some(Field::Prompt));
        assert!(e.to_string().contains("--max-text-bytes"), "{e}");
    }

    /// A required or named choice constrains the output to one call; none hides the tools.
    #[test]
    fn tool_choices_plan_the_prompt_and_the_grammar() {
        let mut spec = chat_with_tools();
        let auto = plan_prompt(&spec).unwrap();
        assert!(auto.tools && auto.response_format.is_none());
        spec.tool_choice = ToolChoice::Required;
        let required = plan_prompt(&spec).unwrap();
        assert!(matches!(
            required.response_format,
            Some(ResponseFormat::Lark(_))
        ));
        spec.tool_choice = ToolChoice::None;
        let none = plan_prompt(&spec).unwrap();
        assert!(!none.tools && none.response_format.is_none());
        assert!(matches!(none.prompt, Prompt::Chat { .. }));
        spec.input = Input::Tokens(vec![1, 2, 3]);
        spec.tools.clear();
        let tokens = plan_prompt(&spec).unwrap();
        assert!(matches!(tokens.prompt, Prompt::Tokens(ref t) if t == &[1, 2, 3]));
    }
}
