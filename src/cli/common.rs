//! Helpers several commands share: opening a GGUF file with errors that name it, and
//! progress bars for long work.

use crate::gguf::GgufFile;
use anyhow::{Context, Result};
use std::path::Path;

/// Opens a GGUF file (a split model's first part), its errors naming the file.
pub fn open_gguf(path: &Path) -> Result<GgufFile> {
    match GgufFile::open(path) {
        Ok(f) => Ok(f),
        // Already names the file.
        Err(e @ crate::gguf::GgufError::Io { .. }) => Err(e.into()),
        Err(e) => Err(e).with_context(|| format!("cannot load model {}", path.display())),
    }
}

/// A progress bar on stderr for long work, drawn only when stderr is a terminal (hidden,
/// so silent, in logs and pipes).
pub fn progress_bar(len: u64, message: &'static str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(len),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{msg:>14} [{bar:40}] {pos}/{len} ({elapsed})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(message);
    bar
}
