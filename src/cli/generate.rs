//! `inferno generate`: one generation from a prompt (or, with `--chat` or `--tools`, a chat
//! built as the service builds one), streamed to stdout with its metrics on stderr, or one
//! JSON object at the end.

use super::args::{ModelArgs, OutputFormat, SpecArgs};
use super::bench;
use crate::engine::loader;
use crate::engine::memory::gib;
use crate::engine::plan::{plan_prompt, Input, Message, PlanError, PromptSpec, Tool, ToolChoice};
use crate::engine::request::{check_context, prompt_tokens, Prompt};
use crate::engine::speculative::{Method, Solo};
use crate::engine::{generate_speculative, FinishReason, Flow, GenerateOptions};
use crate::sampling::constraint::{GrammarCompiler, ResponseFormat};
use crate::sampling::SamplingParams;
use crate::tokenizer::reasoning::{ReasoningParser, ReplyParser, ReplyPiece};
use crate::tokenizer::tool_calls::Parsed;
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Most tokens to generate (fewer when an end token or a stop string comes first).
    #[arg(long, short = 'n', default_value_t = 128)]
    pub max_tokens: usize,
    /// Sampling temperature: 0 always takes the most likely token (greedy); higher is more
    /// random.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Sample only among the k most likely tokens (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Sample only among the most likely tokens whose probabilities add up to this
    /// (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than this fraction of the most likely one (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Divide the scores of recently generated tokens by this, to discourage repeats
    /// (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Add BIAS (from -100 to 100) to the score of token ID before sampling, as llama.cpp's
    /// --logit-bias: -100 all but bans the token, 100 all but forces it. Repeatable.
    #[arg(long, value_name = "ID=BIAS", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of the sampler, for a repeatable run (default: a random one, printed with
    /// --output json).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Render the prompt as a user message with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// With --chat: ask a Qwen3 model to answer without a thinking section.
    #[arg(long)]
    pub no_think: bool,
    /// Optional system message for --chat.
    #[arg(long)]
    pub system: Option<String>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Stop when the text contains this string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// text: stream the text to stdout and the metrics to stderr; json: print one JSON
    /// object at the end.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// Constrain the output to a JSON value valid under the JSON schema in this file.
    #[arg(long, value_name = "FILE", group = "response_format")]
    pub json_schema: Option<PathBuf>,
    /// Constrain the output to any JSON object.
    #[arg(long, group = "response_format")]
    pub json_object: bool,
    /// Constrain the output to match this regular expression (Rust regex syntax) whole.
    #[arg(long, value_name = "REGEX", group = "response_format")]
    pub regex: Option<String>,
    /// Constrain the output to the Lark grammar in this file (llguidance's dialect; the
    /// output is a sentence of its `start` rule).
    #[arg(long, value_name = "FILE", group = "response_format")]
    pub grammar: Option<PathBuf>,
    /// Tools the model may call, from this JSON file: an array of OpenAI-style tools
    /// ({"type": "function", "function": {"name", "description", "parameters"}}) or of
    /// bare {"name", "description", "parameters"} objects. Implies --chat; the tools are
    /// shown to the model through its chat template, and each call it makes is printed as
    /// one JSON line {"name", "arguments"} on stdout (with --output json: in "tool_calls").
    #[arg(long, value_name = "FILE")]
    pub tools: Option<PathBuf>,
    /// With --tools: auto (the model decides), none (no tools shown, no calls parsed),
    /// required (exactly one call of some tool, grammar-constrained) or a tool's name
    /// (exactly one call of that tool, grammar-constrained).
    #[arg(
        long,
        value_name = "MODE|NAME",
        requires = "tools",
        default_value = "auto"
    )]
    pub tool_choice: String,
    /// Report a thinking model's reasoning (a <think> ... </think> section at the start of
    /// the output, or the rest of one the prompt opened) apart from its answer: with
    /// --output text it streams to stderr, between "[reasoning]" and "[/reasoning]" lines,
    /// and only the answer goes to stdout; with --output json it is "reasoning_content" and
    /// "text" is the answer. Without this flag the reasoning is ordinary text.
    // This comment is the --help text, where the brackets are literal, not links.
    #[allow(rustdoc::broken_intra_doc_links)]
    #[arg(long)]
    pub separate_reasoning: bool,
    /// The prompt (with --chat: the user's message).
    pub prompt: String,
}

/// One `--logit-bias ID=BIAS` (also `ID+BIAS` and `ID-BIAS`, as llama.cpp spells it); the
/// bias's range is the sampler's check.
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let at = s
        .find(['=', '+', '-'])
        .ok_or_else(|| format!("{s:?} is not ID=BIAS"))?;
    let id = s[..at]
        .parse::<u32>()
        .map_err(|_| format!("{:?} is not a token id", &s[..at]))?;
    let bias = if s.as_bytes()[at] == b'=' {
        &s[at + 1..]
    } else {
        &s[at..]
    };
    let bias = bias
        .parse::<f32>()
        .map_err(|_| format!("{bias:?} is not a number"))?;
    Ok((id, bias))
}

impl GenerateArgs {
    /// The response format the flags ask for, with its file read.
    fn response_format(&self) -> Result<Option<ResponseFormat>> {
        let read = |p: &PathBuf| {
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
        };
        Ok(if let Some(p) = &self.json_schema {
            Some(ResponseFormat::JsonSchema(read(p)?))
        } else if let Some(p) = &self.grammar {
            Some(ResponseFormat::Lark(read(p)?))
        } else if let Some(r) = &self.regex {
            Some(ResponseFormat::Regex(r.clone()))
        } else if self.json_object {
            Some(ResponseFormat::JsonObject)
        } else {
            None
        })
    }
}

pub fn cmd_generate(a: GenerateArgs) -> Result<()> {
    let sampling = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repeat_penalty: a.repeat_penalty,
        logit_bias: a.logit_bias.clone(),
        seed: a.seed,
        ..SamplingParams::default()
    };
    sampling.validate()?;
    let speculation = a.spec.speculation(Method::Ngram)?;
    let format = a.response_format()?;
    // Checked (files read, tools converted) before the model takes its time to load.
    let (input, format, with_tools) = if a.chat || a.tools.is_some() {
        chat_prompt(&a, format)?
    } else {
        let text = Prompt::Text {
            text: a.prompt.clone(),
            parse_special: false,
        };
        (text, format, false)
    };
    let path = a.model.source.resolve()?;
    let l = loader::file_assets(&path, &a.spec.load_options(a.model.run.load_options()))
        .map_err(anyhow::Error::msg)?;
    if let Some(id) = sampling.logit_bias_outside(l.model.config.vocab) {
        bail!(
            "--logit-bias names token {id}, outside the model's vocabulary of {} tokens",
            l.model.config.vocab
        );
    }
    let grammar = match &format {
        None => None,
        Some(f) => Some(GrammarCompiler::new(&l.tokenizer, l.model.config.vocab)?.compile(f)?),
    };
    let prompt = prompt_tokens(&l.tokenizer, &l.chat_template, &input)?;
    check_context(prompt.len(), Some(a.max_tokens), l.ctx_size).map_err(|e| {
        anyhow!(
            "{e} (raise --ctx-size, up to {})",
            l.model.config.context_length
        )
    })?;
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling,
        stop: a.stop.clone(),
        ignore_eos: a.ignore_eos,
        time_limit: None,
        grammar,
        speculate: true,
        ..GenerateOptions::default()
    };
    // Only the positions this run can fill: a whole long context of cache is gigabytes.
    let positions = (prompt.len() + a.max_tokens).min(l.ctx_size);
    let (kt, vt) = l.kv.types;
    eprintln!(
        "context: {} tokens (model: {}); KV cache {kt}/{vt}, {} bytes per position, {} for \
         this run's {positions} positions (KV memory: {:.2} GiB)",
        l.ctx_size,
        l.model.config.context_length,
        l.kv.bytes_per_token,
        bench::bytes_shown(l.kv.bytes(positions)),
        gib(l.kv.available),
    );
    let mut state = l.model.new_state(positions, l.state_rows);
    let stream = a.output == OutputFormat::Text;
    let reasoning = a.separate_reasoning.then(|| {
        // As the service does: a prompt ending in an open `<think>` starts inside it.
        let tail = &prompt[prompt.len().saturating_sub(8)..];
        ReasoningParser::after_prompt(&l.tokenizer.decode(tail, false).unwrap_or_default())
    });
    let mut out = ReplyOut {
        parser: ReplyParser::new(reasoning, with_tools),
        stream,
        stdout: std::io::stdout().lock(),
        reasoning: String::new(),
        in_reasoning: false,
        answer: String::new(),
        at_line_start: true,
        calls: Vec::new(),
    };
    let mut solo =
        Solo::new(&speculation, l.draft.as_ref(), positions).map_err(anyhow::Error::msg)?;
    let g = generate_speculative(
        &l.model,
        &l.tokenizer,
        &mut state,
        &prompt,
        &opts,
        solo.as_mut(),
        |ev| {
            if !ev.text.is_empty() {
                let piece = out.parser.push(ev.text);
                out.show(piece);
            }
            Flow::Continue
        },
    )?;
    let piece = out.parser.finish();
    out.show(piece);
    out.end_reasoning();
    let ReplyOut {
        mut stdout,
        reasoning,
        answer,
        calls,
        ..
    } = out;
    let m = &g.metrics;
    let mut finish = g.finish_reason;
    if finish == FinishReason::Eos && !calls.is_empty() {
        finish = FinishReason::ToolCalls;
    }
    let finish_reason = crate::server::service::finish_reason(Some(finish)).as_str_name();
    match a.output {
        OutputFormat::Text => {
            let _ = writeln!(stdout);
            drop(stdout);
            eprintln!();
            eprintln!(
                "backend: {} ({} threads)",
                l.model.device().name(),
                l.model.device().threads()
            );
            eprintln!("finish_reason: {finish_reason}");
            eprintln!("metrics:");
            eprintln!("  prompt_tokens: {}", m.prompt_tokens);
            eprintln!("  completion_tokens: {}", m.completion_tokens);
            eprintln!("  time_to_first_token_ms: {:.3}", m.time_to_first_token_ms);
            eprintln!(
                "  prefill_tokens_per_second: {:.3}",
                m.prefill_tokens_per_second
            );
            eprintln!(
                "  decode_tokens_per_second: {:.3}",
                m.decode_tokens_per_second
            );
            eprintln!(
                "  per_forward_ms: min {:.3}  max {:.3}  mean {:.3}  (n={})",
                m.per_forward_ms_min, m.per_forward_ms_max, m.per_forward_ms_mean, m.forward_calls
            );
            if m.masks > 0 {
                eprintln!(
                    "  grammar_mask_ms: mean {:.3}  p99 {:.3}  max {:.3}  (n={})",
                    m.mask_ms_mean, m.mask_ms_p99, m.mask_ms_max, m.masks
                );
            }
            if speculation.is_on() {
                eprintln!(
                    "  speculative ({}): drafted {}  accepted {}  in {} verify steps",
                    speculation.method.name(),
                    m.drafted_tokens,
                    m.accepted_tokens,
                    m.verify_steps
                );
            }
        }
        OutputFormat::Json => {
            let mut v = serde_json::json!({
                "text": answer,
                "tokens": g.tokens,
                "finish_reason": finish_reason,
                "seed": g.seed,
                "metrics": g.metrics,
            });
            if a.separate_reasoning {
                v["reasoning_content"] = reasoning.into();
            }
            if with_tools {
                v["tool_calls"] = calls.into();
            }
            writeln!(stdout, "{v}")?;
        }
    }
    Ok(())
}

/// The chat prompt of `generate --chat` (or `--tools`), built as the service builds a
/// Generate request's (tools and tool choice included), with the response format it
/// implies and whether the output has tool calls to find.
fn chat_prompt(
    a: &GenerateArgs,
    format: Option<ResponseFormat>,
) -> Result<(Prompt, Option<ResponseFormat>, bool)> {
    let mut messages = Vec::new();
    if let Some(sys) = &a.system {
        messages.push(Message::new("system", sys.clone()));
    }
    messages.push(Message::new("user", a.prompt.clone()));
    let mut spec = PromptSpec::new(Input::Messages(messages));
    if let Some(path) = &a.tools {
        spec.tools = read_tools(path)?;
        spec.tool_choice = match a.tool_choice.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            name => ToolChoice::Function(name.to_string()),
        };
    }
    spec.response_format = format;
    spec.enable_thinking = a.no_think.then_some(false);
    // The planner names request fields; two of them are flags here, said in their terms.
    let plan = plan_prompt(&spec).map_err(|e| match e {
        PlanError::UnknownToolChoice(name) => anyhow!(
            "--tool-choice names the function {name:?}, which is not among the tools of \
             --tools"
        ),
        PlanError::FormatWithForcedTool => anyhow!(
            "a response format flag (--json-schema, --json-object, --regex, --grammar) cannot \
             be combined with --tool-choice required or a tool's name"
        ),
        e => e.into(),
    })?;
    Ok((plan.prompt, plan.response_format, plan.tools))
}

/// The tools of a `--tools` file, as the service takes them.
fn read_tools(path: &Path) -> Result<Vec<Tool>> {
    let shown = path.display();
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the tools file {shown}"))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("the tools file {shown} is not valid JSON"))?;
    let Some(items) = v.as_array() else {
        bail!("the tools file {shown} must hold a JSON array of tools");
    };
    let mut tools = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let bad = |why: &str| anyhow!("the tools file {shown}: tool {i} {why}");
        // OpenAI's wrapping, or the function itself.
        let f = match item.get("type") {
            Some(t) if t == "function" => item
                .get("function")
                .ok_or_else(|| bad("has type \"function\" but no \"function\" object"))?,
            Some(t) => return Err(bad(&format!("has type {t}; only \"function\" is known"))),
            None => item,
        };
        let Some(f) = f.as_object() else {
            return Err(bad("is not a JSON object"));
        };
        let name = match f.get("name") {
            Some(serde_json::Value::String(n)) => n.clone(),
            _ => return Err(bad("has no \"name\" string")),
        };
        let description = match f.get("description") {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(serde_json::Value::String(d)) => d.clone(),
            Some(_) => return Err(bad("has a \"description\" that is not a string")),
        };
        let parameters = match f.get("parameters") {
            None | Some(serde_json::Value::Null) => String::new(),
            Some(p @ serde_json::Value::Object(_)) => p.to_string(),
            Some(_) => return Err(bad("has \"parameters\" that are not a JSON object")),
        };
        tools.push(Tool {
            name,
            description,
            parameters,
        });
    }
    if tools.is_empty() {
        bail!("the tools file {shown} holds no tools");
    }
    Ok(tools)
}

/// Where `generate` puts a reply's parts as they come: the answer on stdout, each tool
/// call as a JSON line on stdout, the reasoning on stderr (with --output text); all of it
/// kept for --output json.
struct ReplyOut<W: Write> {
    parser: ReplyParser,
    stream: bool,
    stdout: W,
    reasoning: String,
    /// The "[reasoning]" line is printed and its end is not.
    in_reasoning: bool,
    answer: String,
    at_line_start: bool,
    calls: Vec<serde_json::Value>,
}

impl<W: Write> ReplyOut<W> {
    fn show(&mut self, piece: ReplyPiece) {
        if !piece.reasoning.is_empty() {
            if self.stream {
                if !self.in_reasoning {
                    eprintln!("[reasoning]");
                    self.in_reasoning = true;
                }
                eprint!("{}", piece.reasoning);
            }
            self.reasoning.push_str(&piece.reasoning);
        }
        for p in piece.answer {
            self.end_reasoning();
            let shown = match p {
                Parsed::Text(t) => {
                    self.answer.push_str(&t);
                    t
                }
                Parsed::Call(c) => {
                    let arguments: serde_json::Value =
                        serde_json::from_str(&c.arguments).unwrap_or_default();
                    let call = serde_json::json!({"name": c.name, "arguments": arguments});
                    let mut line = if self.at_line_start {
                        String::new()
                    } else {
                        "\n".to_string()
                    };
                    line.push_str(&call.to_string());
                    line.push('\n');
                    self.calls.push(call);
                    line
                }
            };
            if self.stream && !shown.is_empty() {
                let _ = self.stdout.write_all(shown.as_bytes());
                let _ = self.stdout.flush();
                self.at_line_start = shown.ends_with('\n');
            }
        }
    }

    /// Closes the reasoning on stderr once the answer starts (or the reply ends).
    fn end_reasoning(&mut self) {
        if self.in_reasoning {
            eprintln!("\n[/reasoning]");
            self.in_reasoning = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse_logit_bias;

    #[test]
    fn logit_bias_flags_parse_as_llama_cpp_spells_them() {
        assert_eq!(parse_logit_bias("15043=1.5"), Ok((15043, 1.5)));
        assert_eq!(parse_logit_bias("15043+1"), Ok((15043, 1.0)));
        assert_eq!(parse_logit_bias("15043-100"), Ok((15043, -100.0)));
        assert_eq!(parse_logit_bias("7=-3"), Ok((7, -3.0)));
        for bad in ["15043", "x=1", "=1", "7=", "7=abc", "-7=1", "99999999999=1"] {
            assert!(parse_logit_bias(bad).is_err(), "{bad}");
        }
    }
}
