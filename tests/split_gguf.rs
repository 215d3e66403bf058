//! Split GGUF models as llama.cpp's `gguf-split` writes them (`tests/fixtures/models/split`,
//! made by its `gen_split.sh` from `tiny-untied.q8_0.gguf`): the first part's path opens all
//! three parts as one model with the unsplit file's tensors and metadata, whose logits equal
//! the unsplit file's bit for bit; a missing, misplaced or second part is a clear error
//! naming the file; `info`, `logits` and `quantize` take the split model.

use inferno::backend::{create_backend, BackendOptions};
use inferno::gguf::GgufFile;
use inferno::model::{Logits, Model};
use std::path::{Path, PathBuf};
use std::process::Command;

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models")
}

fn unsplit() -> PathBuf {
    models().join("tiny-untied.q8_0.gguf")
}

fn part(no: u32) -> PathBuf {
    models().join(format!("split/tiny-untied.q8_0-{no:05}-of-00003.gguf"))
}

fn logits(gguf: &GgufFile, backend: &str, ids: &[u32]) -> Vec<f32> {
    let be = create_backend(
        backend,
        &BackendOptions {
            threads: 2,
            tracing: false,
        },
    )
    .unwrap();
    let model = Model::load(gguf, be).unwrap();
    let vocab = model.config.vocab;
    let mut st = model.new_state(ids.len(), 64);
    let mut out = vec![0.0; ids.len() * vocab];
    model.forward(&mut st, ids, Logits::All(&mut out)).unwrap();
    out
}

#[test]
fn the_parts_open_as_the_unsplit_model_with_the_same_logits() {
    let whole = GgufFile::open(unsplit()).unwrap();
    let split = GgufFile::open(part(1)).unwrap();
    assert_eq!(whole.part_count(), 1);
    assert_eq!(split.part_count(), 3);
    assert_eq!(split.paths(), [part(1), part(2), part(3)]);
    // Every tensor, with its bytes, and it comes from more than one part.
    assert_eq!(split.tensors().len(), whole.tensors().len());
    for t in whole.tensors() {
        let s = split.tensor_info(&t.name).expect(&t.name);
        assert_eq!((s.dtype, &s.dims), (t.dtype, &t.dims), "{}", t.name);
        assert_eq!(
            split.tensor_data(&t.name).unwrap().as_slice(),
            whole.tensor_data(&t.name).unwrap().as_slice(),
            "{}",
            t.name
        );
    }
    // The model's metadata, plus the split keys.
    for (key, value) in whole.metadata() {
        assert_eq!(split.get(key), Some(value), "{key}");
    }
    assert_eq!(split.get_u64("split.count").unwrap(), 3);
    assert_eq!(split.get_u64("split.tensors.count").unwrap(), 36);
    assert_eq!(
        split.file_size(),
        (1..=3)
            .map(|n| std::fs::metadata(part(n)).unwrap().len())
            .sum::<u64>()
    );

    // The pool backend repacks the weights and releases their mapped pages, part by part.
    let ids = [1, 17, 300, 42, 7, 511, 256, 3];
    for backend in ["scalar", "pool"] {
        let a = logits(&whole, backend, &ids);
        let b = logits(&split, backend, &ids);
        assert!(a.iter().all(|x| x.is_finite()));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a), bits(&b), "{backend}: split logits differ");
    }
}

/// The three parts copied to a fresh folder, with `edit` applied to the copies.
fn copies(edit: impl FnOnce(&Path)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for n in 1..=3 {
        std::fs::copy(part(n), dir.path().join(part(n).file_name().unwrap())).unwrap();
    }
    edit(dir.path());
    dir
}

fn name(n: u32) -> String {
    format!("tiny-untied.q8_0-{n:05}-of-00003.gguf")
}

#[test]
fn a_missing_or_misplaced_part_is_named() {
    let dir = copies(|d| std::fs::remove_file(d.join(name(3))).unwrap());
    let err = GgufFile::open(dir.path().join(name(1)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("part 3 of 3") && err.contains(&name(3)) && err.contains("missing"),
        "{err}"
    );

    // Part 2's bytes under part 3's name.
    let dir = copies(|d| {
        std::fs::copy(d.join(name(2)), d.join(name(3)))
            .map(drop)
            .unwrap()
    });
    let err = GgufFile::open(dir.path().join(name(1)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&name(3)) && err.contains("is part 2") && err.contains("expected part 3"),
        "{err}"
    );

    // A part cut short.
    let dir = copies(|d| {
        let p = d.join(name(2));
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 100]).unwrap();
    });
    let err = GgufFile::open(dir.path().join(name(1)))
        .unwrap_err()
        .to_string();
    assert!(err.contains(&name(2)) && err.contains("truncated"), "{err}");

    // The first part renamed: its siblings cannot be found by name.
    let dir = copies(|d| std::fs::rename(d.join(name(1)), d.join("model.gguf")).unwrap());
    let err = GgufFile::open(dir.path().join("model.gguf"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("-00001-of-00003.gguf"), "{err}");

    let err = GgufFile::open(part(2)).unwrap_err().to_string();
    assert!(
        err.contains("is part 2 of a model split into 3 files") && err.contains(&name(1)),
        "{err}"
    );
}

#[test]
fn parts_in_memory_are_checked_the_same_way() {
    let read = |n| (name(n), std::fs::read(part(n)).unwrap());
    let joined = GgufFile::from_split_bytes(vec![read(1), read(2), read(3)]).unwrap();
    assert_eq!(joined.tensors().len(), 36);
    assert!(joined.paths().is_empty());
    let err = GgufFile::from_split_bytes(vec![read(1), read(3)])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&name(3)) && err.contains("is part 3") && err.contains("expected part 2"),
        "{err}"
    );
    let err = GgufFile::from_split_bytes(vec![read(1), read(2)])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&name(1)) && err.contains("3 parts") && err.contains("2 given"),
        "{err}"
    );
    let err = GgufFile::from_split_bytes(vec![read(1), read(2), read(2)])
        .unwrap_err()
        .to_string();
    assert!(err.contains("expected part 3"), "{err}");
}

fn inferno(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "inferno {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn info_logits_and_quantize_take_the_first_part() {
    let (first, whole) = (part(1), unsplit());
    let (first, whole) = (first.to_str().unwrap(), whole.to_str().unwrap());
    let info: serde_json::Value =
        serde_json::from_str(&inferno(&["info", "-m", first, "--output", "json"])).unwrap();
    assert_eq!(info["tensors"].as_array().unwrap().len(), 36);
    assert_eq!(info["parts"].as_array().unwrap().len(), 3);
    assert_eq!(info["config"]["layers"], 3);

    // The printed logits, every position, are the same text: the same f32 values.
    let ids = "5,90,211,3";
    let a = inferno(&["logits", "-m", whole, "--ids", ids, "--all"]);
    let b = inferno(&["logits", "-m", first, "--ids", ids, "--all"]);
    assert!(a.len() > 1000);
    assert_eq!(a, b);

    // quantize reads every part and writes one file.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tiny-f16.gguf");
    let out_s = out.to_str().unwrap();
    inferno(&["quantize", "-m", first, "--dtype", "f16", "-o", out_s]);
    let q = GgufFile::open(&out).unwrap();
    assert_eq!(q.part_count(), 1);
    assert_eq!(q.tensors().len(), 36);
    assert!(q.get("split.count").is_none(), "the output is one file");
    let from_whole = dir.path().join("whole-f16.gguf");
    inferno(&[
        "quantize",
        "-m",
        whole,
        "--dtype",
        "f16",
        "-o",
        from_whole.to_str().unwrap(),
    ]);
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(&from_whole).unwrap()
    );
}
