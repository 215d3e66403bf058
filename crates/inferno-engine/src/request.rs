//! Building a request: its parameters checked, its prompt rendered (chat template) and
//! tokenized (BOS, special tokens), then checked against the context window and the KV
//! budget, with `max_tokens` resolved. The service builds each Generate call with
//! [`Served::build`]; the command line uses [`prompt_tokens`] and [`check_context`] for its
//! single sequence.
//!
//! Also what request handlers see of the engine: its [`EngineState`] and, once the model
//! is loaded, [`Served`] (the tokenizer side and the limits, never the model itself).

use super::generate::GenerateOptions;
use super::job::MAX_LOGPROBS;
use super::limits::Limits;
use super::loader::ModelDescription;
use super::memory::KvMemory;
use super::speculative::SpecInfo;
use inferno_model::ModelConfig;
use inferno_sampling::constraint::{ConstraintError, GrammarCompiler, ResponseFormat};
use inferno_sampling::{SamplingError, SamplingParams};
use inferno_tokenizer::{ChatMessage, ChatTemplate, TemplateArgs, Tokenizer};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Roles a chat message may have.
pub const ROLES: &[&str] = &["system", "user", "assistant", "tool"];
/// Limits on the parts of a request that are not bounded by the context window.
pub const MAX_STOP_STRINGS: usize = 16;
/// Most stop token ids one request may give.
pub const MAX_STOP_TOKEN_IDS: usize = 64;
pub const MAX_STOP_BYTES: usize = 256;

/// A generation request as a client states it, before it is built.
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Prompt,
    /// `None`: the server's default, shortened to what fits.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub time_limit: Option<Duration>,
    /// Alternatives to report per token (0 = no logprobs).
    pub logprobs: usize,
    /// What the output must be (JSON schema, regex, grammar); `None`: free text.
    pub response_format: Option<ResponseFormat>,
    /// Whether the request may speculate when the server does (see
    /// [`GenerateOptions::speculate`]).
    pub speculate: bool,
    /// See [`GenerateOptions::min_tokens`]; at most the resolved `max_tokens`.
    pub min_tokens: usize,
    /// See [`GenerateOptions::stop_token_ids`]; each in the vocabulary, at most
    /// [`MAX_STOP_TOKEN_IDS`].
    pub stop_token_ids: Vec<u32>,
}

/// A request's prompt before tokenization.
#[derive(Clone, Debug)]
pub enum Prompt {
    /// Plain text. With `parse_special`, special-token text such as `<|im_start|>` becomes
    /// those tokens; without, it is ordinary text.
    Text { text: String, parse_special: bool },
    /// Chat messages, rendered with the model's template (an assistant turn opened unless
    /// `template` says otherwise).
    Chat {
        messages: Vec<ChatMessage>,
        template: TemplateArgs,
    },
    /// Token ids, used as given (no BOS is added); each must be in the model's vocabulary.
    Tokens(Vec<u32>),
    /// Chat messages as JSON (in the shape `transformers` passes templates: assistant
    /// `tool_calls`, tool `tool_call_id`), with the tools (a JSON array) the model may
    /// call; roles are the caller's to check.
    ChatJson {
        messages: String,
        tools: Option<String>,
        template: TemplateArgs,
    },
}

/// Why a request cannot be built; each is the client's doing.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum RequestError {
    #[error("max_tokens must be at least 1")]
    NoMaxTokens,
    #[error("logprobs is {0} but at most {MAX_LOGPROBS} alternatives may be asked for")]
    TooManyLogprobs(usize),
    #[error("{0} stop strings given; at most {MAX_STOP_STRINGS} are allowed")]
    TooManyStops(usize),
    #[error("stop strings must be 1 to {MAX_STOP_BYTES} bytes long (got {0} bytes)")]
    StopLength(usize),
    #[error("sampling: {0}")]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    ResponseFormat(#[from] ConstraintError),
    #[error("unknown role {role:?} in messages[{index}] (expected one of: {})", ROLES.join(", "))]
    UnknownRole { index: usize, role: String },
    #[error("cannot render the chat template: {0}")]
    Template(String),
    #[error("cannot tokenize the prompt: {0}")]
    Tokenize(String),
    #[error("the prompt is empty after tokenization")]
    Empty,
    #[error("prompt token {index} is {id}, outside the model's vocabulary of {vocab} tokens")]
    TokenOutOfRange { index: usize, id: u32, vocab: usize },
    #[error("logit_bias names token {id}, outside the model's vocabulary of {vocab} tokens")]
    LogitBiasToken { id: u32, vocab: usize },
    #[error("stop_token_ids has token {id}, outside the model's vocabulary of {vocab} tokens")]
    StopTokenOutOfRange { id: u32, vocab: usize },
    #[error("{0} stop_token_ids given; at most {MAX_STOP_TOKEN_IDS} are allowed")]
    TooManyStopTokens(usize),
    #[error("min_tokens ({min_tokens}) exceeds max_tokens ({max_tokens})")]
    MinTokensAboveMax {
        min_tokens: usize,
        max_tokens: usize,
    },
    #[error(
        "the prompt has {prompt} tokens but the context window holds {ctx}, leaving no room \
         for {}", room_wanted(*.max_tokens)
    )]
    PromptExceedsContext {
        prompt: usize,
        /// As the request gave it, if it did.
        max_tokens: Option<usize>,
        ctx: usize,
    },
    #[error(
        "the prompt has {prompt} tokens but the server's KV cache holds {kv} (--kv-cache-tokens)"
    )]
    PromptExceedsKvCache { prompt: usize, kv: usize },
    #[error(
        "the prompt ({prompt} tokens) plus max_tokens ({max_tokens}) exceeds the context \
         window ({ctx} tokens)"
    )]
    ExceedsContext {
        prompt: usize,
        max_tokens: usize,
        ctx: usize,
    },
    #[error(
        "the prompt ({prompt} tokens) plus max_tokens ({max_tokens}) exceeds the server's KV \
         cache ({kv} tokens, --kv-cache-tokens)"
    )]
    ExceedsKvCache {
        prompt: usize,
        max_tokens: usize,
        kv: usize,
    },
}

/// The prompt's tokens: BOS where the tokenizer adds one (unless a rendered chat starts with
/// it already), then the text (or the rendered chat) encoded. Never empty.
pub fn prompt_tokens(
    tokenizer: &Tokenizer,
    chat_template: &ChatTemplate,
    prompt: &Prompt,
) -> Result<Vec<u32>, RequestError> {
    let rendered;
    let (text, parse_special) = match prompt {
        Prompt::Tokens(ids) if ids.is_empty() => return Err(RequestError::Empty),
        Prompt::Tokens(ids) => return Ok(ids.clone()),
        Prompt::Text {
            text,
            parse_special,
        } => (text.as_str(), *parse_special),
        Prompt::Chat { messages, template } => {
            if let Some((index, m)) = messages
                .iter()
                .enumerate()
                .find(|(_, m)| !ROLES.contains(&m.role.as_str()))
            {
                return Err(RequestError::UnknownRole {
                    index,
                    role: m.role.clone(),
                });
            }
            rendered = chat_template
                .render_with(messages, template)
                .map_err(|e| RequestError::Template(e.to_string()))?;
            // The template writes the special tokens that delimit the turns.
            (rendered.as_str(), true)
        }
        Prompt::ChatJson {
            messages,
            tools,
            template,
        } => {
            rendered = chat_template
                .render_json_with(messages, tools.as_deref(), template)
                .map_err(|e| RequestError::Template(e.to_string()))?;
            (rendered.as_str(), true)
        }
    };
    let encoded = tokenizer
        .encode(text, parse_special)
        .map_err(|e| RequestError::Tokenize(e.to_string()))?;
    let mut tokens = Vec::with_capacity(encoded.len() + 1);
    if let Some(bos) = tokenizer.bos_id().filter(|_| tokenizer.add_bos()) {
        // A chat template that writes BOS itself (Llama 3's) gets no second one: transformers
        // tokenizes its rendering without special tokens, llama.cpp strips the template's.
        let template_wrote_it =
            matches!(prompt, Prompt::Chat { .. }) && encoded.first() == Some(&bos);
        if !template_wrote_it {
            tokens.push(bos);
        }
    }
    tokens.extend(encoded);
    if tokens.is_empty() {
        return Err(RequestError::Empty);
    }
    Ok(tokens)
}

/// What a prompt that fills the context leaves no room for, in its error message.
fn room_wanted(max_tokens: Option<usize>) -> String {
    match max_tokens {
        Some(n) => format!("max_tokens ({n})"),
        None => "a generated token".into(),
    }
}

/// Whether a prompt of `prompt_len` tokens leaves room for a generated token in a context
/// of `ctx` positions (`max_tokens`, as asked, goes into the error).
pub fn check_context(
    prompt_len: usize,
    max_tokens: Option<usize>,
    ctx: usize,
) -> Result<(), RequestError> {
    if prompt_len >= ctx {
        return Err(RequestError::PromptExceedsContext {
            prompt: prompt_len,
            max_tokens,
            ctx,
        });
    }
    Ok(())
}

/// A request ready for the queue: its prompt tokens and how to generate.
#[derive(Clone, Debug)]
pub struct Built {
    pub prompt: Vec<u32>,
    pub options: GenerateOptions,
    pub logprobs: usize,
}

/// What the request handlers may use once the model is loaded: the tokenizer side, the
/// model's hyper-parameters and the engine's limits, never the model itself.
pub struct Served {
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Arc<ChatTemplate>,
    pub config: ModelConfig,
    pub quantization: String,
    pub description: ModelDescription,
    /// `limits.ctx` is the context window each sequence has.
    pub limits: Limits,
    /// The KV cache's types, size per position and the memory it may take.
    pub kv: KvMemory,
    /// How the engine speculates.
    pub speculative: SpecInfo,
    /// Compiles response formats; built by the first request that has one.
    pub grammars: GrammarCache,
}

/// A [`GrammarCompiler`] for the served vocabulary, built on first use (most servers never
/// need one, and building it takes a moment).
#[derive(Default)]
pub struct GrammarCache(OnceLock<Result<GrammarCompiler, ConstraintError>>);

impl GrammarCache {
    pub fn get(
        &self,
        tokenizer: &Tokenizer,
        vocab: usize,
    ) -> Result<&GrammarCompiler, ConstraintError> {
        self.0
            .get_or_init(|| GrammarCompiler::new(tokenizer, vocab))
            .as_ref()
            .map_err(Clone::clone)
    }
}

impl Served {
    /// Bytes of the KV budget (`limits.kv_budget` positions) in the cache's types.
    pub fn kv_budget_bytes(&self) -> u64 {
        self.kv.bytes(self.limits.kv_budget)
    }

    /// Checks a request's parameters, tokenizes its prompt and resolves its `max_tokens`
    /// (`None`: `default_max_tokens`, shortened to what fits), refusing what cannot run: a
    /// prompt that fills the context window or the KV budget, or `max_tokens` that would
    /// overflow either. A running request reserves its prompt plus `max_tokens` of the
    /// shared KV cache.
    pub fn build(&self, req: Request, default_max_tokens: usize) -> Result<Built, RequestError> {
        check_parameters(&req)?;
        let vocab = self.config.vocab;
        if let Some(id) = req.sampling.logit_bias_outside(vocab) {
            return Err(RequestError::LogitBiasToken { id, vocab });
        }
        if let Some(&id) = req.stop_token_ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(RequestError::StopTokenOutOfRange { id, vocab });
        }
        let grammar = match &req.response_format {
            None => None,
            Some(f) => Some(
                self.grammars
                    .get(&self.tokenizer, self.config.vocab)?
                    .compile(f)?,
            ),
        };
        let tokens = prompt_tokens(&self.tokenizer, &self.chat_template, &req.prompt)?;
        if let Some((index, &id)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &id)| id as usize >= vocab)
        {
            return Err(RequestError::TokenOutOfRange { index, id, vocab });
        }
        let max_tokens = resolve_max_tokens(
            &self.limits,
            tokens.len(),
            req.max_tokens,
            default_max_tokens,
        )?;
        if req.min_tokens > max_tokens {
            return Err(RequestError::MinTokensAboveMax {
                min_tokens: req.min_tokens,
                max_tokens,
            });
        }
        Ok(Built {
            prompt: tokens,
            options: GenerateOptions {
                max_tokens,
                sampling: req.sampling,
                stop: req.stop,
                ignore_eos: req.ignore_eos,
                time_limit: req.time_limit,
                grammar,
                speculate: req.speculate,
                min_tokens: req.min_tokens,
                stop_token_ids: req.stop_token_ids,
            },
            logprobs: req.logprobs,
        })
    }
}

/// The checks on a request's parameters that need no tokenizer.
fn check_parameters(req: &Request) -> Result<(), RequestError> {
    if req.max_tokens == Some(0) {
        return Err(RequestError::NoMaxTokens);
    }
    if req.logprobs > MAX_LOGPROBS {
        return Err(RequestError::TooManyLogprobs(req.logprobs));
    }
    if req.stop.len() > MAX_STOP_STRINGS {
        return Err(RequestError::TooManyStops(req.stop.len()));
    }
    if let Some(s) = req
        .stop
        .iter()
        .find(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(RequestError::StopLength(s.len()));
    }
    if req.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(RequestError::TooManyStopTokens(req.stop_token_ids.len()));
    }
    req.sampling.validate()?;
    Ok(())
}

/// The KV-budget arithmetic of [`Served::build`].
fn resolve_max_tokens(
    limits: &Limits,
    prompt: usize,
    max_tokens: Option<usize>,
    default_max_tokens: usize,
) -> Result<usize, RequestError> {
    let (ctx, kv) = (limits.ctx, limits.kv_budget);
    check_context(prompt, max_tokens, ctx)?;
    if prompt >= kv {
        return Err(RequestError::PromptExceedsKvCache { prompt, kv });
    }
    let room = ctx.min(kv) - prompt;
    match max_tokens {
        Some(n) if prompt + n > ctx => Err(RequestError::ExceedsContext {
            prompt,
            max_tokens: n,
            ctx,
        }),
        Some(n) if n > room => Err(RequestError::ExceedsKvCache {
            prompt,
            max_tokens: n,
            kv,
        }),
        Some(n) => Ok(n),
        None => Ok(default_max_tokens.min(room)),
    }
}

/// The engine's life cycle as the handlers see it.
#[derive(Clone)]
pub enum EngineState {
    Loading,
    Ready(Arc<Served>),
    Failed(Arc<str>),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(ctx: usize, kv_budget: usize) -> Limits {
        Limits {
            max_seqs: 1,
            prefill_chunk: 1,
            prefill_chunk_running: 1,
            target_itl: None,
            ctx,
            kv_budget,
            draft_max: 0,
        }
    }

    fn request() -> Request {
        Request {
            prompt: Prompt::Text {
                text: "hi".into(),
                parse_special: true,
            },
            max_tokens: None,
            sampling: SamplingParams::default(),
            stop: vec!["\n".into()],
            ignore_eos: false,
            time_limit: None,
            logprobs: MAX_LOGPROBS,
            response_format: None,
            speculate: true,
            min_tokens: 0,
            stop_token_ids: vec![],
        }
    }

    #[test]
    fn parameters_are_checked_before_tokenizing() {
        assert_eq!(check_parameters(&request()), Ok(()));
        let bad = |f: fn(&mut Request)| {
            let mut r = request();
            f(&mut r);
            check_parameters(&r).unwrap_err()
        };
        assert_eq!(bad(|r| r.max_tokens = Some(0)), RequestError::NoMaxTokens);
        assert_eq!(
            bad(|r| r.logprobs = MAX_LOGPROBS + 1),
            RequestError::TooManyLogprobs(MAX_LOGPROBS + 1)
        );
        assert_eq!(
            bad(|r| r.stop = vec!["x".into(); MAX_STOP_STRINGS + 1]),
            RequestError::TooManyStops(MAX_STOP_STRINGS + 1)
        );
        assert_eq!(
            bad(|r| r.stop = vec![String::new()]),
            RequestError::StopLength(0)
        );
        assert_eq!(
            bad(|r| r.stop = vec!["x".repeat(MAX_STOP_BYTES + 1)]),
            RequestError::StopLength(MAX_STOP_BYTES + 1)
        );
        assert!(matches!(
            bad(|r| r.sampling.top_p = 1.5),
            RequestError::Sampling(_)
        ));
    }

    #[test]
    fn max_tokens_fit_the_context_and_the_kv_budget() {
        let l = limits(100, 60);
        assert_eq!(resolve_max_tokens(&l, 10, Some(50), 256), Ok(50));
        assert_eq!(resolve_max_tokens(&l, 10, None, 256), Ok(50));
        assert_eq!(resolve_max_tokens(&l, 10, None, 20), Ok(20));
        assert!(matches!(
            resolve_max_tokens(&l, 10, Some(51), 256),
            Err(RequestError::ExceedsKvCache { .. })
        ));
        assert!(matches!(
            resolve_max_tokens(&limits(100, 500), 10, Some(91), 256),
            Err(RequestError::ExceedsContext { .. })
        ));
        assert!(matches!(
            resolve_max_tokens(&l, 60, None, 256),
            Err(RequestError::PromptExceedsKvCache { prompt: 60, kv: 60 })
        ));
        assert_eq!(
            resolve_max_tokens(&l, 100, None, 256),
            Err(RequestError::PromptExceedsContext {
                prompt: 100,
                max_tokens: None,
                ctx: 100
            })
        );
        let e = resolve_max_tokens(&l, 120, Some(16), 256).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the prompt has 120 tokens but the context window holds 100, leaving no room for \
             max_tokens (16)"
        );
    }
}
