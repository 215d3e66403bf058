//! What both generation endpoints do between their wire types: prepare a request through
//! the planner (on the CPU-job pool), queue its `n` choices as `n` jobs at once (so they run
//! as concurrent sequences of one batch), and read each choice's reply, whole or as it
//! streams. With a seed, choice `i` samples with seed `seed + i` (wrapping), so the whole
//! response is reproducible and choice 0 is the reply an `n = 1` request gets.

use super::error::{plan_error, ApiError, Endpoint};
use super::HttpState;
use crate::engine::plan::{self, GenerateSpec, Prepared, PromptSpec};
use crate::engine::reply::{Ending, Reply, TokenPiece};
use crate::engine::request;
use crate::engine::{
    Event, FinishReason, Job, Logprobs, Protocol, Served, SubmitError, TokenLogprob,
};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};
use tokio_stream::{StreamExt, StreamMap};

/// How a request's reply is reported, on either endpoint.
pub struct Shape {
    /// The response's `id` (`chatcmpl-…` or `cmpl-…`, after the request id).
    pub id: String,
    pub model: String,
    pub created: u64,
    /// Logprobs asked for: how many alternatives to show per token.
    pub logprobs: Option<usize>,
    /// A streamed reply ends with a chunk of usage.
    pub include_usage: bool,
    pub served: Arc<Served>,
}

/// A generation refused before it was queued: counted, and answered.
pub fn refused(state: &HttpState, e: ApiError) -> Response {
    state.count_error("Generate", &e);
    e.into_response()
}

/// The usage chunk of a stream that asked for one, once every choice has ended.
pub fn final_usage(
    shape: &Shape,
    merged: &Merged,
    endings: &[Option<Ending>],
) -> Option<super::wire::Usage> {
    if !shape.include_usage {
        return None;
    }
    let done: Vec<&Ending> = endings.iter().flatten().collect();
    (done.len() == merged.choices.len()).then(|| usage(&merged.choices, &done))
}

/// Most choices one request may ask for.
pub const MAX_CHOICES: usize = 16;

/// Checks `n` (at most [`MAX_CHOICES`], and what the queue can hold).
pub fn choices(n: Option<u32>, queue_capacity: usize) -> Result<usize, ApiError> {
    let n = n.unwrap_or(1) as usize;
    let max = MAX_CHOICES.min(queue_capacity);
    if n == 0 || n > max {
        return Err(ApiError::invalid(
            "n",
            format!("n is {n}; it must be 1 to {max} (the choices are queued together)"),
        ));
    }
    Ok(n)
}

/// Checks and builds one prompt's request (the text-size limit first, then the planner).
pub async fn prepare(
    state: &HttpState,
    served: &Arc<Served>,
    spec: GenerateSpec,
    endpoint: Endpoint,
) -> Result<Prepared, ApiError> {
    let core = &state.core;
    plan::check_text_size(&spec.prompt, core.max_text_bytes)
        .map_err(|e| plan_error(e, endpoint))?;
    let served = Arc::clone(served);
    let default_max = core.default_max_tokens;
    core.cpu_job(move || plan::prepare(spec, &served, default_max))
        .await?
        .map_err(|e| plan_error(e, endpoint))
}

/// The tokens the model would be prompted with for `prompt`, as [`prepare`] would find them
/// (the text-size limit, the planner, then rendering and encoding on the CPU-job pool),
/// without building a request: what `/tokenize` and the Responses API's token count answer.
pub async fn prompt_tokens(
    state: &HttpState,
    served: &Arc<Served>,
    prompt: &PromptSpec,
    endpoint: Endpoint,
) -> Result<Vec<u32>, ApiError> {
    plan::check_text_size(prompt, state.core.max_text_bytes)
        .map_err(|e| plan_error(e, endpoint))?;
    let planned = plan::plan_prompt(prompt).map_err(|e| plan_error(e, endpoint))?;
    let served = Arc::clone(served);
    state
        .core
        .cpu_job(move || {
            request::prompt_tokens(&served.tokenizer, &served.chat_template, &planned.prompt)
        })
        .await?
        .map_err(|e| plan_error(e.into(), endpoint))
}

/// One choice being generated.
pub struct Choice {
    pub index: u32,
    /// Which prompt of the request it continues (completions may have several).
    pub prompt: usize,
    pub prompt_tokens: usize,
    pub reply: Reply,
}

/// Queues every choice of every prompt together (`n` per prompt), or none.
pub fn enqueue(
    state: &HttpState,
    request_id: &str,
    prepared: &[Prepared],
    n: usize,
) -> Result<(Vec<Choice>, Vec<mpsc::UnboundedReceiver<Event>>), ApiError> {
    let total = prepared.len() * n;
    let mut jobs = Vec::with_capacity(total);
    let mut choices = Vec::with_capacity(total);
    let mut receivers = Vec::with_capacity(total);
    for (p, prep) in prepared.iter().enumerate() {
        for j in 0..n {
            let index = p * n + j;
            let (tx, rx) = mpsc::unbounded_channel();
            let id = if total == 1 {
                request_id.to_string()
            } else {
                format!("{request_id}-{index}")
            };
            let mut options = prep.options.clone();
            if let Some(seed) = options.sampling.seed {
                options.sampling.seed = Some(seed.wrapping_add(index as u64));
            }
            let mut job = Job::new(id, prep.prompt.clone(), options, tx);
            job.logprobs = prep.logprobs;
            job.protocol = Protocol::Http;
            jobs.push(job);
            choices.push(Choice {
                index: index as u32,
                prompt: p,
                prompt_tokens: prep.prompt.len(),
                reply: Reply::new(prep.reply.clone(), prep.parallel_tool_calls),
            });
            receivers.push(rx);
        }
    }
    state.core.engine.submit_all(jobs).map_err(|e| match e {
        SubmitError::QueueFull { .. } => ApiError::queue_full(e.to_string()),
        SubmitError::Loading | SubmitError::LoadFailed(_) | SubmitError::ShuttingDown => {
            ApiError::unavailable(e.to_string())
        }
    })?;
    Ok((choices, receivers))
}

/// Refuses a request before any work when the queue has no room (cheap under overload).
pub fn check_queue(state: &HttpState) -> Result<(), ApiError> {
    let engine = &state.core.engine;
    if engine.queue_full() {
        let capacity = engine.queue_capacity();
        return Err(ApiError::queue_full(
            SubmitError::QueueFull { capacity }.to_string(),
        ));
    }
    Ok(())
}

/// What happened to one choice.
pub enum Update {
    Token(TokenPiece),
    End(Box<Ending>),
    Failed(ApiError),
}

/// The events of every choice, merged as they come.
pub struct Merged {
    events: StreamMap<usize, UnboundedReceiverStream<Event>>,
    pub choices: Vec<Choice>,
    /// Which choices have had their final update.
    ended: Vec<bool>,
}

impl Merged {
    pub fn new(choices: Vec<Choice>, receivers: Vec<mpsc::UnboundedReceiver<Event>>) -> Self {
        let mut events = StreamMap::with_capacity(receivers.len());
        for (i, rx) in receivers.into_iter().enumerate() {
            events.insert(i, UnboundedReceiverStream::new(rx));
        }
        let ended = vec![false; choices.len()];
        Self {
            events,
            choices,
            ended,
        }
    }

    /// The next update of some choice (by position in `choices`); `None` once all ended.
    pub async fn next(&mut self) -> Option<(usize, Update)> {
        loop {
            let Some((i, ev)) = self.events.next().await else {
                // A channel closed without a final event: never report that as success.
                let i = self.ended.iter().position(|e| !e)?;
                self.ended[i] = true;
                return Some((
                    i,
                    Update::Failed(ApiError::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "the engine ended the request without a result",
                    )),
                ));
            };
            let choice = &mut self.choices[i];
            match ev {
                Event::Token(t) => return Some((i, Update::Token(choice.reply.token(t)))),
                // A failed generation's summary: its Failed event follows.
                Event::Done(d) if d.finish_reason.is_none() => continue,
                Event::Done(d) => {
                    self.ended[i] = true;
                    self.events.remove(&i);
                    return Some((i, Update::End(Box::new(choice.reply.done(d)))));
                }
                Event::Failed(e) => {
                    self.ended[i] = true;
                    self.events.remove(&i);
                    return Some((i, Update::Failed(e.into())));
                }
            }
        }
    }
}

/// Counts a reply's reasoning tokens as it comes (OpenAI's `reasoning_tokens`): the
/// generated tokens up to the one that released the last of the reasoning, or all of them
/// when the reasoning was only released at the end (it never closed); 0 without reasoning.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReasoningTokens {
    seen: usize,
    reasoning: usize,
}

impl ReasoningTokens {
    pub fn token(&mut self, p: &TokenPiece) {
        self.seen += 1;
        if !p.reasoning.is_empty() {
            self.reasoning = self.seen;
        }
    }

    pub fn end(&mut self, e: &Ending) {
        if !e.reasoning.is_empty() {
            self.reasoning = e.done.completion_tokens;
        }
    }

    pub fn count(&self) -> usize {
        self.reasoning
    }
}

/// A finished choice, read whole.
pub struct Finished {
    /// The answer text (reasoning and tool calls apart, as the request asked).
    pub text: String,
    /// Each token's logprobs with where its text starts in `text` (bytes).
    pub logprobs: Vec<(Logprobs, usize)>,
    /// See [`ReasoningTokens`].
    pub reasoning_tokens: usize,
    pub ending: Ending,
}

/// Reads every choice to its end; the first failure fails the request.
pub async fn collect(mut merged: Merged) -> Result<(Vec<Choice>, Vec<Finished>), ApiError> {
    let n = merged.choices.len();
    let mut texts: Vec<(String, Vec<(Logprobs, usize)>)> =
        (0..n).map(|_| Default::default()).collect();
    let mut endings: Vec<Option<Ending>> = (0..n).map(|_| None).collect();
    let mut counts = vec![ReasoningTokens::default(); n];
    while let Some((i, u)) = merged.next().await {
        let (text, lps) = &mut texts[i];
        match u {
            Update::Token(p) => {
                counts[i].token(&p);
                if let Some(l) = p.token.logprobs {
                    lps.push((l, text.len()));
                }
                text.push_str(&p.text);
            }
            Update::End(e) => {
                text.push_str(&e.text);
                counts[i].end(&e);
                endings[i] = Some(*e);
            }
            Update::Failed(e) => return Err(e),
        }
    }
    let mut done = Vec::with_capacity(n);
    for (((text, logprobs), ending), counted) in texts.into_iter().zip(endings).zip(counts) {
        let ending = ending.ok_or_else(|| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the engine ended the request without a result",
            )
        })?;
        done.push(Finished {
            text,
            logprobs,
            reasoning_tokens: counted.count(),
            ending,
        });
    }
    Ok((merged.choices, done))
}

/// OpenAI's name of a finish reason.
pub fn finish_reason(r: Option<FinishReason>) -> &'static str {
    match r {
        Some(FinishReason::Length | FinishReason::TimeLimit) => "length",
        Some(FinishReason::ToolCalls) => "tool_calls",
        _ => "stop",
    }
}

/// The usage of a response: the prompt counted once per prompt (its choices share it),
/// the cached prompt tokens those of its choice that reused the fewest, and the completion
/// tokens of every choice.
pub fn usage(choices: &[Choice], endings: &[&Ending]) -> super::wire::Usage {
    let prompts = choices.iter().map(|c| c.prompt + 1).max().unwrap_or(0);
    let (mut prompt, mut cached, mut completion) = (0u64, 0u64, 0u64);
    for p in 0..prompts {
        let of_prompt = choices
            .iter()
            .zip(endings)
            .filter(|(c, _)| c.prompt == p)
            .map(|(_, e)| e.done.cached_prompt_tokens as u64);
        cached += of_prompt.min().unwrap_or(0);
        if let Some(c) = choices.iter().find(|c| c.prompt == p) {
            prompt += c.prompt_tokens as u64;
        }
    }
    let (mut drafted, mut accepted) = (0u64, 0u64);
    for e in endings {
        completion += e.done.completion_tokens as u64;
        drafted += e.done.drafted_tokens as u64;
        accepted += e.done.accepted_tokens as u64;
    }
    super::wire::Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        prompt_tokens_details: super::wire::PromptTokensDetails {
            cached_tokens: cached,
        },
        completion_tokens_details: super::wire::CompletionTokensDetails {
            accepted_prediction_tokens: accepted,
            rejected_prediction_tokens: drafted.saturating_sub(accepted),
        },
    }
}

/// A token's text for logprobs: its bytes, as text (invalid UTF-8 replaced), and the bytes.
pub fn token_text(served: &Served, t: &TokenLogprob) -> (String, Vec<u8>) {
    let bytes = served
        .tokenizer
        .token_bytes(t.id)
        .unwrap_or_default()
        .to_vec();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// An SSE response fed by `events` (already JSON or `[DONE]`), sent as they come; a comment
/// every 15 s keeps idle proxies from closing a stream waiting in the queue.
pub fn sse(events: mpsc::Receiver<SseEvent>) -> Response {
    let stream = ReceiverStream::new(events).map(Ok::<_, Infallible>);
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// An SSE event of a JSON value.
pub fn json_event(v: &impl serde::Serialize) -> SseEvent {
    SseEvent::default()
        .json_data(v)
        .unwrap_or_else(|e| SseEvent::default().data(format!("{{\"error\": \"{e}\"}}")))
}

/// Channel depth between a stream's driver and its response body: a slow reader holds the
/// driver back rather than letting events pile up.
pub const STREAM_DEPTH: usize = 64;

/// How a stream reports its choices' updates.
pub trait StreamFormat: Send + 'static {
    /// Adds the events an update makes to `out`; `false` ends the stream (after a failure).
    fn update(
        &mut self,
        merged: &Merged,
        i: usize,
        update: Update,
        out: &mut Vec<SseEvent>,
    ) -> bool;
    /// Adds the events that follow the last choice's end (the usage chunk).
    fn finish(&mut self, merged: &Merged, out: &mut Vec<SseEvent>);
    /// Whether the stream ends with `data: [DONE]` (the chat and completions streams do;
    /// the Responses API's ends with its own final event).
    fn done_marker(&self) -> bool {
        true
    }
}

/// An SSE response that sends `opening`, then each choice's updates as `format` reports
/// them, then `[DONE]` where the format ends with it. A task drives it until every choice
/// ended or the client went away: its body dropped, the job receivers go at once, and the
/// engine stops the jobs within a step.
pub fn stream(
    mut merged: Merged,
    opening: Vec<SseEvent>,
    mut format: impl StreamFormat,
) -> Response {
    let (tx, rx) = mpsc::channel(STREAM_DEPTH);
    tokio::spawn(async move {
        let mut out = opening;
        let mut go_on = true;
        loop {
            for ev in out.drain(..) {
                if tx.send(ev).await.is_err() {
                    return;
                }
            }
            if !go_on {
                break;
            }
            let update = tokio::select! {
                u = merged.next() => u,
                _ = tx.closed() => return,
            };
            match update {
                Some((i, u)) => go_on = format.update(&merged, i, u, &mut out),
                None => {
                    format.finish(&merged, &mut out);
                    go_on = false;
                }
            }
        }
        if format.done_marker() {
            let _ = tx.send(SseEvent::default().data("[DONE]")).await;
        }
    });
    sse(rx)
}
