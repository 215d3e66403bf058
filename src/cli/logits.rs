//! `inferno logits`: the logits one forward pass gives for a sequence of token ids.

use super::args::ModelArgs;
use crate::model::Logits;
use anyhow::{bail, Result};
use clap::Args;

#[derive(Args, Debug)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Comma-separated token ids.
    #[arg(long, value_delimiter = ',', required = true)]
    pub ids: Vec<u32>,
    /// Every position's logits instead of the last one's.
    #[arg(long)]
    pub all: bool,
}

pub fn cmd_logits(a: LogitsArgs) -> Result<()> {
    let l = a.model.load()?;
    let vocab = l.model.config.vocab;
    let n = a.ids.len();
    if n == 0 {
        bail!("--ids is empty");
    }
    // Only the positions the ids fill (a forward past the model's context is refused).
    let ctx = n.min(l.model.config.context_length);
    let mut state = l.model.new_state(ctx, l.state_rows);
    let rows = if a.all { n } else { 1 };
    let mut out = vec![0.0f32; rows * vocab];
    let logits = if a.all {
        Logits::All(&mut out)
    } else {
        Logits::Last(&mut out)
    };
    l.model.forward(&mut state, &a.ids, logits)?;
    let rows: Vec<&[f32]> = out.chunks(vocab).collect();
    let v = serde_json::json!({ "n_vocab": vocab, "logits": rows });
    println!("{v}");
    Ok(())
}
