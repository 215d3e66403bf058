//! The responses kept for `previous_response_id` and `GET /v1/responses/{id}`: in memory,
//! within a byte budget (`--responses-store-bytes`), the oldest dropped first when a new one
//! needs room. Each keeps its conversation as the engine takes it (the earlier turns, the
//! request's input and the answer; not the instructions, which OpenAI does not carry over),
//! so a response that continues it needs no walk up a chain whose links may be gone, and
//! its request's input items as listed by `GET /v1/responses/{id}/input_items`.

use super::wire::ResponseObject;
use crate::engine::plan::Message;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

/// A kept response and the conversation up to its end.
#[derive(Clone, Debug)]
pub struct Stored {
    pub response: Arc<ResponseObject>,
    pub history: Arc<Vec<Message>>,
    /// The request's input items, each with an id, in the order given.
    pub input: Arc<Vec<Value>>,
}

#[derive(Default)]
struct Kept {
    by_id: HashMap<String, (Stored, usize)>,
    /// Ids, oldest first.
    order: VecDeque<String>,
    bytes: usize,
}

pub struct ResponseStore {
    budget: usize,
    kept: Mutex<Kept>,
}

/// What a response and its conversation take, about: their texts and the JSON of the
/// response and its input items.
fn size(response: &ResponseObject, history: &[Message], input: &[Value]) -> usize {
    let json = serde_json::to_vec(response).map_or(0, |v| v.len())
        + serde_json::to_vec(input).map_or(0, |v| v.len());
    let texts: usize = history
        .iter()
        .map(|m| {
            m.role.len()
                + m.content.len()
                + m.tool_call_id.len()
                + m.tool_calls
                    .iter()
                    .map(|c| c.id.len() + c.name.len() + c.arguments.len())
                    .sum::<usize>()
        })
        .sum();
    json + texts + std::mem::size_of_val(history)
}

impl ResponseStore {
    /// A store of at most `budget` bytes; 0 keeps nothing.
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            kept: Mutex::new(Kept::default()),
        }
    }

    /// Whether responses are kept at all.
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        // The map stays consistent at every await-free step; a panic elsewhere leaves it usable.
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps a response, dropping the oldest ones until it fits; `false` when it alone is
    /// over the budget (then nothing is dropped).
    pub fn put(&self, response: ResponseObject, history: Vec<Message>, input: Vec<Value>) -> bool {
        let bytes = size(&response, &history, &input);
        if bytes > self.budget {
            return false;
        }
        let id = response.id.clone();
        let stored = Stored {
            response: Arc::new(response),
            history: Arc::new(history),
            input: Arc::new(input),
        };
        let mut kept = self.lock();
        if let Some((_, old)) = kept.by_id.remove(&id) {
            kept.bytes -= old;
            kept.order.retain(|k| *k != id);
        }
        while kept.bytes + bytes > self.budget {
            let Some(oldest) = kept.order.pop_front() else {
                break;
            };
            if let Some((_, b)) = kept.by_id.remove(&oldest) {
                kept.bytes -= b;
            }
        }
        kept.bytes += bytes;
        kept.order.push_back(id.clone());
        kept.by_id.insert(id, (stored, bytes));
        true
    }

    pub fn get(&self, id: &str) -> Option<Stored> {
        self.lock().by_id.get(id).map(|(s, _)| s.clone())
    }

    /// Forgets a response; `false` when it was not kept.
    pub fn remove(&self, id: &str) -> bool {
        let mut kept = self.lock();
        match kept.by_id.remove(id) {
            Some((_, b)) => {
                kept.bytes -= b;
                kept.order.retain(|k| k != id);
                true
            }
            None => false,
        }
    }

    /// How many responses are kept, and their bytes.
    pub fn usage(&self) -> (usize, usize) {
        let kept = self.lock();
        (kept.by_id.len(), kept.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::super::wire::{ResponseObject, TextOut};
    use super::*;

    fn response(id: &str, text_bytes: usize) -> ResponseObject {
        ResponseObject {
            id: id.into(),
            object: "response",
            created_at: 0,
            status: "completed",
            completed_at: Some(0),
            error: None,
            incomplete_details: None,
            instructions: Some("x".repeat(text_bytes)),
            max_output_tokens: None,
            model: "m".into(),
            output: Vec::new(),
            parallel_tool_calls: true,
            previous_response_id: None,
            reasoning: None,
            store: true,
            temperature: 1.0,
            text: TextOut {
                format: serde_json::json!({"type": "text"}),
            },
            tool_choice: "auto".into(),
            tools: Vec::new(),
            top_p: 1.0,
            top_logprobs: 0,
            truncation: "disabled",
            background: false,
            usage: None,
            user: None,
            metadata: Default::default(),
        }
    }

    /// The oldest go first when a new one needs room; one over the whole budget is not
    /// kept and drops nothing; a removed one frees its bytes.
    #[test]
    fn the_oldest_responses_make_room_within_the_budget() {
        let one = size(&response("a", 1000), &[Message::new("user", "hi")], &[]);
        let store = ResponseStore::new(3 * one + one / 2);
        for id in ["a", "b", "c"] {
            assert!(store.put(
                response(id, 1000),
                vec![Message::new("user", "hi")],
                Vec::new()
            ));
        }
        assert_eq!(store.usage(), (3, 3 * one));
        assert!(store.put(
            response("d", 1000),
            vec![Message::new("user", "hi")],
            Vec::new()
        ));
        assert!(store.get("a").is_none());
        assert!(store.get("b").is_some() && store.get("d").is_some());
        assert!(!store.put(response("huge", 4 * one), Vec::new(), Vec::new()));
        assert_eq!(store.usage(), (3, 3 * one));
        assert!(store.remove("c"));
        assert!(!store.remove("c"));
        assert_eq!(store.usage(), (2, 2 * one));
        let history = &store.get("d").unwrap().history;
        assert_eq!(history[0].content, "hi");
        assert!(!ResponseStore::new(0).put(response("a", 0), Vec::new(), Vec::new()));
    }
}
