//! Chat templates: renders a conversation into the prompt text a model was
//! trained on, using the Jinja template stored in the GGUF
//! (`tokenizer.chat_template`) with the same environment the Hugging Face
//! `transformers` library sets up. Its `tojson` filter is in `tojson.rs`.

use std::fmt;
use std::fmt::Write as _;
use std::sync::Arc;

use minijinja::value::{Enumerator, Object, ObjectExt, ObjectRepr, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::TokenizerError;
use inferno_gguf::GgufFile;

/// Name under which the template is registered in its environment.
const TEMPLATE_NAME: &str = "chat_template";

/// Plain ChatML, for models that ship no template of their own.
const CHATML_TEMPLATE: &str = "\
{%- for message in messages %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- endif %}";

/// One conversation turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// How a rendered conversation ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChatEnding {
    /// The opening of an assistant turn follows the messages (`add_generation_prompt`).
    #[default]
    AssistantTurn,
    /// The messages alone, each turn closed.
    Closed,
    /// The final message left open for the model to continue it (`continue_final_message`,
    /// a "prefilled" reply): the rendering is cut right after that message's text, as
    /// transformers cuts it.
    ContinueFinal,
}

/// What a template is rendered with besides the messages and tools.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TemplateArgs {
    pub ending: ChatEnding,
    /// For templates that honour it (Qwen3): `Some(false)` asks for no thinking section;
    /// passed only when set, so templates that test `enable_thinking is defined` behave as
    /// with transformers.
    pub enable_thinking: Option<bool>,
    /// More variables for the template (vLLM's `chat_template_kwargs`): a JSON object's
    /// text. The variables the renderer sets itself (`messages`, `tools`, …) take
    /// precedence over these; callers refuse such names before.
    pub kwargs: Option<String>,
}

impl TemplateArgs {
    /// An assistant turn opened or not, nothing else.
    pub fn new(add_generation_prompt: bool, enable_thinking: Option<bool>) -> Self {
        Self {
            ending: if add_generation_prompt {
                ChatEnding::AssistantTurn
            } else {
                ChatEnding::Closed
            },
            enable_thinking,
            kwargs: None,
        }
    }
}

/// The variables the renderer sets itself, which `chat_template_kwargs` may not.
pub const RESERVED_TEMPLATE_VARIABLES: &[&str] = &[
    "messages",
    "tools",
    "documents",
    "add_generation_prompt",
    "continue_final_message",
    "bos_token",
    "eos_token",
    "enable_thinking",
];

/// A compiled chat template plus the special-token text it may reference.
#[derive(Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// Why the model's template could not be compiled; every render fails with it.
    broken: Option<String>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish()
    }
}

impl ChatTemplate {
    /// Loads `tokenizer.chat_template` from a GGUF file; `None` when the file
    /// has no template. The BOS/EOS token text is taken from the vocabulary so
    /// templates can use `bos_token` and `eos_token`.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Option<Self>, TokenizerError> {
        let Some(value) = gguf.get("tokenizer.chat_template") else {
            return Ok(None);
        };
        let source = value
            .as_str()
            .ok_or_else(|| TokenizerError::InvalidMetadata {
                key: "tokenizer.chat_template",
                reason: "expected a string".into(),
            })?;
        let token_text = |key: &str| -> Option<String> {
            let id = gguf.get(key)?.as_u64()?;
            let tokens = gguf.get("tokenizer.ggml.tokens")?.as_array()?;
            let id = usize::try_from(id).ok()?;
            tokens.get(id)?.as_str().map(str::to_owned)
        };
        let bos = token_text("tokenizer.ggml.bos_token_id");
        let eos = token_text("tokenizer.ggml.eos_token_id");
        Ok(Some(Self::new(source)?.with_special_tokens(bos, eos)))
    }

    /// The template a model is served with: its own, ChatML when it has none, or, when its
    /// own cannot be compiled, one whose every render fails with that error, so a broken
    /// template refuses chat requests only and plain prompts are still served.
    pub fn for_model(gguf: &GgufFile) -> Self {
        match Self::from_gguf(gguf) {
            Ok(Some(t)) => t,
            Ok(None) => Self::chatml(),
            Err(e) => {
                tracing::warn!(error = %e, "the model's chat template is unusable; chat requests will be refused");
                Self {
                    env: Environment::new(),
                    source: String::new(),
                    bos_token: None,
                    eos_token: None,
                    broken: Some(e.to_string()),
                }
            }
        }
    }

    /// ChatML (`<|im_start|>role\ncontent<|im_end|>\n`), the fallback for
    /// models without a template.
    pub fn chatml() -> Self {
        match Self::new(CHATML_TEMPLATE) {
            Ok(t) => t,
            // The built-in source is a constant known to parse.
            Err(e) => unreachable!("built-in ChatML template failed to parse: {e}"),
        }
    }

    /// Compiles a template from Jinja source.
    pub fn new(source: impl Into<String>) -> Result<Self, TokenizerError> {
        let source = source.into();
        let mut env = Environment::new();
        // transformers renders with trim_blocks and lstrip_blocks; whitespace
        // in the output depends on them.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // Python string/dict methods (`.startswith`, `.split`, `.items`, …).
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        // transformers' tojson is Python's json.dumps (", " / ": " separators,
        // no HTML escaping), unlike Jinja's built-in filter.
        env.add_filter("tojson", super::tojson::tojson);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(template_error)?;
        Ok(Self {
            env,
            source,
            bos_token: None,
            eos_token: None,
            broken: None,
        })
    }

    /// Sets the text of the BOS/EOS tokens exposed as `bos_token`/`eos_token`.
    #[must_use]
    pub fn with_special_tokens(mut self, bos: Option<String>, eos: Option<String>) -> Self {
        self.bos_token = bos;
        self.eos_token = eos;
        self
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation.
    ///
    /// `add_generation_prompt` appends the opening of an assistant turn.
    /// `enable_thinking` is passed to the template only when set, so
    /// templates that test `enable_thinking is defined` behave as with
    /// transformers.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String, TokenizerError> {
        self.render_with(
            messages,
            &TemplateArgs::new(add_generation_prompt, enable_thinking),
        )
    }

    /// Renders a conversation with all of [`TemplateArgs`].
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        args: &TemplateArgs,
    ) -> Result<String, TokenizerError> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                OrderedMap::value(vec![
                    (Value::from("role"), Value::from(m.role.as_str())),
                    (Value::from("content"), Value::from(m.content.as_str())),
                ])
            })
            .collect();
        self.render_values(Value::from(messages), Value::from(()), args)
    }

    /// Renders a conversation given as JSON text, for messages that carry
    /// more than role and content (`tool_calls`, `reasoning_content`, list
    /// content, …) and for tool definitions.
    ///
    /// `messages_json` must be a JSON array of message objects and
    /// `tools_json`, when given, a JSON array (or `null`). Object keys keep
    /// their order from the JSON text, as they would in Python, so `tojson`
    /// in the template reproduces them faithfully.
    pub fn render_json(
        &self,
        messages_json: &str,
        tools_json: Option<&str>,
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
    ) -> Result<String, TokenizerError> {
        self.render_json_with(
            messages_json,
            tools_json,
            &TemplateArgs::new(add_generation_prompt, enable_thinking),
        )
    }

    /// [`Self::render_json`] with all of [`TemplateArgs`].
    pub fn render_json_with(
        &self,
        messages_json: &str,
        tools_json: Option<&str>,
        args: &TemplateArgs,
    ) -> Result<String, TokenizerError> {
        let messages = json_to_value(messages_json)
            .map_err(|e| TokenizerError::ChatInput(format!("messages: {e}")))?;
        if messages.kind() != ValueKind::Seq {
            return Err(TokenizerError::ChatInput(
                "messages: expected a JSON array".into(),
            ));
        }
        let tools = match tools_json {
            None => Value::from(()),
            Some(t) => {
                let tools = json_to_value(t)
                    .map_err(|e| TokenizerError::ChatInput(format!("tools: {e}")))?;
                if !matches!(tools.kind(), ValueKind::Seq | ValueKind::None) {
                    return Err(TokenizerError::ChatInput(
                        "tools: expected a JSON array or null".into(),
                    ));
                }
                tools
            }
        };
        self.render_values(messages, tools, args)
    }

    fn render_values(
        &self,
        messages: Value,
        tools: Value,
        args: &TemplateArgs,
    ) -> Result<String, TokenizerError> {
        if let Some(e) = &self.broken {
            return Err(TokenizerError::Template(format!(
                "the model's chat template is unusable: {e}"
            )));
        }
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(template_error)?;
        let (messages, final_text) = match args.ending {
            ChatEnding::ContinueFinal => {
                // transformers refuses a template that never reads a message's content.
                if !self.source.contains("content") {
                    return Err(TokenizerError::ChatInput(
                        "continue_final_message is set but the chat template does not read \
                         the messages' content"
                            .into(),
                    ));
                }
                let (messages, text) = tag_final_message(messages)?;
                (messages, Some(text))
            }
            _ => (messages, None),
        };
        // The caller's variables first: a later entry of the same name replaces them.
        let mut ctx: Vec<(Value, Value)> = Vec::new();
        if let Some(kwargs) = &args.kwargs {
            let kwargs = json_to_value(kwargs)
                .map_err(|e| TokenizerError::ChatInput(format!("chat_template_kwargs: {e}")))?;
            if kwargs.kind() != ValueKind::Map {
                return Err(TokenizerError::ChatInput(
                    "chat_template_kwargs: expected a JSON object".into(),
                ));
            }
            for key in kwargs.try_iter().map_err(template_error)? {
                let value = kwargs.get_item(&key).map_err(template_error)?;
                ctx.push((key, value));
            }
        }
        let add_generation_prompt = args.ending == ChatEnding::AssistantTurn;
        ctx.extend([
            (Value::from("messages"), messages),
            (
                Value::from("add_generation_prompt"),
                Value::from(add_generation_prompt),
            ),
            // transformers always passes these, as None when unused.
            (Value::from("tools"), tools),
            (Value::from("documents"), Value::from(())),
        ]);
        if let Some(bos) = &self.bos_token {
            ctx.push((Value::from("bos_token"), Value::from(bos.as_str())));
        }
        if let Some(eos) = &self.eos_token {
            ctx.push((Value::from("eos_token"), Value::from(eos.as_str())));
        }
        if let Some(thinking) = args.enable_thinking {
            ctx.push((Value::from("enable_thinking"), Value::from(thinking)));
        }
        let ctx: Value = ctx.into_iter().collect();
        let rendered = template.render(ctx).map_err(template_error)?;
        match final_text {
            Some(text) => cut_at_continue_tag(rendered, &text),
            None => Ok(rendered),
        }
    }
}

/// What `continue_final_message` appends to the final message's text before rendering, to
/// find where the text ends in the rendering (transformers' marker, so a template that
/// changes the text around it cuts where transformers cuts).
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// The messages with [`CONTINUE_TAG`] appended to the final message's text (its content,
/// or, for a list of parts, the last part with a `text`), and that text as it was.
fn tag_final_message(messages: Value) -> Result<(Value, String), TokenizerError> {
    let refuse =
        |what: &str| TokenizerError::ChatInput(format!("continue_final_message is set but {what}"));
    let mut list: Vec<Value> = messages
        .try_iter()
        .map_err(|_| refuse("the messages are not a list"))?
        .collect();
    let last = list
        .pop()
        .ok_or_else(|| refuse("the conversation is empty"))?;
    let mut fields = map_entries(&last).ok_or_else(|| refuse("the final message is no object"))?;
    let content = fields
        .iter_mut()
        .find(|(k, _)| k.as_str() == Some("content"))
        .map(|(_, v)| v)
        .filter(|v| !v.is_none() && !v.is_undefined())
        .ok_or_else(|| refuse("the final message has no content to continue"))?;
    let text = if let Some(text) = content.as_str() {
        let text = text.to_owned();
        *content = Value::from(format!("{text}{CONTINUE_TAG}"));
        text
    } else {
        let mut parts: Vec<Value> = content
            .try_iter()
            .map_err(|_| refuse("the final message's content is neither text nor a list"))?
            .collect();
        let mut found = None;
        for part in parts.iter_mut().rev() {
            let Some(mut entries) = map_entries(part) else {
                continue;
            };
            let Some((_, v)) = entries.iter_mut().find(|(k, _)| k.as_str() == Some("text")) else {
                continue;
            };
            let text = v
                .as_str()
                .ok_or_else(|| refuse("the final message's last text part is no string"))?
                .to_owned();
            *v = Value::from(format!("{text}{CONTINUE_TAG}"));
            *part = OrderedMap::value(entries);
            found = Some(text);
            break;
        }
        let text = found.ok_or_else(|| refuse("the final message has no text part to continue"))?;
        *content = Value::from(parts);
        text
    };
    list.push(OrderedMap::value(fields));
    Ok((Value::from(list), text))
}

/// A map value's entries in its own order; `None` for anything else.
fn map_entries(v: &Value) -> Option<Vec<(Value, Value)>> {
    if v.kind() != ValueKind::Map {
        return None;
    }
    let keys: Vec<Value> = v.try_iter().ok()?.collect();
    keys.into_iter()
        .map(|k| v.get_item(&k).ok().map(|item| (k, item)))
        .collect()
}

/// Python's `str.isspace`, which transformers' `strip` uses: Unicode whitespace and the
/// four information separators U+001C..U+001F.
fn python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Cuts a rendering where [`CONTINUE_TAG`] begins, as transformers does: right there when
/// the template kept the tag whole, else with the space before it trimmed (the template
/// trimmed the text's end).
fn cut_at_continue_tag(mut rendered: String, text: &str) -> Result<String, TokenizerError> {
    let tag = CONTINUE_TAG.trim_matches(python_space);
    let at = match rendered.rfind(tag) {
        Some(at) if rendered.contains(text.trim_matches(python_space)) => at,
        _ => {
            return Err(TokenizerError::ChatInput(
                "continue_final_message is set but the final message does not appear in the \
                 chat the template renders (the template drops or changes it)"
                    .into(),
            ))
        }
    };
    let whole = rendered[at..].starts_with(CONTINUE_TAG);
    rendered.truncate(at);
    if !whole {
        let kept = rendered.trim_end_matches(python_space).len();
        rendered.truncate(kept);
    }
    Ok(rendered)
}

/// A template map that keeps insertion order (minijinja's own maps are
/// sorted), so dictionaries iterate and serialize as Python's would.
#[derive(Debug)]
struct OrderedMap {
    entries: Vec<(Value, Value)>,
}

impl OrderedMap {
    fn value(entries: Vec<(Value, Value)>) -> Value {
        Value::from_object(Self { entries })
    }
}

impl Object for OrderedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        // Messages have a handful of keys; a scan beats hashing here.
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        self.mapped_enumerator(|this| Box::new(this.entries.iter().map(|(k, _)| k.clone())))
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.entries.len())
    }
}

/// Parses JSON text into a template value with order-preserving objects.
fn json_to_value(text: &str) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = JsonSeed.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// Deserializes any JSON value straight into a [`Value`].
struct JsonSeed;

impl<'de> DeserializeSeed<'de> for JsonSeed {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for JsonSeed {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::from(()))
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::from(()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element_seed(JsonSeed)? {
            items.push(item);
        }
        Ok(Value::from(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut entries: Vec<(Value, Value)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let key = Value::from(key);
            let value = map.next_value_seed(JsonSeed)?;
            // Like a Python dict: a repeated key keeps its first position
            // and takes the last value.
            match entries.iter_mut().find(|(k, _)| *k == key) {
                Some(slot) => slot.1 = value,
                None => entries.push((key, value)),
            }
        }
        Ok(OrderedMap::value(entries))
    }
}

fn template_error(e: Error) -> TokenizerError {
    let mut msg = e.to_string();
    // Include the cause chain (e.g. the failing filter's own error).
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        let _ = write!(msg, ": {cause}");
        source = cause.source();
    }
    TokenizerError::Template(msg)
}

/// `raise_exception(msg)`: templates call this to reject a conversation.
fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("template raised an exception: {msg}"),
    ))
}

/// `strftime_now(format)`: the current UTC time formatted like Python's
/// `strftime` (the common directives only; others are copied verbatim).
fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(Value::from(format_utc(secs, &format)))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Formats a Unix time (UTC) with a subset of `strftime` directives.
fn format_utc(unix_secs: u64, format: &str) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs_of_day = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 with Monday = 0).
    let weekday = ((days % 7 + 7 + 3) % 7) as usize;
    let (hour, minute, second) = (
        secs_of_day / 3600,
        (secs_of_day / 60) % 60,
        secs_of_day % 60,
    );
    let month_name = MONTHS[(month - 1) as usize];
    let weekday_name = WEEKDAYS[weekday];

    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('H') => write!(out, "{hour:02}"),
            Some('I') => write!(out, "{:02}", (hour + 11) % 12 + 1),
            Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{minute:02}"),
            Some('S') => write!(out, "{second:02}"),
            Some('B') => write!(out, "{month_name}"),
            Some('b') => write!(out, "{}", &month_name[..3]),
            Some('A') => write!(out, "{weekday_name}"),
            Some('a') => write!(out, "{}", &weekday_name[..3]),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// Proleptic Gregorian (year, month, day) for a count of days since 1970-01-01,
/// by splitting time into 400-year eras that start on March 1st.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153; // 0 = March
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(pairs: &[(&str, &str)]) -> Vec<ChatMessage> {
        pairs
            .iter()
            .map(|(r, c)| ChatMessage::new(*r, *c))
            .collect()
    }

    /// The caller's variables reach the template in their order, the renderer's own win
    /// over them, and a continued final message is cut where its text ends, or refused
    /// where there is none or the template never reads one.
    #[test]
    fn template_arguments_and_the_continued_final_message() {
        let t = ChatTemplate::new(
            "{{ add_generation_prompt }}|{{ x | tojson }}|{% for m in messages %}{{ m.content }};{% endfor %}",
        )
        .unwrap();
        let args = |ending, kwargs: &str| TemplateArgs {
            ending,
            enable_thinking: None,
            kwargs: Some(kwargs.into()),
        };
        let hi = msgs(&[("user", "Hi"), ("assistant", "Hel\u{1f} ")]);
        let out = t
            .render_with(
                &hi,
                &args(
                    ChatEnding::Closed,
                    r#"{"x": {"b": 1, "a": 2}, "add_generation_prompt": true, "messages": []}"#,
                ),
            )
            .unwrap();
        assert_eq!(out, "False|{\"b\": 1, \"a\": 2}|Hi;Hel\u{1f} ;");
        let out = t
            .render_with(&hi, &args(ChatEnding::ContinueFinal, r#"{"x": 1}"#))
            .unwrap();
        assert_eq!(out, "False|1|Hi;Hel\u{1f} ");
        for bad in ["[1]", "{"] {
            let e = t
                .render_with(&hi, &args(ChatEnding::Closed, bad))
                .unwrap_err();
            assert!(e.to_string().contains("chat_template_kwargs"), "{e}");
        }
        let e = t
            .render_json_with(
                r#"[{"role": "assistant", "content": null}]"#,
                None,
                &TemplateArgs {
                    ending: ChatEnding::ContinueFinal,
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert!(e.to_string().contains("no content to continue"), "{e}");
        let continued = |t: &ChatTemplate, m: &[ChatMessage]| {
            t.render_with(
                m,
                &TemplateArgs {
                    ending: ChatEnding::ContinueFinal,
                    ..Default::default()
                },
            )
        };
        let e = continued(&t, &[]).unwrap_err();
        assert!(e.to_string().contains("the conversation is empty"), "{e}");
        let blind = ChatTemplate::new("{% for m in messages %}{{ m.role }}{% endfor %}").unwrap();
        let e = continued(&blind, &hi).unwrap_err();
        assert!(e.to_string().contains("does not read"), "{e}");
        // The Python whitespace set: U+001F is trimmed where the template trims the text.
        let trims =
            ChatTemplate::new("{% for m in messages %}<{{ m.content | trim }}>{% endfor %}")
                .unwrap();
        assert_eq!(continued(&trims, &hi).unwrap(), "<Hi><Hel");
    }

    #[test]
    fn chatml_renders() {
        let t = ChatTemplate::chatml();
        let out = t
            .render(
                &msgs(&[("system", "Be brief."), ("user", "Hi")]),
                true,
                None,
            )
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = t.render(&msgs(&[("user", "Hi")]), false, None).unwrap();
        assert_eq!(out, "<|im_start|>user\nHi<|im_end|>\n");
    }

    #[test]
    fn trim_and_lstrip_blocks_apply() {
        let t = ChatTemplate::new(
            "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}",
        )
        .unwrap();
        assert_eq!(
            t.render(
                &msgs(&[("user", "a"), ("assistant", "b"), ("user", "c")]),
                false,
                None
            )
            .unwrap(),
            "[a]\n[c]\n"
        );
    }

    #[test]
    fn python_methods_slicing_and_loop_controls() {
        let src = "{%- for m in messages[::-1] %}{% if m.role == 'assistant' %}{% continue %}{% endif %}\
                   {{ m.content.strip().split('|')[0].rstrip('x') }}{% if m.content.startswith(' a') %}!{% endif %}\
                   {%- if loop.index0 == 2 %}{% break %}{% endif %},{% endfor %}";
        let t = ChatTemplate::new(src).unwrap();
        let out = t
            .render(
                &msgs(&[
                    ("system", "s"),
                    ("user", " abx|q "),
                    ("assistant", "cd|e"),
                    ("user", "zz"),
                ]),
                false,
                None,
            )
            .unwrap();
        assert_eq!(out, "zz,ab!");
    }

    #[test]
    fn enable_thinking_only_defined_when_set() {
        let t = ChatTemplate::new(
            "{%- if enable_thinking is defined and enable_thinking is false %}off{% elif enable_thinking is defined %}on{% else %}unset{% endif %}",
        )
        .unwrap();
        assert_eq!(t.render(&[], false, None).unwrap(), "unset");
        assert_eq!(t.render(&[], false, Some(false)).unwrap(), "off");
        assert_eq!(t.render(&[], false, Some(true)).unwrap(), "on");
    }

    #[test]
    fn special_token_variables_and_none_tools() {
        let t = ChatTemplate::new(
            "{{ bos_token }}{% if tools is not none %}T{% endif %}{% if tools is defined %}D{% endif %}{{ eos_token }}",
        )
        .unwrap()
        .with_special_tokens(Some("<s>".into()), Some("</s>".into()));
        assert_eq!(t.render(&[], false, None).unwrap(), "<s>D</s>");
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new(
            "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok",
        )
        .unwrap();
        assert_eq!(
            t.render(&msgs(&[("user", "x")]), false, None).unwrap(),
            "ok"
        );
        let err = t
            .render(&msgs(&[("assistant", "x")]), false, None)
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("first message must be from the user"), "{msg}");
    }

    #[test]
    fn syntax_errors_are_reported() {
        let err = ChatTemplate::new("{% for m in messages %}").unwrap_err();
        assert!(matches!(err, TokenizerError::Template(_)));
        assert!(err.to_string().contains("chat template error"), "{err}");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = ChatTemplate::new(
            "{{ {'a': 'é\"<>\\n', 'b': [1, 2.5, none, true]} | tojson }}|{{ [] | tojson }}|{{ {'k': [1]} | tojson(indent=2) }}",
        )
        .unwrap();
        let out = t.render(&[], false, None).unwrap();
        assert_eq!(
            out,
            "{\"a\": \"é\\\"<>\\n\", \"b\": [1, 2.5, null, true]}|[]|{\n  \"k\": [\n    1\n  ]\n}"
        );
    }

    #[test]
    fn json_input_keeps_key_order_and_extra_fields() {
        let t = ChatTemplate::new(
            "{% for m in messages %}{{ m.role }}:{{ m.content }}\
             {% if m.tool_calls %}{% for c in m.tool_calls %}[{{ c.function.arguments | tojson }}]{% endfor %}{% endif %}\
             {% if m.reasoning_content is string %}({{ m.reasoning_content }}){% endif %};{% endfor %}\
             {% for t in tools %}{{ t | tojson }}{% endfor %}|{{ messages[0] | tojson }}",
        )
        .unwrap();
        let messages = r#"[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "ok", "reasoning_content": "why",
             "tool_calls": [{"function": {"name": "f", "arguments": {"zeta": 1, "alpha": [true, null]}}}]}
        ]"#;
        let tools = r#"[{"type": "function", "function": {"name": "f", "description": "d"}}]"#;
        let out = t.render_json(messages, Some(tools), false, None).unwrap();
        assert_eq!(
            out,
            "user:hi;assistant:ok[{\"zeta\": 1, \"alpha\": [true, null]}](why);\
             {\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"d\"}}\
             |{\"role\": \"user\", \"content\": \"hi\"}"
        );
        // Plain messages go through the same ordered representation.
        let plain = t
            .render(&[ChatMessage::new("user", "hi")], false, None)
            .unwrap();
        assert_eq!(plain, "user:hi;|{\"role\": \"user\", \"content\": \"hi\"}");
    }

    #[test]
    fn bad_json_input_is_reported() {
        let t = ChatTemplate::chatml();
        for (messages, tools) in [
            ("not json", None),
            ("{}", None),
            ("[]", Some("{\"a\": 1}")),
            ("[] trailing", None),
        ] {
            let err = t.render_json(messages, tools, false, None).unwrap_err();
            assert!(matches!(err, TokenizerError::ChatInput(_)), "{err}");
        }
        assert_eq!(
            t.render_json("[]", Some("null"), true, None).unwrap(),
            "<|im_start|>assistant\n"
        );
    }

    #[test]
    fn from_gguf_reads_template_and_special_token_text() {
        use crate::test_vocab::gguf_from_kv;
        use inferno_gguf::Value as G;
        let tokens = G::Array(vec![G::String("<s>".into()), G::String("</s>".into())]);
        let gguf = gguf_from_kv(vec![
            ("tokenizer.ggml.tokens", tokens.clone()),
            ("tokenizer.ggml.bos_token_id", G::U32(0)),
            ("tokenizer.ggml.eos_token_id", G::U32(1)),
            (
                "tokenizer.chat_template",
                G::String("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}".into()),
            ),
        ]);
        let t = ChatTemplate::from_gguf(&gguf).unwrap().unwrap();
        assert_eq!(
            t.render(&msgs(&[("user", "x")]), false, None).unwrap(),
            "<s>x</s>"
        );
        let none = gguf_from_kv(vec![("tokenizer.ggml.tokens", tokens)]);
        assert!(ChatTemplate::from_gguf(&none).unwrap().is_none());
        let bad = gguf_from_kv(vec![("tokenizer.chat_template", G::U32(1))]);
        assert!(ChatTemplate::from_gguf(&bad).is_err());
    }

    #[test]
    fn a_template_that_does_not_compile_fails_only_its_renders() {
        use crate::test_vocab::gguf_from_kv;
        use inferno_gguf::Value as G;
        let gguf = gguf_from_kv(vec![(
            "tokenizer.chat_template",
            G::String("{% for m in messages %}{{ m.content }".into()),
        )]);
        assert!(ChatTemplate::from_gguf(&gguf).is_err());
        let t = ChatTemplate::for_model(&gguf);
        let e = t.render(&msgs(&[("user", "x")]), true, None).unwrap_err();
        assert!(e.to_string().contains("chat template is unusable"), "{e}");
        let none = gguf_from_kv(vec![]);
        let chatml = ChatTemplate::for_model(&none);
        assert_eq!(chatml.source(), ChatTemplate::chatml().source());
    }

    #[test]
    fn strftime_formats_known_dates() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(format_utc(t, "%d %b %Y"), "29 Feb 2024");
        assert_eq!(
            format_utc(t, "%A %B %e %H:%M:%S %I%p %y %% %Q"),
            "Thursday February 29 13:05:09 01PM 24 % %Q"
        );
        assert_eq!(format_utc(0, "%Y-%m-%d %a"), "1970-01-01 Thu");
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
