//! The `inferno.v1.Inference` service: converts requests into engine jobs and streams the
//! engine's events back as gRPC messages. Handlers never touch the model; they use the
//! tokenizer side ([`Served`], which checks and builds each request) and the engine's queue.

use super::core::{Core, CpuJobError};
use super::pb;
use crate::engine::plan::{
    self, GenerateSpec, Input, Message, PlanError, PromptSpec, Tool, ToolCall, ToolChoice,
};
use crate::engine::reply::Reply;
use crate::engine::{
    Event, FinishReason, Job, JobError, Protocol, Served, SubmitError, TokenLogprob,
};
use crate::sampling::constraint::ResponseFormat;
use crate::sampling::SamplingParams;
use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

pub struct InferenceService {
    core: Arc<Core>,
}

impl InferenceService {
    pub fn new(core: Arc<Core>) -> Self {
        Self { core }
    }

    /// Runs a handler's CPU work on the shared pool ([`Core::cpu_job`]).
    async fn cpu_job<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, Status> + Send + 'static,
    ) -> Result<T, Status> {
        match self.core.cpu_job(work).await {
            Ok(r) => r,
            Err(e @ CpuJobError::ShuttingDown) => Err(Status::unavailable(e.to_string())),
            Err(e @ CpuJobError::Failed(_)) => Err(Status::internal(e.to_string())),
        }
    }

    /// Refuses a text too large to tokenize.
    fn check_text_size(&self, what: &'static str, bytes: usize) -> Result<(), Status> {
        plan::check_text_bytes(what, bytes, self.core.max_text_bytes).map_err(plan_status)
    }

    fn served(&self) -> Result<Arc<Served>, Status> {
        self.core
            .served()
            .map_err(|e| Status::unavailable(e.to_string()))
    }

    /// Records the outcome of a unary call.
    fn count<T>(&self, method: &'static str, r: Result<T, Status>) -> Result<T, Status> {
        self.core.metrics.request(
            Protocol::Grpc,
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

/// A planning error as the client's status; its text is the planner's.
fn plan_status(e: PlanError) -> Status {
    invalid(e.to_string())
}

/// Converts a Generate request to the engine's plain request. Only what the wire format
/// alone can get wrong is refused here; the request itself is checked by the planner.
pub(crate) fn generate_spec(req: pb::GenerateRequest) -> Result<GenerateSpec, Status> {
    let has_prompt = !req.prompt.is_empty();
    let has_messages = !req.messages.is_empty();
    if has_prompt && has_messages {
        return Err(invalid("give either prompt or messages, not both"));
    }
    if !has_prompt && !has_messages {
        return Err(invalid("the prompt is empty: give prompt or messages"));
    }
    let input = if has_messages {
        Input::Messages(
            req.messages
                .into_iter()
                .map(|m| Message {
                    role: m.role,
                    content: m.content,
                    tool_calls: m.tool_calls.into_iter().map(tool_call).collect(),
                    tool_call_id: m.tool_call_id,
                })
                .collect(),
        )
    } else {
        Input::Text(req.prompt)
    };
    use pb::tool_choice::{Choice, Mode};
    let tool_choice = match req.tool_choice.and_then(|c| c.choice) {
        None => ToolChoice::Auto,
        Some(Choice::Mode(m)) => match Mode::try_from(m) {
            Ok(Mode::Unspecified | Mode::Auto) => ToolChoice::Auto,
            Ok(Mode::None) => ToolChoice::None,
            Ok(Mode::Required) => ToolChoice::Required,
            Err(_) => return Err(invalid(format!("tool_choice mode {m} is unknown"))),
        },
        Some(Choice::Function(name)) => ToolChoice::Function(name),
    };
    let prompt = PromptSpec {
        input,
        tools: req
            .tools
            .into_iter()
            .map(|t| Tool {
                name: t.name,
                description: t.description,
                parameters: t.parameters,
            })
            .collect(),
        tool_choice,
        response_format: req.response_format.map(response_format).transpose()?,
        enable_thinking: req.enable_thinking,
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        ending: plan::chat_ending(req.add_generation_prompt, req.continue_final_message)
            .map_err(plan_status)?,
        template_kwargs: (!req.chat_template_kwargs.is_empty()).then_some(req.chat_template_kwargs),
    };
    Ok(GenerateSpec {
        prompt,
        max_tokens: req.max_tokens.map(|n| n as usize),
        sampling: sampling_params(req.sampling.as_ref()),
        stop: req.stop,
        ignore_eos: req.ignore_eos,
        time_limit: (req.time_limit_ms > 0)
            .then(|| Duration::from_millis(req.time_limit_ms as u64)),
        logprobs: req.logprobs as usize,
        separate_reasoning: req.separate_reasoning,
        request_id: req.request_id,
        speculate: !req.disable_speculation,
        min_tokens: req.min_tokens as usize,
        stop_token_ids: req.stop_token_ids,
    })
}

fn tool_call(c: pb::ToolCall) -> ToolCall {
    ToolCall {
        id: c.id,
        name: c.name,
        arguments: c.arguments,
    }
}

fn pb_tool_call(c: ToolCall) -> pb::ToolCall {
    pb::ToolCall {
        id: c.id,
        name: c.name,
        arguments: c.arguments,
    }
}

fn response_format(f: pb::ResponseFormat) -> Result<ResponseFormat, Status> {
    use pb::response_format::Format;
    Ok(match f.format {
        Some(Format::JsonSchema(s)) => ResponseFormat::JsonSchema(s),
        Some(Format::JsonObject(_)) => ResponseFormat::JsonObject,
        Some(Format::Regex(r)) => ResponseFormat::Regex(r),
        Some(Format::Lark(g)) => ResponseFormat::Lark(g),
        Some(Format::Choice(c)) => ResponseFormat::choice(&c.options).ok_or_else(|| {
            invalid("response_format.choice has no options: give at least one string")
        })?,
        None => {
            return Err(invalid(
                "response_format is set but names no format (json_schema, json_object, \
                 regex, lark or choice)",
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
        frequency_penalty: p.frequency_penalty.unwrap_or(d.frequency_penalty),
        presence_penalty: p.presence_penalty.unwrap_or(d.presence_penalty),
        logit_bias: {
            let mut bias: Vec<(u32, f32)> = p.logit_bias.iter().map(|(&t, &b)| (t, b)).collect();
            // A map's order is arbitrary; the request's, as logged and compared, is not.
            bias.sort_unstable_by_key(|&(t, _)| t);
            bias
        },
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
    reply: Reply,
    /// Messages converted but not yet yielded (a token can complete a call).
    queued: VecDeque<Result<pb::GenerateResponse, Status>>,
}

impl GenerateStream {
    /// Converts an engine event into the messages it makes, queued in order: a token's
    /// message before the calls it completes, the calls completed at the end before the
    /// final message.
    fn convert(&mut self, ev: Event) {
        use pb::generate_response::Event as E;
        let call = |c| {
            Ok(pb::GenerateResponse {
                event: Some(E::ToolCall(pb_tool_call(c))),
            })
        };
        match ev {
            Event::Token(t) => {
                let p = self.reply.token(t);
                let t = &p.token;
                self.queued.push_back(Ok(pb::GenerateResponse {
                    event: Some(E::Token(pb::GeneratedToken {
                        index: t.index as u32,
                        id: t.id,
                        text: p.text,
                        logprobs: t.logprobs.as_ref().map(|l| pb::Logprobs {
                            chosen: Some(self.logprob(&l.chosen)),
                            top: l.top.iter().map(|t| self.logprob(t)).collect(),
                        }),
                        reasoning: p.reasoning,
                    })),
                }));
                self.queued.extend(p.calls.into_iter().map(call));
            }
            Event::Done(d) => {
                if d.finish_reason.is_some() {
                    self.ended = true;
                }
                let e = self.reply.done(d);
                self.queued.extend(e.calls.into_iter().map(call));
                let d = &e.done;
                let t = &d.timings;
                self.queued.push_back(Ok(pb::GenerateResponse {
                    event: Some(E::Done(pb::GenerateDone {
                        finish_reason: finish_reason(e.finish_reason) as i32,
                        text: e.text,
                        tool_calls: e.all_calls.into_iter().map(pb_tool_call).collect(),
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
                        reasoning: e.reasoning,
                        reasoning_content: e.reasoning_content,
                    })),
                }));
            }
            Event::Failed(e) => {
                self.ended = true;
                self.queued.push_back(Err(job_status(e)));
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
        if self.core.engine.is_closed() {
            return self.count(
                "Generate",
                Err(Status::unavailable("the server is shutting down")),
            );
        }
        if self.core.engine.queue_full() {
            // Refuse before tokenizing: under overload, refusals must stay cheap.
            let capacity = self.core.engine.queue_capacity();
            return self.count(
                "Generate",
                Err(Status::resource_exhausted(
                    SubmitError::QueueFull { capacity }.to_string(),
                )),
            );
        }
        let spec = match generate_spec(request.into_inner()) {
            Ok(s) => s,
            Err(e) => return self.count("Generate", Err(e)),
        };
        if let Err(e) = plan::check_text_size(&spec.prompt, self.core.max_text_bytes) {
            return self.count("Generate", Err(plan_status(e)));
        }
        let default_max = self.core.default_max_tokens;
        let served2 = Arc::clone(&served);
        let p = match self
            .cpu_job(move || plan::prepare(spec, &served2, default_max).map_err(plan_status))
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
        if let Err(e) = self.core.engine.submit(job) {
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
            reply: Reply::new(p.reply, p.parallel_tool_calls),
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
                queue_capacity: self.core.engine.queue_capacity() as u32,
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
