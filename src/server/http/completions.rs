//! `POST /v1/completions`: the legacy completions API. The prompt is a string, a list of
//! strings, token ids or a list of token-id lists (each prompt gets `n` choices, numbered
//! prompt by prompt); token ids are used as given. `echo` puts the prompt before the text.
//! `echo` with `logprobs` would need the prompt tokens' logprobs, which the engine does not
//! compute (its prefill keeps only the last position's logits), so that pair is refused.

use super::chat::{common_spec, fingerprint, now, one_format};
use super::error::{ApiError, Endpoint};
use super::generate::{self, Merged, Shape, StreamFormat, Update};
use super::wire::{self, CompletionRequest, PromptIn};
use super::{HttpState, JsonBody, RequestId};
use crate::engine::plan::{Input, PromptSpec};
use crate::engine::reply::Ending;
use crate::engine::{Logprobs, Served};
use axum::extract::State;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use std::sync::Arc;

pub async fn handle(
    State(state): State<Arc<HttpState>>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    body: Result<JsonBody<CompletionRequest>, ApiError>,
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
    req: CompletionRequest,
) -> Result<Response, ApiError> {
    let served = state.serving()?;
    let model = state.check_model(&served, req.sampling.model.as_deref())?;
    let capacity = state.core.engine.queue_capacity();
    let n = generate::choices(req.sampling.n, capacity)?;
    generate::check_queue(state)?;
    let echo = req.echo.unwrap_or(false);
    if echo && req.logprobs.is_some() {
        return Err(ApiError::invalid(
            "echo",
            "echo with logprobs asks for the prompt tokens' logprobs, which this server does \
             not compute; ask for echo or for logprobs",
        ));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "suffix is not supported"));
    }
    if req.best_of.is_some_and(|b| b as usize != n) {
        return Err(ApiError::invalid(
            "best_of",
            "best_of is not supported other than equal to n",
        ));
    }
    let inputs: Vec<Input> = match req.prompt {
        PromptIn::Text(t) => vec![Input::Text(t)],
        PromptIn::Texts(ts) => ts.into_iter().map(Input::Text).collect(),
        PromptIn::Tokens(ids) => vec![Input::Tokens(ids)],
        PromptIn::TokenLists(lists) => lists.into_iter().map(Input::Tokens).collect(),
    };
    if inputs.is_empty() {
        return Err(ApiError::invalid("prompt", "prompt is an empty list"));
    }
    if inputs.len() * n > generate::MAX_CHOICES.min(capacity) {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "{} prompts with n = {n} make {} choices; at most {} are queued together",
                inputs.len(),
                inputs.len() * n,
                generate::MAX_CHOICES.min(capacity)
            ),
        ));
    }
    let stream = req.sampling.stream.unwrap_or(false);
    let include_usage = req
        .sampling
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let format = one_format(None, &req.sampling)?;
    let mut echoed = Vec::new();
    let mut prepared = Vec::with_capacity(inputs.len());
    for input in inputs {
        if echo {
            echoed.push(match &input {
                Input::Text(t) => t.clone(),
                Input::Tokens(ids) => served.tokenizer.decode(ids, false).unwrap_or_default(),
                Input::Messages(_) => String::new(),
            });
        }
        let mut prompt = PromptSpec::new(input);
        prompt.response_format = format.clone();
        let mut spec = common_spec(prompt, req.sampling.clone(), request_id.clone())?;
        spec.logprobs = req.logprobs.map_or(0, |k| (k as usize).max(1));
        prepared.push(generate::prepare(state, &served, spec, Endpoint::Completions).await?);
    }
    let request_id = prepared[0].request_id.clone();
    let (choices, receivers) = generate::enqueue(state, &request_id, &prepared, n)?;
    let merged = Merged::new(choices, receivers);
    let shape = Shape {
        id: format!("cmpl-{request_id}"),
        model,
        created: now(),
        logprobs: req.logprobs.map(|k| k as usize),
        include_usage,
        served,
    };
    let echo = Echo(echo.then_some(echoed));
    if stream {
        Ok(stream_reply(merged, shape, echo))
    } else {
        whole_reply(merged, shape, echo).await
    }
}

/// Each prompt's text, when echoed.
struct Echo(Option<Vec<String>>);

impl Echo {
    /// The echoed prompt of a choice (empty without echo).
    fn of(&self, prompt: usize) -> &str {
        self.0
            .as_ref()
            .and_then(|e| e.get(prompt))
            .map_or("", String::as_str)
    }
}

/// Adds one token to the legacy logprobs shape, its text starting at `offset`.
fn push_logprob(
    out: &mut wire::CompletionLogprobs,
    served: &Served,
    l: &Logprobs,
    top: usize,
    offset: usize,
) {
    let (token, _) = generate::token_text(served, &l.chosen);
    out.tokens.push(token);
    out.token_logprobs.push(l.chosen.logprob);
    out.top_logprobs.push(
        l.top
            .iter()
            .take(top)
            .map(|t| {
                (
                    generate::token_text(served, t).0,
                    serde_json::Value::from(t.logprob),
                )
            })
            .collect(),
    );
    out.text_offset.push(offset);
}

async fn whole_reply(merged: Merged, shape: Shape, echo: Echo) -> Result<Response, ApiError> {
    let (choices, finished) = generate::collect(merged).await?;
    let endings: Vec<_> = finished.iter().map(|f| &f.ending).collect();
    let usage = generate::usage(&choices, &endings);
    let out = choices
        .iter()
        .zip(finished)
        .map(|(c, f)| {
            let prefix = echo.of(c.prompt);
            let logprobs = shape.logprobs.map(|top| {
                let mut lp = wire::CompletionLogprobs::default();
                for (l, at) in &f.logprobs {
                    push_logprob(&mut lp, &shape.served, l, top, prefix.len() + at);
                }
                lp
            });
            wire::CompletionChoice {
                index: c.index,
                text: format!("{prefix}{}", f.text),
                logprobs,
                finish_reason: Some(generate::finish_reason(f.ending.finish_reason)),
            }
        })
        .collect();
    Ok(Json(wire::Completion {
        id: shape.id,
        object: "text_completion",
        created: shape.created,
        model: shape.model,
        choices: out,
        usage: Some(usage),
        system_fingerprint: fingerprint(),
    })
    .into_response())
}

/// A streamed completion's state: where each choice's text has got to (for
/// `text_offset`), and the endings for the usage chunk.
struct CompletionStream {
    shape: Shape,
    offsets: Vec<usize>,
    endings: Vec<Option<Ending>>,
}

impl CompletionStream {
    fn chunk(&self, choice: wire::CompletionChoice, usage: Option<wire::Usage>) -> SseEvent {
        let s = &self.shape;
        generate::json_event(&wire::Completion {
            id: s.id.clone(),
            object: "text_completion",
            created: s.created,
            model: s.model.clone(),
            choices: usage.is_none().then_some(choice).into_iter().collect(),
            usage,
            system_fingerprint: fingerprint(),
        })
    }
}

impl StreamFormat for CompletionStream {
    fn update(&mut self, m: &Merged, i: usize, u: Update, out: &mut Vec<SseEvent>) -> bool {
        let index = m.choices[i].index;
        match u {
            Update::Token(p) => {
                let logprobs = match (self.shape.logprobs, &p.token.logprobs) {
                    (Some(top), Some(l)) => {
                        let mut lp = wire::CompletionLogprobs::default();
                        push_logprob(&mut lp, &self.shape.served, l, top, self.offsets[i]);
                        Some(lp)
                    }
                    _ => None,
                };
                if p.text.is_empty() && logprobs.is_none() {
                    return true;
                }
                self.offsets[i] += p.text.len();
                let choice = wire::CompletionChoice {
                    index,
                    text: p.text,
                    logprobs,
                    finish_reason: None,
                };
                out.push(self.chunk(choice, None));
            }
            Update::End(mut e) => {
                let choice = wire::CompletionChoice {
                    index,
                    text: std::mem::take(&mut e.text),
                    logprobs: None,
                    finish_reason: Some(generate::finish_reason(e.finish_reason)),
                };
                out.push(self.chunk(choice, None));
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
        let none = wire::CompletionChoice {
            index: 0,
            text: String::new(),
            logprobs: None,
            finish_reason: None,
        };
        out.push(self.chunk(none, Some(usage)));
    }
}

fn stream_reply(merged: Merged, shape: Shape, echo: Echo) -> Response {
    let mut offsets = Vec::with_capacity(merged.choices.len());
    let mut opening = Vec::new();
    let format_shape = shape;
    for c in &merged.choices {
        let prefix = echo.of(c.prompt).to_string();
        offsets.push(prefix.len());
        if !prefix.is_empty() {
            opening.push((c.index, prefix));
        }
    }
    let n = merged.choices.len();
    let format = CompletionStream {
        shape: format_shape,
        offsets,
        endings: (0..n).map(|_| None).collect(),
    };
    let opening = opening
        .into_iter()
        .map(|(index, text)| {
            format.chunk(
                wire::CompletionChoice {
                    index,
                    text,
                    logprobs: None,
                    finish_reason: None,
                },
                None,
            )
        })
        .collect();
    generate::stream(merged, opening, format)
}
