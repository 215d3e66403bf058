//! `inferno serve`: runs the gRPC service and the OpenAI-compatible HTTP API on a small
//! tokio runtime, with the model on its own engine thread, until SIGINT or SIGTERM.

use crate::engine::limits::DEFAULT_TARGET_ITL;
use crate::engine::loader::{file_assets, synthetic_assets};
use crate::engine::speculative::Method;
use crate::engine::EngineConfig;
use crate::hub::ModelSpec;
use crate::server::auth::read_token_file;
use crate::server::{self, ServerConfig, TlsError, TlsPem};
use anyhow::{anyhow, Context, Result};
use clap::Args;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tracing::{info, warn};

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: super::args::ModelOrSynthetic,
    #[command(flatten)]
    pub run: super::args::RunArgs,
    #[command(flatten)]
    pub spec: super::args::SpecArgs,
    /// Address gRPC listens on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Address the OpenAI-compatible HTTP API listens on (port 0 picks a free port), or
    /// `none` for no HTTP API. It also serves /metrics and /health.
    #[arg(long, default_value = "127.0.0.1:8080", value_parser = parse_listen)]
    pub http_listen: Listen,
    /// The model's id in the HTTP API (the `model` of requests and of /v1/models).
    /// Default: the file's general.name, else its file name without .gguf.
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Generate requests that may wait to be admitted into the batch; more are refused with
    /// RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 16)]
    pub queue_capacity: usize,
    /// Sequences generated at once: each engine step runs one token of every running
    /// stream in a single forward pass.
    #[arg(long, default_value_t = 8)]
    pub max_batch: usize,
    /// Most prompt tokens one engine step processes for a starting request, so a long
    /// prompt delays running streams by one chunk at a time.
    #[arg(long, default_value_t = 256)]
    pub prefill_chunk: usize,
    /// While streams are generating, each engine step runs as many prompt tokens as keep
    /// the step (which every stream waits on) within this many milliseconds, sized from
    /// what steps are measured to cost on this machine (at least 8, at most
    /// --prefill-chunk). 0: a fixed chunk of --prefill-chunk-running.
    #[arg(long, default_value_t = DEFAULT_TARGET_ITL.as_millis() as u64)]
    pub target_itl_ms: u64,
    /// A fixed prefill chunk while other streams are generating, instead of the latency
    /// target (at most --prefill-chunk): each step of theirs waits for it.
    #[arg(long)]
    pub prefill_chunk_running: Option<usize>,
    /// KV-cache positions shared by all sequences (each running request reserves its prompt
    /// plus max_tokens; finished ones are kept for prompt-prefix reuse). Default: max-batch
    /// full contexts, capped at what fits in memory (available memory less the model and
    /// 20% of the total, at least 1 GiB; but at least one context).
    #[arg(long)]
    pub kv_cache_tokens: Option<usize>,
    /// On SIGINT/SIGTERM, how long in-flight requests may finish before they are cancelled
    /// (e.g. 30s, 500ms).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// Serve Prometheus metrics over HTTP at this address (path /metrics).
    #[arg(long)]
    pub metrics_addr: Option<SocketAddr>,
    /// TLS certificate chain (PEM); with --tls-key the service speaks TLS only.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// File holding a bearer token that every call except health must carry.
    #[arg(long)]
    pub auth_token_file: Option<PathBuf>,
    /// Largest request or response message in bytes.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub max_message_bytes: usize,
    /// max_tokens of a Generate request that does not set it.
    #[arg(long, default_value_t = 256)]
    pub default_max_tokens: usize,
    /// Threads of the async runtime that handles the network (the engine has its own).
    #[arg(long, default_value_t = 2)]
    pub runtime_threads: usize,
    /// Largest text one call may tokenize (a Tokenize text, a prompt, or a chat's messages
    /// together), in bytes.
    #[arg(long, default_value_t = 1024 * 1024)]
    pub max_text_bytes: usize,
    /// Tokenize, Detokenize and prompt preparations run at once, on threads of their own;
    /// more wait their turn.
    #[arg(long, default_value_t = 2)]
    pub cpu_jobs: usize,
    /// Open client connections at most, gRPC and HTTP together (lowered to fit the
    /// process's file-descriptor limit). Past it a new connection closes an idle one, or
    /// is refused when none is idle.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// How long a new connection may take to send its first request (TLS and HTTP/2
    /// handshakes included) before it is closed; an HTTP request's headers and body must
    /// arrive within it too.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub handshake_timeout: Duration,
    /// How long a connection with no open request is kept before it is closed.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// Memory for the Responses API's kept responses (for previous_response_id and GET
    /// /v1/responses/{id}), in bytes; the oldest are dropped to make room. 0 keeps none.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub responses_store_bytes: usize,
}

/// File descriptors kept free for everything but client connections (listeners, the model
/// file, the metrics endpoint, logs), at most a quarter of the limit.
const RESERVED_FDS: u64 = 64;

/// Raises the soft open-file limit to the hard one where allowed, and returns the
/// connection cap that fits under it.
fn fit_connections(asked: usize) -> usize {
    let limit = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => n,
        Err(e) => {
            warn!(error = %e, "cannot read or raise the open-file limit");
            return asked;
        }
    };
    let reserve = RESERVED_FDS.min(limit / 4);
    let fit = usize::try_from(limit - reserve)
        .unwrap_or(usize::MAX)
        .max(1);
    if fit < asked {
        warn!(
            max_connections = fit,
            asked,
            open_file_limit = limit,
            "--max-connections lowered to fit the open-file limit"
        );
    }
    asked.min(fit)
}

/// A listening address, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listen(pub Option<SocketAddr>);

/// Parses `none` or an address.
pub fn parse_listen(s: &str) -> Result<Listen, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(Listen(None));
    }
    s.parse()
        .map(|a| Listen(Some(a)))
        .map_err(|e| format!("{s:?} is neither an address (e.g. 127.0.0.1:8080) nor none: {e}"))
}

/// Parses "30s", "500ms", "2m" or a plain number of seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("invalid duration {s:?} (e.g. 30s, 500ms, 2m)"))?;
    let secs = match unit.trim() {
        "" | "s" => n,
        "ms" => n / 1e3,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration unit in {s:?} (use ms, s, m or h)"
            ))
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

pub fn cmd_serve(a: ServeArgs) -> Result<()> {
    let auth_token = match &a.auth_token_file {
        Some(p) => Some(
            read_token_file(p)
                .with_context(|| format!("cannot read the token file {}", p.display()))?,
        ),
        None => None,
    };
    let tls = match (&a.tls_cert, &a.tls_key) {
        (Some(c), Some(k)) => {
            let read = |p: &PathBuf| {
                std::fs::read(p).map_err(|e| anyhow!("cannot read {}: {e}", p.display()))
            };
            let pem = TlsPem {
                cert: read(c)?,
                key: read(k)?,
            };
            pem.check().map_err(|e| match e {
                TlsError::Certificate(_) => anyhow!("--tls-cert {}: {e}", c.display()),
                TlsError::Key(_) => anyhow!("--tls-key {}: {e}", k.display()),
                TlsError::KeyMismatch => anyhow!(
                    "--tls-key {} does not match the certificate in --tls-cert {}",
                    k.display(),
                    c.display()
                ),
            })?;
            Some(pem)
        }
        _ => None,
    };
    let speculation = a.spec.speculation(Method::Ngram)?;
    for addr in std::iter::once(a.listen).chain(a.http_listen.0) {
        if !addr.ip().is_loopback() && auth_token.is_none() {
            warn!(listen = %addr, "listening beyond loopback without --auth-token-file");
        }
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    let config = ServerConfig {
        listen: a.listen,
        metrics_addr: a.metrics_addr,
        http_listen: a.http_listen.0,
        served_model_name: a.served_model_name.clone(),
        engine: EngineConfig {
            queue_capacity: a.queue_capacity.max(1),
            max_seqs: a.max_batch.max(1),
            prefill_chunk: a.prefill_chunk.max(1),
            prefill_chunk_running: a
                .prefill_chunk_running
                .unwrap_or(EngineConfig::default().prefill_chunk_running)
                .max(1),
            // An explicit chunk replaces the target.
            target_itl: (a.prefill_chunk_running.is_none() && a.target_itl_ms > 0)
                .then(|| Duration::from_millis(a.target_itl_ms)),
            kv_cache_tokens: a.kv_cache_tokens.map(|n| n.max(1)),
            speculation,
            ..EngineConfig::default()
        },
        drain_timeout: a.drain_timeout,
        auth_token,
        tls,
        max_message_bytes: a.max_message_bytes,
        default_max_tokens: a.default_max_tokens,
        max_text_bytes: a.max_text_bytes,
        cpu_jobs: a.cpu_jobs.max(1),
        max_connections: fit_connections(a.max_connections.max(1)),
        handshake_timeout: a.handshake_timeout,
        idle_timeout: a.idle_timeout,
        responses_store_bytes: a.responses_store_bytes,
    };
    let load = a.spec.load_options(a.run.load_options());
    // Check the backend now, so a typo (or, for gpu, a missing adapter) fails before
    // anything starts.
    let checked = crate::backend::create_backend(&load.backend, &Default::default())?;
    if let Some(gpu) = checked.gpu_backend() {
        info!(adapter = %gpu.context().describe(), "gpu backend");
    }
    drop(checked);
    // A typo in --model (or an unreadable token file) fails before anything starts; the
    // pull itself runs on the engine thread, as loading does, while health is NOT_SERVING.
    let model = match &a.model.model {
        Some(text) => Some((
            ModelSpec::parse(text).map_err(anyhow::Error::msg)?,
            a.model.hub.options()?,
        )),
        None => {
            warn!(preset = %a.model.synthetic, "{}", crate::engine::DEMO_NOTE);
            None
        }
    };
    let synthetic = a.model.synthetic.clone();
    let loader = move || match model {
        Some((ModelSpec::Local(path), _)) => {
            info!(model = %path.display(), "loading the model");
            file_assets(&path, &load)
        }
        Some((ModelSpec::Hub(r), hub)) => {
            info!(model = %r, "pulling the model (if not cached) before serving");
            let pulled = crate::hub::pull(&r, &hub).map_err(|e| e.to_string())?;
            info!(
                model = %r,
                path = %pulled.path.display(),
                downloaded_bytes = pulled.downloaded,
                "loading the model"
            );
            file_assets(&pulled.path, &load)
        }
        None => synthetic_assets(&synthetic, &load),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.runtime_threads.max(1))
        .thread_name("inferno-rt")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let server = server::start(config, loader).await?;
        // A plain line on stdout for scripts that start the server on port 0.
        let mut out = std::io::stdout().lock();
        writeln!(out, "inferno: gRPC listening on {}", server.addr())?;
        if let Some(m) = server.metrics_addr() {
            writeln!(out, "inferno: metrics listening on http://{m}/metrics")?;
        }
        if let Some(h) = server.http_addr() {
            writeln!(out, "inferno: HTTP listening on {scheme}://{h}")?;
        }
        out.flush()?;
        drop(out);
        server.serve_until(server::shutdown_signal()).await?;
        info!("stopped");
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5d").is_err());
    }
}
