//! Metadata values: the typed values a GGUF key can hold, and their on-disk type ids.

/// A metadata value as stored in a GGUF file. Arrays hold elements of a single type (nested
/// arrays may each have their own element type).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

/// On-disk value type ids, as numbered by the GGUF specification.
pub(crate) mod type_id {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// Fewest bytes one value of type `id` can occupy on disk, or `None` for an unknown id. Used to
/// reject lying element counts before any memory is reserved.
pub(crate) fn min_encoded_size(id: u32) -> Option<u64> {
    use type_id::*;
    Some(match id {
        U8 | I8 | BOOL => 1,
        U16 | I16 => 2,
        U32 | I32 | F32 => 4,
        U64 | I64 | F64 => 8,
        // A string is at least its u64 length.
        STRING => 8,
        // An array is at least its u32 element type and u64 count.
        ARRAY => 12,
        _ => return None,
    })
}

/// Name of an on-disk type id, for messages.
pub(crate) fn type_id_name(id: u32) -> &'static str {
    use type_id::*;
    match id {
        U8 => "u8",
        I8 => "i8",
        U16 => "u16",
        I16 => "i16",
        U32 => "u32",
        I32 => "i32",
        F32 => "f32",
        BOOL => "bool",
        STRING => "string",
        ARRAY => "array",
        U64 => "u64",
        I64 => "i64",
        F64 => "f64",
        _ => "unknown",
    }
}

impl Value {
    /// The value as a `u64`, for any integer type holding a non-negative number.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as an `i64`, for any integer type whose value fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => None,
        }
    }

    /// The value as an `f64`, for any numeric type (large 64-bit integers round).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::U64(v) => Some(v as f64),
            Value::I64(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The value as an `f32`, for any numeric type (rounding as needed).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            _ => self.as_f64().map(|v| v as f32),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Short name of the value's type: "u8", "i32", "f64", "bool", "string", "array", ...
    pub fn type_name(&self) -> &'static str {
        type_id_name(self.type_id())
    }

    /// The on-disk type id of this value.
    pub(crate) fn type_id(&self) -> u32 {
        use type_id::*;
        match self {
            Value::U8(_) => U8,
            Value::I8(_) => I8,
            Value::U16(_) => U16,
            Value::I16(_) => I16,
            Value::U32(_) => U32,
            Value::I32(_) => I32,
            Value::U64(_) => U64,
            Value::I64(_) => I64,
            Value::F32(_) => F32,
            Value::F64(_) => F64,
            Value::Bool(_) => BOOL,
            Value::String(_) => STRING,
            Value::Array(_) => ARRAY,
        }
    }

    /// A short description for error messages: the type, plus the value for scalars.
    pub(crate) fn describe(&self) -> String {
        match self {
            Value::String(s) if s.len() <= 32 => format!("string {s:?}"),
            Value::String(_) => "string".to_string(),
            Value::Array(a) => format!("array of {} elements", a.len()),
            Value::U8(v) => format!("u8 {v}"),
            Value::I8(v) => format!("i8 {v}"),
            Value::U16(v) => format!("u16 {v}"),
            Value::I16(v) => format!("i16 {v}"),
            Value::U32(v) => format!("u32 {v}"),
            Value::I32(v) => format!("i32 {v}"),
            Value::U64(v) => format!("u64 {v}"),
            Value::I64(v) => format!("i64 {v}"),
            Value::F32(v) => format!("f32 {v}"),
            Value::F64(v) => format!("f64 {v}"),
            Value::Bool(v) => format!("bool {v}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions() {
        assert_eq!(Value::I32(-1).as_u64(), None);
        assert_eq!(Value::I32(7).as_u64(), Some(7));
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::U8(3).as_f32(), Some(3.0));
        assert_eq!(Value::F64(0.5).as_f32(), Some(0.5));
        assert_eq!(Value::Bool(true).as_u64(), None);
        assert_eq!(Value::Bool(true).as_f64(), None);
        assert_eq!(Value::String("x".into()).as_str(), Some("x"));
        assert_eq!(Value::Array(vec![]).type_name(), "array");
        assert_eq!(Value::U32(1).type_name(), "u32");
        for id in 0..=12 {
            assert!(min_encoded_size(id).is_some());
            assert_ne!(type_id_name(id), "unknown");
        }
        assert_eq!(min_encoded_size(13), None);
    }
}
