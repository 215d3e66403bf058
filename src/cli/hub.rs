//! `inferno pull`, `list` and `rm`: the GGUF models in the Hugging Face cache.

use super::args::{HubArgs, OutputFormat};
use crate::hub::{self, HubOptions, ModelRef};
use anyhow::{Context, Result};
use clap::Args;

#[derive(Args, Debug)]
pub struct PullArgs {
    /// The model: USER/REPO[:QUANT], hf.co/USER/REPO[:QUANT] or USER/REPO/FILE.gguf, with an
    /// optional @REVISION.
    // This comment is the --help text, where the brackets are literal, not links.
    #[allow(rustdoc::broken_intra_doc_links)]
    pub reference: String,
    #[command(flatten)]
    pub hub: HubArgs,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// text for reading, json for scripts.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
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
    if a.output == OutputFormat::Json {
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
