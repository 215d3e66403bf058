//! The `inferno serve` binary as an operator runs it: the built-in demo model on a free
//! port, the Prometheus endpoint, the load generator against it, an idle server's CPU use,
//! and SIGTERM letting an in-flight request finish before the process exits 0.

mod service_support;

use inferno::server::pb::FinishReason;
use service_support::*;
use std::process::Command;
use std::time::Duration;
use tonic::Code;

/// User plus system CPU time of a process, in clock ticks.
#[cfg(target_os = "linux")]
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// `inferno loadtest` against `addr` with `args`, every request to max_tokens: its JSON
/// report.
fn loadtest(addr: std::net::SocketAddr, args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["loadtest", "--addr", &format!("http://{addr}")])
        .args(args)
        .args(["--ignore-eos", "--output", "json", "--duration", "120s"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_binary_metrics_loadtest_idle_cpu_and_sigterm_drain() {
    let mut p = spawn_serve(&["--drain-timeout", "60s", "--queue-capacity", "4"]);
    wait_serving(p.addr).await;

    // `inferno health`, the container's health check: exit 0 and SERVING.
    let health = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["health", "--addr", &format!("http://{}", p.addr)])
        .output()
        .unwrap();
    assert!(health.status.success(), "{health:?}");
    assert_eq!(String::from_utf8_lossy(&health.stdout), "SERVING\n");

    // Idle: model loaded, no requests. A resource check, not a speed check.
    #[cfg(target_os = "linux")]
    {
        let ticks_per_sec = 100.0; // USER_HZ on Linux
        let secs = 5.0;
        let before = cpu_ticks(p.child.id());
        std::thread::sleep(Duration::from_secs_f64(secs));
        let used = (cpu_ticks(p.child.id()) - before) as f64 / ticks_per_sec;
        // The target is < 1% of a core; the margin absorbs the clock tick's granularity.
        assert!(
            used / secs < 0.02,
            "an idle server used {:.1}% of a core",
            used / secs * 100.0
        );
    }

    // The load generator against the real server.
    let report = loadtest(
        p.addr,
        &["--concurrency", "2", "--requests", "4", "--max-tokens", "4"],
    );
    assert_eq!(report["by_status"]["OK"], 4, "{report}");
    assert_eq!(report["completion_tokens"], 16, "{report}");
    assert!(
        report["ttft_ms"]["p99"].as_f64().unwrap() >= report["ttft_ms"]["p50"].as_f64().unwrap()
    );

    let m = http_get(p.metrics, "/metrics");
    assert!(m.starts_with("HTTP/1.1 200 OK"), "{m}");
    assert!(
        m.contains("inferno_requests_total{method=\"Generate\",code=\"OK\",protocol=\"grpc\"} 4"),
        "{m}"
    );
    assert!(m.contains("inferno_generated_tokens_total 16"), "{m}");
    assert!(m.contains("inferno_queue_depth 0"), "{m}");
    assert!(m.contains("inferno_queue_capacity 4"), "{m}");
    assert!(
        m.contains("inferno_time_to_first_token_seconds_count 4"),
        "{m}"
    );
    assert!(
        m.contains("inferno_decode_step_seconds_bucket{le=\"+Inf\"} 12"),
        "{m}"
    );
    assert!(m.contains("inferno_queue_wait_seconds_count 4"), "{m}");
    // Four prompts of "Once upon a time": 16 byte tokens each in the demo vocabulary.
    assert!(m.contains("\ninferno_prompt_tokens_total 64\n"), "{m}");
    assert!(m.contains("\ninferno_running_streams 0\n"), "{m}");
    // The standard process metrics, of this server process (CPU time in whole seconds, as
    // the Prometheus client counts it: 0 for a young process).
    #[cfg(target_os = "linux")]
    for (series, least) in [
        ("process_cpu_seconds_total", 0.0),
        ("process_resident_memory_bytes", 1e6),
        ("process_open_fds", 3.0),
        ("process_max_fds", 3.0),
        ("process_start_time_seconds", 1e9),
    ] {
        let line = m
            .lines()
            .find(|l| l.starts_with(&format!("{series} ")))
            .unwrap_or_else(|| panic!("no {series}: {m}"));
        let v: f64 = line[series.len() + 1..].parse().unwrap();
        assert!(v >= least, "{line}");
    }
    assert!(http_get(p.metrics, "/nope").starts_with("HTTP/1.1 404"));
    let h = http_get(p.metrics, "/healthz");
    assert!(
        h.starts_with("HTTP/1.1 200 OK") && h.ends_with("ok\n"),
        "{h}"
    );

    // The same over the HTTP API (the OpenAI-compatible streamed completions).
    let http = loadtest(
        p.http,
        &[
            "--protocol",
            "http",
            "--concurrency",
            "2",
            "--requests",
            "2",
            "--max-tokens",
            "4",
        ],
    );
    assert_eq!(http["by_status"]["OK"], 2, "{http}");
    assert_eq!(http["completion_tokens"], 8, "{http}");
    assert_eq!(http["protocol"], "http", "{http}");
    let m = http_get(p.metrics, "/metrics");
    assert!(
        m.contains("inferno_requests_total{method=\"Generate\",code=\"OK\",protocol=\"http\"} 2"),
        "{m}"
    );

    // --baseline: the overhead is never negative, and carries the raw difference and its
    // noise.
    let report = loadtest(
        p.addr,
        &["--baseline", "--requests", "3", "--max-tokens", "8"],
    );
    let b = &report["baseline"];
    let (o, raw, noise) = (
        b["overhead_ms_per_token"].as_f64().unwrap(),
        b["overhead_raw_ms_per_token"].as_f64().unwrap(),
        b["overhead_noise_ms_per_token"].as_f64().unwrap(),
    );
    assert_eq!(o, raw.max(0.0), "{report}");
    assert!(noise.is_finite() && noise >= 0.0, "{report}");
    assert!(
        b["in_process_run_mean_inter_token_ms_p50"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{report}"
    );

    // SIGTERM while a request streams: it finishes, then the process exits 0.
    let mut c = client(p.addr).await;
    let mut s = c
        .generate(greedy("drain me", 30))
        .await
        .unwrap()
        .into_inner();
    next_token(&mut s).await;
    let killed = Command::new("kill")
        .args(["-TERM", &p.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let rest = collect(s).await;
    assert_eq!(rest.code(), Code::Ok, "{:?}", rest.status);
    assert_eq!(rest.tokens.len(), 29);
    assert_eq!(rest.finish_reason(), Some(FinishReason::Length));
    drop(c);
    let status = tokio::task::spawn_blocking(move || {
        let s = p.child.wait().unwrap();
        (s, p)
    })
    .await
    .unwrap()
    .0;
    assert!(status.success(), "exit status {status:?}");
}

#[test]
fn health_fails_where_nothing_serves() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["health", "--addr", &format!("http://127.0.0.1:{port}")])
        .args(["--timeout", "5s"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: cannot connect"), "{err}");
}

#[test]
fn serve_rejects_an_unknown_backend_at_once() {
    let out = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--backend",
            "warp-drive",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown backend"), "{err}");
}

/// Runs `inferno serve` with `args` on a free port and waits for it to exit (hang guard).
fn serve_exit(args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_inferno"))
        .args(["serve", "--listen", "127.0.0.1:0", "--http-listen", "none"])
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut s).unwrap();
        s
    });
    for _ in 0..1200 {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, reader.join().unwrap());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    panic!("serve {args:?} did not exit");
}

#[test]
fn serve_exits_1_with_the_error_when_the_model_cannot_load() {
    let dir = tempfile::tempdir().unwrap();
    let corrupt = dir.path().join("corrupt.gguf");
    std::fs::write(&corrupt, b"GGUF\x03\x00\x00\x00 not really a model").unwrap();
    let (status, err) = serve_exit(&["--model", corrupt.to_str().unwrap()]);
    assert_eq!(status.code(), Some(1), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ") && last.contains("corrupt.gguf"),
        "{err}"
    );
    // stderr is a pipe here: plain text, no colour codes.
    assert!(!err.contains('\u{1b}'), "ANSI codes in {err:?}");

    let missing = dir.path().join("missing.gguf");
    let (status, err) = serve_exit(&["--model", missing.to_str().unwrap()]);
    assert_eq!(status.code(), Some(1), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(last.contains("missing.gguf"), "{err}");
    assert_eq!(last.matches("os error").count(), 1, "{last}");
    assert_eq!(last.matches("missing.gguf").count(), 1, "{last}");
}

#[test]
fn serve_names_the_bad_tls_file() {
    let tls = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/service_support/tls");
    let p = |f: &str| tls.join(f).to_str().unwrap().to_string();
    let (cert, key, other) = (p("server.pem"), p("server.key"), p("other.key"));
    let (status, err) = serve_exit(&["--tls-cert", &cert, "--tls-key", &other]);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("other.key") && err.contains("does not match the certificate"),
        "{err}"
    );
    let (status, err) = serve_exit(&["--tls-cert", &key, "--tls-key", &key]);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("--tls-cert") && err.contains("server.key"),
        "{err}"
    );
    let (status, err) = serve_exit(&["--tls-cert", &cert, "--tls-key", &cert]);
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("--tls-key") && err.contains("server.pem"),
        "{err}"
    );
}

/// `inferno serve` under a shell's `ulimit` settings.
#[cfg(target_os = "linux")]
fn spawn_serve_limited(ulimit: &str) -> ServeProcess {
    let script = format!(
        "ulimit {ulimit} && exec \"$0\" serve --listen 127.0.0.1:0 --metrics-addr 127.0.0.1:0 \
         --http-listen 127.0.0.1:0"
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script, env!("CARGO_BIN_EXE_inferno")]);
    spawn_serve_command(cmd)
}

/// The soft and hard "Max open files" of a process.
#[cfg(target_os = "linux")]
fn open_file_limits(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[3].to_string(), f[4].to_string())
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_raises_its_open_file_limit_and_stays_reachable_past_it() {
    // A low soft limit under a higher hard one is raised to the hard one.
    let p = spawn_serve_limited("-Sn 100");
    let (soft, hard) = open_file_limits(p.child.id());
    assert_eq!(soft, hard, "soft limit raised to the hard limit");
    assert_ne!(soft, "100");
    drop(p);

    // With 128 descriptors in all, 300 idle sockets neither keep a client out nor make
    // the accept loop spin.
    let p = spawn_serve_limited("-n 128");
    wait_serving(p.addr).await;
    let addr = p.addr;
    let idle = tokio::task::spawn_blocking(move || {
        (0..300)
            .filter_map(|_| std::net::TcpStream::connect(addr).ok())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert!(idle.len() > 128, "the backlog took the sockets");
    let before = cpu_ticks(p.child.id());
    let served = tokio::time::timeout(Duration::from_secs(1), async {
        let mut c = client(addr).await;
        c.get_model_info(inferno::server::pb::GetModelInfoRequest {})
            .await
    })
    .await
    .expect("a real client is served within a second");
    assert!(served.is_ok(), "{served:?}");
    std::thread::sleep(Duration::from_secs(2));
    let used = (cpu_ticks(p.child.id()) - before) as f64 / 100.0;
    // A spinning accept loop burns a whole core; the margin absorbs the 10 ms tick.
    assert!(
        used < 1.0,
        "{used:.2}s of CPU in ~2s while past the descriptor limit"
    );
    drop(idle);
}
