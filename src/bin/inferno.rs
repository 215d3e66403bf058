//! The `inferno` binary: parses the command line and reports errors as one line.

use clap::Parser;

fn main() {
    let cli = inferno::cli::Cli::parse();
    inferno::cli::init_logging(cli.log_format);
    if let Err(e) = inferno::cli::run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
