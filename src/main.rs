//! The `inferno` binary: the command line ([`cli`], not library API) over the library's
//! crates; parses it and reports errors as one line.

mod cli;

// The layers the commands drive, under the names the library gives them.
use inferno::{backend, engine, gguf, hub, model, sampling, server, tensor, tokenizer};

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    cli::init_logging(cli.log_format);
    if let Err(e) = cli::run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
