//! The `inferno.v1.Inference` service: converts requests into engine jobs and streams the
//! engine's events back as gRPC messages. Handlers never touch the model; they use the
//! tokenizer side ([`Served`], which checks and builds each request) and the engine's queue.

use super::metrics::Metrics;
use super::pb;
use crate::engine::{
    self, Engine, EngineState, Event, FinishReason, GenerateOptions, Job, JobError, Prompt, Served,
    SubmitError, TokenLogprob,
};
use crate::sampling::constraint::{tool_call_grammar, ResponseFormat};
use crate::sampling::SamplingParams;
use crate::tokenizer::reasoning::{ReasoningParser, ReplyParser};
use crate::tokenizer::tool_calls::Parsed;
use crate::tokenizer::ChatMessage;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, Semaphore};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

/// The longest request id accepted.
const MAX_REQUEST_ID_BYTES: usize = 128;

/// Limits of the handlers, set by the server's configuration.
#[derive(Clone, Debug)]
pub struct HandlerLimits {
    /// `max_tokens` of a Generate request that does not set it.
    pub default_max_tokens: usize,
    /// Largest text a call may ask to tokenize (a Tokenize text, a prompt, or the sum of a
    /// chat's message contents).
    pub max_text_bytes: usize,
    /// Tokenize, Detokenize and prompt preparations that run at once; more wait their turn.
    pub cpu_jobs: usize,
}

pub struct InferenceService {
    engine: Arc<Engine>,
    metrics: Arc<Metrics>,
    default_max_tokens: usize,
    max_text_bytes: usize,
    /// Bounds the handlers' CPU work on the blocking threads.
    cpu_jobs: Arc<Semaphore>,
}

impl InferenceService {
    pub fn new(engine: Arc<Engine>, metrics: Arc<Metrics>, limits: HandlerLimits) -> Self {
        Self {
            engine,
            metrics,
            default_max_tokens: limits.default_max_tokens.max(1),
            max_text_bytes: limits.max_text_bytes,
            cpu_jobs: Arc::new(Semaphore::new(limits.cpu_jobs.max(1))),
        }
    }

    /// Runs a handler's CPU work (tokenizing, detokenizing) on a blocking thread, at most
    /// `cpu_jobs` at once: on the runtime's few threads it would stall every stream and
    /// health check while it runs.
    async fn cpu_job<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, Status> + Send + 'static,
    ) -> Result<T, Status> {
        let permit = Arc::clone(&self.cpu_jobs)
            .acquire_owned()
            .await
            .map_err(|_| Status::unavailable("the server is shutting down"))?;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        })
        .await
        .unwrap_or_else(|e| Err(Status::internal(format!("the request's work failed: {e}"))))
    }

    /// Refuses a text too large to tokenize.
    fn check_text_size(&self, what: &str, bytes: usize) -> Result<(), Status> {
        if bytes > self.max_text_bytes {
            return Err(invalid(format!(
                "the {what} is {bytes} bytes; at most {} may be tokenized (--max-text-bytes)",
                self.max_text_bytes
            )));
        }
        Ok(())
    }

    fn served(&self) -> Result<Arc<Served>, Status> {
        match self.engine.state() {
            EngineState::Ready(s) => Ok(s),
            EngineState::Loading => Err(Status::unavailable("the model is still loading")),
            EngineState::Failed(e) => Err(Status::unavailable(format!(
                "the model failed to load: {e}"
            ))),
        }
    }

    /// Records the outcome of a unary call.
    fn count<T>(&self, method: &'static str, r: Result<T, Status>) -> Result<T, Status> {
        self.metrics.request(
            method,
            match &r {
                Ok(_) => "OK",
                Err(s) => code_name(s.code()),
            },
        );
        r
    }
}

/// The status code's name as gRPC spells it.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Parses a `grpc-timeout` header value ("100m", "5S", ...).
pub fn parse_grpc_timeout(v: &str) -> Option<Duration> {
    if v.len() < 2 || v.len() > 9 {
        return None;
    }
    let (digits, unit) = v.split_at(v.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// tonic refuses a request message over the size limit with OUT_OF_RANGE before any handler
/// runs; the gRPC convention (grpc-go, grpc C++) is RESOURCE_EXHAUSTED, and the client should
/// learn which setting it ran into. The handlers never answer OUT_OF_RANGE themselves, so
/// such a status in a response's headers is the transport's.
pub(crate) fn oversize(headers: &mut http::HeaderMap, limit: usize) {
    let Some(status) = Status::from_header_map(headers) else {
        return;
    };
    if status.code() != tonic::Code::OutOfRange {
        return;
    }
    let renamed = Status::resource_exhausted(format!(
        "the message is larger than the server's limit of {limit} bytes \
         (--max-message-bytes): {}",
        status.message()
    ));
    // Only fails for a message that cannot be encoded; the original status stays then.
    let _ = renamed.add_header(headers);
}

fn invalid(msg: impl Into<String>) -> Status {
    Status::invalid_argument(msg)
}

/// A validated Generate request, ready for the queue.
pub(crate) struct Prepared {
    pub request_id: String,
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    pub logprobs: usize,
    /// Splits the output into reasoning, text and tool calls as the request asks.
    pub reply: ReplyParser,
}

/// How a request lets the model use its tools.
#[derive(Clone, Debug, PartialEq)]
enum ToolMode {
    /// No tools (none given, or tool_choice none).
    Off,
    Auto,
    Required,
    Named(String),
}

fn tool_mode(req: &pb::GenerateRequest) -> Result<ToolMode, Status> {
    use pb::tool_choice::{Choice, Mode};
    let choice = req.tool_choice.as_ref().and_then(|c| c.choice.clone());
    let mode = match choice {
        None => ToolMode::Auto,
        Some(Choice::Mode(m)) => match Mode::try_from(m) {
            Ok(Mode::Unspecified | Mode::Auto) => ToolMode::Auto,
            Ok(Mode::None) => ToolMode::Off,
            Ok(Mode::Required) => ToolMode::Required,
            Err(_) => return Err(invalid(format!("tool_choice mode {m} is unknown"))),
        },
        Some(Choice::Function(name)) => {
            if !req.tools.iter().any(|t| t.name == name) {
                return Err(invalid(format!(
                    "tool_choice names the function {name:?}, which is not among the tools"
                )));
            }
            ToolMode::Named(name)
        }
    };
    if req.tools.is_empty() {
        return match mode {
            ToolMode::Required => Err(invalid("tool_choice is required but no tools are given")),
            _ => Ok(ToolMode::Off),
        };
    }
    if req.messages.is_empty() {
        return Err(invalid(
            "tools need a chat request (messages), not a raw prompt",
        ));
    }
    if req.response_format.is_some() && matches!(mode, ToolMode::Required | ToolMode::Named(_)) {
        return Err(invalid(
            "response_format cannot be combined with a required or named tool_choice",
        ));
    }
    Ok(mode)
}

/// Parses JSON text that must be an object (a schema, a call's arguments).
fn json_object(what: &str, text: &str) -> Result<Value, Status> {
    let v: Value = serde_json::from_str(text)
        .map_err(|e| invalid(format!("{what} is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(invalid(format!("{what} must be a JSON object")));
    }
    Ok(v)
}

/// The tools as the chat template takes them (`transformers`' shape), and the schema of
/// one call of any tool `mode` allows.
fn tools_json(tools: &[pb::Tool], mode: &ToolMode) -> Result<(Value, Value), Status> {
    let mut shown = Vec::with_capacity(tools.len());
    let mut calls = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        if t.name.is_empty()
            || !t
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        {
            return Err(invalid(format!(
                "tools[{i}].name must be letters, digits, '_', '-' or '.' (got {:?})",
                t.name
            )));
        }
        let parameters = if t.parameters.is_empty() {
            json!({"type": "object", "properties": {}})
        } else {
            json_object(&format!("tools[{i}].parameters"), &t.parameters)?
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
fn message_json(i: usize, m: &pb::ChatMessage) -> Result<Value, Status> {
    let mut v = serde_json::Map::new();
    v.insert("role".into(), Value::from(m.role.clone()));
    v.insert("content".into(), Value::from(m.content.clone()));
    if !m.tool_calls.is_empty() {
        let calls = m
            .tool_calls
            .iter()
            .enumerate()
            .map(|(j, c)| {
                let arguments = json_object(
                    &format!("messages[{i}].tool_calls[{j}].arguments"),
                    &c.arguments,
                )?;
                Ok(json!({
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": arguments},
                }))
            })
            .collect::<Result<Vec<_>, Status>>()?;
        v.insert("tool_calls".into(), Value::Array(calls));
    }
    if !m.tool_call_id.is_empty() {
        v.insert("tool_call_id".into(), Value::from(m.tool_call_id.clone()));
    }
    Ok(Value::Object(v))
}

/// Converts a request for the engine, which checks and builds it.
pub(crate) fn prepare(
    req: pb::GenerateRequest,
    served: &Served,
    default_max_tokens: usize,
) -> Result<Prepared, Status> {
    let has_prompt = !req.prompt.is_empty();
    let has_messages = !req.messages.is_empty();
    if has_prompt && has_messages {
        return Err(invalid("give either prompt or messages, not both"));
    }
    if !has_prompt && !has_messages {
        return Err(invalid("the prompt is empty: give prompt or messages"));
    }
    if req.request_id.len() > MAX_REQUEST_ID_BYTES {
        return Err(invalid(format!(
            "request_id is longer than {MAX_REQUEST_ID_BYTES} bytes"
        )));
    }
    // The id is written to the logs: a newline or an escape code in it could forge lines.
    if !req
        .request_id
        .bytes()
        .all(|b| b.is_ascii_graphic() || b == b' ')
    {
        return Err(invalid(
            "request_id may hold only printable ASCII characters (letters, digits, \
             punctuation and spaces)",
        ));
    }
    let plan = plan_prompt(&req)?;
    let separate_reasoning = req.separate_reasoning;
    let built = served
        .build(
            engine::Request {
                prompt: plan.prompt,
                max_tokens: req.max_tokens.map(|n| n as usize),
                sampling: sampling_params(req.sampling.as_ref()),
                stop: req.stop,
                ignore_eos: req.ignore_eos,
                time_limit: (req.time_limit_ms > 0)
                    .then(|| Duration::from_millis(req.time_limit_ms as u64)),
                logprobs: req.logprobs as usize,
                response_format: plan.response_format,
                speculate: !req.disable_speculation,
            },
            default_max_tokens,
        )
        .map_err(|e| invalid(e.to_string()))?;
    let request_id = if req.request_id.is_empty() {
        format!("{:016x}", rand::random::<u64>())
    } else {
        req.request_id
    };
    let reasoning = separate_reasoning.then(|| {
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
    })
}

/// What the engine gets of a request's prompt: the prompt itself (a chat rendered with
/// its tools and tool turns through the model's template), the response format (the
/// request's, or a required or named tool call's grammar), and whether the output is
/// parsed for tool calls. The command line builds its prompts with this too.
pub(crate) struct PromptPlan {
    pub prompt: Prompt,
    pub response_format: Option<ResponseFormat>,
    pub tools: bool,
}

/// Checks and converts a request's prompt, messages, tools, tool choice and response
/// format (exactly one of prompt and messages is assumed given).
pub(crate) fn plan_prompt(req: &pb::GenerateRequest) -> Result<PromptPlan, Status> {
    let has_messages = !req.messages.is_empty();
    let mode = tool_mode(req)?;
    let mut response_format = req
        .response_format
        .clone()
        .map(response_format)
        .transpose()?;
    let with_tool_fields = req
        .messages
        .iter()
        .any(|m| !m.tool_calls.is_empty() || !m.tool_call_id.is_empty());
    let prompt = if has_messages && (mode != ToolMode::Off || with_tool_fields) {
        if let Some((index, m)) = req
            .messages
            .iter()
            .enumerate()
            .find(|(_, m)| !engine::request::ROLES.contains(&m.role.as_str()))
        {
            return Err(invalid(
                engine::RequestError::UnknownRole {
                    index,
                    role: m.role.clone(),
                }
                .to_string(),
            ));
        }
        let messages = req
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| message_json(i, m))
            .collect::<Result<Vec<_>, Status>>()?;
        let tools = if mode == ToolMode::Off {
            None
        } else {
            let (shown, call) = tools_json(&req.tools, &mode)?;
            if matches!(mode, ToolMode::Required | ToolMode::Named(_)) {
                response_format = Some(tool_call_grammar(&call));
            }
            Some(shown.to_string())
        };
        Prompt::ChatJson {
            messages: Value::Array(messages).to_string(),
            tools,
            enable_thinking: req.enable_thinking,
        }
    } else if has_messages {
        Prompt::Chat {
            messages: req
                .messages
                .iter()
                .map(|m| ChatMessage::new(m.role.clone(), m.content.clone()))
                .collect(),
            enable_thinking: req.enable_thinking,
        }
    } else {
        Prompt::Text {
            text: req.prompt.clone(),
            parse_special: true,
        }
    };
    Ok(PromptPlan {
        prompt,
        response_format,
        tools: mode != ToolMode::Off,
    })
}

/// The bytes of a response format's schema, regex or grammar.
fn format_text_bytes(f: &pb::ResponseFormat) -> usize {
    use pb::response_format::Format;
    match &f.format {
        Some(Format::JsonSchema(t) | Format::Regex(t) | Format::Lark(t)) => t.len(),
        Some(Format::JsonObject(_)) | None => 0,
    }
}

fn response_format(f: pb::ResponseFormat) -> Result<ResponseFormat, Status> {
    use pb::response_format::Format;
    Ok(match f.format {
        Some(Format::JsonSchema(s)) => ResponseFormat::JsonSchema(s),
        Some(Format::JsonObject(_)) => ResponseFormat::JsonObject,
        Some(Format::Regex(r)) => ResponseFormat::Regex(r),
        Some(Format::Lark(g)) => ResponseFormat::Lark(g),
        None => {
            return Err(invalid(
                "response_format is set but names no format (json_schema, json_object, \
                 regex or lark)",
            ))
        }
    })
}

fn sampling_params(p: Option<&pb::SamplingParams>) -> SamplingParams {
    let d = SamplingParams::default();
    let Some(p) = p else { return d };
    SamplingParams {
        temperature: p.temperature.unwrap_or(d.temperature),
        top_k: p.top_k.map_or(d.top_k, |k| k as usize),
        top_p: p.top_p.unwrap_or(d.top_p),
        min_p: p.min_p.unwrap_or(d.min_p),
        repeat_penalty: p.repeat_penalty.unwrap_or(d.repeat_penalty),
        repeat_last_n: p.repeat_last_n.map_or(d.repeat_last_n, |n| n as usize),
        seed: p.seed.or(d.seed),
    }
}

/// The gRPC enum of an engine finish reason (`None`: the request failed). Its name
/// (`as_str_name`) is the one spelling every output uses.
pub fn finish_reason(f: Option<FinishReason>) -> pb::FinishReason {
    match f {
        Some(FinishReason::Eos) => pb::FinishReason::Eos,
        Some(FinishReason::StopSequence) => pb::FinishReason::StopSequence,
        Some(FinishReason::Length) => pb::FinishReason::Length,
        Some(FinishReason::Cancelled) => pb::FinishReason::Cancelled,
        Some(FinishReason::TimeLimit) => pb::FinishReason::TimeLimit,
        Some(FinishReason::ToolCalls) => pb::FinishReason::ToolCalls,
        None => pb::FinishReason::Error,
    }
}

fn job_status(e: JobError) -> Status {
    match e {
        JobError::DeadlineExceeded => Status::deadline_exceeded("the request's deadline passed"),
        JobError::ShuttingDown => Status::unavailable("the server is shutting down"),
        JobError::InvalidArgument(m) => Status::invalid_argument(m),
        JobError::Internal(m) => Status::internal(format!("the engine failed: {m}")),
    }
}

/// The response stream of one Generate call.
pub struct GenerateStream {
    rx: mpsc::UnboundedReceiver<Event>,
    served: Arc<Served>,
    request_id: String,
    /// A final message (Done with a finish reason, or an error) has been yielded.
    ended: bool,
    /// Splits the text into reasoning, answer text and tool calls, as the request asked.
    reply: ReplyParser,
    /// The calls found so far.
    calls: Vec<pb::ToolCall>,
    /// All the reasoning so far (with separate_reasoning).
    reasoning: String,
    /// Messages converted but not yet yielded (a token can complete a call).
    queued: VecDeque<Result<pb::GenerateResponse, Status>>,
}

impl GenerateStream {
    /// Splits `text` into its reasoning and answer text (returned) and the calls it
    /// completes (queued as events).
    fn split_reply(&mut self, text: String, last: bool) -> (String, String) {
        let mut piece = self.reply.push(&text);
        if last {
            let end = self.reply.finish();
            piece.reasoning.push_str(&end.reasoning);
            piece.answer.extend(end.answer);
        }
        self.reasoning.push_str(&piece.reasoning);
        let mut out = String::new();
        for p in piece.answer {
            match p {
                Parsed::Text(t) => out.push_str(&t),
                Parsed::Call(c) => {
                    let call = pb::ToolCall {
                        id: format!("call_{:016x}", rand::random::<u64>()),
                        name: c.name,
                        arguments: c.arguments,
                    };
                    self.calls.push(call.clone());
                    self.queued.push_back(Ok(pb::GenerateResponse {
                        event: Some(pb::generate_response::Event::ToolCall(call)),
                    }));
                }
            }
        }
        (piece.reasoning, out)
    }

    /// Converts an engine event into the messages it makes, queued in order.
    fn convert(&mut self, ev: Event) {
        let calls_before = self.queued.len();
        let msg = self.convert_one(ev);
        // The event's own message goes first for a token, after the calls for the end.
        let is_token = matches!(
            &msg,
            Ok(pb::GenerateResponse {
                event: Some(pb::generate_response::Event::Token(_))
            })
        );
        if is_token {
            self.queued.insert(calls_before, msg);
        } else {
            self.queued.push_back(msg);
        }
    }

    fn convert_one(&mut self, ev: Event) -> Result<pb::GenerateResponse, Status> {
        use pb::generate_response::Event as E;
        match ev {
            Event::Token(t) => {
                let (reasoning, text) = self.split_reply(t.text, false);
                Ok(pb::GenerateResponse {
                    event: Some(E::Token(pb::GeneratedToken {
                        index: t.index as u32,
                        id: t.id,
                        text,
                        logprobs: t.logprobs.map(|l| pb::Logprobs {
                            chosen: Some(self.logprob(&l.chosen)),
                            top: l.top.iter().map(|t| self.logprob(t)).collect(),
                        }),
                        reasoning,
                    })),
                })
            }
            Event::Done(d) => {
                if d.finish_reason.is_some() {
                    self.ended = true;
                }
                let (reasoning, text) = self.split_reply(d.text, true);
                let mut reason = d.finish_reason;
                if reason == Some(FinishReason::Eos) && !self.calls.is_empty() {
                    reason = Some(FinishReason::ToolCalls);
                }
                let t = &d.timings;
                Ok(pb::GenerateResponse {
                    event: Some(E::Done(pb::GenerateDone {
                        finish_reason: finish_reason(reason) as i32,
                        text,
                        tool_calls: self.calls.clone(),
                        usage: Some(pb::Usage {
                            prompt_tokens: d.prompt_tokens as u32,
                            completion_tokens: d.completion_tokens as u32,
                            cached_prompt_tokens: d.cached_prompt_tokens as u32,
                            drafted_tokens: d.drafted_tokens as u32,
                            accepted_tokens: d.accepted_tokens as u32,
                        }),
                        seed: d.seed,
                        timings: Some(pb::Timings {
                            queue_wait_ms: t.queue_wait.as_secs_f64() * 1e3,
                            time_to_first_token_ms: t.time_to_first_token.as_secs_f64() * 1e3,
                            prefill_tokens_per_second: t.prefill_tokens_per_second,
                            decode_tokens_per_second: t.decode_tokens_per_second,
                            total_ms: t.total.as_secs_f64() * 1e3,
                        }),
                        request_id: self.request_id.clone(),
                        reasoning,
                        reasoning_content: std::mem::take(&mut self.reasoning),
                    })),
                })
            }
            Event::Failed(e) => {
                self.ended = true;
                Err(job_status(e))
            }
        }
    }

    fn logprob(&self, t: &TokenLogprob) -> pb::TokenLogprob {
        let bytes = self.served.tokenizer.token_bytes(t.id).unwrap_or_default();
        pb::TokenLogprob {
            id: t.id,
            text: String::from_utf8_lossy(bytes).into_owned(),
            logprob: t.logprob,
        }
    }
}

impl Stream for GenerateStream {
    type Item = Result<pb::GenerateResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(m) = this.queued.pop_front() {
            return Poll::Ready(Some(m));
        }
        match this.rx.poll_recv(cx) {
            Poll::Ready(Some(ev)) => {
                this.convert(ev);
                Poll::Ready(this.queued.pop_front())
            }
            Poll::Ready(None) if !this.ended => {
                // The engine let go of the request without a final message: never let that
                // look like a successful stream.
                this.ended = true;
                Poll::Ready(Some(Err(Status::internal(
                    "the engine ended the request without a result",
                ))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[tonic::async_trait]
impl pb::inference_server::Inference for InferenceService {
    type GenerateStream = GenerateStream;

    async fn generate(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        let arrived = Instant::now();
        let deadline = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_grpc_timeout)
            .map(|d| arrived + d);
        let served = match self.served() {
            Ok(s) => s,
            Err(e) => return self.count("Generate", Err(e)),
        };
        if self.engine.is_closed() {
            return self.count(
                "Generate",
                Err(Status::unavailable("the server is shutting down")),
            );
        }
        if self.engine.queue_full() {
            // Refuse before tokenizing: under overload, refusals must stay cheap.
            let capacity = self.engine.queue_capacity();
            return self.count(
                "Generate",
                Err(Status::resource_exhausted(
                    SubmitError::QueueFull { capacity }.to_string(),
                )),
            );
        }
        let req = request.into_inner();
        let text_bytes = req.prompt.len()
            + req
                .messages
                .iter()
                .map(|m| {
                    m.content.len()
                        + m.tool_calls
                            .iter()
                            .map(|c| c.arguments.len())
                            .sum::<usize>()
                })
                .sum::<usize>()
            + req
                .tools
                .iter()
                .map(|t| t.description.len() + t.parameters.len())
                .sum::<usize>();
        if let Err(e) = self.check_text_size("prompt", text_bytes) {
            return self.count("Generate", Err(e));
        }
        let format_bytes = req.response_format.as_ref().map_or(0, format_text_bytes);
        if let Err(e) = self.check_text_size("response_format", format_bytes) {
            return self.count("Generate", Err(e));
        }
        let default_max = self.default_max_tokens;
        let served2 = Arc::clone(&served);
        let p = match self
            .cpu_job(move || prepare(req, &served2, default_max))
            .await
        {
            Ok(p) => p,
            Err(e) => return self.count("Generate", Err(e)),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let request_id = p.request_id.clone();
        let mut job = Job::new(p.request_id, p.prompt, p.options, tx);
        job.logprobs = p.logprobs;
        job.deadline = deadline;
        if let Err(e) = self.engine.submit(job) {
            let status = match e {
                SubmitError::QueueFull { .. } => Status::resource_exhausted(e.to_string()),
                SubmitError::Loading | SubmitError::LoadFailed(_) | SubmitError::ShuttingDown => {
                    Status::unavailable(e.to_string())
                }
            };
            return self.count("Generate", Err(status));
        }
        Ok(Response::new(GenerateStream {
            rx,
            served,
            request_id,
            ended: false,
            reply: p.reply,
            calls: Vec::new(),
            reasoning: String::new(),
            queued: VecDeque::new(),
        }))
    }

    async fn tokenize(
        &self,
        request: Request<pb::TokenizeRequest>,
    ) -> Result<Response<pb::TokenizeResponse>, Status> {
        let r = async {
            let served = self.served()?;
            let req = request.into_inner();
            self.check_text_size("text", req.text.len())?;
            let ids = self
                .cpu_job(move || {
                    served
                        .tokenizer
                        .encode(&req.text, req.parse_special.unwrap_or(true))
                        .map_err(|e| invalid(format!("cannot tokenize: {e}")))
                })
                .await?;
            Ok(Response::new(pb::TokenizeResponse { ids }))
        }
        .await;
        self.count("Tokenize", r)
    }

    async fn detokenize(
        &self,
        request: Request<pb::DetokenizeRequest>,
    ) -> Result<Response<pb::DetokenizeResponse>, Status> {
        let r = async {
            let served = self.served()?;
            let req = request.into_inner();
            let text = self
                .cpu_job(move || {
                    served
                        .tokenizer
                        .decode(&req.ids, req.skip_special)
                        .map_err(|e| invalid(e.to_string()))
                })
                .await?;
            Ok(Response::new(pb::DetokenizeResponse { text }))
        }
        .await;
        self.count("Detokenize", r)
    }

    async fn get_model_info(
        &self,
        _request: Request<pb::GetModelInfoRequest>,
    ) -> Result<Response<pb::ModelInfo>, Status> {
        let r = self.served().map(|s| {
            let c = &s.config;
            let d = &s.description;
            Response::new(pb::ModelInfo {
                architecture: c.arch.name().to_string(),
                name: d.name.clone(),
                context_length: s.limits.ctx as u32,
                model_context_length: c.context_length as u32,
                vocab_size: c.vocab as u32,
                quantization: s.quantization.clone(),
                backend: d.backend.clone(),
                threads: d.threads as u32,
                queue_capacity: self.engine.queue_capacity() as u32,
                n_layers: c.n_layers as u32,
                hidden_size: c.hidden as u32,
                demo: d.demo,
                server_version: env!("CARGO_PKG_VERSION").to_string(),
                max_batch: s.limits.max_seqs as u32,
                prefill_chunk: s.limits.prefill_chunk as u32,
                kv_cache_tokens: s.limits.kv_budget as u32,
                note: if d.demo {
                    crate::engine::DEMO_NOTE.to_string()
                } else {
                    String::new()
                },
                kv_cache_type_k: s.kv.types.0.to_string(),
                kv_cache_type_v: s.kv.types.1.to_string(),
                kv_bytes_per_token: s.kv.bytes_per_token as u64,
                kv_cache_bytes: s.kv_budget_bytes(),
                speculative: s.speculative.method.name().to_string(),
                draft_max: s.speculative.max_drafts() as u32,
                draft_model: s.speculative.draft_model.clone().unwrap_or_default(),
            })
        });
        self.count("GetModelInfo", r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request with tools and a tool-call turn renders as transformers renders the same
    /// conversation (the `tools_and_tool_calls` fixture of `tests/fixtures/tokenizer`, made
    /// by `gen_tokenizer_fixture.py` with the Qwen3 template).
    #[test]
    fn tool_requests_render_as_transformers_renders_them() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tokenizer");
        let raw = std::fs::read_to_string(format!("{dir}/chat.json")).unwrap();
        let file: Value = serde_json::from_str(&raw).unwrap();
        let conv = file["conversations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "tools_and_tool_calls")
            .unwrap();
        let gguf = crate::gguf::GgufFile::open(format!("{dir}/qwen3-vocab.gguf")).unwrap();
        let template = crate::tokenizer::ChatTemplate::for_model(&gguf);
        let messages: Vec<pb::ChatMessage> = conv["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| pb::ChatMessage {
                role: m["role"].as_str().unwrap().into(),
                content: m["content"].as_str().unwrap().into(),
                tool_calls: m["tool_calls"]
                    .as_array()
                    .map(|calls| {
                        calls
                            .iter()
                            .map(|c| pb::ToolCall {
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
        let tools: Vec<pb::Tool> = conv["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| pb::Tool {
                name: t["function"]["name"].as_str().unwrap().into(),
                description: t["function"]["description"].as_str().unwrap().into(),
                parameters: t["function"]["parameters"].to_string(),
            })
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

    /// Tool conversations as the API sends them (assistant turns with tool_calls, tool
    /// messages with tool_call_id) render through Qwen2.5-Coder's template as transformers
    /// renders them, byte for byte (`tests/fixtures/chat_tools`, made by
    /// `gen_chat_tools_fixture.py`): tools, calls and arguments keep their keys' order.
    #[test]
    fn tool_conversations_render_as_transformers_renders_them_with_qwen25s_template() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/chat_tools/qwen2.5-coder-tools.json"
        );
        let file: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let template =
            crate::tokenizer::ChatTemplate::new(file["chat_template"].as_str().unwrap()).unwrap();
        let convs = file["conversations"].as_array().unwrap();
        assert_eq!(convs.len(), 3);
        for conv in convs {
            let name = conv["name"].as_str().unwrap();
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            let req = pb::GenerateRequest {
                messages: conv["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| pb::ChatMessage {
                        role: text(&m["role"]),
                        content: text(&m["content"]),
                        tool_calls: m["tool_calls"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|c| pb::ToolCall {
                                id: text(&c["id"]),
                                name: text(&c["function"]["name"]),
                                arguments: c["function"]["arguments"].to_string(),
                            })
                            .collect(),
                        tool_call_id: text(&m["tool_call_id"]),
                    })
                    .collect(),
                tools: conv["tools"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| pb::Tool {
                        name: text(&t["function"]["name"]),
                        description: text(&t["function"]["description"]),
                        parameters: t["function"]["parameters"].to_string(),
                    })
                    .collect(),
                ..Default::default()
            };
            let plan = plan_prompt(&req).unwrap();
            assert!(plan.tools && plan.response_format.is_none(), "{name}");
            let Prompt::ChatJson {
                messages,
                tools,
                enable_thinking,
            } = plan.prompt
            else {
                panic!("{name}: not a chat with tools");
            };
            let rendered = template
                .render_json(&messages, tools.as_deref(), true, enable_thinking)
                .unwrap();
            assert_eq!(rendered, conv["rendered"].as_str().unwrap(), "{name}");
        }
    }

    #[test]
    fn grpc_timeout_units() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse_grpc_timeout("9n"), Some(Duration::from_nanos(9)));
        assert_eq!(parse_grpc_timeout("5"), None);
        assert_eq!(parse_grpc_timeout("5x"), None);
        assert_eq!(parse_grpc_timeout("123456789S"), None);
        assert_eq!(parse_grpc_timeout("-1S"), None);
    }

    #[test]
    fn unset_sampling_fields_take_defaults() {
        let d = SamplingParams::default();
        assert_eq!(sampling_params(None), d);
        let p = sampling_params(Some(&pb::SamplingParams {
            temperature: Some(0.0),
            seed: Some(7),
            ..Default::default()
        }));
        assert_eq!(p.temperature, 0.0);
        assert_eq!(p.seed, Some(7));
        assert_eq!(p.top_k, d.top_k);
        assert_eq!(p.top_p, d.top_p);
    }
}
