//! Chat messages (SPEC §7): a non-empty list of `{role, content}` with a known role and
//! string or text-part content, turned into the turns the chat template renders.

use serde_json::Value;

use super::error::ApiError;
use super::fields::shown;
use super::tokenize::ChatTurn;

/// Roles a conversation may use. `tool` and `function` results need tool calling, which is
/// not implemented, so they are refused as such.
const ROLES: &[&str] = &["system", "developer", "user", "assistant"];

fn bad(message: String) -> ApiError {
    ApiError::invalid("invalid_message", Some("messages"), message)
}

/// The turns of `messages` (the body's value), validated.
pub fn chat_turns(messages: Option<&Value>) -> Result<Vec<ChatTurn>, ApiError> {
    let messages = match messages {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(
                "missing_field",
                Some("messages"),
                "`messages` is required".into(),
            ))
        }
        Some(Value::Array(m)) if m.is_empty() => {
            return Err(bad("`messages` must hold at least one message".into()))
        }
        Some(Value::Array(m)) => m,
        Some(v) => return Err(bad(format!("`messages` must be a list, got {}", shown(v)))),
    };
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| turn(i, m))
        .collect()
}

fn turn(i: usize, m: &Value) -> Result<ChatTurn, ApiError> {
    let Value::Object(m) = m else {
        return Err(bad(format!(
            "messages[{i}] must be an object, got {}",
            shown(m)
        )));
    };
    let role = match m.get("role") {
        Some(Value::String(r)) => r.as_str(),
        None | Some(Value::Null) => return Err(bad(format!("messages[{i}].role is required"))),
        Some(v) => {
            return Err(bad(format!(
                "messages[{i}].role must be a string, got {}",
                shown(v)
            )))
        }
    };
    if role == "tool" || role == "function" {
        return Err(ApiError::unsupported(
            "messages",
            &format!("a `{role}` message (tool calling; messages[{i}])"),
        ));
    }
    if !ROLES.contains(&role) {
        return Err(bad(format!(
            "messages[{i}].role must be one of {}, got {role:?}",
            ROLES.join(", ")
        )));
    }
    // An empty list says "no tool calls", like `tools: []` at the top level.
    let no_calls = |v: &Value| v.is_null() || v.as_array().is_some_and(|a| a.is_empty());
    if m.get("tool_calls").is_some_and(|v| !no_calls(v)) {
        return Err(ApiError::unsupported(
            "messages",
            &format!("`tool_calls` (tool calling; messages[{i}])"),
        ));
    }
    // Only an assistant turn may come without content (OpenAI allows it with tool calls,
    // and a prefilled empty reply means the same as none).
    let content = match m.get("content") {
        None | Some(Value::Null) if role == "assistant" => String::new(),
        None | Some(Value::Null) => {
            return Err(bad(format!(
                "messages[{i}].content is required for role {role}"
            )))
        }
        Some(c) => text(i, c)?,
    };
    Ok(ChatTurn {
        role: role.to_owned(),
        content,
    })
}

/// A string, or a list of `{"type": "text", "text": …}` parts joined.
fn text(i: usize, content: &Value) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => text.push_str(t),
                    (Some("text"), _) => {
                        return Err(bad(format!(
                            "messages[{i}]: a text part needs a string `text`"
                        )))
                    }
                    (Some(other), _) => {
                        return Err(ApiError::unsupported(
                            "messages",
                            &format!("content of type `{other}` (messages[{i}])"),
                        ))
                    }
                    (None, _) => {
                        return Err(bad(format!(
                            "messages[{i}]: each content part needs a `type`"
                        )))
                    }
                }
            }
            Ok(text)
        }
        v => Err(bad(format!(
            "messages[{i}].content must be a string or a list of parts, got {}",
            shown(v)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn code(v: Value) -> &'static str {
        match chat_turns(Some(&v)) {
            Ok(t) => panic!("expected an error, got {t:?}"),
            Err(e) => e.code,
        }
    }

    #[test]
    fn known_roles_with_text_content_become_turns() {
        let turns = chat_turns(Some(&json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": null},
        ])))
        .unwrap();
        let roles: Vec<&str> = turns.iter().map(|t| t.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant"]);
        assert_eq!(turns[1].content, "Hi there");
        assert_eq!(turns[2].content, "");
    }

    #[test]
    fn empty_lists_unknown_roles_and_missing_content_are_refused() {
        assert_eq!(code(json!([])), "invalid_message");
        assert_eq!(code(json!("hi")), "invalid_message");
        assert_eq!(
            code(json!([{"role": "wizard", "content": "x"}])),
            "invalid_message"
        );
        assert_eq!(code(json!([{"content": "x"}])), "invalid_message");
        assert_eq!(code(json!([{"role": "user"}])), "invalid_message");
        assert_eq!(
            code(json!([{"role": "user", "content": 5}])),
            "invalid_message"
        );
        assert_eq!(code(json!(["user"])), "invalid_message");
        assert_eq!(chat_turns(None).unwrap_err().code, "missing_field");
    }

    #[test]
    fn tool_calling_and_non_text_parts_are_named_as_unsupported() {
        assert_eq!(
            code(json!([{"role": "tool", "content": "42"}])),
            "not_supported"
        );
        assert_eq!(
            code(json!([{"role": "assistant", "content": null, "tool_calls": [{"id": "a"}]}])),
            "not_supported"
        );
        assert_eq!(
            code(json!([{"role": "user", "content": [{"type": "image_url"}]}])),
            "not_supported"
        );
    }

    #[test]
    fn an_empty_tool_call_list_means_no_tool_calls() {
        for calls in [json!([]), Value::Null] {
            let turns = chat_turns(Some(&json!([
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "y", "tool_calls": calls},
            ])))
            .unwrap();
            assert_eq!(turns[1].content, "y");
        }
    }
}
