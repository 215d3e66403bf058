//! `inferno tokenize`: the token ids of a text, as the model's tokenizer encodes it.

use super::args::ModelSource;
use super::common::open_gguf;
use crate::tokenizer::Tokenizer;
use anyhow::{Context, Result};
use clap::Args;

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    /// The model whose tokenizer to use.
    #[command(flatten)]
    pub model: ModelSource,
    /// Treat special-token text such as <|im_start|> as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
    /// The text to encode.
    pub text: String,
}

pub fn cmd_tokenize(a: TokenizeArgs) -> Result<()> {
    let path = a.model.resolve()?;
    let gguf = open_gguf(&path)?;
    let tok = Tokenizer::from_gguf(&gguf)
        .with_context(|| format!("cannot load the tokenizer of {}", path.display()))?;
    let ids = tok.encode(&a.text, !a.no_parse_special)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}
