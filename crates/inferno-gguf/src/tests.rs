//! Unit tests for the GGUF reader and writer: round trips and accessor behaviour. Malformed
//! input is covered by the `gguf_malformed` integration test.

use super::*;

fn every_value() -> Vec<(&'static str, Value)> {
    vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f32", Value::F32(1.5)),
        ("t.f64", Value::F64(-2.25e100)),
        ("t.bool_t", Value::Bool(true)),
        ("t.bool_f", Value::Bool(false)),
        ("t.str", Value::String("héllo ✓".into())),
        ("t.empty_str", Value::String(String::new())),
        ("t.empty_arr", Value::Array(vec![])),
        (
            "t.arr_str",
            Value::Array(vec![Value::String("a".into()), Value::String("bc".into())]),
        ),
        (
            "t.arr_f32",
            Value::Array(vec![Value::F32(0.5), Value::F32(-1.0)]),
        ),
        (
            "t.arr_bool",
            Value::Array(vec![Value::Bool(true), Value::Bool(false)]),
        ),
        (
            "t.nested",
            Value::Array(vec![
                Value::Array(vec![Value::I32(1), Value::I32(2)]),
                Value::Array(vec![]),
                Value::Array(vec![Value::String("x".into())]),
            ]),
        ),
    ]
}

fn f32_bytes(vals: &[f32]) -> Vec<u8> {
    vals.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()));
    for (k, v) in every_value() {
        w.add(k, v);
    }
    let f32_data = f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let f16_data: Vec<u8> = [0.5f32, -0.25, 8.0]
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    // One Q8_0 block per row: an f16 scale then 32 signed bytes.
    let q8_data: Vec<u8> = (0..2 * 34).map(|i| i as u8).collect();
    w.add_tensor("a.f32", &[3, 2], GgmlType::F32, f32_data)
        .unwrap();
    w.add_tensor("b.f16", &[3], GgmlType::F16, f16_data)
        .unwrap();
    w.add_tensor("c.q8", &[32, 2], GgmlType::Q8_0, q8_data)
        .unwrap();
    w
}

#[test]
fn round_trip_every_value_type() {
    let w = sample_writer();
    let bytes = w.to_bytes();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.architecture().unwrap(), "llama");
    let expected = every_value();
    assert_eq!(f.metadata().len(), expected.len() + 1);
    // File order is insertion order.
    for ((k, v), (ek, ev)) in f.metadata()[1..].iter().zip(&expected) {
        assert_eq!(k, ek);
        assert_eq!(v, ev, "value of {k}");
        assert_eq!(f.get(k), Some(ev));
    }
    assert_eq!(f.file_size(), bytes.len() as u64);
    assert_eq!(f.data_offset() % 32, 0);
    assert_eq!(f.bytes(), &bytes[..]);
}

#[test]
fn round_trip_tensor_bytes() {
    let w = sample_writer();
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a.f32", "b.f16", "c.q8"]);

    let a = f.tensor_info("a.f32").unwrap();
    assert_eq!(a.dims, [3, 2]);
    assert_eq!(a.dtype, GgmlType::F32);
    assert_eq!(a.n_elements(), 6);
    assert_eq!(a.n_bytes, 24);
    assert_eq!(
        f.tensor_data("a.f32").unwrap().as_slice(),
        &f32_bytes(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])[..]
    );

    let b = f.tensor_data("b.f16").unwrap();
    assert_eq!(b.len(), 6);
    let halves: Vec<f32> = b
        .chunks_exact(2)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect();
    assert_eq!(halves, [0.5, -0.25, 8.0]);

    let q = f.tensor_info("c.q8").unwrap();
    assert_eq!(q.n_bytes, 68);
    assert_eq!(q.offset % 32, 0);
    let qd = f.tensor_data("c.q8").unwrap();
    assert_eq!(
        qd.as_slice(),
        &(0..68).map(|i| i as u8).collect::<Vec<_>>()[..]
    );
    // Views outlive the file that made them.
    drop(f);
    assert_eq!(qd.len(), 68);
    assert!(!qd.is_empty());

    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert!(matches!(
        f.tensor_data("nope"),
        Err(GgufError::MissingTensor(n)) if n == "nope"
    ));
    assert!(f.tensor_info("nope").is_none());
}

#[test]
fn custom_alignment() {
    for align in [1u32, 8, 64, 4096] {
        let mut w = GgufWriter::new();
        w.set_alignment(align);
        w.add_tensor("x", &[3], GgmlType::F32, f32_bytes(&[1.0, 2.0, 3.0]))
            .unwrap();
        w.add_tensor("y", &[1], GgmlType::F32, f32_bytes(&[9.0]))
            .unwrap();
        let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(f.alignment(), u64::from(align));
        assert_eq!(f.data_offset() % u64::from(align), 0);
        let y = f.tensor_info("y").unwrap();
        assert_eq!(y.offset % u64::from(align), 0);
        assert!(y.offset >= 12);
        assert_eq!(
            f.tensor_data("y").unwrap().as_slice(),
            &f32_bytes(&[9.0])[..]
        );
        if align == 32 {
            assert!(f.get("general.alignment").is_none());
        } else {
            assert_eq!(f.get_u32("general.alignment").unwrap(), align);
        }
    }
    // Non powers of two round up rather than producing an unreadable file.
    let mut w = GgufWriter::new();
    w.set_alignment(48);
    assert_eq!(w.alignment(), 64);
    w.set_alignment(0);
    assert_eq!(w.alignment(), 1);
    w.set_alignment(32);
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert!(f.get("general.alignment").is_none());
    // Adding the key directly also drives the layout.
    let mut w = GgufWriter::new();
    w.add("general.alignment", Value::U32(128));
    w.add_tensor("x", &[1], GgmlType::F32, f32_bytes(&[1.0]))
        .unwrap();
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(f.alignment(), 128);
    assert_eq!(f.data_offset() % 128, 0);
}

#[test]
fn accessors() {
    let mut w = GgufWriter::new();
    w.add("s", Value::String("v".into()))
        .add("n", Value::I32(7))
        .add("neg", Value::I64(-1))
        .add("big", Value::U64(1 << 40))
        .add("f", Value::F64(0.25))
        .add("arr", Value::Array(vec![Value::U8(1)]));
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(f.get_str("s").unwrap(), "v");
    assert_eq!(f.get_u64("n").unwrap(), 7);
    assert_eq!(f.get_u32("n").unwrap(), 7);
    assert_eq!(f.get_u64("big").unwrap(), 1 << 40);
    assert_eq!(f.get_f32("f").unwrap(), 0.25);
    assert_eq!(f.get_f32("n").unwrap(), 7.0);
    assert_eq!(f.get_array("arr").unwrap(), &[Value::U8(1)]);

    match f.get_str("n") {
        Err(GgufError::WrongType {
            key,
            expected,
            found,
        }) => {
            assert_eq!(key, "n");
            assert_eq!(expected, "string");
            assert!(found.contains("i32"), "{found}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(f.get_u64("neg"), Err(GgufError::WrongType { .. })));
    assert!(matches!(f.get_u32("big"), Err(GgufError::WrongType { .. })));
    assert!(matches!(f.get_f32("s"), Err(GgufError::WrongType { .. })));
    assert!(matches!(f.get_array("s"), Err(GgufError::WrongType { .. })));
    let err = f.get_u32("missing").unwrap_err();
    assert!(matches!(&err, GgufError::MissingKey(k) if k == "missing"));
    assert!(err.to_string().contains("missing"));
    assert!(matches!(f.architecture(), Err(GgufError::MissingKey(_))));
}

#[test]
fn writer_replaces_duplicate_keys_in_place() {
    let mut w = GgufWriter::new();
    w.add("a", Value::U8(1))
        .add("b", Value::U8(2))
        .add("a", Value::U8(3));
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(
        f.metadata(),
        &[
            ("a".to_string(), Value::U8(3)),
            ("b".to_string(), Value::U8(2))
        ]
    );
}

#[test]
fn writer_rejects_unencodable_values() {
    let mixed = Value::Array(vec![Value::U8(1), Value::String("x".into())]);
    let mut w = GgufWriter::new();
    assert!(matches!(
        w.try_add("mixed", mixed.clone()),
        Err(GgufError::InvalidValue { key, .. }) if key == "mixed"
    ));
    w.add("ok", Value::U8(1));
    w.add("mixed", mixed);
    // The valid part is still written; the strict paths report the refused key.
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    assert_eq!(f.metadata().len(), 1);
    let err = w.try_to_bytes().unwrap_err();
    assert!(err.to_string().contains("mixed"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        w.write_to(dir.path().join("x.gguf")),
        Err(GgufError::InvalidValue { .. })
    ));

    let mut deep = Value::Array(vec![Value::U8(0)]);
    for _ in 0..MAX_ARRAY_DEPTH {
        deep = Value::Array(vec![deep]);
    }
    assert!(GgufWriter::new().try_add("deep", deep).is_err());
    // Exactly the limit is fine, and readable.
    let mut ok = Value::Array(vec![Value::U8(0)]);
    for _ in 1..MAX_ARRAY_DEPTH {
        ok = Value::Array(vec![ok]);
    }
    let mut w = GgufWriter::new();
    w.try_add("deep", ok.clone()).unwrap();
    let f = GgufFile::from_bytes(w.try_to_bytes().unwrap()).unwrap();
    assert_eq!(f.get("deep"), Some(&ok));
}

#[test]
fn writer_checks_tensors() {
    let mut w = GgufWriter::new();
    assert!(matches!(
        w.add_tensor("x", &[4], GgmlType::F32, vec![0; 15]),
        Err(GgufError::TensorSizeMismatch {
            expected: 16,
            actual: 15,
            ..
        })
    ));
    assert!(matches!(
        w.add_tensor("x", &[31], GgmlType::Q8_0, vec![0; 34]),
        Err(GgufError::BadRowLength { block_size: 32, .. })
    ));
    assert!(matches!(
        w.add_tensor("x", &[], GgmlType::F32, vec![]),
        Err(GgufError::BadDimCount { n_dims: 0, .. })
    ));
    assert!(matches!(
        w.add_tensor("x", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0; 4]),
        Err(GgufError::BadDimCount { n_dims: 5, .. })
    ));
    assert!(matches!(
        w.add_tensor("x", &[2, 0], GgmlType::F32, vec![]),
        Err(GgufError::ZeroDim { .. })
    ));
    assert!(matches!(
        w.add_tensor("x", &[u64::MAX, 2], GgmlType::F32, vec![]),
        Err(GgufError::ShapeOverflow { .. })
    ));
    w.add_tensor("x", &[1], GgmlType::F32, vec![0; 4]).unwrap();
    assert!(matches!(
        w.add_tensor("x", &[1], GgmlType::F32, vec![0; 4]),
        Err(GgufError::InvalidTensor { .. })
    ));
}

#[test]
fn write_to_and_open_match_to_bytes() {
    let w = sample_writer();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    w.write_to(&path).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), w.to_bytes());
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensors().len(), 3);
    assert_eq!(
        f.tensor_data("c.q8").unwrap().as_slice(),
        &(0..68).map(|i| i as u8).collect::<Vec<_>>()[..]
    );
    let _: &Storage = &f.parts[0].storage;
    assert!(matches!(*f.parts[0].storage, Storage::Mmap(_)));
    assert_eq!(f.paths(), vec![path.as_path()]);
}

#[test]
fn empty_writer_is_a_valid_file() {
    let f = GgufFile::from_bytes(GgufWriter::new().to_bytes()).unwrap();
    assert!(f.metadata().is_empty());
    assert!(f.tensors().is_empty());
}

/// Releasing a mapped tensor's pages changes none of its bytes (they fault back in from the
/// file); owned bytes are never released.
#[cfg(unix)]
#[test]
fn released_mapped_tensor_reads_back_the_same_bytes() {
    let vals: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut w = GgufWriter::new();
    w.add_tensor("t", &[vals.len() as u64], GgmlType::I8, vals.clone())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    w.write_to(&path).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let t = f.tensor_data("t").unwrap();
    assert_eq!(t.as_slice(), &vals[..]);
    assert!(
        t.release_resident(),
        "a mapped tensor of many pages releases some"
    );
    assert_eq!(t.as_slice(), &vals[..]);
    // The range is remembered: releasing again after the read above releases it once more.
    assert_eq!(f.release_again(), 1);
    assert_eq!(t.as_slice(), &vals[..]);
    let owned = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let t = owned.tensor_data("t").unwrap();
    assert!(!t.release_resident());
    assert_eq!(owned.release_again(), 0);
    assert_eq!(t.as_slice(), &vals[..]);
}
