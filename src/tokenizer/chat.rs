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
use crate::gguf::GgufFile;

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
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                OrderedMap::value(vec![
                    (Value::from("role"), Value::from(m.role.as_str())),
                    (Value::from("content"), Value::from(m.content.as_str())),
                ])
            })
            .collect();
        self.render_values(
            Value::from(messages),
            Value::from(()),
            add_generation_prompt,
            enable_thinking,
        )
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
        self.render_values(messages, tools, add_generation_prompt, enable_thinking)
    }

    fn render_values(
        &self,
        messages: Value,
        tools: Value,
        add_generation_prompt: bool,
        enable_thinking: Option<bool>,
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
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", messages),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
            // transformers always passes these, as None when unused.
            ("tools", tools),
            ("documents", Value::from(())),
        ];
        if let Some(bos) = &self.bos_token {
            ctx.push(("bos_token", Value::from(bos.as_str())));
        }
        if let Some(eos) = &self.eos_token {
            ctx.push(("eos_token", Value::from(eos.as_str())));
        }
        if let Some(thinking) = enable_thinking {
            ctx.push(("enable_thinking", Value::from(thinking)));
        }
        let ctx: Value = ctx.into_iter().collect();
        template.render(ctx).map_err(template_error)
    }
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
        use crate::gguf::Value as G;
        use crate::tokenizer::test_vocab::gguf_from_kv;
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
        use crate::gguf::Value as G;
        use crate::tokenizer::test_vocab::gguf_from_kv;
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
