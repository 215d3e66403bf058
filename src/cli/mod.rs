//! The `inferno` command line: generate, tokenize, logits, info, serve, health, loadtest,
//! bench, synth, quantize, and pull, list and rm for models from the Hugging Face Hub.
//!
//! Each command lives in its own module; the flags several share are in [`args`], defined
//! once. This module holds the top-level parser, the dispatch and logging.

pub mod args;
pub mod bench;
pub mod common;
pub mod generate;
pub mod health;
pub mod hub;
pub mod info;
pub mod loadtest;
pub mod logits;
pub mod quantize;
pub mod serve;
pub mod synth;
pub mod tokenize;

use clap::{Parser, Subcommand, ValueEnum};
use std::io::IsTerminal;

#[derive(Parser, Debug)]
#[command(
    name = "inferno",
    version,
    about = "LLM inference for GGUF models, served over gRPC and an OpenAI-compatible HTTP API"
)]
pub struct Cli {
    /// Log output format (filter with RUST_LOG, e.g. RUST_LOG=inferno=debug).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Pretty)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq)]
pub enum LogFormat {
    Pretty,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    Generate(generate::GenerateArgs),
    /// Print the token ids of a text as a JSON array.
    Tokenize(tokenize::TokenizeArgs),
    /// Print the logits for a sequence of token ids as JSON.
    Logits(logits::LogitsArgs),
    /// Describe a GGUF model: architecture, hyper-parameters, tensors, tokenizer.
    Info(info::InfoArgs),
    /// Serve a model over gRPC and the OpenAI-compatible HTTP API (the built-in demo model
    /// when no --model is given).
    Serve(serve::ServeArgs),
    /// Ask a running service's gRPC health whether it is serving (exit 0 only if it is).
    Health(health::HealthArgs),
    /// Load-test a running service: throughput, time to first token, status counts.
    Loadtest(loadtest::LoadtestArgs),
    /// Time prompt processing and generation, llama-bench style.
    Bench(bench::BenchArgs),
    /// Write a random-weight GGUF of a real model's shape (for benchmarks).
    Synth(synth::SynthArgs),
    /// Rewrite a GGUF model with its weight matrices in another type (e.g. Q8_0).
    Quantize(quantize::QuantizeArgs),
    /// Download a model from the Hugging Face Hub into its cache and print its local path.
    Pull(hub::PullArgs),
    /// List the GGUF models in the Hugging Face cache: reference, quantization, size, path.
    List(hub::ListArgs),
    /// Remove a model from the Hugging Face cache.
    Rm(hub::RmArgs),
}

/// Runs the command `cli` names.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Generate(a) => generate::cmd_generate(a),
        Command::Tokenize(a) => tokenize::cmd_tokenize(a),
        Command::Logits(a) => logits::cmd_logits(a),
        Command::Info(a) => info::cmd_info(a),
        Command::Serve(a) => serve::cmd_serve(a),
        Command::Health(a) => health::cmd_health(a),
        Command::Loadtest(a) => loadtest::cmd_loadtest(a),
        Command::Bench(a) => bench::cmd_bench(a),
        Command::Synth(a) => synth::cmd_synth(a),
        Command::Quantize(a) => quantize::cmd_quantize(a),
        Command::Pull(a) => hub::cmd_pull(a),
        Command::List(a) => hub::cmd_list(a),
        Command::Rm(a) => hub::cmd_rm(a),
    }
}

/// Logs to stderr; `RUST_LOG` filters (default: warnings, and info from inferno; the
/// Vulkan loader's and driver's own chatter that wgpu relays is left out, since the gpu
/// backend turns what matters into its own errors).
pub fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("warn,inferno=info,wgpu_hal=off"));
    // Colours only on a terminal: a log file or a test's captured output gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every subcommand and every flag or positional argument of every command says what it
    /// is for in `--help`.
    #[test]
    fn every_command_and_argument_has_a_help_text() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                // clap's own --help and --version.
                if id == "help" || id == "version" {
                    continue;
                }
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                if help.trim().is_empty() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_name() == "help" {
                    continue;
                }
                let sub_path = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() {
                    missing.push(sub_path.clone());
                }
                walk(sub, &sub_path, missing);
            }
        }
        let cmd = Cli::command();
        let mut missing = Vec::new();
        walk(&cmd, "inferno", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:?}");
        // The tree really was walked: a nested flag is reached.
        let generate = cmd.find_subcommand("generate").expect("generate");
        assert!(generate.get_arguments().any(|a| a.get_id() == "top_k"));
    }

    #[test]
    fn threads_help_says_what_zero_means() {
        let cmd = Cli::command();
        for name in ["generate", "serve", "loadtest", "logits"] {
            let sub = cmd.find_subcommand(name).expect(name);
            let threads = sub
                .get_arguments()
                .find(|a| a.get_id() == "threads")
                .unwrap_or_else(|| panic!("{name} has --threads"));
            let help = threads
                .get_help()
                .map(|h| h.to_string())
                .unwrap_or_default();
            assert!(help.contains("0 = "), "{name}: {help}");
        }
    }
}
