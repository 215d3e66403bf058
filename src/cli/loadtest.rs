//! `inferno loadtest`: a load generator for a running service. Sends a bounded number of
//! Generate calls (or, with `--protocol http`, streamed `/v1/completions` requests of the
//! OpenAI-compatible API) from concurrent clients (bounded in time too) and reports aggregate
//! throughput (tokens/s over all streams), time to first token and per-stream inter-token
//! latency percentiles, prompt tokens the server reused from its prefix cache, and counts
//! by status. With
//! `--baseline` it also runs the same request in-process on the same model and reports the
//! service's per-token overhead over the bare engine: the median over requests of each
//! stream's mean gap between tokens, on both sides, with the noise of that difference.

use super::args::OutputFormat;
use super::serve::parse_duration;
use crate::engine::loader::{file_assets, synthetic_assets};
use crate::engine::request::{prompt_tokens, Prompt};
use crate::engine::{generate, Flow, GenerateOptions};
use crate::sampling::SamplingParams;
use crate::server::pb::{self, inference_client::InferenceClient};
use crate::server::service::code_name;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::transport::{Channel, Endpoint};

/// The API a load test speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadProtocol {
    /// inferno.v1.Inference/Generate over gRPC.
    Grpc,
    /// The OpenAI-compatible HTTP API: streamed POST /v1/completions.
    Http,
}

#[derive(Args, Debug)]
// --model and --synthetic name the model of --baseline here, not a served one.
#[command(
    mut_arg("model", |a| a.help(
        "Model for --baseline (default: the built-in synthetic model --synthetic names): a \
         local GGUF file or a Hugging Face Hub reference, as for `serve`"
    )),
    mut_arg("synthetic", |a| a.help(
        "Built-in synthetic model for --baseline without --model (use the server's \
         --synthetic): demo or 0.6b"
    ))
)]
pub struct LoadtestArgs {
    /// The service's address (gRPC's, or with --protocol http the HTTP API's, e.g.
    /// http://127.0.0.1:8080).
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// The API to load: grpc, or http (each token is a server-sent event).
    #[arg(long, value_enum, default_value_t = LoadProtocol::Grpc)]
    pub protocol: LoadProtocol,
    /// Clients sending requests at the same time.
    #[arg(long, short = 'c', default_value_t = 1)]
    pub concurrency: usize,
    /// Requests to send in all.
    #[arg(long, short = 'n', default_value_t = 16)]
    pub requests: usize,
    /// Start no new request after this long (e.g. 60s).
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Deadline of each request.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// Prompt of every request.
    #[arg(long, default_value = "Once upon a time")]
    pub prompt: String,
    /// max_tokens of every request.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: u32,
    /// Sampling temperature of every request (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Sampling seed of every request.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Keep generating past end-of-generation tokens (every request then has max_tokens).
    #[arg(long)]
    pub ignore_eos: bool,
    /// File holding the service's bearer token.
    #[arg(long)]
    pub auth_token_file: Option<PathBuf>,
    /// After each service request, run the same request in-process on the same model
    /// (--model, or the built-in synthetic one) and report the service's overhead per
    /// token. Needs --concurrency 1.
    #[arg(long)]
    pub baseline: bool,
    #[command(flatten)]
    pub model: super::args::ModelOrSynthetic,
    /// How --baseline runs its model (use the server's settings).
    #[command(flatten)]
    pub run: super::args::RunArgs,
    /// text for reading, json for scripts.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// What one request saw.
#[derive(Debug, Default)]
struct Sample {
    code: &'static str,
    ttft: Option<Duration>,
    /// Gaps between consecutive token messages.
    gaps: Vec<Duration>,
    tokens: usize,
    /// The server's own decode rate for this request.
    server_decode_tps: f64,
    /// Prompt tokens the server reused from its prefix cache.
    cached_prompt_tokens: usize,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn cmd_loadtest(a: LoadtestArgs) -> Result<()> {
    if a.concurrency == 0 || a.requests == 0 {
        bail!("--concurrency and --requests must be at least 1");
    }
    let token = match &a.auth_token_file {
        Some(p) => Some(crate::server::auth::read_token_file(p)?),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (samples, wall, in_process) = if a.baseline {
        if a.concurrency != 1 {
            bail!("--baseline compares one stream at a time: use --concurrency 1");
        }
        let mut base = Baseline::load(&a)?;
        let (samples, wall, in_process) = runtime.block_on(run_paired(&a, token, &mut base))?;
        (samples, wall, Some(in_process))
    } else {
        let (samples, wall) = runtime.block_on(run_load(&a, token))?;
        (samples, wall, None)
    };
    drop(runtime);

    let mut by_code: BTreeMap<&str, usize> = BTreeMap::new();
    for s in &samples {
        *by_code.entry(s.code).or_default() += 1;
    }
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.code == "OK").collect();
    let tokens: usize = ok.iter().map(|s| s.tokens).sum();
    let mut ttft: Vec<f64> = ok.iter().filter_map(|s| s.ttft.map(ms)).collect();
    ttft.sort_by(f64::total_cmp);
    let mut gaps: Vec<f64> = ok
        .iter()
        .flat_map(|s| s.gaps.iter().copied().map(ms))
        .collect();
    gaps.sort_by(f64::total_cmp);
    let gap_mean = mean(&gaps);
    // Each stream's own mean gap: how smooth streams are one by one under this load.
    let mut stream_gaps: Vec<f64> = ok
        .iter()
        .filter(|s| !s.gaps.is_empty())
        .map(|s| s.gaps.iter().copied().map(ms).sum::<f64>() / s.gaps.len() as f64)
        .collect();
    stream_gaps.sort_by(f64::total_cmp);
    let cached_prompt_tokens: usize = ok.iter().map(|s| s.cached_prompt_tokens).sum();
    let server_tps: Vec<f64> = ok
        .iter()
        .map(|s| s.server_decode_tps)
        .filter(|t| *t > 0.0)
        .collect();
    let server_ms_per_token = if server_tps.is_empty() {
        0.0
    } else {
        1e3 / (server_tps.iter().sum::<f64>() / server_tps.len() as f64)
    };
    let service_ms_per_token = percentile(&gaps, 50.0);
    // Per token, each side's cost is the median over requests of a stream's mean gap:
    // robust to the odd preemption on a busy machine (which would swamp a mean over all
    // gaps), and to HTTP/2 delivering several tokens in one read (which makes many single
    // gaps near 0, so that their median falls below the engine's own step).
    let baseline = in_process.map(|runs| {
        let mut all: Vec<f64> = runs.iter().flatten().copied().collect();
        all.sort_by(f64::total_cmp);
        let mut run_means: Vec<f64> = runs.iter().map(|g| mean(g)).collect();
        run_means.sort_by(f64::total_cmp);
        Baselined {
            gap_p50: percentile(&all, 50.0),
            gap_mean: mean(&all),
            per_token: percentile(&run_means, 50.0),
            noise: median_noise(&run_means),
        }
    });
    // The overhead is a difference of two medians, each with its sampling noise; a
    // negative one means no measurable overhead, and reads as zero.
    let service_stream_ms = percentile(&stream_gaps, 50.0);
    let overhead = baseline.as_ref().map(|b| {
        let raw = service_stream_ms - b.per_token;
        let noise = median_noise(&stream_gaps).hypot(b.noise);
        (raw.max(0.0), raw, noise)
    });

    let secs = wall.as_secs_f64().max(1e-9);
    let report = serde_json::json!({
        "addr": a.addr,
        "protocol": match a.protocol {
            LoadProtocol::Grpc => "grpc",
            LoadProtocol::Http => "http",
        },
        "concurrency": a.concurrency,
        "requests": samples.len(),
        "by_status": by_code,
        "wall_seconds": secs,
        "requests_per_second": ok.len() as f64 / secs,
        "completion_tokens": tokens,
        "tokens_per_second": tokens as f64 / secs,
        "aggregate_tokens_per_second": tokens as f64 / secs,
        "cached_prompt_tokens": cached_prompt_tokens,
        "ttft_ms": {"p50": percentile(&ttft, 50.0), "p99": percentile(&ttft, 99.0)},
        "inter_token_ms": {
            "mean": gap_mean,
            "p50": percentile(&gaps, 50.0),
            "p99": percentile(&gaps, 99.0),
        },
        "per_stream_mean_inter_token_ms": {
            "p50": percentile(&stream_gaps, 50.0),
            "p99": percentile(&stream_gaps, 99.0),
        },
        "server_decode_ms_per_token": server_ms_per_token,
        "baseline": baseline.as_ref().zip(overhead).map(|(b, (o, raw, noise))| serde_json::json!({
            "service_inter_token_ms_p50": service_ms_per_token,
            "service_inter_token_ms_mean": gap_mean,
            "in_process_inter_token_ms_p50": b.gap_p50,
            "in_process_inter_token_ms_mean": b.gap_mean,
            "service_stream_mean_inter_token_ms_p50": service_stream_ms,
            "in_process_run_mean_inter_token_ms_p50": b.per_token,
            "overhead_ms_per_token": o,
            "overhead_percent_of_decode_step": o / b.per_token * 100.0,
            "overhead_raw_ms_per_token": raw,
            "overhead_noise_ms_per_token": noise,
        })),
    });
    match a.output {
        OutputFormat::Json => println!("{report}"),
        OutputFormat::Text => {
            println!("target: {}  concurrency: {}", a.addr, a.concurrency);
            println!("requests: {}", samples.len());
            for (code, n) in &by_code {
                println!("  {code}: {n}");
            }
            println!("wall: {secs:.3} s");
            println!(
                "throughput: {:.2} requests/s, {:.1} tokens/s aggregate over all streams \
                 ({tokens} tokens)",
                ok.len() as f64 / secs,
                tokens as f64 / secs
            );
            println!(
                "time to first token: p50 {:.2} ms  p99 {:.2} ms",
                percentile(&ttft, 50.0),
                percentile(&ttft, 99.0)
            );
            println!(
                "inter-token (within each stream): mean {gap_mean:.4} ms  p50 {:.4} ms  \
                 p99 {:.4} ms",
                percentile(&gaps, 50.0),
                percentile(&gaps, 99.0)
            );
            println!(
                "per-stream mean inter-token: p50 {:.4} ms  p99 {:.4} ms",
                percentile(&stream_gaps, 50.0),
                percentile(&stream_gaps, 99.0)
            );
            println!("prompt tokens reused from the server's prefix cache: {cached_prompt_tokens}");
            println!("server-reported decode: {server_ms_per_token:.3} ms/token");
            if let Some((b, (o, raw, noise))) = baseline.as_ref().zip(overhead) {
                println!(
                    "in-process inter-token (same model, interleaved): mean {:.4} ms  \
                     p50 {:.4} ms",
                    b.gap_mean, b.gap_p50
                );
                println!(
                    "per token (median over requests of each stream's mean gap): service \
                     {service_stream_ms:.4} ms, in-process {:.4} ms",
                    b.per_token
                );
                println!(
                    "service overhead: {o:.4} ± {noise:.4} ms/token ({:.2}% of a decode step)",
                    o / b.per_token * 100.0
                );
                if raw < 0.0 {
                    println!(
                        "  (measured {raw:.4} ms: the service was the faster, {} its noise; \
                         shown as 0)",
                        if -raw <= 2.0 * noise {
                            "within"
                        } else {
                            "beyond"
                        }
                    );
                }
            }
        }
    }
    Ok(())
}

fn request(a: &LoadtestArgs) -> pb::GenerateRequest {
    pb::GenerateRequest {
        prompt: a.prompt.clone(),
        max_tokens: Some(a.max_tokens),
        sampling: Some(pb::SamplingParams {
            temperature: Some(a.temperature),
            seed: Some(a.seed),
            ..Default::default()
        }),
        ignore_eos: a.ignore_eos,
        ..Default::default()
    }
}

async fn connect(a: &LoadtestArgs) -> Result<Channel> {
    Endpoint::from_shared(a.addr.clone())
        .context("invalid --addr")?
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("cannot connect to {}", a.addr))
}

/// The request with the bearer token, if any, and a deadline.
fn authorized(
    req: pb::GenerateRequest,
    token: &Option<String>,
    timeout: Duration,
) -> tonic::Request<pb::GenerateRequest> {
    let mut r = tonic::Request::new(req);
    r.set_timeout(timeout);
    if let Some(t) = token {
        if let Ok(v) = format!("Bearer {t}").parse() {
            r.metadata_mut().insert("authorization", v);
        }
    }
    r
}

/// Where a load test's requests go.
#[derive(Clone)]
enum Target {
    Grpc {
        client: InferenceClient<Channel>,
        // Boxed: a request is far larger than the other variant.
        req: Box<pb::GenerateRequest>,
        token: Option<String>,
    },
    Http(Arc<HttpTarget>),
}

impl Target {
    async fn new(a: &LoadtestArgs, token: Option<String>) -> Result<Self> {
        Ok(match a.protocol {
            LoadProtocol::Grpc => Target::Grpc {
                client: InferenceClient::new(connect(a).await?)
                    .max_decoding_message_size(64 * 1024 * 1024),
                req: Box::new(request(a)),
                token,
            },
            LoadProtocol::Http => Target::Http(Arc::new(HttpTarget::new(a, token)?)),
        })
    }

    /// Sends one request and reads its stream to the end.
    async fn send(&mut self, timeout: Duration) -> Sample {
        match self {
            Target::Grpc { client, req, token } => {
                let r = authorized((**req).clone(), token, timeout);
                one(client, r, timeout).await
            }
            Target::Http(h) => h.one(timeout).await,
        }
    }
}

/// The OpenAI-compatible API's streamed completions, over a pooled HTTP/1.1 client.
struct HttpTarget {
    client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        axum::body::Body,
    >,
    uri: http::Uri,
    body: String,
    token: Option<String>,
}

impl HttpTarget {
    fn new(a: &LoadtestArgs, token: Option<String>) -> Result<Self> {
        let uri: http::Uri = format!("{}/v1/completions", a.addr.trim_end_matches('/'))
            .parse()
            .context("invalid --addr")?;
        let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
        connector.set_nodelay(true);
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build(connector);
        let body = serde_json::json!({
            "prompt": a.prompt,
            "max_tokens": a.max_tokens,
            "temperature": a.temperature,
            "seed": a.seed,
            "ignore_eos": a.ignore_eos,
            "stream": true,
            "stream_options": {"include_usage": true},
        })
        .to_string();
        Ok(Self {
            client,
            uri,
            body,
            token,
        })
    }

    async fn one(&self, timeout: Duration) -> Sample {
        let sent = Instant::now();
        let mut s = Sample::default();
        let run = async {
            let mut req = http::Request::post(self.uri.clone())
                .header(http::header::CONTENT_TYPE, "application/json");
            if let Some(t) = &self.token {
                req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
            }
            let req = req
                .body(axum::body::Body::from(self.body.clone()))
                .map_err(|_| "INTERNAL")?;
            let resp = self.client.request(req).await.map_err(|_| "UNAVAILABLE")?;
            let status = resp.status();
            if !status.is_success() {
                return Err(crate::server::http::error::code_name(status));
            }
            let mut body = axum::body::Body::new(resp.into_body()).into_data_stream();
            let mut pending = Vec::new();
            let mut last = None;
            use tokio_stream::StreamExt;
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|_| "UNAVAILABLE")?;
                let now = Instant::now();
                pending.extend_from_slice(&chunk);
                // Whole events only: `data: {...}` lines ended by a blank line.
                while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
                    let event: Vec<u8> = pending.drain(..end + 2).collect();
                    let text = String::from_utf8_lossy(&event);
                    let Some(data) = text.trim().strip_prefix("data:") else {
                        continue;
                    };
                    let data = data.trim();
                    if data == "[DONE]" {
                        continue;
                    }
                    let v: serde_json::Value =
                        serde_json::from_str(data).map_err(|_| "INTERNAL")?;
                    if v.get("error").is_some() {
                        return Err("INTERNAL");
                    }
                    if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                        s.cached_prompt_tokens = u["prompt_tokens_details"]["cached_tokens"]
                            .as_u64()
                            .unwrap_or(0) as usize;
                    }
                    let token = v["choices"][0]["text"]
                        .as_str()
                        .is_some_and(|t| !t.is_empty());
                    if token {
                        match last {
                            None => s.ttft = Some(now - sent),
                            Some(prev) => s.gaps.push(now - prev),
                        }
                        last = Some(now);
                        s.tokens += 1;
                    }
                }
            }
            Ok(())
        };
        s.code = match tokio::time::timeout(timeout, run).await {
            Ok(Ok(())) => "OK",
            Ok(Err(code)) => code,
            Err(_) => "DEADLINE_EXCEEDED",
        };
        s
    }
}

async fn run_load(a: &LoadtestArgs, token: Option<String>) -> Result<(Vec<Sample>, Duration)> {
    let target = Target::new(a, token).await?;
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..a.concurrency.min(a.requests) {
        let mut target = target.clone();
        let next = Arc::clone(&next);
        let (n, duration, timeout) = (a.requests, a.duration, a.timeout);
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            while next.fetch_add(1, Ordering::SeqCst) < n && start.elapsed() < duration {
                out.push(target.send(timeout).await);
            }
            out
        }));
    }
    let mut samples = Vec::new();
    for t in tasks {
        samples.extend(t.await?);
    }
    Ok((samples, start.elapsed()))
}

async fn one(
    client: &mut InferenceClient<Channel>,
    r: tonic::Request<pb::GenerateRequest>,
    timeout: Duration,
) -> Sample {
    let sent = Instant::now();
    let mut s = Sample::default();
    let run = async {
        let mut stream = client.generate(r).await?.into_inner();
        let mut last = None;
        while let Some(msg) = stream.message().await? {
            match msg.event {
                Some(pb::generate_response::Event::Token(_)) => {
                    let now = Instant::now();
                    match last {
                        None => s.ttft = Some(now - sent),
                        Some(prev) => s.gaps.push(now - prev),
                    }
                    last = Some(now);
                    s.tokens += 1;
                }
                Some(pb::generate_response::Event::Done(d)) => {
                    s.server_decode_tps = d.timings.map_or(0.0, |t| t.decode_tokens_per_second);
                    s.cached_prompt_tokens = d.usage.map_or(0, |u| u.cached_prompt_tokens as usize);
                }
                Some(pb::generate_response::Event::ToolCall(_)) | None => {}
            }
        }
        Ok::<(), tonic::Status>(())
    };
    // The client enforces the deadline over the whole stream, not only its start.
    s.code = match tokio::time::timeout(timeout, run).await {
        Ok(Ok(())) => "OK",
        Ok(Err(status)) => code_name(status.code()),
        Err(_) => "DEADLINE_EXCEEDED",
    };
    s
}

/// The same request run in-process on the same model: the bare engine, for comparison.
struct Baseline {
    assets: crate::engine::EngineAssets,
    prompt: Vec<u32>,
    opts: GenerateOptions,
    state: crate::model::State,
}

impl Baseline {
    fn load(a: &LoadtestArgs) -> Result<Self> {
        let load = a.run.load_options();
        let assets = match &a.model.model {
            Some(m) => file_assets(&a.model.hub.resolve(m)?, &load),
            None => synthetic_assets(&a.model.synthetic, &load),
        }
        .map_err(anyhow::Error::msg)?;
        // Built as the service builds a prompt.
        let prompt = prompt_tokens(
            &assets.tokenizer,
            &assets.chat_template,
            &Prompt::Text {
                text: a.prompt.clone(),
                parse_special: true,
            },
        )?;
        // Only the positions the baseline fills: a whole long context of cache is gigabytes.
        let positions = (prompt.len() + a.max_tokens as usize).min(assets.ctx_size);
        let state = assets.model.new_state(positions, assets.state_rows);
        let opts = GenerateOptions {
            max_tokens: a.max_tokens as usize,
            sampling: SamplingParams {
                temperature: a.temperature,
                seed: Some(a.seed),
                ..SamplingParams::default()
            },
            stop: Vec::new(),
            ignore_eos: a.ignore_eos,
            time_limit: None,
            grammar: None,
            speculate: true,
            ..GenerateOptions::default()
        };
        Ok(Self {
            assets,
            prompt,
            opts,
            state,
        })
    }

    /// One run; the gaps (ms) between consecutive tokens, measured as the service's client
    /// measures them (between token arrivals), here between token callbacks.
    fn run(&mut self) -> Result<Vec<f64>> {
        let a = &self.assets;
        let mut last: Option<Instant> = None;
        let mut gaps = Vec::with_capacity(self.opts.max_tokens);
        generate(
            &a.model,
            &a.tokenizer,
            &mut self.state,
            &self.prompt,
            &self.opts,
            |ev| {
                if ev.id.is_some() {
                    let now = Instant::now();
                    if let Some(prev) = last {
                        gaps.push(ms(now - prev));
                    }
                    last = Some(now);
                }
                Flow::Continue
            },
        )?;
        if gaps.is_empty() {
            bail!("the baseline generated fewer than two tokens; raise --max-tokens");
        }
        Ok(gaps)
    }
}

/// Longer than the thread pool's spin window before its workers park.
const QUIET: Duration = Duration::from_millis(20);

/// One stream at a time, alternating a service request with an in-process run, so both see
/// the same machine conditions.
async fn run_paired(
    a: &LoadtestArgs,
    token: Option<String>,
    base: &mut Baseline,
) -> Result<(Vec<Sample>, Duration, Vec<Vec<f64>>)> {
    let mut target = Target::new(a, token).await?;
    let start = Instant::now();
    let mut samples = Vec::new();
    let mut in_process = Vec::new();
    let mut service_time = Duration::ZERO;
    for _ in 0..a.requests {
        if start.elapsed() >= a.duration {
            break;
        }
        let t = Instant::now();
        samples.push(target.send(a.timeout).await);
        service_time += t.elapsed();
        // Let the side that just ran go quiet first: idle pool workers spin a moment
        // before they park, and would compete with the other side for the cores.
        tokio::time::sleep(QUIET).await;
        in_process.push(base.run()?);
        tokio::time::sleep(QUIET).await;
    }
    Ok((samples, service_time, in_process))
}

/// The in-process side of `--baseline`, in ms per token.
struct Baselined {
    /// Median and mean of all gaps between tokens.
    gap_p50: f64,
    gap_mean: f64,
    /// Median over runs of each run's mean gap, and its noise.
    per_token: f64,
    noise: f64,
}

/// The standard error of the median of `sorted`: 1.2533 σ / √n for roughly normal
/// samples, with σ estimated robustly as 1.4826 times the median absolute deviation.
fn median_noise(sorted: &[f64]) -> f64 {
    if sorted.len() < 2 {
        return 0.0;
    }
    let m = percentile(sorted, 50.0);
    let mut dev: Vec<f64> = sorted.iter().map(|x| (x - m).abs()).collect();
    dev.sort_by(f64::total_cmp);
    1.2533 * 1.4826 * percentile(&dev, 50.0) / (sorted.len() as f64).sqrt()
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::{median_noise, percentile};

    #[test]
    fn median_noise_shrinks_with_more_samples_and_is_zero_without_spread() {
        let few: Vec<f64> = (0..16).map(|i| 10.0 + (i % 4) as f64).collect();
        let many: Vec<f64> = (0..1600).map(|i| 10.0 + (i % 4) as f64).collect();
        let (mut few, mut many) = (few, many);
        few.sort_by(f64::total_cmp);
        many.sort_by(f64::total_cmp);
        assert!(median_noise(&few) > 0.0);
        // 100 times the samples: a tenth of the noise.
        let ratio = median_noise(&few) / median_noise(&many);
        assert!((ratio - 10.0).abs() < 1e-9, "{ratio}");
        assert_eq!(median_noise(&[5.0; 10]), 0.0);
        assert_eq!(median_noise(&[5.0]), 0.0);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
