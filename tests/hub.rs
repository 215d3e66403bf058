//! Models by name from the Hugging Face Hub, against a stand-in Hub on loopback
//! (`hub_support`, set through `HF_ENDPOINT`) serving the test checkpoints of
//! `tests/fixtures/models` and llama.cpp's split of one: pulling, quantization choice, the
//! cache laid out as Python's `huggingface_hub` reads it (and reusing what it downloaded),
//! `list` and `rm`, offline mode, gated and private repositories (their token sent to the
//! Hub and never to the storage host), a download resumed after the connection drops, a
//! corrupted body refused by its sha256, two pulls of one file at once, a split model equal
//! to the unsplit file, and `serve` pulling while health says NOT_SERVING.

mod hub_support;
mod service_support;

use hub_support::{sha256, Fault, RepoSpec, StandIn, Storage};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const TINY: &str = "inferno-test/tiny-GGUF";
const SPLIT: &str = "inferno-test/split-GGUF";
const GATED: &str = "inferno-test/gated-GGUF";
/// A private split model, also reachable by the name it had before a rename.
const PRIVATE: &str = "inferno-test/private-GGUF";
const PRIVATE_OLD: &str = "inferno-test/private-old-name-GGUF";
const C1: &str = "1f0c5e9d2b7a4c3e8d6f1a2b3c4d5e6f7a8b9c0d";
const C2: &str = "2a0c5e9d2b7a4c3e8d6f1a2b3c4d5e6f7a8b9c0d";
const C3: &str = "3b0c5e9d2b7a4c3e8d6f1a2b3c4d5e6f7a8b9c0d";
const TOKEN: &str = "hf_standin_token";

fn fixture(name: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/models")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn q8() -> Vec<u8> {
    fixture("tiny-gqa-tied.q8_0.gguf")
}
fn f16() -> Vec<u8> {
    fixture("tiny-gqa-tied.f16.gguf")
}
fn f32() -> Vec<u8> {
    fixture("tiny-gqa-tied.f32.gguf")
}
fn split_part(n: u32) -> Vec<u8> {
    fixture(&format!("split/tiny-untied.q8_0-{n:05}-of-00003.gguf"))
}

/// llama.cpp's split of a model in three parts, and the whole model in F16.
fn split_files() -> Vec<(String, Vec<u8>)> {
    (1..=3)
        .map(|n| {
            (
                format!("Q8_0/tiny-untied-Q8_0-{n:05}-of-00003.gguf"),
                split_part(n),
            )
        })
        .chain([(
            "tiny-untied-F16.gguf".to_string(),
            fixture("tiny-untied.f16.gguf"),
        )])
        .collect()
}

fn repos() -> Vec<RepoSpec> {
    vec![
        RepoSpec {
            id: TINY.into(),
            commit: C1.into(),
            files: vec![
                ("README.md".into(), b"# tiny\n".to_vec()),
                ("tiny-Q8_0.gguf".into(), q8()),
                ("tiny-F16.gguf".into(), f16()),
                ("tiny-F32.gguf".into(), f32()),
            ],
            token: None,
            private: false,
            renamed_from: None,
        },
        RepoSpec {
            id: SPLIT.into(),
            commit: C2.into(),
            files: split_files(),
            token: None,
            private: false,
            renamed_from: None,
        },
        RepoSpec {
            id: "inferno-test/broken-split-GGUF".into(),
            commit: C2.into(),
            files: vec![
                ("m-Q8_0-00001-of-00003.gguf".into(), split_part(1)),
                ("m-Q8_0-00003-of-00003.gguf".into(), split_part(3)),
            ],
            token: None,
            private: false,
            renamed_from: None,
        },
        RepoSpec {
            id: GATED.into(),
            commit: C3.into(),
            files: vec![("gated-Q8_0.gguf".into(), q8())],
            token: Some(TOKEN.into()),
            private: false,
            renamed_from: None,
        },
        RepoSpec {
            id: PRIVATE.into(),
            commit: C2.into(),
            files: split_files(),
            token: Some(TOKEN.into()),
            private: true,
            renamed_from: Some(PRIVATE_OLD.into()),
        },
    ]
}

/// A stand-in Hub and an empty `HF_HOME` for one test. Whatever the test, the storage host
/// must never have seen a token: checked when it ends.
struct Env {
    hub: StandIn,
    home: tempfile::TempDir,
}

impl Drop for Env {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let leaked: Vec<_> = self
                .hub
                .seen()
                .into_iter()
                .filter(|s| s.host == "cdn" && s.auth.is_some())
                .collect();
            assert!(
                leaked.is_empty(),
                "the storage host got a token: {leaked:#?}"
            );
        }
    }
}

impl Env {
    fn new() -> Env {
        Env::with_storage(Storage::OtherHost)
    }

    fn with_storage(storage: Storage) -> Env {
        Env {
            hub: StandIn::start_with(repos(), storage),
            home: tempfile::tempdir().unwrap(),
        }
    }

    fn cache(&self) -> PathBuf {
        self.home.path().join("hub")
    }

    fn repo_dir(&self, repo: &str) -> PathBuf {
        self.cache()
            .join(format!("models--{}", repo.replace('/', "--")))
    }

    /// `inferno` with the Hub settings of this test only (none from the caller's
    /// environment).
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_inferno"));
        c.args(args)
            .env("HF_HOME", self.home.path())
            .env("HF_ENDPOINT", &self.hub.endpoint)
            .env("RUST_LOG", "warn,inferno=info");
        for k in [
            "HF_TOKEN",
            "HF_TOKEN_PATH",
            "HF_HUB_OFFLINE",
            "HF_HUB_CACHE",
            "HUGGINGFACE_HUB_CACHE",
            "XDG_CACHE_HOME",
        ] {
            c.env_remove(k);
        }
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// Runs `inferno` that must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "inferno {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Runs `inferno` that must fail; its stderr.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "inferno {args:?} succeeded: {err}");
        err
    }

    fn pull(&self, reference: &str) -> PathBuf {
        PathBuf::from(self.ok(&["pull", reference]).trim())
    }
}

fn python() -> PathBuf {
    service_support::python_with("huggingface_hub", "huggingface_hub")
}

/// Runs a Python snippet with huggingface_hub against this test's Hub and cache.
fn python_hub(env: &Env, code: &str) -> String {
    let out = Command::new(python())
        .args(["-c", code])
        .env("HF_HOME", env.home.path())
        .env("HF_ENDPOINT", &env.hub.endpoint)
        .env("HF_HUB_DISABLE_TELEMETRY", "1")
        .env("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_HUB_CACHE")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn pull_chooses_the_quantization_and_shares_the_cache_with_huggingface_hub() {
    let env = Env::new();
    // No Q4_K_M here, so the default is Q8_0.
    let path = env.pull(TINY);
    let snapshot = env.repo_dir(TINY).join("snapshots").join(C1);
    assert_eq!(path, snapshot.join("tiny-Q8_0.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), q8());
    // The layout huggingface_hub writes: a relative link to the blob named by its sha256,
    // the branch's ref, no ref named by the commit, nothing left over.
    let sha = sha256(&q8());
    assert_eq!(
        std::fs::read_link(&path).unwrap(),
        Path::new("../../blobs").join(&sha)
    );
    assert_eq!(
        std::fs::read_to_string(env.repo_dir(TINY).join("refs/main")).unwrap(),
        C1
    );
    let refs: Vec<_> = std::fs::read_dir(env.repo_dir(TINY).join("refs"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(refs, ["main"]);
    let blobs: Vec<String> = std::fs::read_dir(env.repo_dir(TINY).join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(blobs, std::slice::from_ref(&sha));

    // Python's huggingface_hub finds it where it would have put it.
    let found = python_hub(
        &env,
        &format!(
            "from huggingface_hub import try_to_load_from_cache as t\n\
             print(t('{TINY}', 'tiny-Q8_0.gguf'))"
        ),
    );
    assert_eq!(found, path.to_str().unwrap());

    // A quantization in any case, with the hf.co prefix.
    assert_eq!(
        env.pull(&format!("hf.co/{TINY}:f16")),
        snapshot.join("tiny-F16.gguf")
    );
    let err = env.fails(&["pull", &format!("{TINY}:Q4_K_M")]);
    assert!(
        err.contains("has no Q4_K_M GGUF file") && err.contains("it offers F16, F32, Q8_0"),
        "{err}"
    );

    // What Python downloads, inferno reuses without a byte more.
    let py = python_hub(
        &env,
        &format!(
            "from huggingface_hub import hf_hub_download as d\n\
             print(d('{TINY}', 'tiny-F32.gguf'))"
        ),
    );
    assert_eq!(env.hub.bodies(&f32()).len(), 1);
    let out = env.run(&["pull", &format!("{TINY}/tiny-F32.gguf")]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already in the cache"));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), py);
    assert_eq!(env.hub.bodies(&f32()).len(), 1, "downloaded again");

    // Pulled again: nothing downloaded.
    env.pull(TINY);
    assert_eq!(env.hub.bodies(&q8()).len(), 1);

    // Every command takes the reference; the model is the file's.
    let ids = "1,2,3,400";
    let by_ref = env.ok(&["logits", "-m", &format!("{TINY}:Q8_0"), "--ids", ids]);
    let by_path = env.ok(&["logits", "-m", path.to_str().unwrap(), "--ids", ids]);
    assert_eq!(by_ref, by_path);
    let info = env.ok(&["info", "-m", TINY, "--output", "json"]);
    assert!(info.contains("tiny-Q8_0.gguf"), "{info}");

    let list: serde_json::Value =
        serde_json::from_str(&env.ok(&["list", "--output", "json"])).unwrap();
    let refs: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["reference"].as_str().unwrap())
        .collect();
    assert_eq!(
        refs,
        [
            format!("{TINY}:F16"),
            format!("{TINY}:F32"),
            format!("{TINY}:Q8_0")
        ]
    );
    assert_eq!(list[2]["size"], q8().len());
    let table = env.ok(&["list"]);
    assert!(
        table.contains("Q8_0") && table.contains(path.to_str().unwrap()),
        "{table}"
    );

    // rm takes the file and its blob away, and leaves the rest.
    env.ok(&["rm", &format!("{TINY}:F16")]);
    assert!(!snapshot.join("tiny-F16.gguf").exists());
    assert!(!env
        .repo_dir(TINY)
        .join("blobs")
        .join(sha256(&f16()))
        .exists());
    assert!(path.exists());
    let err = env.fails(&["rm", &format!("{TINY}:F16")]);
    assert!(err.contains("not in the cache"), "{err}");

    // Repositories and revisions that do not exist.
    let err = env.fails(&["pull", "inferno-test/nope"]);
    assert!(
        err.contains("the repository inferno-test/nope was not found"),
        "{err}"
    );
    let err = env.fails(&["pull", &format!("{TINY}@v9")]);
    assert!(
        err.contains("revision v9 of") && err.contains("not found"),
        "{err}"
    );
}

#[test]
fn offline_mode_reads_only_the_cache() {
    let env = Env::new();
    let path = env.pull(&format!("{TINY}:Q8_0"));
    let before = env.hub.seen().len();
    let offline = |args: &[&str]| {
        let mut c = env.command(args);
        // Offline must not even try: a Hub that is not there.
        c.env("HF_HUB_OFFLINE", "1")
            .env("HF_ENDPOINT", "http://127.0.0.1:9");
        c.output().unwrap()
    };
    let out = offline(&["pull", &format!("{TINY}:q8_0")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        path.to_str().unwrap()
    );
    let out = offline(&["pull", &format!("{TINY}@{C1}")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = offline(&["tokenize", "-m", TINY, "hello"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = offline(&["pull", &format!("{TINY}:F16")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("not in the cache") && err.contains("HF_HUB_OFFLINE"),
        "{err}"
    );
    let out = offline(&["pull", "inferno-test/other-GGUF"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not in the cache"));
    assert_eq!(
        env.hub.seen().len(),
        before,
        "offline commands reached the Hub"
    );
}

#[test]
fn a_gated_repository_says_how_to_pass_a_token() {
    let env = Env::new();
    let err = env.fails(&["pull", GATED]);
    assert!(
        err.contains(&format!("{GATED} is gated"))
            && err.contains("HF_TOKEN")
            && err.contains("--hf-token-file"),
        "{err}"
    );
    let out = env
        .command(&["pull", GATED])
        .env("HF_TOKEN", "hf_wrong")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("the token given has no access"), "{err}");
    assert!(
        !err.contains("hf_wrong"),
        "the error shows the token: {err}"
    );

    let token_file = env.home.path().join("token.txt");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let path = env.pull_with_token(&token_file);
    assert_eq!(std::fs::read(path).unwrap(), q8());
    // The Hub's own host got the token.
    assert!(env.hub.seen().iter().any(|s| {
        s.host == "hub"
            && s.path.contains("/resolve/")
            && s.auth.as_deref() == Some(&format!("Bearer {TOKEN}")[..])
    }));
}

/// A token set for gated repositories does not travel with a public repository's
/// downloads, so the host the Hub redirects file bodies to never sees it.
#[test]
fn a_public_repository_is_downloaded_without_the_token() {
    let env = Env::new();
    let out = env
        .command(&["pull", TINY])
        .env("HF_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = env.hub.seen();
    assert!(seen.iter().any(|s| s.host == "cdn"), "{seen:?}");
    assert!(
        seen.iter().all(|s| s.host != "cdn" || s.auth.is_none()),
        "{seen:?}"
    );
}

/// Private and gated pulls with `HF_TOKEN` set, the storage host on the Hub's own address
/// but another port (where a same-host rule still sends the token): the Hub gets the token
/// on every request and the storage host on none, whatever the pull: a body resumed after a
/// dropped connection, a split model's parts, a renamed repository's relative redirect, a
/// mirror's endpoint with a path. The pulls log at `trace` without showing the token, and
/// the cache keeps none.
#[test]
fn the_token_goes_to_the_hub_and_never_to_the_storage_host() {
    let env = Env::with_storage(Storage::OtherPort);
    let pull = |reference: &str, endpoint: &str| {
        let out = env
            .command(&["pull", reference])
            .env("HF_TOKEN", TOKEN)
            .env("HF_ENDPOINT", endpoint)
            .env("RUST_LOG", "trace")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "pull {reference}: {err}");
        // The HTTP client's own lines are there, the header named, its value not.
        assert!(err.contains("Authorization"), "{err}");
        assert!(!err.contains(TOKEN), "the log shows the token: {err}");
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    };

    // A gated file whose body drops once: resumed from where it stopped.
    env.hub.set_fault(
        &q8(),
        Fault {
            cut_requests: 1,
            cut_after: 100_000,
            ..Fault::default()
        },
    );
    assert_eq!(std::fs::read(pull(GATED, &env.hub.endpoint)).unwrap(), q8());
    let starts: Vec<u64> = env
        .hub
        .bodies(&q8())
        .iter()
        .map(|b| b.range_start())
        .collect();
    assert_eq!(starts, [0, 100_000]);

    // A private split model by its old name: the Hub's relative redirect to the new one
    // keeps the token, and every part comes down.
    let first = pull(&format!("{PRIVATE_OLD}:Q8_0"), &env.hub.endpoint);
    for n in 1..=3 {
        let part = first.with_file_name(format!("tiny-untied-Q8_0-{n:05}-of-00003.gguf"));
        assert_eq!(std::fs::read(part).unwrap(), split_part(n));
    }
    let seen = env.hub.seen();
    for name in [PRIVATE_OLD, PRIVATE] {
        assert!(
            seen.iter()
                .any(|s| s.path.contains(&format!("/{name}/resolve/"))),
            "{seen:#?}"
        );
    }

    // Through a mirror whose endpoint has a path.
    let mirror = format!("{}/mirror", env.hub.endpoint);
    let f16 = pull(&format!("{PRIVATE}:F16"), &mirror);
    assert_eq!(std::fs::read(f16).unwrap(), fixture("tiny-untied.f16.gguf"));
    let seen = env.hub.seen();
    assert!(seen.iter().any(|s| s.requested.starts_with("/mirror/")));

    let bearer = format!("Bearer {TOKEN}");
    let (hub, cdn): (Vec<_>, Vec<_>) = seen.iter().partition(|s| s.host == "hub");
    assert!(cdn.len() >= 6, "{cdn:#?}");
    assert!(cdn.iter().all(|s| s.auth.is_none()), "{cdn:#?}");
    assert!(
        hub.iter().all(|s| s.auth.as_deref() == Some(&bearer[..])),
        "{hub:#?}"
    );

    // Nothing in the cache holds it.
    let mut dirs = vec![env.cache()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                dirs.push(path);
            } else if meta.is_file() {
                let bytes = std::fs::read(&path).unwrap();
                assert!(
                    !bytes.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()),
                    "{} holds the token",
                    path.display()
                );
            }
        }
    }

    // Without the token, a private repository is not there, as the Hub says.
    let err = env.fails(&["pull", PRIVATE]);
    assert!(
        err.contains(&format!("the repository {PRIVATE} was not found"))
            && err.contains("HF_TOKEN"),
        "{err}"
    );
}

impl Env {
    fn pull_with_token(&self, file: &Path) -> PathBuf {
        PathBuf::from(
            self.ok(&["pull", GATED, "--hf-token-file", file.to_str().unwrap()])
                .trim(),
        )
    }
}

#[test]
fn an_interrupted_download_resumes_where_it_stopped() {
    let env = Env::new();
    // The connection drops once mid-file: the same pull resumes it.
    env.hub.set_fault(
        &f32(),
        Fault {
            cut_requests: 1,
            cut_after: 200_000,
            ..Fault::default()
        },
    );
    let path = env.pull(&format!("{TINY}:F32"));
    assert_eq!(std::fs::read(&path).unwrap(), f32());
    let bodies = env.hub.bodies(&f32());
    assert_eq!(bodies.len(), 2, "{bodies:#?}");
    assert_eq!(bodies[0].range_start(), 0);
    assert_eq!(bodies[1].range_start(), 200_000);

    // It drops on every try: the pull gives up, keeping what it got, and the next pull
    // asks for the rest only.
    env.hub.set_fault(
        &f16(),
        Fault {
            cut_requests: usize::MAX,
            cut_after: 50_000,
            ..Fault::default()
        },
    );
    env.fails(&["pull", &format!("{TINY}:F16")]);
    // Kept where huggingface_hub keeps a download it has not finished.
    let part = env
        .repo_dir(TINY)
        .join("blobs")
        .join(format!("{}.incomplete", sha256(&f16())));
    let kept = std::fs::metadata(&part).unwrap().len();
    assert!(kept >= 50_000 && kept < f16().len() as u64, "{kept}");
    env.hub.set_fault(&f16(), Fault::default());
    let tries = env.hub.bodies(&f16()).len();
    let path = env.pull(&format!("{TINY}:F16"));
    assert_eq!(std::fs::read(&path).unwrap(), f16());
    let resumed = &env.hub.bodies(&f16())[tries];
    assert_eq!(resumed.range_start(), kept);
    assert!(!part.exists());
}

#[test]
fn a_corrupted_download_is_refused_by_its_sha256() {
    let env = Env::new();
    env.hub.set_fault(
        &f16(),
        Fault {
            corrupt: true,
            ..Fault::default()
        },
    );
    let err = env.fails(&["pull", &format!("{TINY}:F16")]);
    assert!(
        err.contains("tiny-F16.gguf does not match the sha256") && err.contains(&sha256(&f16())),
        "{err}"
    );
    // Nothing of it is left to be used.
    let blobs = env.repo_dir(TINY).join("blobs");
    let left: Vec<_> = std::fs::read_dir(&blobs)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| !n.to_string_lossy().ends_with(".lock"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(!env
        .repo_dir(TINY)
        .join("snapshots")
        .join(C1)
        .join("tiny-F16.gguf")
        .exists());
    let err = env.fails(&["info", "-m", &format!("{TINY}:F16")]);
    assert!(err.contains("sha256"), "{err}");
    env.hub.set_fault(&f16(), Fault::default());
    assert_eq!(
        std::fs::read(env.pull(&format!("{TINY}:F16"))).unwrap(),
        f16()
    );
}

#[test]
fn two_pulls_of_one_file_at_once_download_it_once() {
    let env = Env::new();
    env.hub.set_fault(
        &f32(),
        Fault {
            hold: true,
            ..Fault::default()
        },
    );
    let reference = format!("{TINY}:F32");
    let spawn = || {
        env.command(&["pull", &reference])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let first = spawn();
    // The first is downloading (its body held back) ...
    env.hub.wait_for("the first pull's download", |s| {
        s.iter().any(|r| r.is_body())
    });
    // ... when the second starts, and waits for it.
    let mut second = spawn();
    // Its stderr is read to the end on a thread, so it never writes into a closed pipe.
    let stderr = second.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("waiting for another process downloading the same file") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    // Ends with an error if the second pull exits without having waited.
    rx.recv().expect("the second pull waits for the first");
    env.hub.release();
    let a = first.wait_with_output().unwrap();
    let b = second.wait_with_output().unwrap();
    let b_err = reader.join().unwrap();
    assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
    assert!(b.status.success(), "{b_err}");
    assert!(b_err.contains("already in the cache"), "{b_err}");
    assert_eq!(a.stdout, b.stdout);
    let path = PathBuf::from(String::from_utf8(a.stdout).unwrap().trim());
    assert_eq!(std::fs::read(path).unwrap(), f32());
    assert_eq!(env.hub.bodies(&f32()).len(), 1);
}

#[test]
fn a_split_model_pulls_every_part_and_runs_as_the_unsplit_file() {
    let env = Env::new();
    let path = env.pull(SPLIT);
    let snapshot = env.repo_dir(SPLIT).join("snapshots").join(C2);
    assert_eq!(
        path,
        snapshot.join("Q8_0/tiny-untied-Q8_0-00001-of-00003.gguf")
    );
    for n in 1..=3 {
        let p = snapshot.join(format!("Q8_0/tiny-untied-Q8_0-{n:05}-of-00003.gguf"));
        assert_eq!(std::fs::read(p).unwrap(), split_part(n));
    }
    let unsplit =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/tiny-untied.q8_0.gguf");
    let ids = "7,8,9,10,300";
    let a = env.ok(&["logits", "--all", "-m", SPLIT, "--ids", ids]);
    let b = env.ok(&[
        "logits",
        "--all",
        "-m",
        unsplit.to_str().unwrap(),
        "--ids",
        ids,
    ]);
    assert!(a.len() > 1000);
    assert_eq!(a, b, "split logits differ from the unsplit file's");
    let list: serde_json::Value =
        serde_json::from_str(&env.ok(&["list", "--output", "json"])).unwrap();
    assert_eq!(list[0]["reference"], format!("{SPLIT}:Q8_0"));
    assert_eq!(list[0]["parts"], 3);
    assert_eq!(
        list[0]["size"],
        (1..=3).map(|n| split_part(n).len()).sum::<usize>()
    );
    // rm takes every part.
    env.ok(&["rm", SPLIT]);
    assert!(!env.repo_dir(SPLIT).exists());

    let err = env.fails(&["pull", "inferno-test/broken-split-GGUF"]);
    assert!(
        err.contains("split into 3 parts") && err.contains("m-Q8_0-00002-of-00003.gguf"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_pulls_the_model_while_health_says_not_serving() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let env = Env::new();
    env.hub.set_fault(
        &q8(),
        Fault {
            hold: true,
            ..Fault::default()
        },
    );
    let mut cmd = env.command(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--metrics-addr",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--model",
        &format!("{TINY}:Q8_0"),
    ]);
    cmd.stdin(Stdio::null());
    let mut p = service_support::spawn_serve_command(cmd);
    let hub = &env.hub;
    tokio::task::block_in_place(|| {
        hub.wait_for("the model's download", |s| s.iter().any(|r| r.is_body()))
    });
    // Mid-pull: not serving, on gRPC and on /healthz.
    let mut health = HealthClient::new(service_support::channel(p.addr).await);
    assert_eq!(
        service_support::health_status(&mut health).await,
        ServingStatus::NotServing
    );
    let healthz = service_support::http_get(p.metrics, "/healthz");
    assert!(healthz.starts_with("HTTP/1.1 503"), "{healthz}");
    hub.release();
    service_support::wait_serving(p.addr).await;
    let healthz = service_support::http_get(p.metrics, "/healthz");
    assert!(healthz.starts_with("HTTP/1.1 200"), "{healthz}");
    let _ = p.child.kill();
    let _ = p.child.wait();
    assert!(env
        .repo_dir(TINY)
        .join("snapshots")
        .join(C1)
        .join("tiny-Q8_0.gguf")
        .exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_model_says_how_to_serve_a_real_one() {
    use inferno::server::pb;
    let mut child = Command::new(env!("CARGO_BIN_EXE_inferno"))
        // Free ports only: the HTTP API's default port may be another test's.
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = err.next().unwrap().unwrap();
    assert!(
        first.contains("its text is random")
            && first.contains("inferno serve --model Qwen/Qwen3-0.6B-GGUF:Q8_0"),
        "{first}"
    );
    // Kept open while the server runs: it prints more lines, and a closed pipe fails them.
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = out.next().unwrap().unwrap();
    let addr: std::net::SocketAddr = line
        .strip_prefix("inferno: gRPC listening on ")
        .unwrap()
        .parse()
        .unwrap();
    service_support::wait_serving(addr).await;
    let info = service_support::client(addr)
        .await
        .get_model_info(pb::GetModelInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.note, inferno::engine::DEMO_NOTE);
    let _ = child.kill();
    let _ = child.wait();
}
