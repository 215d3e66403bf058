//! The GGUF reader against malformed, truncated, lying and randomly mutated files: every one
//! must give a specific error, never a panic, an out-of-bounds read or a huge allocation.

use std::path::PathBuf;

use inferno::gguf::{GgmlType, GgufError, GgufFile, GgufWriter, Value};

/// Builds raw GGUF bytes by hand, so tests can write what the writer never would.
struct Raw(Vec<u8>);

impl Raw {
    fn new(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        Raw(Vec::new())
            .bytes(b"GGUF")
            .u32(version)
            .u64(n_tensors)
            .u64(n_kv)
    }
    fn bytes(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    fn u8(self, v: u8) -> Self {
        self.bytes(&[v])
    }
    fn u32(self, v: u32) -> Self {
        self.bytes(&v.to_le_bytes())
    }
    fn u64(self, v: u64) -> Self {
        self.bytes(&v.to_le_bytes())
    }
    fn str(self, s: &str) -> Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    fn kv_u32(self, key: &str, v: u32) -> Self {
        self.str(key).u32(4).u32(v)
    }
    fn kv_str(self, key: &str, v: &str) -> Self {
        self.str(key).u32(8).str(v)
    }
    fn tensor(self, name: &str, dims: &[u64], ty: u32, offset: u64) -> Self {
        let mut r = self.str(name).u32(dims.len() as u32);
        for &d in dims {
            r = r.u64(d);
        }
        r.u32(ty).u64(offset)
    }
    fn pad(mut self, align: usize) -> Self {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
        self
    }
    fn zeros(mut self, n: usize) -> Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
}

fn parse(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(bytes)
}

fn err(bytes: Vec<u8>) -> GgufError {
    let e = parse(bytes).expect_err("malformed file was accepted");
    assert!(!e.to_string().is_empty());
    e
}

fn f32_bytes(vals: &[f32]) -> Vec<u8> {
    vals.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A small valid file with metadata of several kinds and three tensors.
fn small_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()))
        .add("llama.block_count", Value::U32(2))
        .add("flag", Value::Bool(true))
        .add(
            "tokens",
            Value::Array(vec![Value::String("a".into()), Value::String("bc".into())]),
        )
        .add(
            "nested",
            Value::Array(vec![Value::Array(vec![Value::I16(-3)])]),
        );
    w.add_tensor(
        "a.f32",
        &[2, 2],
        GgmlType::F32,
        f32_bytes(&[1.0, 2.0, 3.0, 4.0]),
    )
    .unwrap();
    w.add_tensor("b.q8", &[32], GgmlType::Q8_0, (0..34).collect())
        .unwrap();
    w.add_tensor("c.f16", &[3], GgmlType::F16, vec![1, 2, 3, 4, 5, 6])
        .unwrap();
    w.to_bytes()
}

/// Visits everything a successful parse exposes, as a consumer would.
fn touch_everything(f: &GgufFile) -> u64 {
    fn visit(v: &Value) -> u64 {
        match v {
            Value::Array(items) => items.iter().map(visit).sum::<u64>() + 1,
            Value::String(s) => s.len() as u64,
            other => other.as_f64().map_or(1, |x| x.to_bits() & 1),
        }
    }
    let mut acc = 0u64;
    for (k, v) in f.metadata() {
        acc += k.len() as u64 + visit(v);
        assert!(f.get(k).is_some());
    }
    for t in f.tensors() {
        let data = f
            .tensor_data(&t.name)
            .expect("listed tensor must be readable");
        assert_eq!(data.len() as u64, t.n_bytes);
        assert!(f.data_offset() + t.offset + t.n_bytes <= f.file_size());
        acc += data.iter().map(|&b| u64::from(b)).sum::<u64>();
    }
    acc
}

#[test]
fn hand_built_v2_file() {
    let bytes = Raw::new(2, 1, 2)
        .kv_str("general.architecture", "llama")
        .kv_u32("llama.context_length", 128)
        .tensor("w", &[2], 0, 0)
        .pad(32)
        .bytes(&f32_bytes(&[1.5, -2.0]))
        .0;
    let f = parse(bytes).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.architecture().unwrap(), "llama");
    assert_eq!(f.get_u32("llama.context_length").unwrap(), 128);
    assert_eq!(
        f.tensor_data("w").unwrap().as_slice(),
        &f32_bytes(&[1.5, -2.0])[..]
    );
    assert_eq!(f.data_offset() % 32, 0);
}

#[test]
fn small_file_is_valid() {
    let f = parse(small_file()).unwrap();
    assert_eq!(f.tensors().len(), 3);
    touch_everything(&f);
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = small_file();
    for n in 0..bytes.len() {
        let e = err(bytes[..n].to_vec());
        let msg = e.to_string();
        assert!(
            msg.contains("truncated"),
            "prefix of {n} bytes gave an error that does not say truncated: {msg}"
        );
    }
}

#[test]
fn truncation_messages_name_the_section() {
    let bytes = small_file();
    let find = |needle: &[u8]| {
        bytes
            .windows(needle.len())
            .position(|w| w == needle)
            .unwrap()
    };
    let msg_at = |n: usize| err(bytes[..n].to_vec()).to_string();

    assert!(msg_at(2).contains("header magic"));
    assert!(msg_at(6).contains("header version"));
    assert!(msg_at(12).contains("header tensor count"));
    assert!(msg_at(20).contains("header metadata count"));

    // Too short for the metadata entries the header promises.
    let m = msg_at(24 + 8 + 3);
    assert!(m.contains("metadata key-value count"), "{m}");
    // Inside a key (its length says more bytes than remain).
    let m = msg_at(find(b"tokens") + 3);
    assert!(m.contains("key of metadata entry #3"), "{m}");
    // Inside the value of a key.
    let m = msg_at(find(b"llama.block_count") + 17 + 4 + 2);
    assert!(
        m.contains("value of metadata key 'llama.block_count'"),
        "{m}"
    );
    let m = msg_at(find(b"tokens") + 6 + 4 + 4 + 3);
    assert!(m.contains("array length of metadata key 'tokens'"), "{m}");

    // Inside the tensor table: too short for the promised tensor infos at all, then inside
    // each field of the last one.
    let m = msg_at(find(b"a.f32") + 2);
    assert!(m.contains("tensor count"), "{m}");
    let name = find(b"c.f16");
    let m = msg_at(name + 5 + 2);
    assert!(m.contains("dimension count of tensor info 'c.f16'"), "{m}");
    let m = msg_at(name + 5 + 4 + 3);
    assert!(m.contains("dimensions of tensor info 'c.f16'"), "{m}");
    let m = msg_at(name + 5 + 4 + 8 + 1);
    assert!(m.contains("type of tensor info 'c.f16'"), "{m}");
    let m = msg_at(name + 5 + 4 + 8 + 4 + 1);
    assert!(m.contains("data offset of tensor info 'c.f16'"), "{m}");

    // Inside the data section.
    let f = parse(bytes.clone()).unwrap();
    let last = f.tensor_info("c.f16").unwrap();
    let end = (f.data_offset() + last.offset) as usize + 3;
    match err(bytes[..end].to_vec()) {
        GgufError::TensorOutOfBounds { tensor, .. } => assert_eq!(tensor, "c.f16"),
        other => panic!("unexpected {other:?}"),
    }
    match err(bytes[..f.data_offset() as usize - 1].to_vec()) {
        GgufError::TensorOutOfBounds { tensor, .. } => assert_eq!(tensor, "a.f32"),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn lying_counts() {
    // Huge metadata count.
    match err(Raw::new(3, 0, u64::MAX).0) {
        GgufError::CountExceedsFile { what, count, .. } => {
            assert!(what.contains("metadata"), "{what}");
            assert_eq!(count, u64::MAX);
        }
        other => panic!("unexpected {other:?}"),
    }
    // A metadata count a little too big for the bytes there.
    let e = err(Raw::new(3, 0, 2).kv_u32("a", 1).0);
    assert!(matches!(e, GgufError::CountExceedsFile { .. }), "{e:?}");

    // Huge tensor count, both absurd and just too many for the bytes left.
    match err(Raw::new(3, u64::MAX, 0).0) {
        GgufError::CountExceedsFile { what, .. } => assert!(what.contains("tensor count")),
        other => panic!("unexpected {other:?}"),
    }
    let e = err(Raw::new(3, 2, 0).tensor("t", &[1], 0, 0).pad(32).zeros(4).0);
    assert!(
        matches!(&e, GgufError::CountExceedsFile { what, .. } if what.contains("tensor count")),
        "{e:?}"
    );

    // Huge array length, of plain values and of arrays.
    for elem_ty in [0u32, 8, 9, 12] {
        let e = err(Raw::new(3, 0, 1)
            .str("arr")
            .u32(9)
            .u32(elem_ty)
            .u64(1 << 60)
            .zeros(64)
            .0);
        match e {
            GgufError::CountExceedsFile { what, count, .. } => {
                assert!(
                    what.contains("array length of metadata key 'arr'"),
                    "{what}"
                );
                assert_eq!(count, 1 << 60);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    // An array of 8-byte values whose count would fit were they single bytes.
    let e = err(Raw::new(3, 0, 1)
        .str("arr")
        .u32(9)
        .u32(10)
        .u64(10)
        .zeros(40)
        .0);
    assert!(
        matches!(e, GgufError::CountExceedsFile { needed: 80, .. }),
        "{e:?}"
    );

    // Huge string lengths: in a key, a value, and a tensor name.
    let e = err(Raw::new(3, 0, 1).u64(u64::MAX).zeros(32).0);
    assert!(
        matches!(&e, GgufError::CountExceedsFile { what, .. } if what.contains("key of metadata entry #0")),
        "{e:?}"
    );
    let e = err(Raw::new(3, 0, 1).str("s").u32(8).u64(1 << 40).zeros(32).0);
    assert!(
        matches!(&e, GgufError::CountExceedsFile { what, .. } if what.contains("'s'")),
        "{e:?}"
    );
    let e = err(Raw::new(3, 1, 0).u64(u64::MAX / 2).zeros(64).0);
    assert!(
        matches!(&e, GgufError::CountExceedsFile { what, .. } if what.contains("name of tensor info #0")),
        "{e:?}"
    );
}

#[test]
fn bad_alignment() {
    // A tensor offset that is not a multiple of the alignment.
    let e = err(Raw::new(3, 1, 0)
        .tensor("t", &[4], 0, 4)
        .pad(32)
        .zeros(64)
        .0);
    match e {
        GgufError::MisalignedTensor {
            tensor,
            offset,
            alignment,
        } => {
            assert_eq!((tensor.as_str(), offset, alignment), ("t", 4, 32));
        }
        other => panic!("unexpected {other:?}"),
    }

    // general.alignment of 0, 3, the wrong integer type, and a string.
    let cases = [
        Raw::new(3, 0, 1).kv_u32("general.alignment", 0),
        Raw::new(3, 0, 1).kv_u32("general.alignment", 3),
        Raw::new(3, 0, 1).str("general.alignment").u32(10).u64(32),
        Raw::new(3, 0, 1).kv_str("general.alignment", "32"),
    ];
    for (raw, shown) in cases
        .into_iter()
        .zip(["u32 0", "u32 3", "u64 32", "string"])
    {
        match err(raw.0) {
            GgufError::BadAlignment(found) => assert!(found.contains(shown), "{found}"),
            other => panic!("unexpected {other:?}"),
        }
    }

    // A valid custom alignment is honoured when locating the data section.
    let bytes = Raw::new(3, 1, 1)
        .kv_u32("general.alignment", 64)
        .tensor("t", &[1], 0, 0)
        .pad(64)
        .bytes(&f32_bytes(&[7.0]))
        .0;
    let f = parse(bytes).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(
        f.tensor_data("t").unwrap().as_slice(),
        &f32_bytes(&[7.0])[..]
    );
}

#[test]
fn duplicates() {
    match err(Raw::new(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2).0) {
        GgufError::DuplicateKey { key, offset } => {
            assert_eq!(key, "k");
            assert_eq!(offset, 24 + 8 + 1 + 4 + 4);
        }
        other => panic!("unexpected {other:?}"),
    }
    let e = err(Raw::new(3, 2, 0)
        .tensor("t", &[1], 0, 0)
        .tensor("t", &[1], 0, 32)
        .pad(32)
        .zeros(64)
        .0);
    assert!(
        matches!(&e, GgufError::DuplicateTensor { name, .. } if name == "t"),
        "{e:?}"
    );
}

#[test]
fn bad_tensor_infos() {
    let one = |dims: &[u64], ty: u32| {
        err(Raw::new(3, 1, 0)
            .tensor("w", dims, ty, 0)
            .pad(32)
            .zeros(64)
            .0)
    };

    let e = one(&[32], 4);
    assert!(
        matches!(&e, GgufError::UnknownTensorType { tensor, id: 4 } if tensor == "w"),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains("'w'") && msg.contains('4'), "{msg}");
    assert!(matches!(
        one(&[32], 1000),
        GgufError::UnknownTensorType { id: 1000, .. }
    ));

    assert!(matches!(
        one(&[1, 1, 1, 1, 1], 0),
        GgufError::BadDimCount { n_dims: 5, .. }
    ));
    assert!(matches!(
        one(&[], 0),
        GgufError::BadDimCount { n_dims: 0, .. }
    ));
    // A huge n_dims must be refused before any dims are read or reserved.
    let e = err(Raw::new(3, 1, 0).str("w").u32(u32::MAX).zeros(64).0);
    assert!(
        matches!(
            e,
            GgufError::BadDimCount {
                n_dims: u32::MAX,
                ..
            }
        ),
        "{e:?}"
    );

    assert!(matches!(one(&[4, 0], 0), GgufError::ZeroDim { .. }));
    assert!(matches!(one(&[0], 0), GgufError::ZeroDim { .. }));

    // Element count overflows u64, exceeds i64, or the byte size overflows.
    assert!(matches!(
        one(&[u64::MAX, 2], 0),
        GgufError::ShapeOverflow { .. }
    ));
    assert!(matches!(
        one(&[1 << 32, 1 << 31], 0),
        GgufError::ShapeOverflow { .. }
    ));
    assert!(matches!(
        one(&[1 << 62], 0),
        GgufError::ShapeOverflow { .. }
    ));
    assert!(matches!(
        one(&[1 << 40, 1 << 22], 0),
        GgufError::ShapeOverflow { .. }
    ));

    match one(&[33], GgmlType::Q8_0.id()) {
        GgufError::BadRowLength {
            tensor,
            row_len,
            block_size,
            ..
        } => assert_eq!((tensor.as_str(), row_len, block_size), ("w", 33, 32)),
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        one(&[255, 2], GgmlType::Q4_K.id()),
        GgufError::BadRowLength {
            block_size: 256,
            ..
        }
    ));
}

#[test]
fn data_past_eof() {
    // 4 floats declared, 3 present.
    let e = err(Raw::new(3, 1, 0)
        .tensor("w", &[4], 0, 0)
        .pad(32)
        .zeros(12)
        .0);
    match e {
        GgufError::TensorOutOfBounds {
            tensor,
            end,
            file_size,
            ..
        } => {
            assert_eq!(tensor, "w");
            assert_eq!(end, file_size + 4);
        }
        other => panic!("unexpected {other:?}"),
    }
    // An offset so large that start + size overflows.
    let e = err(Raw::new(3, 1, 0)
        .tensor("w", &[4], 0, u64::MAX - 31)
        .pad(32)
        .zeros(16)
        .0);
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e:?}");
    // A tensor table with no padding or data after it at all.
    let e = err(Raw::new(3, 1, 0).tensor("w", &[1], 0, 0).0);
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e:?}");
}

#[test]
fn overlapping_tensors() {
    // 64-byte tensors at offsets 0 and 32; listed in reverse so sorting matters.
    let e = err(Raw::new(3, 2, 0)
        .tensor("b", &[16], 0, 32)
        .tensor("a", &[16], 0, 0)
        .pad(32)
        .zeros(96)
        .0);
    match e {
        GgufError::OverlappingTensors {
            first,
            second,
            first_end,
            second_start,
        } => {
            assert_eq!((first.as_str(), second.as_str()), ("a", "b"));
            assert_eq!((first_end, second_start), (64, 32));
        }
        other => panic!("unexpected {other:?}"),
    }
    // Identical ranges overlap too.
    let e = err(Raw::new(3, 2, 0)
        .tensor("a", &[1], 0, 0)
        .tensor("b", &[1], 0, 0)
        .pad(32)
        .zeros(4)
        .0);
    assert!(matches!(e, GgufError::OverlappingTensors { .. }), "{e:?}");
    // Adjacent ranges are fine, and may share one file region in any table order.
    let f = parse(
        Raw::new(3, 2, 0)
            .tensor("b", &[8], 0, 32)
            .tensor("a", &[8], 0, 0)
            .pad(32)
            .zeros(64)
            .0,
    )
    .unwrap();
    assert_eq!(f.tensors().len(), 2);
}

#[test]
fn deep_nesting() {
    let nested = |levels: usize| {
        let mut r = Raw::new(3, 0, 1).str("deep").u32(9);
        for _ in 1..levels {
            r = r.u32(9).u64(1);
        }
        r.u32(0).u64(1).u8(7).0
    };
    // 16 levels of arrays are accepted, 17 are not.
    let f = parse(nested(16)).unwrap();
    let mut v = f.get("deep").unwrap();
    let mut depth = 0;
    while let Value::Array(items) = v {
        depth += 1;
        v = &items[0];
    }
    assert_eq!((depth, v), (16, &Value::U8(7)));
    match err(nested(17)) {
        GgufError::NestingTooDeep { key, limit, .. } => {
            assert_eq!((key.as_str(), limit), ("deep", 16))
        }
        other => panic!("unexpected {other:?}"),
    }
    // Far deeper nesting must not overflow the stack.
    assert!(matches!(
        err(nested(100_000)),
        GgufError::NestingTooDeep { .. }
    ));
}

#[test]
fn bad_values() {
    match err(Raw::new(3, 0, 1).str("b").u32(7).u8(2).0) {
        GgufError::BadBool { key, byte, offset } => {
            assert_eq!((key.as_str(), byte, offset), ("b", 2, 24 + 9 + 4))
        }
        other => panic!("unexpected {other:?}"),
    }
    // A bad bool inside an array.
    let e = err(Raw::new(3, 0, 1)
        .str("b")
        .u32(9)
        .u32(7)
        .u64(2)
        .u8(1)
        .u8(255)
        .0);
    assert!(matches!(e, GgufError::BadBool { byte: 255, .. }), "{e:?}");

    let e = err(Raw::new(3, 0, 1).str("x").u32(13).zeros(8).0);
    assert!(
        matches!(&e, GgufError::UnknownValueType { key, id: 13, .. } if key == "x"),
        "{e:?}"
    );
    let e = err(Raw::new(3, 0, 1).str("x").u32(9).u32(99).u64(0).0);
    assert!(
        matches!(e, GgufError::UnknownValueType { id: 99, .. }),
        "{e:?}"
    );

    // Invalid UTF-8 in a key, a string value, and a tensor name.
    let bad = [b'a', 0xff, b'b'];
    let e = err(Raw::new(3, 0, 1).u64(3).bytes(&bad).u32(4).u32(1).0);
    assert!(
        matches!(&e, GgufError::InvalidUtf8 { what, offset: 32 } if what.contains("key")),
        "{e:?}"
    );
    let e = err(Raw::new(3, 0, 1).str("s").u32(8).u64(3).bytes(&bad).0);
    assert!(
        matches!(&e, GgufError::InvalidUtf8 { what, .. } if what.contains("'s'")),
        "{e:?}"
    );
    let e = err(Raw::new(3, 1, 0)
        .u64(3)
        .bytes(&bad)
        .u32(1)
        .u64(1)
        .u32(0)
        .u64(0)
        .pad(32)
        .zeros(4)
        .0);
    assert!(
        matches!(&e, GgufError::InvalidUtf8 { what, .. } if what.contains("tensor info #0")),
        "{e:?}"
    );
}

#[test]
fn bad_headers() {
    assert!(matches!(
        err(b"GGML\x03\0\0\0".to_vec()),
        GgufError::NotGguf
    ));
    assert!(matches!(err(b"PK\x03".to_vec()), GgufError::NotGguf));
    assert!(matches!(err(Vec::new()), GgufError::Truncated { .. }));

    let e = err(Raw::new(1, 0, 0).0);
    assert!(matches!(e, GgufError::UnsupportedVersion(1)));
    assert!(e.to_string().contains("version 1"), "{e}");
    assert!(matches!(
        err(Raw::new(4, 0, 0).0),
        GgufError::UnsupportedVersion(4)
    ));
    assert!(matches!(
        err(Raw::new(0, 0, 0).0),
        GgufError::UnsupportedVersion(0)
    ));

    // A big-endian v3 header: every field byte-swapped.
    let be = Raw(b"GGUF".to_vec())
        .bytes(&3u32.to_be_bytes())
        .bytes(&0u64.to_be_bytes())
        .bytes(&0u64.to_be_bytes())
        .0;
    let e = err(be);
    assert!(
        matches!(e, GgufError::BigEndian { raw: 0x0300_0000 }),
        "{e:?}"
    );
    assert!(e.to_string().contains("big-endian"));
}

#[test]
fn open_missing_path() {
    let path = PathBuf::from("definitely/not/here/model.gguf");
    match GgufFile::open(&path) {
        Err(e @ GgufError::Io { .. }) => {
            assert!(
                e.to_string().contains("definitely/not/here/model.gguf"),
                "{e}"
            )
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn open_real_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.gguf");
    std::fs::write(&path, small_file()).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.file_size(), small_file().len() as u64);
    assert_eq!(
        f.tensor_data("a.f32").unwrap().as_slice(),
        &f32_bytes(&[1.0, 2.0, 3.0, 4.0])[..]
    );
    // Tensor views keep the mapping alive after the file object is gone.
    let view = f.tensor_data("b.q8").unwrap();
    drop(f);
    assert_eq!(view.as_slice(), &(0..34).collect::<Vec<u8>>()[..]);

    // An empty file and a malformed file fail cleanly through the mmap path as well.
    let empty = dir.path().join("empty.gguf");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&empty),
        Err(GgufError::Truncated { .. })
    ));
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"not a model at all").unwrap();
    assert!(matches!(GgufFile::open(&junk), Err(GgufError::NotGguf)));
}

/// Small deterministic generator (xorshift64*), so failures reproduce.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn mutate(rng: &mut Rng, data: &mut Vec<u8>) {
    const INTERESTING: [u64; 8] = [0, 1, 0x7f, 0x80, 0xff, 0xffff_ffff, 1 << 32, u64::MAX];
    for _ in 0..1 + rng.below(4) {
        let len = data.len();
        match rng.below(6) {
            0 if len > 0 => {
                let i = rng.below(len);
                data[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                data[i] = rng.next() as u8;
            }
            2 => data.truncate(rng.below(len + 1)),
            3 => {
                let i = rng.below(len + 1);
                let n = 1 + rng.below(16);
                let extra: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                data.splice(i..i, extra);
            }
            // Overwrite what may be a count, length or offset with an extreme value.
            4 if len >= 8 => {
                let i = rng.below(len - 7);
                let v = INTERESTING[rng.below(INTERESTING.len())];
                data[i..i + 8].copy_from_slice(&v.to_le_bytes());
            }
            5 if len >= 4 => {
                let i = rng.below(len - 3);
                let v = INTERESTING[rng.below(INTERESTING.len())] as u32;
                data[i..i + 4].copy_from_slice(&v.to_le_bytes());
            }
            _ => {}
        }
    }
}

#[test]
fn random_mutations_never_panic() {
    let bases: Vec<Vec<u8>> = fuzz_seeds().into_iter().map(|(_, b)| b).collect();
    // INFERNO_GGUF_MUTATIONS raises the count for a longer local soak.
    let iterations = std::env::var("INFERNO_GGUF_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut accepted = 0;
    for i in 0..iterations {
        let mut data = bases[i % bases.len()].clone();
        mutate(&mut rng, &mut data);
        match GgufFile::from_bytes(data) {
            Ok(f) => {
                touch_everything(&f);
                accepted += 1;
            }
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
    // Some mutations (inside tensor data or padding) leave the file valid.
    assert!(accepted > 0);
}

/// Seed inputs for the `gguf_parse` fuzz target, all small valid files.
fn fuzz_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let empty = GgufWriter::new().to_bytes();

    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::String("llama".into()))
        .add("u8", Value::U8(1))
        .add("i8", Value::I8(-1))
        .add("u16", Value::U16(2))
        .add("i16", Value::I16(-2))
        .add("u32", Value::U32(3))
        .add("i32", Value::I32(-3))
        .add("u64", Value::U64(4))
        .add("i64", Value::I64(-4))
        .add("f32", Value::F32(0.5))
        .add("f64", Value::F64(0.25))
        .add("bool", Value::Bool(true))
        .add("str", Value::String("gguf".into()))
        .add(
            "arr",
            Value::Array(vec![Value::String("a".into()), Value::String("b".into())]),
        )
        .add(
            "nested",
            Value::Array(vec![
                Value::Array(vec![Value::U32(1), Value::U32(2)]),
                Value::Array(vec![Value::Bool(false)]),
            ]),
        );
    let metadata = w.to_bytes();

    let tensors = small_file();

    let mut w = GgufWriter::new();
    w.set_alignment(8);
    w.add("general.architecture", Value::String("tiny".into()));
    w.add_tensor(
        "x",
        &[2, 2],
        GgmlType::F32,
        f32_bytes(&[1.0, 0.0, 0.0, 1.0]),
    )
    .unwrap();
    w.add_tensor("y", &[3], GgmlType::I8, vec![1, 2, 3])
        .unwrap();
    w.add_tensor("z", &[1], GgmlType::F16, vec![0, 0x3c])
        .unwrap();
    let aligned = w.to_bytes();

    let v2 = Raw::new(2, 1, 1)
        .kv_str("general.architecture", "llama")
        .tensor("w", &[2], 0, 0)
        .pad(32)
        .bytes(&f32_bytes(&[1.5, -2.0]))
        .0;

    vec![
        ("seed-empty", empty),
        ("seed-metadata", metadata),
        ("seed-tensors", tensors),
        ("seed-aligned", aligned),
        ("seed-v2", v2),
    ]
}

/// The committed fuzz seeds must match what `fuzz_seeds` builds. Set
/// `INFERNO_WRITE_FUZZ_SEEDS=1` to regenerate them after changing the writer or the seeds.
#[test]
fn fuzz_seeds_are_current() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/gguf_parse");
    let regenerate = std::env::var_os("INFERNO_WRITE_FUZZ_SEEDS").is_some();
    if regenerate {
        std::fs::create_dir_all(&dir).unwrap();
    }
    for (name, bytes) in fuzz_seeds() {
        parse(bytes.clone()).unwrap_or_else(|e| panic!("seed {name} is invalid: {e}"));
        assert!(bytes.len() < 1024, "seed {name} is {} bytes", bytes.len());
        let path = dir.join(name);
        if regenerate {
            std::fs::write(&path, &bytes).unwrap();
        }
        let committed = std::fs::read(&path).unwrap_or_default();
        assert!(
            committed == bytes,
            "{} is stale; rerun this test with INFERNO_WRITE_FUZZ_SEEDS=1",
            path.display()
        );
    }
}
