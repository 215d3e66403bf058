//! `POST /v1/chat/completions`: OpenAI's chat request converted to the planner's
//! ([`GenerateSpec`]), and the reply as a `chat.completion` or as `chat.completion.chunk`
//! events. A thinking model's reasoning (a `<think>` section) is reported as
//! `reasoning_content` when the model's chat template handles `<think>` (Qwen3, the
//! DeepSeek-R1 distills) or the request sets `separate_reasoning: true`;
//! `separate_reasoning: false` keeps it in the content.

use super::error::{plan_error, ApiError, Endpoint};
use super::generate::{self, Merged, Shape, StreamFormat, Update};
use super::wire::{self, ChatRequest, Content, ToolChoiceIn};
use super::{HttpState, JsonBody, RequestId};
use crate::engine::plan::{
    self, GenerateSpec, Input, Message, PromptSpec, Tool, ToolCall, ToolChoice,
};
use crate::engine::reply::Ending;
use crate::engine::{Logprobs, Served};
use crate::sampling::constraint::ResponseFormat;
use crate::sampling::{check_number, narrow, SamplingParams};
use axum::extract::State;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use std::sync::Arc;

/// Seconds since the Unix epoch.
pub(super) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The `system_fingerprint` of every response: the server's version.
pub(super) fn fingerprint() -> String {
    concat!("inferno-", env!("CARGO_PKG_VERSION")).to_string()
}

pub async fn handle(
    State(state): State<Arc<HttpState>>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    body: Result<JsonBody<ChatRequest>, ApiError>,
) -> Response {
    let r = match body {
        Ok(JsonBody(req)) => run(&state, request_id, req).await,
        Err(e) => Err(e),
    };
    r.unwrap_or_else(|e| generate::refused(&state, e))
}

async fn run(
    state: &HttpState,
    request_id: String,
    req: ChatRequest,
) -> Result<Response, ApiError> {
    let served = state.serving()?;
    let model = state.check_model(&served, req.sampling.model.as_deref())?;
    let n = generate::choices(req.sampling.n, state.core.engine.queue_capacity())?;
    generate::check_queue(state)?;
    let stream = req.sampling.stream.unwrap_or(false);
    let include_usage = req
        .sampling
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let (spec, top) = chat_spec(req, &served, request_id.clone())?;
    let prepared = generate::prepare(state, &served, spec, Endpoint::Chat).await?;
    let request_id = prepared.request_id.clone();
    let (choices, receivers) = generate::enqueue(state, &request_id, &[prepared], n)?;
    let merged = Merged::new(choices, receivers);
    let shape = Shape {
        id: format!("chatcmpl-{request_id}"),
        model,
        created: now(),
        logprobs: top,
        include_usage,
        served,
    };
    if stream {
        Ok(stream_reply(merged, shape))
    } else {
        whole_reply(merged, shape).await
    }
}

/// The template variables with OpenAI's `reasoning_effort` among them, as vLLM passes it,
/// unless the request sets that variable in `chat_template_kwargs` itself.
pub(super) fn with_reasoning_effort(
    mut kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    effort: Option<String>,
) -> Option<serde_json::Map<String, serde_json::Value>> {
    if let Some(effort) = effort {
        kwargs
            .get_or_insert_with(Default::default)
            .entry("reasoning_effort")
            .or_insert(serde_json::Value::String(effort));
    }
    kwargs
}

/// The prompt side of a chat: the messages, the tools shown, and how the template renders
/// them (shared with `/tokenize`, which counts the same tokens).
pub(super) fn chat_prompt(
    messages: Vec<wire::MessageIn>,
    tools: Option<Vec<wire::ToolIn>>,
    kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
) -> Result<PromptSpec, ApiError> {
    let messages = messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let tools = tools
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, t)| tool(i, t))
        .collect::<Result<_, _>>()?;
    conversation_prompt(
        messages,
        tools,
        kwargs,
        add_generation_prompt,
        continue_final_message,
    )
}

/// The prompt side of a conversation already in the engine's terms (chat's and the
/// Responses API's): the template variables checked, and how the rendering ends.
pub(super) fn conversation_prompt(
    messages: Vec<Message>,
    tools: Vec<Tool>,
    kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
) -> Result<PromptSpec, ApiError> {
    let mut prompt = PromptSpec::new(Input::Messages(messages));
    prompt.tools = tools;
    if let Some(mut kwargs) = kwargs {
        // The engine takes enable_thinking as its own field, as gRPC does.
        prompt.enable_thinking = match kwargs.shift_remove("enable_thinking") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::Bool(b)) => Some(b),
            Some(_) => {
                return Err(ApiError::invalid(
                    "chat_template_kwargs.enable_thinking",
                    "chat_template_kwargs.enable_thinking must be true or false",
                ))
            }
        };
        if !kwargs.is_empty() {
            prompt.template_kwargs = Some(serde_json::Value::Object(kwargs).to_string());
        }
    }
    prompt.ending = plan::chat_ending(
        add_generation_prompt,
        continue_final_message.unwrap_or(false),
    )
    .map_err(|e| plan_error(e, Endpoint::Chat))?;
    Ok(prompt)
}

/// Converts the request, returning the alternatives to show per token when logprobs are
/// asked for.
fn chat_spec(
    req: ChatRequest,
    served: &Served,
    request_id: String,
) -> Result<(GenerateSpec, Option<usize>), ApiError> {
    if req.functions.as_ref().is_some_and(|f| !f.is_empty()) || req.function_call.is_some() {
        let param = if req.function_call.is_some() {
            "function_call"
        } else {
            "functions"
        };
        return Err(ApiError::invalid(
            param,
            "functions and function_call (OpenAI's deprecated forms) are not supported: give \
             tools and tool_choice",
        ));
    }
    let mut prompt = chat_prompt(
        req.messages,
        req.tools,
        with_reasoning_effort(req.chat_template_kwargs, req.reasoning_effort),
        req.add_generation_prompt,
        req.continue_final_message,
    )?;
    prompt.tool_choice = match req.tool_choice {
        None => ToolChoice::Auto,
        Some(ToolChoiceIn::Mode(m)) => match m.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "tool_choice {other:?} is unknown (auto, none, required, or \
                         {{\"type\": \"function\", \"function\": {{\"name\": ...}}}})"
                    ),
                ))
            }
        },
        Some(ToolChoiceIn::Named { kind, function }) => {
            if kind != "function" {
                return Err(ApiError::invalid(
                    "tool_choice.type",
                    format!("tool_choice type {kind:?} is not supported (only \"function\")"),
                ));
            }
            ToolChoice::Function(function.name)
        }
    };
    let format = match req.response_format {
        None => None,
        Some(f) => match f.kind.as_str() {
            "text" => None,
            "json_object" => Some(ResponseFormat::JsonObject),
            "json_schema" => {
                let schema = f.json_schema.and_then(|s| s.schema).ok_or_else(|| {
                    ApiError::invalid(
                        "response_format.json_schema.schema",
                        "response_format json_schema needs json_schema.schema",
                    )
                })?;
                Some(ResponseFormat::JsonSchema(schema.to_string()))
            }
            other => {
                return Err(ApiError::invalid(
                    "response_format.type",
                    format!(
                        "response_format type {other:?} is unknown (text, json_object, \
                         json_schema)"
                    ),
                ))
            }
        },
    };
    prompt.response_format = one_format(format, &req.sampling)?;
    prompt.parallel_tool_calls = req.parallel_tool_calls.unwrap_or(true);
    let top = match (req.logprobs, req.top_logprobs) {
        (Some(true), t) => Some(t.unwrap_or(0) as usize),
        (_, Some(t)) if t > 0 => {
            return Err(ApiError::invalid(
                "top_logprobs",
                "top_logprobs needs logprobs: true",
            ))
        }
        _ => None,
    };
    let mut spec = common_spec(prompt, req.sampling, request_id)?;
    spec.max_tokens = req
        .max_completion_tokens
        .or(spec.max_tokens.map(|n| n as u32))
        .map(|n| n as usize);
    // The engine reports alternatives only when at least one is asked for.
    spec.logprobs = top.map_or(0, |t| t.max(1));
    spec.separate_reasoning = req
        .separate_reasoning
        .unwrap_or_else(|| plan::thinks(served));
    Ok((spec, top))
}

/// The response format, or one of the extensions' constraints in its place: `regex`,
/// `grammar`, vLLM's `structured_outputs` or its `guided_*` fields. At most one.
pub(super) fn one_format(
    format: Option<ResponseFormat>,
    s: &wire::Sampling,
) -> Result<Option<ResponseFormat>, ApiError> {
    let mut formats: Vec<(&str, ResponseFormat)> =
        format.map(|f| ("response_format", f)).into_iter().collect();
    let mut add =
        |name: &'static str, f: Option<ResponseFormat>| formats.extend(f.map(|f| (name, f)));
    add("regex", s.regex.clone().map(ResponseFormat::Regex));
    add("grammar", s.grammar.clone().map(ResponseFormat::Lark));
    add(
        "guided_json",
        json_schema("guided_json", s.guided_json.as_ref())?,
    );
    add(
        "guided_regex",
        s.guided_regex.clone().map(ResponseFormat::Regex),
    );
    add(
        "guided_choice",
        choice("guided_choice", s.guided_choice.as_deref())?,
    );
    add(
        "guided_grammar",
        s.guided_grammar.clone().map(ResponseFormat::Lark),
    );
    if let Some(o) = &s.structured_outputs {
        if o.structural_tag.as_ref().is_some_and(|t| !t.is_null()) {
            return Err(ApiError::invalid(
                "structured_outputs.structural_tag",
                "structured_outputs.structural_tag is not supported (use json, json_object, \
                 regex, choice or grammar)",
            ));
        }
        add(
            "structured_outputs.json",
            json_schema("structured_outputs.json", o.json.as_ref())?,
        );
        add(
            "structured_outputs.json_object",
            (o.json_object == Some(true)).then_some(ResponseFormat::JsonObject),
        );
        add(
            "structured_outputs.regex",
            o.regex.clone().map(ResponseFormat::Regex),
        );
        add(
            "structured_outputs.choice",
            choice("structured_outputs.choice", o.choice.as_deref())?,
        );
        add(
            "structured_outputs.grammar",
            o.grammar.clone().map(ResponseFormat::Lark),
        );
    }
    if formats.len() > 1 {
        let named: Vec<&str> = formats.iter().map(|(name, _)| *name).collect();
        return Err(ApiError::invalid(
            formats[1].0,
            format!(
                "give at most one constraint on the output (response_format, regex, grammar, \
                 structured_outputs or a guided_* field); this request gives {}",
                named.join(", ")
            ),
        ));
    }
    Ok(formats.pop().map(|(_, f)| f))
}

/// A JSON schema constraint (vLLM's, and the Responses API's `text.format`): the schema as
/// an object, or as its JSON text.
pub(super) fn json_schema(
    param: &'static str,
    v: Option<&serde_json::Value>,
) -> Result<Option<ResponseFormat>, ApiError> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(text)) => Ok(Some(ResponseFormat::JsonSchema(text.clone()))),
        Some(schema @ serde_json::Value::Object(_)) => {
            Ok(Some(ResponseFormat::JsonSchema(schema.to_string())))
        }
        Some(_) => Err(ApiError::invalid(
            param,
            format!("{param} must be a JSON schema: an object, or its JSON text"),
        )),
    }
}

/// vLLM's choice constraint: the output is exactly one of the strings.
fn choice(
    param: &'static str,
    choices: Option<&[String]>,
) -> Result<Option<ResponseFormat>, ApiError> {
    match choices {
        None => Ok(None),
        Some(c) => ResponseFormat::choice(c).map(Some).ok_or_else(|| {
            ApiError::invalid(param, format!("{param} is empty: give at least one string"))
        }),
    }
}

/// The request fields both endpoints share: sampling, stop strings, limits. Each sampling
/// number is checked against its range as sent, then narrowed to the sampler's `f32`.
pub(super) fn common_spec(
    prompt: PromptSpec,
    s: wire::Sampling,
    request_id: String,
) -> Result<GenerateSpec, ApiError> {
    refuse_unserved(&s)?;
    let d = SamplingParams::default();
    let number = |param: &'static str, v: Option<f64>, default: f32| {
        v.map_or(Ok(default), |v| {
            check_number(param, v)
                .map(|()| narrow(v))
                .map_err(|e| ApiError::invalid(param, e.to_string()))
        })
    };
    let mut spec = GenerateSpec::new(prompt);
    spec.sampling = SamplingParams {
        temperature: number("temperature", s.temperature, d.temperature)?,
        top_k: s.top_k.map_or(d.top_k, |k| k.max(0) as usize),
        top_p: number("top_p", s.top_p, d.top_p)?,
        min_p: number("min_p", s.min_p, d.min_p)?,
        repeat_penalty: number("repetition_penalty", s.repetition_penalty, d.repeat_penalty)?,
        repeat_last_n: d.repeat_last_n,
        frequency_penalty: number(
            "frequency_penalty",
            s.frequency_penalty,
            d.frequency_penalty,
        )?,
        presence_penalty: number("presence_penalty", s.presence_penalty, d.presence_penalty)?,
        logit_bias: logit_bias(s.logit_bias.unwrap_or_default())?,
        seed: s.seed,
    };
    spec.max_tokens = s.max_tokens.map(|n| n as usize);
    spec.stop = s.stop.map(wire::Stop::into_vec).unwrap_or_default();
    spec.ignore_eos = s.ignore_eos.unwrap_or(false);
    spec.min_tokens = s.min_tokens.unwrap_or(0) as usize;
    spec.stop_token_ids = s.stop_token_ids.unwrap_or_default();
    spec.speculate = !s.disable_speculation.unwrap_or(false);
    spec.request_id = request_id;
    Ok(spec)
}

/// Refuses what OpenAI or vLLM define but this server does not do, rather than give a
/// different answer than asked for.
fn refuse_unserved(s: &wire::Sampling) -> Result<(), ApiError> {
    if s.prompt_logprobs.is_some() {
        return Err(ApiError::invalid(
            "prompt_logprobs",
            "prompt_logprobs is not supported: the engine computes logprobs for generated \
             tokens only",
        ));
    }
    if s.use_beam_search == Some(true) {
        return Err(ApiError::invalid(
            "use_beam_search",
            "beam search is not supported: ask for n sampled choices instead",
        ));
    }
    Ok(())
}

/// `logit_bias` as the sampler takes it: each key a token id in decimal (its range against
/// the vocabulary is the engine's check), each bias checked as sent, then narrowed.
fn logit_bias(map: std::collections::BTreeMap<String, f64>) -> Result<Vec<(u32, f32)>, ApiError> {
    let mut out = Vec::with_capacity(map.len());
    for (key, bias) in map {
        let id = key
            .parse::<u32>()
            .ok()
            .filter(|_| key.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| {
                ApiError::invalid(
                    "logit_bias",
                    format!("logit_bias key {key:?} is not a token id (a decimal number)"),
                )
            })?;
        check_number("logit_bias", bias)
            .map_err(|e| ApiError::invalid("logit_bias", format!("{e} (token {id})")))?;
        out.push((id, narrow(bias)));
    }
    // Keys that spell one id two ways ("7", "07") are one token: refused, not summed.
    out.sort_unstable_by_key(|&(id, _)| id);
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(ApiError::invalid(
            "logit_bias",
            format!("logit_bias names token {} twice", w[0].0),
        ));
    }
    Ok(out)
}

fn message(i: usize, m: wire::MessageIn) -> Result<Message, ApiError> {
    // OpenAI's newer name for the system role.
    let role = if m.role == "developer" {
        "system".to_string()
    } else {
        m.role
    };
    let content = match m.content {
        None => String::new(),
        Some(Content::Text(t)) => t,
        Some(Content::Parts(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, p) in parts.into_iter().enumerate() {
                match (p.kind.as_str(), p.text) {
                    ("text", Some(t)) => texts.push(t),
                    ("text", None) => {
                        return Err(ApiError::invalid(
                            format!("messages[{i}].content[{j}].text"),
                            format!("messages[{i}].content[{j}] is a text part without text"),
                        ))
                    }
                    (other, _) => {
                        return Err(ApiError::invalid(
                            format!("messages[{i}].content[{j}].type"),
                            format!(
                                "messages[{i}].content[{j}] is a {other:?} part; only text \
                                 parts are supported"
                            ),
                        ))
                    }
                }
            }
            // Parts are joined by newlines, as vLLM joins them.
            texts.join("\n")
        }
    };
    let tool_calls = m
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(j, c)| {
            if c.kind.as_deref().is_some_and(|k| k != "function") {
                return Err(ApiError::invalid(
                    format!("messages[{i}].tool_calls[{j}].type"),
                    "only function tool calls are supported",
                ));
            }
            Ok(ToolCall {
                id: c.id.unwrap_or_default(),
                name: c.function.name,
                arguments: c.function.arguments,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Message {
        role,
        content,
        tool_calls,
        tool_call_id: m.tool_call_id.unwrap_or_default(),
    })
}

fn tool(i: usize, t: wire::ToolIn) -> Result<Tool, ApiError> {
    if t.kind != "function" {
        return Err(ApiError::invalid(
            format!("tools[{i}].type"),
            format!(
                "tools[{i}] is a {:?} tool; only function tools are supported",
                t.kind
            ),
        ));
    }
    let f = t.function.ok_or_else(|| {
        ApiError::invalid(
            format!("tools[{i}].function"),
            format!("tools[{i}] has no function"),
        )
    })?;
    Ok(Tool {
        name: f.name,
        description: f.description.unwrap_or_default(),
        parameters: match f.parameters {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(p) => p.to_string(),
        },
    })
}

/// A token's logprobs in the chat shape, with `top` alternatives.
pub(super) fn token_logprob(served: &Served, l: &Logprobs, top: usize) -> wire::TokenLogprob {
    let (token, bytes) = generate::token_text(served, &l.chosen);
    wire::TokenLogprob {
        token,
        logprob: l.chosen.logprob,
        bytes,
        top_logprobs: l
            .top
            .iter()
            .take(top)
            .map(|t| {
                let (token, bytes) = generate::token_text(served, t);
                wire::TopLogprob {
                    token,
                    logprob: t.logprob,
                    bytes,
                }
            })
            .collect(),
    }
}

fn tool_call_out(c: ToolCall) -> wire::ToolCallOut {
    wire::ToolCallOut {
        id: c.id,
        kind: "function",
        function: wire::FunctionCallOut {
            name: c.name,
            arguments: c.arguments,
        },
    }
}

async fn whole_reply(merged: Merged, shape: Shape) -> Result<Response, ApiError> {
    let (choices, finished) = generate::collect(merged).await?;
    let endings: Vec<_> = finished.iter().map(|f| &f.ending).collect();
    let usage = generate::usage(&choices, &endings);
    let out = choices
        .iter()
        .zip(finished)
        .map(|(c, f)| {
            let calls: Vec<_> = f.ending.all_calls.clone();
            // A turn that only called tools has no content, as OpenAI reports it.
            let content = (!f.text.is_empty() || calls.is_empty()).then_some(f.text);
            let reasoning = f.ending.reasoning_content.clone();
            wire::ChatChoice {
                index: c.index,
                message: wire::MessageOut {
                    role: "assistant",
                    content,
                    reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
                    tool_calls: calls.into_iter().map(tool_call_out).collect(),
                },
                logprobs: shape.logprobs.map(|top| wire::ChoiceLogprobs {
                    content: f
                        .logprobs
                        .iter()
                        .map(|(l, _)| token_logprob(&shape.served, l, top))
                        .collect(),
                }),
                finish_reason: generate::finish_reason(f.ending.finish_reason),
            }
        })
        .collect();
    Ok(Json(wire::ChatCompletion {
        id: shape.id,
        object: "chat.completion",
        created: shape.created,
        model: shape.model,
        choices: out,
        usage,
        system_fingerprint: fingerprint(),
    })
    .into_response())
}

/// The chunk of one choice's delta.
fn chunk(shape: &Shape, choice: wire::ChunkChoice) -> SseEvent {
    generate::json_event(&wire::ChatChunk {
        id: shape.id.clone(),
        object: "chat.completion.chunk",
        created: shape.created,
        model: shape.model.clone(),
        choices: vec![choice],
        usage: None,
        system_fingerprint: fingerprint(),
    })
}

/// A streamed chat reply's state: calls are numbered per choice, and the usage chunk
/// needs every choice's end.
struct ChatStream {
    shape: Shape,
    calls_sent: Vec<u32>,
    endings: Vec<Option<Ending>>,
}

impl ChatStream {
    fn delta(
        &mut self,
        i: usize,
        text: String,
        reasoning: String,
        calls: Vec<ToolCall>,
    ) -> wire::Delta {
        let sent = &mut self.calls_sent[i];
        wire::Delta {
            role: None,
            content: (!text.is_empty()).then_some(text),
            reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
            tool_calls: calls
                .into_iter()
                .map(|c| {
                    *sent += 1;
                    wire::ToolCallDelta {
                        index: *sent - 1,
                        id: c.id,
                        kind: "function",
                        function: wire::FunctionDelta {
                            name: c.name,
                            arguments: c.arguments,
                        },
                    }
                })
                .collect(),
        }
    }

    fn choice(
        &self,
        index: u32,
        delta: wire::Delta,
        logprobs: Option<wire::ChoiceLogprobs>,
        finish: Option<&'static str>,
    ) -> SseEvent {
        chunk(
            &self.shape,
            wire::ChunkChoice {
                index,
                delta,
                logprobs,
                finish_reason: finish,
            },
        )
    }
}

impl StreamFormat for ChatStream {
    fn update(&mut self, m: &Merged, i: usize, u: Update, out: &mut Vec<SseEvent>) -> bool {
        let index = m.choices[i].index;
        match u {
            Update::Token(p) => {
                let logprobs = match (self.shape.logprobs, &p.token.logprobs) {
                    (Some(top), Some(l)) => Some(wire::ChoiceLogprobs {
                        content: vec![token_logprob(&self.shape.served, l, top)],
                    }),
                    _ => None,
                };
                if p.text.is_empty()
                    && p.reasoning.is_empty()
                    && p.calls.is_empty()
                    && logprobs.is_none()
                {
                    return true;
                }
                let delta = self.delta(i, p.text, p.reasoning, p.calls);
                out.push(self.choice(index, delta, logprobs, None));
            }
            Update::End(mut e) => {
                let text = std::mem::take(&mut e.text);
                let reasoning = std::mem::take(&mut e.reasoning);
                let calls = std::mem::take(&mut e.calls);
                if !(text.is_empty() && reasoning.is_empty() && calls.is_empty()) {
                    let delta = self.delta(i, text, reasoning, calls);
                    out.push(self.choice(index, delta, None, None));
                }
                let finish = generate::finish_reason(e.finish_reason);
                out.push(self.choice(index, wire::Delta::default(), None, Some(finish)));
                self.endings[i] = Some(*e);
            }
            Update::Failed(e) => {
                out.push(generate::json_event(&e.body()));
                return false;
            }
        }
        true
    }

    fn finish(&mut self, m: &Merged, out: &mut Vec<SseEvent>) {
        let Some(usage) = generate::final_usage(&self.shape, m, &self.endings) else {
            return;
        };
        let s = &self.shape;
        out.push(generate::json_event(&wire::ChatChunk {
            id: s.id.clone(),
            object: "chat.completion.chunk",
            created: s.created,
            model: s.model.clone(),
            choices: Vec::new(),
            usage: Some(usage),
            system_fingerprint: fingerprint(),
        }));
    }
}

fn stream_reply(merged: Merged, shape: Shape) -> Response {
    // Each choice opens with its role.
    let opening: Vec<SseEvent> = merged
        .choices
        .iter()
        .map(|c| {
            let role = wire::Delta {
                role: Some("assistant"),
                content: Some(String::new()),
                ..Default::default()
            };
            chunk(
                &shape,
                wire::ChunkChoice {
                    index: c.index,
                    delta: role,
                    logprobs: None,
                    finish_reason: None,
                },
            )
        })
        .collect();
    let n = merged.choices.len();
    let format = ChatStream {
        shape,
        calls_sent: vec![0; n],
        endings: (0..n).map(|_| None).collect(),
    };
    generate::stream(merged, opening, format)
}

#[cfg(test)]
mod tests {
    use super::{logit_bias, one_format, wire, with_reasoning_effort, ResponseFormat};
    use serde_json::json;

    /// OpenAI's reasoning_effort reaches the template as a variable, after the request's
    /// own variables and not over one of the same name.
    #[test]
    fn reasoning_effort_is_a_template_variable() {
        let map = |v: serde_json::Value| v.as_object().cloned();
        assert_eq!(with_reasoning_effort(None, None), None);
        assert_eq!(
            with_reasoning_effort(None, Some("low".into())),
            map(json!({"reasoning_effort": "low"}))
        );
        let got = with_reasoning_effort(map(json!({"b": 1, "a": 2})), Some("high".into()));
        assert_eq!(
            serde_json::to_string(&got).unwrap(),
            r#"{"b":1,"a":2,"reasoning_effort":"high"}"#
        );
        assert_eq!(
            with_reasoning_effort(
                map(json!({"reasoning_effort": "medium"})),
                Some("high".into())
            ),
            map(json!({"reasoning_effort": "medium"}))
        );
    }

    /// vLLM's choice list becomes a regular expression that matches each string whole and
    /// nothing else, whatever characters they hold.
    #[test]
    fn a_choice_list_matches_exactly_its_strings() {
        let choices: Vec<String> = [
            "yes",
            "no",
            "a.b",
            "(x)|[y]",
            "1+1=2?",
            "$5 ^ {3}",
            "#tag & -~\\",
            "naïve ✓",
            "",
        ]
        .map(String::from)
        .into();
        let Some(ResponseFormat::Regex(re)) = ResponseFormat::choice(&choices) else {
            panic!("no regex");
        };
        let re = regex::Regex::new(&format!("^{re}$")).unwrap();
        for c in &choices {
            assert!(re.is_match(c), "{c:?}");
        }
        for other in ["ye", "yesno", "aXb", "x", "1+1=2", "11=2?", "naive ✓", " "] {
            assert!(!re.is_match(other), "{other:?}");
        }
    }

    /// The output constraints of vLLM arrive as the engine's response formats, and two of
    /// them in one request are refused, naming the second.
    #[test]
    fn vllms_structured_outputs_become_response_formats() {
        let parse = |v: serde_json::Value| -> wire::Sampling { serde_json::from_value(v).unwrap() };
        let one = |v| one_format(None, &parse(v));
        let schema = json!({"type": "object", "properties": {"b": {}, "a": {}}});
        for v in [
            json!({"guided_json": schema}),
            json!({"guided_json": schema.to_string()}),
            json!({"structured_outputs": {"json": schema}}),
        ] {
            assert_eq!(
                one(v).unwrap(),
                Some(ResponseFormat::JsonSchema(
                    r#"{"type":"object","properties":{"b":{},"a":{}}}"#.into()
                ))
            );
        }
        assert_eq!(
            one(json!({"structured_outputs": {"json_object": true}})).unwrap(),
            Some(ResponseFormat::JsonObject)
        );
        assert_eq!(
            one(json!({"guided_regex": "a+"})).unwrap(),
            Some(ResponseFormat::Regex("a+".into()))
        );
        assert_eq!(
            one(json!({"structured_outputs": {"choice": ["a", "b"]}})).unwrap(),
            Some(ResponseFormat::Regex("(?:a|b)".into()))
        );
        assert_eq!(
            one(json!({"guided_grammar": "start: \"x\""})).unwrap(),
            Some(ResponseFormat::Lark("start: \"x\"".into()))
        );
        assert_eq!(one(json!({"structured_outputs": {}})).unwrap(), None);
        for (v, param) in [
            (json!({"guided_json": 5}), "guided_json"),
            (json!({"guided_choice": []}), "guided_choice"),
            (
                json!({"structured_outputs": {"structural_tag": {}}}),
                "structured_outputs.structural_tag",
            ),
            (
                json!({"regex": "a", "guided_choice": ["b"]}),
                "guided_choice",
            ),
            (
                json!({"structured_outputs": {"regex": "a", "grammar": "start: \"x\""}}),
                "structured_outputs.grammar",
            ),
        ] {
            let e = one(v.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{v}: {}", e.message);
        }
        let e = one_format(
            Some(ResponseFormat::JsonObject),
            &parse(json!({"guided_regex": "a"})),
        )
        .unwrap_err();
        assert!(
            e.message.contains("response_format, guided_regex"),
            "{}",
            e.message
        );
    }

    #[test]
    fn logit_bias_keys_are_decimal_token_ids_each_named_once() {
        let map = |pairs: &[(&str, f64)]| pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect();
        assert_eq!(
            logit_bias(map(&[("10", 1.5), ("2", -100.0), ("7", 100.0)])).unwrap(),
            vec![(2, -100.0), (7, 100.0), (10, 1.5)]
        );
        assert_eq!(logit_bias(map(&[])).unwrap(), vec![]);
        let refused = |pairs: &[(&str, f64)]| logit_bias(map(pairs)).unwrap_err().message;
        for key in ["", "abc", "+7", "-7", " 7", "7.0", "4294967296"] {
            let m = refused(&[(key, 1.0)]);
            assert!(m.contains("is not a token id"), "{key:?}: {m}");
        }
        assert_eq!(
            refused(&[("7", 1.0), ("007", 2.0)]),
            "logit_bias names token 7 twice"
        );
        assert_eq!(
            refused(&[("7", 100.5)]),
            "invalid logit_bias 100.5: must be in [-100, 100] (token 7)"
        );
    }
}
