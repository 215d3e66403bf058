//! `POST /v1/responses`, OpenAI's Responses API, over the same engine as chat completions:
//! the input items become a conversation (with `instructions` first as a system message),
//! the answer becomes output items (a thinking model's reasoning, the message, each function
//! call), whole or as the API's typed events (`response.created` ... `response.completed`,
//! numbered by `sequence_number`). Responses are kept in memory ([`store`]) unless
//! `store: false`, so `previous_response_id` continues a conversation,
//! `GET`/`DELETE /v1/responses/{id}` find one, and `GET /v1/responses/{id}/input_items`
//! pages through its request's input items. `POST /v1/responses/input_tokens` counts the
//! tokens of the prompt a request would be answered from.
//!
//! Served: text input, function tools, `tool_choice`, `parallel_tool_calls`, `text.format`
//! (text, JSON object, JSON schema), `reasoning.effort` (a template variable, as on chat),
//! `max_output_tokens`, `temperature`, `top_p`, logprobs (`include:
//! ["message.output_text.logprobs"]` with `top_logprobs`), `truncation: "auto"` (the oldest
//! turns dropped until the conversation fits), and the sampling extensions the other
//! endpoints take. Refused with a 400 naming the field: built-in tools, non-text input
//! parts, `background`, `conversation`, stored `prompt` templates, `item_reference` items.

mod convert;
pub mod store;
pub mod wire;

use super::chat::{
    common_spec, conversation_prompt, now, one_format, token_logprob, with_reasoning_effort,
};
use super::error::{ApiError, Endpoint};
use super::generate::{self, Merged, ReasoningTokens, StreamFormat, Update};
use super::wire::TokenLogprob;
use super::{HttpState, JsonBody, RequestId};
use crate::engine::plan::{self, Message, PromptSpec, ToolCall};
use crate::engine::reply::Ending;
use crate::engine::{FinishReason, Served};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use store::ResponseStore;
use wire::{OutputItem, OutputText, ReasoningText, ResponseObject, ResponsesRequest};

/// The `include` value that asks for the output text's logprobs.
const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// Every `include` value OpenAI defines. The others name output of built-in tools, images
/// or encrypted reasoning, which this server never makes: accepted, with nothing to add.
const INCLUDABLE: [&str; 8] = [
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
    INCLUDE_LOGPROBS,
];

/// Most alternatives per token OpenAI's `top_logprobs` allows.
const MAX_TOP_LOGPROBS: u32 = 20;

pub async fn create(
    State(state): State<Arc<HttpState>>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    body: Result<JsonBody<ResponsesRequest>, ApiError>,
) -> Response {
    let r = match body {
        Ok(JsonBody(req)) => run(&state, request_id, req).await,
        Err(e) => Err(e),
    };
    r.unwrap_or_else(|e| generate::refused(&state, e))
}

/// `POST /v1/responses/input_tokens`: how many tokens the model would be prompted with for
/// the same body on `POST /v1/responses` (its `usage.input_tokens`), nothing generated.
pub async fn input_tokens(
    State(state): State<Arc<HttpState>>,
    body: Result<JsonBody<ResponsesRequest>, ApiError>,
) -> Response {
    let r = async {
        let JsonBody(mut req) = body?;
        let served = state.core.served()?;
        state.check_model(&served, req.sampling.model.as_deref())?;
        refuse_unserved(&req)?;
        let mut prompt = conversation(&state, &mut req)?.prompt;
        let output = req.max_output_tokens.or(req.sampling.max_tokens);
        let input_tokens = if auto_truncation(&req)? {
            drop_oldest_turns(&state, &served, &mut prompt, output).await?
        } else {
            count_tokens(&state, &served, &prompt).await?
        };
        Ok(Json(wire::InputTokens {
            object: "response.input_tokens",
            input_tokens,
        }))
    }
    .await;
    super::misc::answer(&state, "CountInputTokens", r)
}

/// `GET /v1/responses/{id}`: a kept response.
pub async fn retrieve(State(state): State<Arc<HttpState>>, Path(id): Path<String>) -> Response {
    let r = state
        .responses
        .get(&id)
        .map(|s| Json(Arc::unwrap_or_clone(s.response)))
        .ok_or_else(|| not_kept(&id, "response_id", StatusCode::NOT_FOUND));
    super::misc::answer(&state, "GetResponse", r)
}

/// `DELETE /v1/responses/{id}`: forgets a kept response.
pub async fn delete(State(state): State<Arc<HttpState>>, Path(id): Path<String>) -> Response {
    let r = if state.responses.remove(&id) {
        Ok(Json(wire::Deleted {
            id,
            object: "response",
            deleted: true,
        }))
    } else {
        Err(not_kept(&id, "response_id", StatusCode::NOT_FOUND))
    };
    super::misc::answer(&state, "DeleteResponse", r)
}

/// A response that is not kept: 404 where it is the resource asked for, 400 where a
/// request names it (as OpenAI answers both).
/// The query of `GET /v1/responses/{id}/input_items`.
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    /// Items a page, 1 to 100 (20 by default).
    #[serde(default)]
    pub limit: Option<u32>,
    /// `asc`, or `desc` (the default: the last item first).
    #[serde(default)]
    pub order: Option<String>,
    /// The page starts after this item (its id), in the order asked for.
    #[serde(default)]
    pub after: Option<String>,
    /// The page ends before this item.
    #[serde(default)]
    pub before: Option<String>,
}

/// `GET /v1/responses/{id}/input_items`: a kept response's input items, a page at a time.
pub async fn input_items(
    State(state): State<Arc<HttpState>>,
    Path(id): Path<String>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let r = query
        .map_err(|e| ApiError::invalid("query", format!("the query does not fit: {e}")))
        .and_then(|Query(q)| {
            let kept = state
                .responses
                .get(&id)
                .ok_or_else(|| not_kept(&id, "response_id", StatusCode::NOT_FOUND))?;
            page(&kept.input, &q).map(Json)
        });
    super::misc::answer(&state, "ListInputItems", r)
}

/// One page of a list of items, as OpenAI's cursor pages are: `first_id`, `last_id` and
/// `has_more` say where it is.
fn page(items: &[Value], q: &ListQuery) -> Result<Value, ApiError> {
    let limit = q.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(ApiError::invalid("limit", "limit must be 1 to 100"));
    }
    let mut ordered: Vec<&Value> = items.iter().collect();
    match q.order.as_deref() {
        None | Some("desc") => ordered.reverse(),
        Some("asc") => {}
        Some(other) => {
            return Err(ApiError::invalid(
                "order",
                format!("order {other:?} is unknown (asc or desc)"),
            ))
        }
    }
    let position = |param: &'static str, cursor: &str| {
        ordered
            .iter()
            .position(|item| item.get("id").and_then(Value::as_str) == Some(cursor))
            .ok_or_else(|| {
                ApiError::invalid(param, format!("no input item {cursor:?} in this response"))
            })
    };
    let start = match &q.after {
        Some(a) => position("after", a)? + 1,
        None => 0,
    };
    let end = match &q.before {
        Some(b) => position("before", b)?,
        None => ordered.len(),
    };
    let window = ordered.get(start..end.max(start)).unwrap_or_default();
    let shown = &window[..window.len().min(limit as usize)];
    let id_of = |item: Option<&&Value>| item.and_then(|i| i.get("id")).cloned();
    Ok(json!({
        "object": "list",
        "data": shown,
        "first_id": id_of(shown.first()),
        "last_id": id_of(shown.last()),
        "has_more": window.len() > shown.len(),
    }))
}

fn not_kept(id: &str, param: &str, status: StatusCode) -> ApiError {
    ApiError::new(
        status,
        format!(
            "no response {id:?} is kept here: it was made with store: false, by another \
             server process, or dropped to make room for newer ones (--responses-store-bytes)"
        ),
    )
    .param(param)
    .code(if status == StatusCode::NOT_FOUND {
        "not_found"
    } else {
        "previous_response_not_found"
    })
}

/// What a reply needs besides the engine's events.
struct Context {
    /// The response as it starts: the request echoed, no output yet.
    base: ResponseObject,
    /// Logprobs asked for: how many alternatives per token.
    logprobs: Option<usize>,
    served: Arc<Served>,
    /// What keeping the finished response takes, when it is kept.
    keep: Option<Keep>,
    /// The random part of the response's id, shared by its items' ids.
    key: String,
}

/// Where a finished response is kept, with the conversation before its answer and its
/// request's input items as `input_items` lists them.
struct Keep {
    store: Arc<ResponseStore>,
    history: Vec<Message>,
    input: Vec<Value>,
}

impl Context {
    /// The finished response: its output and usage, `incomplete` when the output limit or
    /// time limit cut it; kept when asked for.
    fn finish(
        &mut self,
        output: Vec<OutputItem>,
        usage: super::wire::Usage,
        reasoning_tokens: usize,
        reason: Option<FinishReason>,
    ) -> ResponseObject {
        let mut r = self.base.clone();
        r.output = output;
        r.usage = Some(wire::Usage {
            input_tokens: usage.prompt_tokens,
            input_tokens_details: wire::InputTokensDetails {
                cached_tokens: usage.prompt_tokens_details.cached_tokens,
                cache_write_tokens: 0,
            },
            output_tokens: usage.completion_tokens,
            output_tokens_details: wire::OutputTokensDetails {
                reasoning_tokens: reasoning_tokens as u64,
            },
            total_tokens: usage.total_tokens,
        });
        if cut_short(reason) {
            r.status = "incomplete";
            r.incomplete_details = Some(wire::IncompleteDetails {
                reason: "max_output_tokens",
            });
        } else {
            r.status = "completed";
            r.completed_at = Some(now());
        }
        if let Some(Keep {
            store,
            mut history,
            input,
        }) = self.keep.take()
        {
            history.extend(convert::answer_messages(&r.output));
            if !store.put(r.clone(), history, input) {
                tracing::warn!(id = %r.id, "a response is larger than the whole response store; not kept");
                r.store = false;
            }
        }
        r
    }

    fn failed(&self, e: &ApiError) -> ResponseObject {
        let mut r = self.base.clone();
        r.status = "failed";
        r.error = Some(wire::ResponseError {
            code: match e.status {
                StatusCode::TOO_MANY_REQUESTS => "rate_limit_exceeded",
                s if s.is_client_error() => "invalid_prompt",
                _ => "server_error",
            },
            message: e.message.clone(),
        });
        r
    }

    fn logprob(&self, l: Option<&crate::engine::Logprobs>) -> Option<TokenLogprob> {
        Some(token_logprob(&self.served, l?, self.logprobs?))
    }
}

async fn run(
    state: &Arc<HttpState>,
    request_id: String,
    mut req: ResponsesRequest,
) -> Result<Response, ApiError> {
    let served = state.serving()?;
    let model = state.check_model(&served, req.sampling.model.as_deref())?;
    refuse_unserved(&req)?;
    generate::check_queue(state)?;
    let stream = req.sampling.stream.unwrap_or(false);

    let key = format!("{}{}", plan::new_request_id(), plan::new_request_id());
    let keep = req.store.unwrap_or(true) && state.responses.enabled();
    let listed = keep.then(|| convert::listed_items(&req.input, &key));
    let Conversation {
        history,
        mut prompt,
        tools: tools_echo,
        tool_choice: tool_choice_echo,
        format: format_echo,
    } = conversation(state, &mut req)?;

    let auto_truncate = auto_truncation(&req)?;
    if auto_truncate {
        let output = req.max_output_tokens.or(req.sampling.max_tokens);
        drop_oldest_turns(state, &served, &mut prompt, output).await?;
    }

    let logprobs = req
        .include
        .as_ref()
        .is_some_and(|inc| inc.iter().any(|i| i == INCLUDE_LOGPROBS))
        .then(|| req.top_logprobs.unwrap_or(0) as usize);
    let sampling = req.sampling;
    let max_tokens = req.max_output_tokens.or(sampling.max_tokens);
    let mut spec = common_spec(prompt, sampling, request_id)?;
    spec.max_tokens = max_tokens.map(|n| n as usize);
    spec.logprobs = logprobs.map_or(0, |t| t.max(1));
    spec.separate_reasoning = req
        .separate_reasoning
        .unwrap_or_else(|| plan::thinks(&served));
    let (temperature, top_p) = (spec.sampling.temperature, spec.sampling.top_p);

    let prepared = generate::prepare(state, &served, spec, Endpoint::Responses).await?;
    let queued_id = prepared.request_id.clone();
    let (choices, receivers) = generate::enqueue(state, &queued_id, &[prepared], 1)?;
    let merged = Merged::new(choices, receivers);

    let base = ResponseObject {
        id: format!("resp_{key}"),
        object: "response",
        created_at: now(),
        status: "in_progress",
        completed_at: None,
        error: None,
        incomplete_details: None,
        instructions: req.instructions,
        max_output_tokens: req.max_output_tokens,
        model,
        output: Vec::new(),
        parallel_tool_calls: req.parallel_tool_calls.unwrap_or(true),
        previous_response_id: req.previous_response_id,
        reasoning: req.reasoning,
        store: keep,
        temperature,
        text: wire::TextOut {
            format: format_echo,
        },
        tool_choice: tool_choice_echo,
        tools: tools_echo,
        top_p,
        top_logprobs: req.top_logprobs.unwrap_or(0),
        truncation: if auto_truncate { "auto" } else { "disabled" },
        background: false,
        usage: None,
        user: req.user,
        metadata: req.metadata.unwrap_or_default(),
    };
    let ctx = Context {
        base,
        logprobs,
        served,
        keep: listed.map(|input| Keep {
            store: Arc::clone(&state.responses),
            history,
            input,
        }),
        key,
    };
    if stream {
        let mut s = ResponseStream::new(ctx);
        let opening = s.opening();
        Ok(generate::stream(merged, opening, s))
    } else {
        whole_reply(merged, ctx).await
    }
}

/// What a request asks the model to answer, as the engine takes it, beside the fields the
/// response echoes.
struct Conversation {
    /// The kept conversation this request continues, then its own input, as messages (what
    /// a kept response keeps before its answer).
    history: Vec<Message>,
    /// `instructions` as a system message, then `history`, with the tools, tool choice,
    /// output format and template variables.
    prompt: PromptSpec,
    tools: Vec<Value>,
    tool_choice: Value,
    format: Value,
}

/// The conversation of `req` (taking its input, tools and template variables): the one
/// `POST /v1/responses` answers and `POST /v1/responses/input_tokens` counts.
fn conversation(state: &HttpState, req: &mut ResponsesRequest) -> Result<Conversation, ApiError> {
    let mut history = match req.previous_response_id.as_deref() {
        None => Vec::new(),
        Some(id) => {
            let kept = state
                .responses
                .get(id)
                .ok_or_else(|| not_kept(id, "previous_response_id", StatusCode::BAD_REQUEST))?;
            kept.history.as_ref().clone()
        }
    };
    history.extend(convert::input_messages(req.input.take())?);
    if history.is_empty() {
        return Err(ApiError::invalid(
            "input",
            "input holds no message: give a text, or at least one message or function call item",
        ));
    }
    let mut messages = Vec::with_capacity(history.len() + 1);
    if let Some(i) = req.instructions.as_ref().filter(|i| !i.is_empty()) {
        messages.push(Message::new("system", i.clone()));
    }
    messages.extend(history.iter().cloned());

    let tools_echo = req.tools.take().unwrap_or_default();
    let tools = convert::tools(&tools_echo)?;
    let tool_choice_echo = req.tool_choice.take().unwrap_or_else(|| json!("auto"));
    let format_echo = req
        .text
        .take()
        .and_then(|t| t.format)
        .unwrap_or_else(|| json!({"type": "text"}));
    let effort = req.reasoning.as_ref().and_then(|r| r.effort.clone());
    let mut prompt = conversation_prompt(
        messages,
        tools,
        with_reasoning_effort(req.chat_template_kwargs.take(), effort),
        None,
        None,
    )?;
    prompt.tool_choice = convert::tool_choice(&tool_choice_echo)?;
    prompt.response_format = one_format(convert::text_format(&format_echo)?, &req.sampling)?;
    prompt.parallel_tool_calls = req.parallel_tool_calls.unwrap_or(true);
    Ok(Conversation {
        history,
        prompt,
        tools: tools_echo,
        tool_choice: tool_choice_echo,
        format: format_echo,
    })
}

/// Whether `req` asks for `truncation: "auto"` (else `"disabled"`, the default).
fn auto_truncation(req: &ResponsesRequest) -> Result<bool, ApiError> {
    match req.truncation.as_deref() {
        None | Some("disabled") => Ok(false),
        Some("auto") => Ok(true),
        Some(other) => Err(ApiError::invalid(
            "truncation",
            format!("truncation {other:?} is unknown (\"auto\" or \"disabled\")"),
        )),
    }
}

/// How many tokens `prompt` renders and encodes to, as the engine would prompt the model.
async fn count_tokens(
    state: &HttpState,
    served: &Arc<Served>,
    prompt: &PromptSpec,
) -> Result<usize, ApiError> {
    let tokens = generate::prompt_tokens(state, served, prompt, Endpoint::Responses).await?;
    Ok(tokens.len())
}

/// `truncation: "auto"`: when the prompt and the output limit (`output`, else one token)
/// do not fit the context, the fewest oldest turns of the conversation after its system
/// messages are dropped that make them fit. A turn is a user message and everything up to
/// the next one, so no call or call output is kept without the request it answered. When
/// even the last turn alone does not fit, only it is kept, and the engine refuses it as it
/// refuses any prompt too long. Returns the prompt's tokens.
async fn drop_oldest_turns(
    state: &HttpState,
    served: &Arc<Served>,
    prompt: &mut PromptSpec,
    output: Option<u32>,
) -> Result<usize, ApiError> {
    let room = served.limits.ctx.min(served.limits.kv_budget);
    let fits = |n: usize| n + output.map_or(1, |o| o as usize) <= room;
    let whole = count_tokens(state, served, prompt).await?;
    let plan::Input::Messages(messages) = &prompt.input else {
        return Ok(whole);
    };
    if fits(whole) {
        return Ok(whole);
    }
    let lead = messages.iter().take_while(|m| m.role == "system").count();
    // Where each later turn starts: dropping up to `starts[k]` keeps turns k.. of them.
    let starts: Vec<usize> = (lead + 1..messages.len())
        .filter(|&i| messages[i].role == "user")
        .collect();
    let without = |k: usize| {
        let mut p = prompt.clone();
        let mut kept = messages[..lead].to_vec();
        kept.extend_from_slice(&messages[starts[k]..]);
        p.input = plan::Input::Messages(kept);
        p
    };
    // The fewest turns dropped that fit: tokens only fall as more are dropped.
    let (mut lo, mut hi) = (0, starts.len());
    let mut best = None;
    while lo < hi {
        let mid = (lo + hi) / 2;
        let p = without(mid);
        let n = count_tokens(state, served, &p).await?;
        if fits(n) {
            best = Some((p, n));
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let (p, n) = match best {
        Some(b) => b,
        None if starts.is_empty() => return Ok(whole),
        None => {
            let p = without(starts.len() - 1);
            let n = count_tokens(state, served, &p).await?;
            (p, n)
        }
    };
    *prompt = p;
    Ok(n)
}

/// Whether the output limit (or the time limit) ended the reply.
fn cut_short(reason: Option<FinishReason>) -> bool {
    matches!(reason, Some(FinishReason::Length | FinishReason::TimeLimit))
}

/// Refuses what the Responses API defines but this server does not do.
fn refuse_unserved(req: &ResponsesRequest) -> Result<(), ApiError> {
    let refuse = |param: &str, what: &str| Err(ApiError::invalid(param, what.to_string()));
    if req.background == Some(true) {
        return refuse(
            "background",
            "background responses are not supported: the response is generated while the \
             request waits (stream it to see it as it comes)",
        );
    }
    if req.conversation.as_ref().is_some_and(|c| !c.is_null()) {
        return refuse(
            "conversation",
            "conversations are not supported: continue a response with previous_response_id",
        );
    }
    if req.prompt.as_ref().is_some_and(|p| !p.is_null()) {
        return refuse(
            "prompt",
            "stored prompt templates are not supported: send the input itself",
        );
    }
    if req.sampling.n.is_some_and(|n| n != 1) {
        return refuse("n", "a response has one output: n must be 1");
    }
    if req.top_logprobs.is_some_and(|n| n > MAX_TOP_LOGPROBS) {
        return refuse("top_logprobs", "top_logprobs must be 0 to 20");
    }
    for (i, inc) in req.include.iter().flatten().enumerate() {
        if !INCLUDABLE.contains(&inc.as_str()) {
            return Err(ApiError::invalid(
                format!("include[{i}]"),
                format!(
                    "include {inc:?} is unknown (one of {})",
                    INCLUDABLE.join(", ")
                ),
            ));
        }
    }
    for (key, value) in req.metadata.iter().flatten() {
        if !value.is_string() {
            return Err(ApiError::invalid(
                format!("metadata.{key}"),
                format!("metadata values are strings; {key:?} is not"),
            ));
        }
    }
    Ok(())
}

/// The output items of a finished reply: reasoning, the message (when it has text or no
/// tool was called), then each call.
fn output_items(
    key: &str,
    reasoning: String,
    text: String,
    logprobs: Option<Vec<TokenLogprob>>,
    calls: Vec<ToolCall>,
) -> Vec<OutputItem> {
    let mut items = Vec::with_capacity(2 + calls.len());
    if !reasoning.is_empty() {
        items.push(OutputItem::Reasoning {
            id: format!("rs_{key}"),
            summary: Vec::new(),
            content: vec![ReasoningText::new(reasoning)],
            status: "completed",
        });
    }
    // Whitespace between or around tool calls is no message.
    if !text.trim().is_empty() || calls.is_empty() {
        items.push(OutputItem::Message {
            id: format!("msg_{key}"),
            status: "completed",
            role: "assistant",
            content: vec![OutputText::new(text, logprobs)],
        });
    }
    for (i, c) in calls.into_iter().enumerate() {
        items.push(call_item(call_id(key, i), c, "completed"));
    }
    items
}

/// The id of a response's `i`th function call item.
fn call_id(key: &str, i: usize) -> String {
    format!("fc_{key}_{i}")
}

fn call_item(id: String, c: ToolCall, status: &'static str) -> OutputItem {
    OutputItem::FunctionCall {
        id,
        call_id: c.id,
        name: c.name,
        arguments: c.arguments,
        status,
    }
}

async fn whole_reply(merged: Merged, mut ctx: Context) -> Result<Response, ApiError> {
    let (choices, finished) = generate::collect(merged).await?;
    let Some(f) = finished.into_iter().next() else {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the engine ended the request without a result",
        ));
    };
    let usage = generate::usage(&choices, &[&f.ending]);
    let logprobs = ctx.logprobs.map(|_| {
        f.logprobs
            .iter()
            .filter_map(|(l, _)| ctx.logprob(Some(l)))
            .collect()
    });
    let e = f.ending;
    let mut output = output_items(&ctx.key, e.reasoning_content, f.text, logprobs, e.all_calls);
    // The item being written when the limit came is incomplete (a call is whole or absent).
    if cut_short(e.finish_reason) {
        if let Some(OutputItem::Message { status, .. } | OutputItem::Reasoning { status, .. }) =
            output.last_mut()
        {
            *status = "incomplete";
        }
    }
    let r = ctx.finish(output, usage, f.reasoning_tokens, e.finish_reason);
    Ok(Json(r).into_response())
}

/// A value as JSON, its 32-bit floats written as they are (shortest form) rather than
/// widened to 64 bits on the way into a `Value` (-1.6611452, not -1.6611452102661133), so
/// the events carry the same numbers as the whole response.
fn typed(v: &impl serde::Serialize) -> Value {
    serde_json::to_string(v)
        .and_then(|text| serde_json::from_str(&text))
        .unwrap_or(Value::Null)
}

/// The item being streamed.
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
}

/// A streamed response's state: the items closed so far, the one open, and what waits
/// for a message to open (whitespace, which alone makes none, and tokens' logprobs).
struct ResponseStream {
    ctx: Context,
    seq: u64,
    output: Vec<OutputItem>,
    open: Option<Open>,
    held_text: String,
    held_logprobs: Vec<TokenLogprob>,
    calls: usize,
    messages: usize,
    reasoning_tokens: ReasoningTokens,
    ending: Option<Ending>,
    /// The status the next closed text or reasoning item gets: `incomplete` for the one
    /// open when the output limit came.
    closing_status: &'static str,
}

impl ResponseStream {
    fn new(ctx: Context) -> Self {
        Self {
            ctx,
            seq: 0,
            output: Vec::new(),
            open: None,
            held_text: String::new(),
            held_logprobs: Vec::new(),
            calls: 0,
            messages: 0,
            reasoning_tokens: ReasoningTokens::default(),
            ending: None,
            closing_status: "completed",
        }
    }

    /// An event of the API: its `type` (also the SSE event's name) and sequence number.
    fn event(&mut self, kind: &'static str, mut body: Value) -> SseEvent {
        if let Value::Object(m) = &mut body {
            m.insert("type".into(), kind.into());
            m.insert("sequence_number".into(), self.seq.into());
        }
        self.seq += 1;
        SseEvent::default()
            .event(kind)
            .json_data(&body)
            .unwrap_or_else(|e| SseEvent::default().data(format!("{{\"error\": \"{e}\"}}")))
    }

    fn opening(&mut self) -> Vec<SseEvent> {
        let r = self.ctx.base.clone();
        vec![
            self.event("response.created", json!({"response": typed(&r)})),
            self.event("response.in_progress", json!({"response": typed(&r)})),
        ]
    }

    fn index(&self) -> usize {
        self.output.len()
    }

    fn open_reasoning(&mut self, out: &mut Vec<SseEvent>) {
        if matches!(self.open, Some(Open::Reasoning { .. })) {
            return;
        }
        self.close(out);
        let id = format!("rs_{}", self.ctx.key);
        let item = json!({"type": "reasoning", "id": id, "summary": [], "content": [],
                          "status": "in_progress"});
        let index = self.index();
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": typed(&item)}),
        ));
        out.push(self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0,
                   "part": typed(&ReasoningText::new(String::new()))}),
        ));
        self.open = Some(Open::Reasoning {
            id,
            text: String::new(),
        });
    }

    fn reasoning(&mut self, delta: String, out: &mut Vec<SseEvent>) {
        if delta.is_empty() {
            return;
        }
        self.open_reasoning(out);
        let index = self.index();
        let Some(Open::Reasoning { id, text }) = &mut self.open else {
            return;
        };
        text.push_str(&delta);
        let body = json!({"item_id": id, "output_index": index, "content_index": 0,
                          "delta": delta});
        out.push(self.event("response.reasoning_text.delta", body));
    }

    fn open_message(&mut self, out: &mut Vec<SseEvent>) {
        self.close(out);
        let id = match self.messages {
            0 => format!("msg_{}", self.ctx.key),
            n => format!("msg_{}_{n}", self.ctx.key),
        };
        self.messages += 1;
        let item = json!({"type": "message", "id": id, "status": "in_progress",
                          "role": "assistant", "content": []});
        let index = self.index();
        let part = OutputText::new(String::new(), self.ctx.logprobs.map(|_| Vec::new()));
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": typed(&item)}),
        ));
        out.push(self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": typed(&part)}),
        ));
        self.open = Some(Open::Message {
            id,
            text: String::new(),
            logprobs: Vec::new(),
        });
    }

    /// Answer text: into the open message, or held while it is only whitespace and no
    /// message is open (whitespace beside tool calls makes no message).
    fn text(&mut self, delta: String, out: &mut Vec<SseEvent>) {
        if delta.is_empty() {
            return;
        }
        if !matches!(self.open, Some(Open::Message { .. })) {
            self.held_text.push_str(&delta);
            if delta.trim().is_empty() {
                return;
            }
            self.open_message(out);
        }
        let delta = if self.held_text.is_empty() {
            delta
        } else {
            std::mem::take(&mut self.held_text)
        };
        let index = self.index();
        let fresh = std::mem::take(&mut self.held_logprobs);
        let Some(Open::Message { id, text, logprobs }) = &mut self.open else {
            return;
        };
        text.push_str(&delta);
        let events_logprobs: Vec<Value> = fresh
            .iter()
            .map(|l| {
                json!({"token": l.token, "logprob": typed(&l.logprob),
                       "top_logprobs": l.top_logprobs.iter()
                           .map(|t| json!({"token": t.token, "logprob": typed(&t.logprob)}))
                           .collect::<Vec<_>>()})
            })
            .collect();
        logprobs.extend(fresh);
        let body = json!({"item_id": id, "output_index": index, "content_index": 0,
                          "delta": delta, "logprobs": events_logprobs});
        out.push(self.event("response.output_text.delta", body));
    }

    fn call(&mut self, c: ToolCall, out: &mut Vec<SseEvent>) {
        self.close(out);
        let index = self.index();
        let id = call_id(&self.ctx.key, self.calls);
        self.calls += 1;
        let added = ToolCall {
            arguments: String::new(),
            ..c.clone()
        };
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": index,
                   "item": typed(&call_item(id.clone(), added, "in_progress"))}),
        ));
        out.push(self.event(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": c.arguments}),
        ));
        out.push(self.event(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "name": c.name,
                   "arguments": c.arguments}),
        ));
        let done = call_item(id, c, "completed");
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": typed(&done)}),
        ));
        self.output.push(done);
    }

    /// Ends the open item, if any.
    fn close(&mut self, out: &mut Vec<SseEvent>) {
        let index = self.index();
        let item = match self.open.take() {
            None => return,
            Some(Open::Reasoning { id, text }) => {
                let part = ReasoningText::new(text.clone());
                out.push(self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "text": text}),
                ));
                out.push(self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "part": typed(&part)}),
                ));
                OutputItem::Reasoning {
                    id,
                    summary: Vec::new(),
                    content: vec![part],
                    status: self.closing_status,
                }
            }
            Some(Open::Message { id, text, logprobs }) => {
                let logprobs = self.ctx.logprobs.map(|_| logprobs);
                let part = OutputText::new(text.clone(), logprobs.clone());
                out.push(self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "text": text, "logprobs": typed(&logprobs.unwrap_or_default())}),
                ));
                out.push(self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0,
                           "part": typed(&part)}),
                ));
                OutputItem::Message {
                    id,
                    status: self.closing_status,
                    role: "assistant",
                    content: vec![part],
                }
            }
        };
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": typed(&item)}),
        ));
        self.output.push(item);
    }
}

impl StreamFormat for ResponseStream {
    fn update(&mut self, _m: &Merged, _i: usize, u: Update, out: &mut Vec<SseEvent>) -> bool {
        match u {
            Update::Token(p) => {
                self.reasoning_tokens.token(&p);
                if let Some(l) = self.ctx.logprob(p.token.logprobs.as_ref()) {
                    self.held_logprobs.push(l);
                }
                self.reasoning(p.reasoning, out);
                self.text(p.text, out);
                for c in p.calls {
                    self.call(c, out);
                }
            }
            Update::End(mut e) => {
                self.reasoning_tokens.end(&e);
                self.reasoning(std::mem::take(&mut e.reasoning), out);
                self.text(std::mem::take(&mut e.text), out);
                for c in std::mem::take(&mut e.calls) {
                    self.call(c, out);
                }
                // A reply with neither text nor calls still has its (empty) message.
                if self.messages == 0 && self.calls == 0 {
                    let held = std::mem::take(&mut self.held_text);
                    self.open_message(out);
                    self.text(held, out);
                }
                // The last tokens' logprobs go with the message still open.
                if let Some(Open::Message { logprobs, .. }) = &mut self.open {
                    logprobs.append(&mut self.held_logprobs);
                }
                if cut_short(e.finish_reason) {
                    self.closing_status = "incomplete";
                }
                self.close(out);
                self.ending = Some(*e);
            }
            Update::Failed(e) => {
                let r = self.ctx.failed(&e);
                out.push(self.event("response.failed", json!({"response": typed(&r)})));
                return false;
            }
        }
        true
    }

    fn finish(&mut self, m: &Merged, out: &mut Vec<SseEvent>) {
        let Some(e) = self.ending.take() else {
            return;
        };
        let usage = generate::usage(&m.choices, &[&e]);
        let output = std::mem::take(&mut self.output);
        let r = self.ctx.finish(
            output,
            usage,
            self.reasoning_tokens.count(),
            e.finish_reason,
        );
        let kind = if r.status == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        out.push(self.event(kind, json!({"response": typed(&r)})));
    }

    fn done_marker(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::{page, ListQuery};
    use serde_json::{json, Value};

    fn ids(page: &Value) -> Vec<&str> {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap())
            .collect()
    }

    /// Pages run in either order from either cursor, and say whether more follow.
    #[test]
    fn input_items_come_a_page_at_a_time() {
        let items: Vec<Value> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|id| json!({"id": id}))
            .collect();
        let q =
            |limit: Option<u32>, order: Option<&str>, after: Option<&str>, before: Option<&str>| {
                ListQuery {
                    limit,
                    order: order.map(String::from),
                    after: after.map(String::from),
                    before: before.map(String::from),
                }
            };
        let all = page(&items, &q(None, None, None, None)).unwrap();
        assert_eq!(ids(&all), ["e", "d", "c", "b", "a"]);
        assert_eq!(all["has_more"], false);
        assert_eq!(
            (all["first_id"].as_str(), all["last_id"].as_str()),
            (Some("e"), Some("a"))
        );
        let first = page(&items, &q(Some(2), Some("asc"), None, None)).unwrap();
        assert_eq!(ids(&first), ["a", "b"]);
        assert_eq!(first["has_more"], true);
        let next = page(&items, &q(Some(2), Some("asc"), Some("b"), None)).unwrap();
        assert_eq!(ids(&next), ["c", "d"]);
        let last = page(&items, &q(Some(2), Some("asc"), Some("d"), None)).unwrap();
        assert_eq!(ids(&last), ["e"]);
        assert_eq!(last["has_more"], false);
        let between = page(&items, &q(None, Some("desc"), Some("e"), Some("b"))).unwrap();
        assert_eq!(ids(&between), ["d", "c"]);
        let none = page(&items, &q(None, Some("asc"), Some("e"), None)).unwrap();
        assert_eq!(ids(&none), Vec::<&str>::new());
        assert_eq!(none["first_id"], Value::Null);
        let crossed = page(&items, &q(None, Some("asc"), Some("d"), Some("b"))).unwrap();
        assert_eq!(ids(&crossed), Vec::<&str>::new());
        for (bad, param) in [
            (q(Some(0), None, None, None), "limit"),
            (q(Some(101), None, None, None), "limit"),
            (q(None, Some("up"), None, None), "order"),
            (q(None, None, Some("z"), None), "after"),
            (q(None, None, None, Some("z")), "before"),
        ] {
            assert_eq!(
                page(&items, &bad).unwrap_err().param.as_deref(),
                Some(param)
            );
        }
    }
}
