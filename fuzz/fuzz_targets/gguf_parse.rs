//! Fuzz target: the GGUF reader must reject or accept any byte string without panicking, and
//! everything an accepted file exposes must be readable.

#![no_main]

use inferno::gguf::{GgufFile, Value};
use libfuzzer_sys::fuzz_target;

fn visit(v: &Value) -> u64 {
    match v {
        Value::Array(items) => items.iter().map(visit).sum::<u64>() + 1,
        Value::String(s) => s.len() as u64,
        other => {
            // Exercise the conversions consumers rely on.
            let _ = (
                other.as_u64(),
                other.as_i64(),
                other.as_f32(),
                other.as_bool(),
            );
            other.as_f64().map_or(1, |x| x.to_bits() & 1)
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let file = match GgufFile::from_bytes(data.to_vec()) {
        Ok(f) => f,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    let mut acc = 0u64;
    for (key, value) in file.metadata() {
        acc = acc.wrapping_add(visit(value));
        // Compared by identity: a NaN value is not equal to itself.
        assert!(file.get(key).is_some_and(|v| std::ptr::eq(v, value)));
    }
    let _ = file.architecture();
    let _ = file.get_u32("general.alignment");
    for t in file.tensors() {
        let bytes = file
            .tensor_data(&t.name)
            .expect("listed tensor must be readable");
        assert_eq!(bytes.len() as u64, t.n_bytes);
        assert_eq!(t.offset % file.alignment(), 0);
        acc = acc.wrapping_add(bytes.iter().map(|&b| u64::from(b)).sum::<u64>());
    }
    std::hint::black_box(acc);
});
