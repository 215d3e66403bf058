//! Where a command's model comes from (`--model`: a local file or a Hugging Face Hub
//! reference, with `--hf-token-file`), and the cache commands `pull`, `list` and `rm`.

use crate::hub::{self, HubOptions, ModelRef};
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;

/// The help of every `--model`.
pub const MODEL_HELP: &str = "A GGUF model: a local file (for a split model, its first part \
    ...-00001-of-0000N.gguf), or a model on the Hugging Face Hub, pulled into its cache when \
    missing: USER/REPO[:QUANT] (also hf.co/USER/REPO[:QUANT]; without QUANT, Q4_K_M, else \
    Q8_0, else the first GGUF) or USER/REPO/FILE.gguf, each with an optional @REVISION. An \
    existing local path always wins";

/// Access to the Hugging Face Hub, for commands that may pull a model.
#[derive(Args, Debug, Clone, Default)]
pub struct HubArgs {
    /// File holding a Hugging Face access token, for gated or private repositories (default:
    /// HF_TOKEN, else the token `hf auth login` saved). HF_ENDPOINT, HF_HOME and
    /// HF_HUB_OFFLINE=1 are read as huggingface_hub reads them.
    #[arg(long, value_name = "FILE")]
    pub hf_token_file: Option<PathBuf>,
}

impl HubArgs {
    pub fn options(&self) -> Result<HubOptions> {
        Ok(HubOptions::from_env(self.hf_token_file.as_deref())?)
    }

    /// The local file `model` names, pulling a Hub reference first.
    pub fn resolve(&self, model: &str) -> Result<PathBuf> {
        Ok(hub::resolve(model, &self.options()?)?)
    }
}

/// A command's model: `--model` and how to reach the Hub for it.
#[derive(Args, Debug, Clone)]
pub struct ModelSource {
    #[arg(long, short = 'm', value_name = "PATH|USER/REPO[:QUANT]", help = MODEL_HELP)]
    pub model: String,
    #[command(flatten)]
    pub hub: HubArgs,
}

impl ModelSource {
    /// The local file to open (see [`HubArgs::resolve`]).
    pub fn resolve(&self) -> Result<PathBuf> {
        self.hub.resolve(&self.model)
    }
}

#[derive(Args, Debug)]
pub struct PullArgs {
    /// The model: USER/REPO[:QUANT], hf.co/USER/REPO[:QUANT] or USER/REPO/FILE.gguf, with an
    /// optional @REVISION.
    pub reference: String,
    #[command(flatten)]
    pub hub: HubArgs,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// text for reading, json for scripts.
    #[arg(long, value_enum, default_value_t = super::OutputFormat::Text)]
    pub output: super::OutputFormat,
}

#[derive(Args, Debug)]
pub struct RmArgs {
    /// The cached model to remove, as `pull` takes it (or as `list` shows it).
    pub reference: String,
}

fn parse_ref(text: &str) -> Result<ModelRef> {
    ModelRef::parse(text).map_err(anyhow::Error::msg)
}

/// `inferno pull`: downloads the model when it is not cached, and prints the path of its
/// (first) file.
pub fn cmd_pull(a: PullArgs) -> Result<()> {
    let r = parse_ref(&a.reference)?;
    let pulled = hub::pull(&r, &a.hub.options()?)?;
    if pulled.downloaded == 0 {
        eprintln!("{r}: already in the cache");
    }
    println!("{}", pulled.path.display());
    Ok(())
}

/// `inferno list`: the GGUF models in the Hugging Face cache.
pub fn cmd_list(a: ListArgs) -> Result<()> {
    let cache = hub::hub_cache_dir();
    let models = hub::cached_models(&cache);
    if a.output == super::OutputFormat::Json {
        let rows: Vec<serde_json::Value> = models
            .iter()
            .map(|m| {
                serde_json::json!({
                    "reference": m.reference,
                    "quant": m.model.quant,
                    "size": m.size,
                    "parts": m.model.expected_parts,
                    "complete": m.complete(),
                    "commit": m.commit,
                    "path": m.path.display().to_string(),
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return Ok(());
    }
    if models.is_empty() {
        eprintln!("no GGUF models in {}", cache.display());
        return Ok(());
    }
    let width = models.iter().map(|m| m.reference.len()).max().unwrap_or(0);
    println!(
        "{:<width$}  {:<10}  {:>10}  PATH",
        "REFERENCE", "QUANT", "SIZE"
    );
    for m in &models {
        let mut path = m.path.display().to_string();
        if !m.complete() {
            path.push_str(&format!(
                "  (only {} of {} parts)",
                m.model.parts.len(),
                m.model.expected_parts
            ));
        }
        println!(
            "{:<width$}  {:<10}  {:>10}  {path}",
            m.reference,
            m.model.quant.as_deref().unwrap_or("-"),
            super::bench::bytes_shown(m.size),
        );
    }
    Ok(())
}

/// `inferno rm`: removes a cached model (its blobs too, unless another snapshot uses them).
pub fn cmd_rm(a: RmArgs) -> Result<()> {
    let r = parse_ref(&a.reference)?;
    // Only the cache is read: offline whatever the environment says.
    let opts = HubOptions {
        offline: true,
        ..HubOptions::from_env(None).context("cannot read the Hub settings")?
    };
    let removed = hub::remove(&r, &opts)?;
    for f in &removed.files {
        eprintln!("removed {}", f.display());
    }
    println!(
        "{r}: {} files removed, {} freed",
        removed.files.len(),
        super::bench::bytes_shown(removed.bytes)
    );
    Ok(())
}
