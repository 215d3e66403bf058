//! The `tojson` filter of chat templates with the semantics of transformers' filter, which
//! is Python's `json.dumps(value, ensure_ascii=False, indent=None, separators=None,
//! sort_keys=False)` with those keyword arguments open to the template.
//!
//! serde_json writes the text; a [`Formatter`] gives it Python's layout (separators,
//! indentation, `ensure_ascii`, float `repr`), which serde_json's own formatters do not.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::ser::Formatter;
use std::io::{self, Write};

/// The `tojson` filter.
pub(super) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: indent must be an integer or a string",
                    )
                })?;
                Some(" ".repeat(usize::try_from(n).unwrap_or(0)))
            }
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(seps) if seps.len() == 2 => (seps[0].clone(), seps[1].clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair of strings",
            ))
        }
        // Python drops the space after ',' when indenting.
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    // Converted whole first, so that a value JSON cannot hold fails with the template's
    // own error before anything is written.
    let json = Json::from_value(value, sort_keys.unwrap_or(false))?;
    let formatter = PythonFormatter {
        indent,
        item_sep,
        key_sep,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        level: 0,
        has_value: false,
    };
    let mut out = Vec::new();
    let written = json.serialize(&mut serde_json::Serializer::with_formatter(
        &mut out, formatter,
    ));
    let text = written
        .map_err(|e| e.to_string())
        .and_then(|()| String::from_utf8(out).map_err(|e| e.to_string()))
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from(text))
}

/// A template value as the JSON Python would write for it.
enum Json {
    Null,
    Bool(bool),
    Int(i128),
    /// An integer above `i128::MAX`.
    UInt(u128),
    Float(f64),
    Str(String),
    Seq(Vec<Json>),
    /// Keys as Python makes them strings, in the value's order (or sorted).
    Map(Vec<(String, Json)>),
}

impl Json {
    fn from_value(value: &Value, sort_keys: bool) -> Result<Self, Error> {
        Ok(match value.kind() {
            ValueKind::Undefined | ValueKind::None => Self::Null,
            ValueKind::Bool => Self::Bool(value.is_true()),
            ValueKind::Number if value.is_integer() => match i128::try_from(value.clone()) {
                Ok(i) => Self::Int(i),
                Err(_) => Self::UInt(u128::try_from(value.clone())?),
            },
            ValueKind::Number => Self::Float(f64::try_from(value.clone()).unwrap_or(f64::NAN)),
            ValueKind::String => Self::Str(value.as_str().unwrap_or_default().to_owned()),
            ValueKind::Seq | ValueKind::Iterable => Self::Seq(
                value
                    .try_iter()?
                    .map(|item| Self::from_value(&item, sort_keys))
                    .collect::<Result<_, _>>()?,
            ),
            ValueKind::Map => {
                let mut keys: Vec<Value> = value.try_iter()?.collect();
                if sort_keys {
                    keys.sort();
                }
                let mut entries = Vec::with_capacity(keys.len());
                for key in keys {
                    // JSON object keys are strings; Python stringifies others.
                    let name = match key.as_str() {
                        Some(k) => k.to_owned(),
                        None => key.to_string(),
                    };
                    entries.push((name, Self::from_value(&value.get_item(&key)?, sort_keys)?));
                }
                Self::Map(entries)
            }
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: a value of type {other} is not JSON serializable"),
                ))
            }
        })
    }
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Null => s.serialize_unit(),
            Self::Bool(b) => s.serialize_bool(*b),
            Self::Int(i) => s.serialize_i128(*i),
            Self::UInt(u) => s.serialize_u128(*u),
            Self::Float(f) if f.is_finite() => s.serialize_f64(*f),
            // serde_json writes non-finite floats as null; Python writes these tokens. They
            // go through the byte-array path, which nothing else here takes, and
            // `PythonFormatter` writes them as they are.
            Self::Float(f) => s.serialize_bytes(match f {
                f if f.is_nan() => b"NaN",
                f if *f > 0.0 => b"Infinity",
                _ => b"-Infinity",
            }),
            Self::Str(text) => s.serialize_str(text),
            Self::Seq(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Self::Map(entries) => {
                let mut map = s.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
        }
    }
}

/// Python's `json.dumps` layout: its item and key separators, `indent` (a newline and the
/// indent string per level before each item and before a non-empty container's close),
/// `ensure_ascii`, and floats as Python's `repr` writes them.
struct PythonFormatter {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    /// Containers open around the next value.
    level: usize,
    /// The innermost open container has an item (an empty one closes on its line).
    has_value: bool,
}

impl PythonFormatter {
    fn newline_indent<W: ?Sized + Write>(&self, w: &mut W, level: usize) -> io::Result<()> {
        if let Some(indent) = &self.indent {
            w.write_all(b"\n")?;
            for _ in 0..level {
                w.write_all(indent.as_bytes())?;
            }
        }
        Ok(())
    }

    fn begin<W: ?Sized + Write>(&mut self, w: &mut W, open: &[u8]) -> io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(open)
    }

    fn item<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if !first {
            w.write_all(self.item_sep.as_bytes())?;
        }
        self.newline_indent(w, self.level)
    }

    fn end<W: ?Sized + Write>(&mut self, w: &mut W, close: &[u8]) -> io::Result<()> {
        self.level -= 1;
        if self.has_value {
            self.newline_indent(w, self.level)?;
        }
        // A container just closed is the enclosing one's item.
        self.has_value = true;
        w.write_all(close)
    }
}

impl Formatter for PythonFormatter {
    fn write_f64<W: ?Sized + Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        // Debug keeps the ".0" of integral floats, like Python's repr.
        write!(w, "{value:?}")
    }

    /// Only the non-finite floats' tokens take this path (see `Json::serialize`).
    fn write_byte_array<W: ?Sized + Write>(&mut self, w: &mut W, value: &[u8]) -> io::Result<()> {
        w.write_all(value)
    }

    fn write_string_fragment<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        if !self.ensure_ascii {
            return w.write_all(fragment.as_bytes());
        }
        for c in fragment.chars() {
            if c.is_ascii() {
                w.write_all(&[c as u8])?;
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(w, "\\u{unit:04x}")?;
                }
            }
        }
        Ok(())
    }

    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.begin(w, b"[")
    }

    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.end(w, b"]")
    }

    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.item(w, first)
    }

    fn end_array_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.begin(w, b"{")
    }

    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.end(w, b"}")
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        self.item(w, first)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(self.key_sep.as_bytes())
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}
