//! Prometheus metrics for the service: counters, gauges and histograms kept with atomics
//! (requests, tokens, running streams, latencies, batch sizes, KV-cache occupancy) and, on
//! Linux, the standard `process_*` metrics, rendered in the text exposition format (the
//! HTTP front-end serves it at `/metrics`). The queue, running and KV-cache gauges are also
//! exported under the names vLLM gives them (`vllm:num_requests_waiting`,
//! `vllm:num_requests_running`, `vllm:kv_cache_usage_perc`, and its earlier name
//! `vllm:gpu_cache_usage_perc`), which the Kubernetes inference gateway's endpoint picker
//! reads by default.

use crate::engine::speculative::Method;
use crate::engine::{KvUsage, Observer, Outcome, Protocol};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Upper bounds (seconds) of the latency histograms' buckets.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
];

/// Upper bounds (seconds) of the grammar-mask histogram's buckets: a mask takes from
/// microseconds to milliseconds.
const MASK_BUCKETS: &[f64] = &[
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1,
];

/// Upper bounds of the batch-size histogram's buckets (sequences per engine step).
const BATCH_BUCKETS: &[u64] = &[1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64];

/// A fixed-bucket histogram of small whole numbers (sequences per step).
pub struct CountHistogram {
    /// Observations per bucket (not cumulative); the last one is +Inf.
    counts: Vec<AtomicU64>,
    sum: AtomicU64,
}

impl CountHistogram {
    fn new() -> Self {
        Self {
            counts: (0..=BATCH_BUCKETS.len())
                .map(|_| AtomicU64::new(0))
                .collect(),
            sum: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, v: u64) {
        let i = BATCH_BUCKETS.partition_point(|&b| b < v);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(v, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Observations at most `le`, summed over the buckets whose bound is at most `le`.
    pub fn count_le(&self, le: u64) -> u64 {
        BATCH_BUCKETS
            .iter()
            .zip(&self.counts)
            .take_while(|(b, _)| **b <= le)
            .map(|(_, c)| c.load(Ordering::Relaxed))
            .sum()
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cum = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            cum += c.load(Ordering::Relaxed);
            match BATCH_BUCKETS.get(i) {
                Some(b) => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cum}");
                }
            }
        }
        let _ = writeln!(out, "{name}_sum {}", self.sum.load(Ordering::Relaxed));
        let _ = writeln!(out, "{name}_count {cum}");
    }
}

/// A fixed-bucket histogram of durations.
pub struct Histogram {
    /// Upper bounds (seconds) of the buckets but the last.
    buckets: &'static [f64],
    /// Observations per bucket (not cumulative); the last one is +Inf.
    counts: Vec<AtomicU64>,
    sum_nanos: AtomicU64,
}

impl Histogram {
    fn new() -> Self {
        Self::with_buckets(LATENCY_BUCKETS)
    }

    fn with_buckets(buckets: &'static [f64]) -> Self {
        Self {
            buckets,
            counts: (0..=buckets.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = self.buckets.partition_point(|&b| b < s);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cum = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            cum += c.load(Ordering::Relaxed);
            match self.buckets.get(i) {
                Some(b) => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {cum}");
                }
            }
        }
        let sum = self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {cum}");
    }
}

/// Everything the service counts.
pub struct Metrics {
    /// Finished requests by (method, gRPC status code name, protocol).
    requests: Mutex<BTreeMap<(&'static str, &'static str, &'static str), u64>>,
    /// Tokens streamed so far, counted one by one as they are sampled.
    tokens: AtomicU64,
    prompt_tokens: AtomicU64,
    running: AtomicU64,
    auth_failures: AtomicU64,
    pub queue_wait: Histogram,
    pub time_to_first_token: Histogram,
    pub decode_step: Histogram,
    /// Time to compute each grammar mask of a constrained request.
    pub grammar_mask: Histogram,
    /// How long sampling waited for each mask (what the forward pass did not hide of its
    /// computation) and applied it.
    pub grammar_mask_wait: Histogram,
    constrained_requests: AtomicU64,
    /// Sequences in each engine step's forward pass.
    pub batch_size: CountHistogram,
    prompt_tokens_reused: AtomicU64,
    kv_reserved: AtomicU64,
    kv_cached: AtomicU64,
    kv_budget: AtomicU64,
    /// The served model's name, the `model_name` label of the vLLM-named gauges.
    model_name: OnceLock<String>,
    /// Speculative decoding, per method (ngram, draft, custom): draft tokens verified,
    /// those accepted, and the verifications.
    speculation: [SpecCounters; 3],
    #[cfg(target_os = "linux")]
    process: prometheus::process_collector::ProcessCollector,
}

/// One speculative method's counters.
#[derive(Default)]
struct SpecCounters {
    drafted: AtomicU64,
    accepted: AtomicU64,
    verifications: AtomicU64,
}

/// The methods counted, in [`Metrics::speculation`]'s order.
const SPEC_METHODS: [Method; 3] = [Method::Ngram, Method::Draft, Method::Custom];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self {
            requests: Mutex::new(BTreeMap::new()),
            tokens: AtomicU64::new(0),
            prompt_tokens: AtomicU64::new(0),
            running: AtomicU64::new(0),
            auth_failures: AtomicU64::new(0),
            queue_wait: Histogram::new(),
            time_to_first_token: Histogram::new(),
            decode_step: Histogram::new(),
            grammar_mask: Histogram::with_buckets(MASK_BUCKETS),
            grammar_mask_wait: Histogram::with_buckets(MASK_BUCKETS),
            constrained_requests: AtomicU64::new(0),
            batch_size: CountHistogram::new(),
            prompt_tokens_reused: AtomicU64::new(0),
            kv_reserved: AtomicU64::new(0),
            kv_cached: AtomicU64::new(0),
            kv_budget: AtomicU64::new(0),
            model_name: OnceLock::new(),
            speculation: Default::default(),
            #[cfg(target_os = "linux")]
            process: prometheus::process_collector::ProcessCollector::for_self(),
        }
    }

    /// Names the served model in the vLLM-named gauges (once; later calls are ignored).
    pub fn set_model_name(&self, name: &str) {
        let _ = self.model_name.set(name.to_string());
    }

    /// Reserved KV-cache positions as a fraction of the budget (0 before the model loads).
    pub fn kv_cache_usage(&self) -> f64 {
        let budget = self.kv_budget.load(Ordering::Relaxed);
        if budget == 0 {
            return 0.0;
        }
        self.kv_reserved.load(Ordering::Relaxed) as f64 / budget as f64
    }

    /// Prompt tokens reused from the prefix cache so far.
    pub fn prompt_tokens_reused(&self) -> u64 {
        self.prompt_tokens_reused.load(Ordering::Relaxed)
    }

    /// Counts one finished request that came through `protocol`.
    pub fn request(&self, protocol: Protocol, method: &'static str, code: &'static str) {
        let mut m = self
            .requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *m.entry((method, code, protocol.as_str())).or_insert(0) += 1;
    }

    /// Finished requests of `method` with status `code` so far, over both protocols.
    pub fn requests(&self, method: &str, code: &str) -> u64 {
        self.requests_by(None, method, code)
    }

    /// Finished requests of `method` with status `code` so far through `protocol` (or
    /// any, for `None`).
    pub fn requests_by(&self, protocol: Option<Protocol>, method: &str, code: &str) -> u64 {
        let m = self
            .requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        m.iter()
            .filter(|((me, c, p), _)| {
                *me == method && *c == code && protocol.is_none_or(|want| want.as_str() == *p)
            })
            .map(|(_, n)| *n)
            .sum()
    }

    pub fn auth_failure(&self) {
        self.auth_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Tokens generated so far, over all requests.
    pub fn tokens_total(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }

    /// Prompt tokens of the requests that started running so far.
    pub fn prompt_tokens_total(&self) -> u64 {
        self.prompt_tokens.load(Ordering::Relaxed)
    }

    /// Requests with a response format that started running so far.
    pub fn constrained_requests(&self) -> u64 {
        self.constrained_requests.load(Ordering::Relaxed)
    }

    /// Draft tokens verified and accepted so far with `method`.
    pub fn speculated_tokens(&self, method: Method) -> (u64, u64) {
        SPEC_METHODS
            .iter()
            .position(|&m| m == method)
            .map_or((0, 0), |i| {
                let c = &self.speculation[i];
                (
                    c.drafted.load(Ordering::Relaxed),
                    c.accepted.load(Ordering::Relaxed),
                )
            })
    }

    /// Requests running now (admitted into the batch and not yet ended).
    pub fn running_streams(&self) -> u64 {
        self.running.load(Ordering::Relaxed)
    }

    /// `process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_open_fds` and
    /// the rest of the standard process metrics, as the Prometheus clients name them.
    #[cfg(target_os = "linux")]
    fn render_process(&self, out: &mut String) {
        use prometheus::core::Collector;
        use prometheus::Encoder;
        let mut buf = Vec::new();
        // Encoding only fails on a malformed family, which the collector does not make.
        if prometheus::TextEncoder::new()
            .encode(&self.process.collect(), &mut buf)
            .is_ok()
        {
            out.push_str(&String::from_utf8_lossy(&buf));
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn render_process(&self, _out: &mut String) {}

    /// The gauges the inference gateway's endpoint picker reads, as vLLM names them: the
    /// same values as `inferno_queue_depth`, `inferno_running_streams` and
    /// `inferno_kv_cache_usage_ratio`.
    fn render_vllm(&self, out: &mut String, queue_depth: usize) {
        let labels = match self.model_name.get() {
            Some(name) => format!("{{model_name=\"{}\"}}", label_value(name)),
            None => String::new(),
        };
        for (name, help, value) in [
            (
                "vllm:num_requests_waiting",
                "Requests waiting to be admitted into the batch (as inferno_queue_depth).",
                queue_depth as f64,
            ),
            (
                "vllm:num_requests_running",
                "Requests running in the batch (as inferno_running_streams).",
                self.running.load(Ordering::Relaxed) as f64,
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage, 1 = full (as inferno_kv_cache_usage_ratio).",
                self.kv_cache_usage(),
            ),
            // vLLM's name for it before 0.10, which gateways set up then still read.
            (
                "vllm:gpu_cache_usage_perc",
                "KV-cache usage, 1 = full (vLLM's earlier name of vllm:kv_cache_usage_perc).",
                self.kv_cache_usage(),
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} gauge");
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self, queue_depth: usize, queue_capacity: usize) -> String {
        let mut out = String::with_capacity(4096);
        out.push_str(
            "# HELP inferno_requests_total Finished requests by method, gRPC status code \
             (an HTTP response's equivalent) and protocol (grpc or http).\n",
        );
        out.push_str("# TYPE inferno_requests_total counter\n");
        {
            let m = self
                .requests
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for ((method, code, protocol), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "inferno_requests_total{{method=\"{method}\",code=\"{code}\",\
                     protocol=\"{protocol}\"}} {n}"
                );
            }
        }
        let _ = write!(
            out,
            "# HELP inferno_queue_depth Generate requests waiting for the engine.\n\
             # TYPE inferno_queue_depth gauge\n\
             inferno_queue_depth {queue_depth}\n\
             # HELP inferno_queue_capacity Most Generate requests that may wait.\n\
             # TYPE inferno_queue_capacity gauge\n\
             inferno_queue_capacity {queue_capacity}\n\
             # HELP inferno_generated_tokens_total Tokens generated over all requests, counted as they stream.\n\
             # TYPE inferno_generated_tokens_total counter\n\
             inferno_generated_tokens_total {}\n\
             # HELP inferno_prompt_tokens_total Prompt tokens of the requests that started running.\n\
             # TYPE inferno_prompt_tokens_total counter\n\
             inferno_prompt_tokens_total {}\n\
             # HELP inferno_running_streams Requests running now: admitted into the batch and not yet ended.\n\
             # TYPE inferno_running_streams gauge\n\
             inferno_running_streams {}\n\
             # HELP inferno_auth_failures_total Requests refused for a missing or wrong token.\n\
             # TYPE inferno_auth_failures_total counter\n\
             inferno_auth_failures_total {}\n\
             # HELP inferno_prompt_tokens_reused_total Prompt tokens whose KV came from the prefix cache.\n\
             # TYPE inferno_prompt_tokens_reused_total counter\n\
             inferno_prompt_tokens_reused_total {}\n\
             # HELP inferno_kv_cache_reserved_tokens KV-cache positions reserved by running sequences.\n\
             # TYPE inferno_kv_cache_reserved_tokens gauge\n\
             inferno_kv_cache_reserved_tokens {}\n\
             # HELP inferno_kv_cache_cached_tokens KV-cache positions kept from finished sequences for prefix reuse.\n\
             # TYPE inferno_kv_cache_cached_tokens gauge\n\
             inferno_kv_cache_cached_tokens {}\n\
             # HELP inferno_kv_cache_capacity_tokens KV-cache positions for all sequences (the budget).\n\
             # TYPE inferno_kv_cache_capacity_tokens gauge\n\
             inferno_kv_cache_capacity_tokens {}\n\
             # HELP inferno_constrained_requests_total Requests with a response format (JSON schema, regex, grammar) that started running.\n\
             # TYPE inferno_constrained_requests_total counter\n\
             inferno_constrained_requests_total {}\n\
             # HELP inferno_kv_cache_usage_ratio KV-cache positions reserved by running sequences, as a fraction of the budget (0 to 1).\n\
             # TYPE inferno_kv_cache_usage_ratio gauge\n\
             inferno_kv_cache_usage_ratio {}\n",
            self.tokens.load(Ordering::Relaxed),
            self.prompt_tokens.load(Ordering::Relaxed),
            self.running.load(Ordering::Relaxed),
            self.auth_failures.load(Ordering::Relaxed),
            self.prompt_tokens_reused.load(Ordering::Relaxed),
            self.kv_reserved.load(Ordering::Relaxed),
            self.kv_cached.load(Ordering::Relaxed),
            self.kv_budget.load(Ordering::Relaxed),
            self.constrained_requests.load(Ordering::Relaxed),
            self.kv_cache_usage(),
        );
        self.render_vllm(&mut out, queue_depth);
        for (name, help, pick) in [
            (
                "inferno_speculative_drafted_tokens_total",
                "Draft tokens verified by speculative decoding, by method.",
                0,
            ),
            (
                "inferno_speculative_accepted_tokens_total",
                "Draft tokens kept (each equal to the model's own pick), by method.",
                1,
            ),
            (
                "inferno_speculative_verifications_total",
                "Sequence steps that verified draft tokens, by method.",
                2,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (m, c) in SPEC_METHODS.iter().zip(&self.speculation) {
                let v = [&c.drafted, &c.accepted, &c.verifications][pick].load(Ordering::Relaxed);
                let _ = writeln!(out, "{name}{{method=\"{}\"}} {v}", m.name());
            }
        }
        self.queue_wait.render(
            &mut out,
            "inferno_queue_wait_seconds",
            "Time Generate requests waited in the queue.",
        );
        self.time_to_first_token.render(
            &mut out,
            "inferno_time_to_first_token_seconds",
            "From the engine taking a request to its first token.",
        );
        self.decode_step.render(
            &mut out,
            "inferno_decode_step_seconds",
            "Time between consecutive tokens of a request.",
        );
        self.grammar_mask.render(
            &mut out,
            "inferno_grammar_mask_seconds",
            "Time to compute the allowed-token mask of one step of a constrained request.",
        );
        self.grammar_mask_wait.render(
            &mut out,
            "inferno_grammar_mask_wait_seconds",
            "Time sampling waited for the mask of one step of a constrained request (it is \
             computed while the step's forward pass runs) and applied it.",
        );
        self.batch_size.render(
            &mut out,
            "inferno_batch_size",
            "Sequences in each engine step's forward pass.",
        );
        self.render_process(&mut out);
        out
    }
}

/// A label value escaped as the text exposition format wants it.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Every streamed token is observed once as it is sampled: the first of a request by its
/// time to first token, each later one by its decode step. Both count it, so the token
/// counter moves while streams run (the request's total at its end is not added again).
impl Observer for Metrics {
    fn queue_wait(&self, wait: Duration) {
        self.queue_wait.observe(wait);
    }
    fn time_to_first_token(&self, ttft: Duration) {
        self.time_to_first_token.observe(ttft);
        self.tokens.fetch_add(1, Ordering::Relaxed);
    }
    fn decode_step(&self, step: Duration) {
        self.decode_step.observe(step);
        self.tokens.fetch_add(1, Ordering::Relaxed);
    }
    fn started(&self, prompt_tokens: usize) {
        self.prompt_tokens
            .fetch_add(prompt_tokens as u64, Ordering::Relaxed);
        self.running.fetch_add(1, Ordering::Relaxed);
    }
    fn ended(&self) {
        // Saturating: an `ended` without its `started` must not wrap the gauge.
        let _ = self
            .running
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
    fn finished(&self, outcome: Outcome, protocol: Protocol) {
        self.request(protocol, "Generate", outcome.code_name());
    }
    fn step(&self, batch_size: usize, _decode_rows: usize, _prefill_rows: usize) {
        self.batch_size.observe(batch_size as u64);
    }
    fn kv_usage(&self, u: KvUsage) {
        self.kv_reserved.store(u.reserved as u64, Ordering::Relaxed);
        self.kv_cached.store(u.cached as u64, Ordering::Relaxed);
        self.kv_budget.store(u.budget as u64, Ordering::Relaxed);
    }
    fn prompt_tokens_reused(&self, n: usize) {
        self.prompt_tokens_reused
            .fetch_add(n as u64, Ordering::Relaxed);
    }
    fn constrained_request(&self) {
        self.constrained_requests.fetch_add(1, Ordering::Relaxed);
    }
    fn grammar_mask(&self, took: Duration) {
        self.grammar_mask.observe(took);
    }
    fn grammar_mask_wait(&self, took: Duration) {
        self.grammar_mask_wait.observe(took);
    }
    fn speculated(&self, method: Method, drafted: usize, accepted: usize) {
        if let Some(i) = SPEC_METHODS.iter().position(|&m| m == method) {
            let c = &self.speculation[i];
            c.drafted.fetch_add(drafted as u64, Ordering::Relaxed);
            c.accepted.fetch_add(accepted as u64, Ordering::Relaxed);
            c.verifications.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new();
        h.observe(Duration::from_micros(300));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(100));
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"0.0005\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.005\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"60\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 3\n"), "{out}");
        assert!(out.contains("x_count 3\n"), "{out}");
        assert_eq!(h.count(), 3);
    }

    #[test]
    fn speculation_is_counted_per_method() {
        let m = Metrics::new();
        m.speculated(Method::Ngram, 8, 5);
        m.speculated(Method::Ngram, 4, 0);
        m.speculated(Method::Draft, 3, 3);
        let text = m.render(0, 16);
        for line in [
            "inferno_speculative_drafted_tokens_total{method=\"ngram\"} 12\n",
            "inferno_speculative_accepted_tokens_total{method=\"ngram\"} 5\n",
            "inferno_speculative_verifications_total{method=\"ngram\"} 2\n",
            "inferno_speculative_accepted_tokens_total{method=\"draft\"} 3\n",
            "inferno_speculative_drafted_tokens_total{method=\"custom\"} 0\n",
            "# TYPE inferno_speculative_drafted_tokens_total counter\n",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
        assert_eq!(m.speculated_tokens(Method::Draft), (3, 3));
    }

    #[test]
    fn render_lists_requests_by_method_and_code() {
        let m = Metrics::new();
        m.request(Protocol::Grpc, "Generate", "OK");
        m.request(Protocol::Grpc, "Generate", "OK");
        m.finished(Outcome::Cancelled, Protocol::Grpc);
        m.finished(Outcome::Cancelled, Protocol::Http);
        m.tokens_generated(5);
        let text = m.render(3, 16);
        assert!(text.contains(
            "inferno_requests_total{method=\"Generate\",code=\"OK\",protocol=\"grpc\"} 2\n"
        ));
        assert!(text.contains(
            "inferno_requests_total{method=\"Generate\",code=\"CANCELLED\",protocol=\"grpc\"} 1\n"
        ));
        assert!(text.contains(
            "inferno_requests_total{method=\"Generate\",code=\"CANCELLED\",protocol=\"http\"} 1\n"
        ));
        assert_eq!(m.requests("Generate", "CANCELLED"), 2);
        assert_eq!(
            m.requests_by(Some(Protocol::Http), "Generate", "CANCELLED"),
            1
        );
        assert!(text.contains("inferno_queue_depth 3\n"));
        // Tokens count as they stream; a request's total at its end adds nothing more.
        assert!(
            text.contains("inferno_generated_tokens_total 0\n"),
            "{text}"
        );
        m.time_to_first_token(Duration::from_millis(5));
        m.decode_step(Duration::from_millis(1));
        m.decode_step(Duration::from_millis(1));
        assert!(m
            .render(3, 16)
            .contains("inferno_generated_tokens_total 3\n"));
        m.started(7);
        m.started(5);
        m.ended();
        let text = m.render(3, 16);
        assert!(text.contains("inferno_prompt_tokens_total 12\n"), "{text}");
        assert!(text.contains("inferno_running_streams 1\n"), "{text}");
        m.ended();
        m.ended();
        assert_eq!(m.running_streams(), 0);
        #[cfg(target_os = "linux")]
        for series in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(&format!("\n{series}")), "{series}: {text}");
        }
        assert_eq!(m.requests("Generate", "OK"), 2);
        m.step(3, 2, 17);
        m.step(8, 8, 0);
        m.kv_usage(KvUsage {
            reserved: 40,
            cached: 2,
            budget: 100,
        });
        let text = m.render(0, 16);
        assert!(
            text.contains("inferno_batch_size_bucket{le=\"3\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("inferno_batch_size_bucket{le=\"+Inf\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("inferno_batch_size_sum 11\n"), "{text}");
        assert!(
            text.contains("inferno_kv_cache_reserved_tokens 40\n"),
            "{text}"
        );
        assert!(
            text.contains("inferno_kv_cache_cached_tokens 2\n"),
            "{text}"
        );
        assert!(
            text.contains("inferno_kv_cache_capacity_tokens 100\n"),
            "{text}"
        );
        assert_eq!(m.batch_size.count_le(4), 1);
        // The gateway's names carry the same values.
        assert!(
            text.contains("\ninferno_kv_cache_usage_ratio 0.4\n"),
            "{text}"
        );
        assert!(text.contains("\nvllm:kv_cache_usage_perc 0.4\n"), "{text}");
        assert!(text.contains("\nvllm:gpu_cache_usage_perc 0.4\n"), "{text}");
        assert!(text.contains("\nvllm:num_requests_waiting 0\n"), "{text}");
        assert!(text.contains("\nvllm:num_requests_running 0\n"), "{text}");
        m.set_model_name("qwen \"x\"");
        let text = m.render(2, 16);
        assert!(
            text.contains("\nvllm:num_requests_waiting{model_name=\"qwen \\\"x\\\"\"} 2\n"),
            "{text}"
        );
    }
}
