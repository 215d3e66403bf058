//! The Responses API's many-shaped request fields in the engine's terms, each refusal
//! naming the exact item: `input` (a text, or message, `function_call` and
//! `function_call_output` items) as the conversation's messages, `tools` as function tools,
//! `tool_choice`, and `text.format` as a response format. And back: a response's output
//! items as the assistant turn a later response continues from.

use super::wire::OutputItem;
use crate::engine::plan::{Message, Tool, ToolCall, ToolChoice};
use crate::sampling::constraint::ResponseFormat;
use crate::server::http::chat::json_schema;
use crate::server::http::error::ApiError;
use serde_json::{Map, Value};

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A string field of an object, required.
fn text_field(obj: &Map<String, Value>, key: &str, at: &str) -> Result<String, ApiError> {
    match obj.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        None | Some(Value::Null) => Err(ApiError::invalid(
            format!("{at}.{key}"),
            format!("{at} has no {key}"),
        )),
        Some(other) => Err(ApiError::invalid(
            format!("{at}.{key}"),
            format!("{at}.{key} must be a string, not {}", kind_of(other)),
        )),
    }
}

/// A string field of an object, optional.
fn optional_text(obj: &Map<String, Value>, key: &str, at: &str) -> Result<String, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(String::new()),
        Some(_) => text_field(obj, key, at),
    }
}

/// Content: a string, or a list of text parts (joined by newlines, as chat joins them).
fn content(v: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let at = format!("{at}[{j}]");
                let Value::Object(p) = part else {
                    return Err(ApiError::invalid(
                        at.clone(),
                        format!("{at} must be an object, not {}", kind_of(part)),
                    ));
                };
                let kind = text_field(p, "type", &at)?;
                match kind.as_str() {
                    "input_text" | "output_text" | "text" => {
                        texts.push(text_field(p, "text", &at)?)
                    }
                    "refusal" => texts.push(text_field(p, "refusal", &at)?),
                    other => {
                        return Err(ApiError::invalid(
                            format!("{at}.type"),
                            format!(
                                "{at} is an {other:?} part; only text parts (input_text, \
                                 output_text) are supported"
                            ),
                        ))
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(other) => Err(ApiError::invalid(
            at.to_string(),
            format!(
                "{at} must be a string or a list of parts, not {}",
                kind_of(other)
            ),
        )),
    }
}

/// `input` as messages: a text is one user message; items are taken in order, a function
/// call joining the assistant turn before it (or opening one), its output a `tool` message.
pub fn input_messages(input: Value) -> Result<Vec<Message>, ApiError> {
    let items = match input {
        Value::String(s) => return Ok(vec![Message::new("user", s)]),
        Value::Array(items) => items,
        other => {
            return Err(ApiError::invalid(
                "input",
                format!(
                    "input must be a string or a list of items, not {}",
                    kind_of(&other)
                ),
            ))
        }
    };
    let mut messages: Vec<Message> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let Value::Object(obj) = item else {
            return Err(ApiError::invalid(
                at.clone(),
                format!("{at} must be an object, not {}", kind_of(item)),
            ));
        };
        // A message may leave out its type (OpenAI's "easy input message").
        let kind = match obj.get("type") {
            None | Some(Value::Null) => "message".to_string(),
            Some(_) => text_field(obj, "type", &at)?,
        };
        match kind.as_str() {
            "message" => {
                let role = text_field(obj, "role", &at)?;
                let role = match role.as_str() {
                    "user" | "assistant" | "system" => role,
                    // OpenAI's newer name for the system role.
                    "developer" => "system".to_string(),
                    other => {
                        return Err(ApiError::invalid(
                            format!("{at}.role"),
                            format!(
                                "{at}.role {other:?} is unknown (user, assistant, system, \
                                 developer)"
                            ),
                        ))
                    }
                };
                let text = content(obj.get("content"), &format!("{at}.content"))?;
                messages.push(Message::new(role, text));
            }
            "function_call" => {
                let call = ToolCall {
                    id: text_field(obj, "call_id", &at)?,
                    name: text_field(obj, "name", &at)?,
                    arguments: text_field(obj, "arguments", &at)?,
                };
                match messages.last_mut() {
                    Some(m) if m.role == "assistant" => m.tool_calls.push(call),
                    _ => {
                        let mut m = Message::new("assistant", "");
                        m.tool_calls.push(call);
                        messages.push(m);
                    }
                }
            }
            "function_call_output" => {
                let mut m =
                    Message::new("tool", content(obj.get("output"), &format!("{at}.output"))?);
                m.tool_call_id = text_field(obj, "call_id", &at)?;
                messages.push(m);
            }
            // Earlier reasoning is not shown again (chat templates drop it too).
            "reasoning" => {}
            "item_reference" => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    format!(
                        "{at} is an item reference, which is not supported: send the item \
                         itself, or continue a kept response with previous_response_id"
                    ),
                ))
            }
            other => {
                return Err(ApiError::invalid(
                    format!("{at}.type"),
                    format!(
                        "{at} is a {other:?} item; supported are message, function_call, \
                         function_call_output and reasoning"
                    ),
                ))
            }
        }
    }
    Ok(messages)
}

/// `input` as `GET /v1/responses/{id}/input_items` lists it: each item as given (already
/// checked by [`input_messages`]), with its `type`, an `id` where it had none, a `status`,
/// and a message's text content as a part (`input_text`; an assistant's `output_text`).
pub fn listed_items(input: &Value, key: &str) -> Vec<Value> {
    let items = match input {
        Value::String(s) => vec![serde_json::json!({"role": "user", "content": s})],
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, mut item)| {
            if let Value::Object(obj) = &mut item {
                let kind = obj
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("message")
                    .to_string();
                let prefix = match kind.as_str() {
                    "function_call" => "fc",
                    "function_call_output" => "fco",
                    "reasoning" => "rs",
                    _ => "msg",
                };
                if obj.get("id").is_none_or(Value::is_null) {
                    obj.insert("id".into(), format!("{prefix}_{key}_in{i}").into());
                }
                if kind == "message" {
                    if let Some(Value::String(text)) = obj.get("content") {
                        let assistant = obj.get("role").and_then(Value::as_str) == Some("assistant");
                        let part = if assistant {
                            serde_json::json!({"type": "output_text", "text": text, "annotations": []})
                        } else {
                            serde_json::json!({"type": "input_text", "text": text})
                        };
                        obj.insert("content".into(), Value::Array(vec![part]));
                    }
                }
                obj.insert("type".into(), kind.into());
                if obj.get("status").is_none_or(Value::is_null) {
                    obj.insert("status".into(), "completed".into());
                }
            }
            item
        })
        .collect()
}

/// The assistant turn a response's output makes in a later response's conversation: its
/// messages' text and its calls (its reasoning is not shown again).
pub fn answer_messages(output: &[OutputItem]) -> Vec<Message> {
    let mut m = Message::new("assistant", "");
    for item in output {
        match item {
            OutputItem::Message { content, .. } => {
                for part in content {
                    m.content.push_str(&part.text);
                }
            }
            OutputItem::FunctionCall {
                call_id,
                name,
                arguments,
                ..
            } => m.tool_calls.push(ToolCall {
                id: call_id.clone(),
                name: name.clone(),
                arguments: arguments.clone(),
            }),
            OutputItem::Reasoning { .. } => {}
        }
    }
    vec![m]
}

/// `tools`: function tools, in the Responses API's flat shape (`name`, `description` and
/// `parameters` beside `type`).
pub fn tools(tools: &[Value]) -> Result<Vec<Tool>, ApiError> {
    let mut out = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        let Value::Object(obj) = t else {
            return Err(ApiError::invalid(
                at.clone(),
                format!("{at} must be an object, not {}", kind_of(t)),
            ));
        };
        let kind = text_field(obj, "type", &at)?;
        if kind != "function" {
            return Err(ApiError::invalid(
                format!("{at}.type"),
                format!("{at} is a {kind:?} tool; only function tools are supported"),
            ));
        }
        let parameters = match obj.get("parameters") {
            None | Some(Value::Null) => String::new(),
            Some(p @ Value::Object(_)) => p.to_string(),
            Some(other) => {
                return Err(ApiError::invalid(
                    format!("{at}.parameters"),
                    format!(
                        "{at}.parameters must be a JSON schema (an object), not {}",
                        kind_of(other)
                    ),
                ))
            }
        };
        out.push(Tool {
            name: text_field(obj, "name", &at)?,
            description: optional_text(obj, "description", &at)?,
            parameters,
        });
    }
    Ok(out)
}

/// `tool_choice`: `"auto"`, `"none"`, `"required"` or `{"type": "function", "name": ...}`.
pub fn tool_choice(v: &Value) -> Result<ToolChoice, ApiError> {
    let refused = || {
        ApiError::invalid(
            "tool_choice",
            "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \
             \"name\": ...}",
        )
    };
    match v {
        Value::String(s) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            _ => Err(refused()),
        },
        Value::Object(obj) => match obj.get("type").and_then(Value::as_str) {
            Some("function") => Ok(ToolChoice::Function(text_field(
                obj,
                "name",
                "tool_choice",
            )?)),
            _ => Err(refused()),
        },
        _ => Err(refused()),
    }
}

/// `text.format` as a response format: `text` (none), `json_object`, or `json_schema` with
/// its `schema` beside `type`.
pub fn text_format(v: &Value) -> Result<Option<ResponseFormat>, ApiError> {
    let at = "text.format";
    let Value::Object(obj) = v else {
        return Err(ApiError::invalid(
            at,
            format!("{at} must be an object, not {}", kind_of(v)),
        ));
    };
    let kind = text_field(obj, "type", at)?;
    match kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(ResponseFormat::JsonObject)),
        "json_schema" => json_schema("text.format.schema", obj.get("schema"))?
            .ok_or_else(|| {
                ApiError::invalid(
                    "text.format.schema",
                    "text.format json_schema needs a schema (an object)",
                )
            })
            .map(Some),
        other => Err(ApiError::invalid(
            "text.format.type",
            format!("text.format type {other:?} is unknown (text, json_object, json_schema)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Items become the conversation a chat request with the same turns would send:
    /// calls join the assistant turn before them, outputs are tool messages, reasoning is
    /// left out, parts are joined.
    #[test]
    fn input_items_become_a_conversation() {
        assert_eq!(
            input_messages(json!("Hi")).unwrap(),
            vec![Message::new("user", "Hi")]
        );
        let got = input_messages(json!([
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user",
             "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{\"x\":1}"},
            {"type": "function_call_output", "call_id": "c1", "output": "1"},
            {"type": "function_call_output", "call_id": "c2",
             "output": [{"type": "input_text", "text": "2"}]},
            {"type": "function_call", "call_id": "c3", "name": "f", "arguments": "{}"},
        ]))
        .unwrap();
        let call = |id: &str, name: &str, args: &str| ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: args.into(),
        };
        let mut assistant = Message::new("assistant", "Checking.");
        assistant.tool_calls = vec![call("c1", "f", "{}"), call("c2", "g", "{\"x\":1}")];
        let mut out1 = Message::new("tool", "1");
        out1.tool_call_id = "c1".into();
        let mut out2 = Message::new("tool", "2");
        out2.tool_call_id = "c2".into();
        let mut again = Message::new("assistant", "");
        again.tool_calls = vec![call("c3", "f", "{}")];
        assert_eq!(
            got,
            vec![
                Message::new("system", "Be brief."),
                Message::new("user", "a\nb"),
                assistant,
                out1,
                out2,
                again
            ]
        );
    }

    /// Each refusal names the item and field it is about.
    #[test]
    fn refusals_name_the_item() {
        for (input, param) in [
            (json!(5), "input"),
            (json!([7]), "input[0]"),
            (json!([{"role": "robot", "content": "x"}]), "input[0].role"),
            (
                json!([{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]),
                "input[0].content[0].type",
            ),
            (
                json!([{"role": "user", "content": "x"}, {"type": "function_call", "name": "f", "arguments": "{}"}]),
                "input[1].call_id",
            ),
            (
                json!([{"type": "item_reference", "id": "msg_1"}]),
                "input[0].type",
            ),
            (json!([{"type": "web_search_call"}]), "input[0].type"),
            (json!([{"role": "user", "content": 3}]), "input[0].content"),
        ] {
            let e = input_messages(input.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{input}: {}", e.message);
        }
        for (t, param) in [
            (json!([{"type": "web_search"}]), "tools[0].type"),
            (json!([{"type": "function"}]), "tools[0].name"),
            (
                json!([{"type": "function", "name": "f", "parameters": "x"}]),
                "tools[0].parameters",
            ),
        ] {
            let e = tools(t.as_array().unwrap()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{t}: {}", e.message);
        }
        assert!(tool_choice(&json!("sometimes")).is_err());
        assert!(tool_choice(&json!({"type": "mcp", "server_label": "x"})).is_err());
        for (f, param) in [
            (
                json!({"type": "json_schema", "name": "x"}),
                "text.format.schema",
            ),
            (json!({"type": "grammar"}), "text.format.type"),
            (json!("json"), "text.format"),
        ] {
            let e = text_format(&f).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{f}: {}", e.message);
        }
    }

    #[test]
    fn tools_choices_and_formats_convert() {
        let t = tools(&[json!({"type": "function", "name": "get_weather",
            "description": "Weather.", "parameters": {"type": "object"}, "strict": true})])
        .unwrap();
        assert_eq!(
            t,
            vec![Tool {
                name: "get_weather".into(),
                description: "Weather.".into(),
                parameters: r#"{"type":"object"}"#.into(),
            }]
        );
        assert_eq!(tool_choice(&json!("none")).unwrap(), ToolChoice::None);
        assert_eq!(
            tool_choice(&json!({"type": "function", "name": "f"})).unwrap(),
            ToolChoice::Function("f".into())
        );
        assert_eq!(text_format(&json!({"type": "text"})).unwrap(), None);
        assert_eq!(
            text_format(&json!({"type": "json_schema", "name": "n", "schema": {"type": "object"}}))
                .unwrap(),
            Some(ResponseFormat::JsonSchema(r#"{"type":"object"}"#.into()))
        );
    }
}
