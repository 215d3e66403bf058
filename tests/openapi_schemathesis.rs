//! The HTTP API against its own OpenAPI description (`GET /openapi.json`), fuzzed by
//! Schemathesis, a tool nobody here wrote: thousands of requests generated from the schema,
//! valid ones and ones that break it (wrong types, out-of-range numbers, missing fields,
//! unknown methods), each answer checked with every check Schemathesis has (`--checks all`)
//! but one that does not apply (below): no 5xx, only documented statuses and content types, bodies that fit the schema, invalid
//! requests refused with a 4xx, valid ones accepted (with the exceptions that
//! `tests/openapi/schemathesis.toml` gives and explains), 405 for methods a path does not
//! take, 401 for the guarded operations without the bearer token or with a wrong one; and
//! a stateful phase that follows the description's links (a tokenize's ids into a
//! detokenize, the listed model into its lookup, a created response into its retrieval,
//! its input items and its deletion) and those Schemathesis infers. The server's log must
//! show no warning, error or panic but the demo model's notice. The seed is fixed, so a run
//! is repeatable; rerun by hand with another `--seed` and more `--max-examples` to search
//! further.
//!
//! Python with `schemathesis` is required: `scripts/test` installs it into `.venv/`;
//! `INFERNO_PYTHON` may name another interpreter.

mod service_support;

use service_support::http;
use service_support::*;
use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn python() -> PathBuf {
    python_with("schemathesis", "schemathesis")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_nothing_against_the_served_description() {
    let python = python();
    // With a token, so that the description's security is checked too: Schemathesis's
    // `ignored_auth` sends the guarded operations without it and with a wrong one.
    let work = tempfile::tempdir().unwrap();
    let token = work.path().join("token");
    std::fs::write(&token, "t0ken\n").unwrap();
    let log = work.path().join("serve.log");
    let mut p = spawn_serve_logging_to(&["--auth-token-file", token.to_str().unwrap()], &log);
    wait_serving(p.addr).await;
    let bearer = ("authorization", "Bearer t0ken");

    // The description is served whole and open, and every path it lists is a route of the
    // server's (the fallback's 404 says "no such endpoint").
    let doc = http::get(p.http, "/openapi.json");
    assert_eq!(doc.status, 200, "{}", doc.text());
    assert_eq!(doc.header("content-type"), Some("application/json"));
    let spec = doc.json();
    assert_eq!(spec["openapi"], "3.0.3", "{spec}");
    let models = http::request(p.http, "GET", "/v1/models", &[bearer], b"").json();
    let model = models["data"][0]["id"].as_str().unwrap().to_string();
    let paths = spec["paths"].as_object().unwrap();
    for (path, ops) in paths {
        for method in ops.as_object().unwrap().keys() {
            let path = path.replace("{id}", &model);
            let r = http::request(
                p.http,
                &method.to_uppercase(),
                &path,
                &[("content-type", "application/json"), bearer],
                b"{}",
            );
            assert!(
                !r.text().contains("no such endpoint"),
                "{method} {path} is described but not served: {}",
                r.text()
            );
        }
    }
    assert!(
        http::get(p.http, "/v2/nothing")
            .text()
            .contains("no such endpoint"),
        "the check above would see an unserved path"
    );

    let out = Command::new(&python)
        .current_dir(work.path())
        .env("NO_COLOR", "1")
        .args(["-m", "schemathesis.cli", "--config-file"])
        .arg(repo().join("tests/openapi/schemathesis.toml"))
        .arg("run")
        .arg(format!("http://{}/openapi.json", p.http))
        .args([
            "--checks",
            "all",
            // The one resource a POST here creates is a kept response, and one made with
            // store: false (or larger than the whole store) is not kept: fetching it right
            // after is a 404, as OpenAI answers it. So the check that what a POST created
            // can be fetched (ST302) does not apply.
            "--exclude-checks",
            "ensure_resource_availability",
            "--max-examples",
            "100",
            "--seed",
            "1",
            "--workers",
            "1",
            "--generation-database",
            "none",
            "--header",
            "Authorization: Bearer t0ken",
        ])
        .output()
        .unwrap();
    let shown = shown(&out);
    assert!(out.status.success(), "{shown}");
    // It ran every operation and found nothing. Loading the description from its URL, it
    // leaves that URL's own operation out. The five links described and the five it
    // infers were followed. (Where a response has both JSON and an event stream, as
    // `POST /v1/responses` has, schemathesis 4.32.5 reads the stream's schema for the
    // resource a response creates: the events' schema is a named component so that it
    // still finds the created response, and its links are followed.)
    let stdout = String::from_utf8_lossy(&out.stdout);
    let operations = paths
        .values()
        .map(|ops| ops.as_object().unwrap().len())
        .sum::<usize>();
    assert!(
        stdout.contains(&format!("Tested: {}", operations - 1)),
        "{shown}"
    );
    assert!(stdout.contains("No issues found"), "{shown}");
    assert!(stdout.contains("API Links:    10 covered"), "{shown}");
    assert!(
        p.child.try_wait().unwrap().is_none(),
        "the server went down under the fuzzing"
    );
    // And it said nothing amiss: a request can be answered as its schema says and still
    // have gone wrong inside (a grammar refusing a token its own mask allowed was found
    // this way), and a handler's panic is answered 500 but only the log says why. The one
    // expected warning is the demo model's notice.
    let logged = std::fs::read_to_string(&log).unwrap();
    let amiss: Vec<&str> = logged
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR ") || l.contains("panicked"))
        .filter(|l| !l.contains("preset=demo"))
        .collect();
    assert!(
        amiss.is_empty(),
        "the server logged, under the fuzzing:\n{}",
        amiss.join("\n")
    );
    assert!(
        logged.contains("preset=demo"),
        "the log was not captured:\n{logged}"
    );
}
