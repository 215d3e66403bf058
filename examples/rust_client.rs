//! Streams a completion from an Inferno server to the terminal with the generated tonic
//! client.
//!
//! ```sh
//! cargo run --release -- serve &
//! cargo run --example rust_client -- --addr http://127.0.0.1:50051 "Once upon a time"
//! ```

use clap::Parser;
use inferno::server::pb::generate_response::Event;
use inferno::server::pb::inference_client::InferenceClient;
use inferno::server::pb::{
    ChatMessage, FinishReason, GenerateRequest, GetModelInfoRequest, SamplingParams,
};
use std::io::Write;
use std::time::Duration;

#[derive(Parser)]
struct Args {
    #[arg(default_value = "Once upon a time")]
    prompt: String,
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    addr: String,
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// Send the prompt as a user message (rendered with the model's chat template).
    #[arg(long)]
    chat: bool,
    /// File holding the server's bearer token.
    #[arg(long)]
    token_file: Option<std::path::PathBuf>,
    /// Deadline in seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

/// A request carrying the bearer token, if any, and a deadline.
fn request<T>(msg: T, token: &Option<String>, timeout_s: u64) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", t.parse().expect("token is ASCII"));
    }
    r.set_timeout(Duration::from_secs(timeout_s));
    r
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let token = match &args.token_file {
        Some(p) => Some(format!("Bearer {}", std::fs::read_to_string(p)?.trim())),
        None => None,
    };
    let mut client = InferenceClient::connect(args.addr.clone()).await?;
    let info = client
        .get_model_info(request(GetModelInfoRequest {}, &token, args.timeout))
        .await?
        .into_inner();
    eprintln!(
        "[{}: {}, {}, context {}]",
        info.name, info.architecture, info.quantization, info.context_length
    );
    if !info.note.is_empty() {
        eprintln!("[{}]", info.note);
    }

    let mut req = GenerateRequest {
        max_tokens: Some(args.max_tokens),
        sampling: Some(SamplingParams {
            temperature: Some(args.temperature),
            seed: args.seed,
            ..Default::default()
        }),
        ..Default::default()
    };
    if args.chat {
        req.messages.push(ChatMessage {
            role: "user".into(),
            content: args.prompt.clone(),
            ..Default::default()
        });
    } else {
        req.prompt = args.prompt.clone();
    }
    let mut stream = client
        .generate(request(req, &token, args.timeout))
        .await?
        .into_inner();
    let mut out = std::io::stdout();
    // A stream that fails midway returns Err here: never mistaken for a finished one.
    while let Some(msg) = stream.message().await? {
        match msg.event {
            Some(Event::Token(t)) => {
                out.write_all(t.text.as_bytes())?;
                out.flush()?;
            }
            Some(Event::ToolCall(c)) => {
                writeln!(out, "\n[tool call {}: {}({})]", c.id, c.name, c.arguments)?;
            }
            Some(Event::Done(d)) => {
                writeln!(out, "{}", d.text)?;
                let reason = FinishReason::try_from(d.finish_reason)
                    .map(|r| r.as_str_name())
                    .unwrap_or("?");
                let usage = d.usage.unwrap_or_default();
                let t = d.timings.unwrap_or_default();
                eprintln!(
                    "[finish_reason={reason} prompt_tokens={} completion_tokens={} \
                     ttft_ms={:.1} decode_tok_s={:.1}]",
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    t.time_to_first_token_ms,
                    t.decode_tokens_per_second
                );
            }
            None => {}
        }
    }
    Ok(())
}
