//! `inferno info`: what a GGUF file holds (architecture, hyper-parameters, tokenizer,
//! tensors), as text or JSON.

use super::args::{ModelSource, OutputFormat};
use super::common::open_gguf;
use anyhow::Result;
use clap::Args;

#[derive(Args, Debug)]
pub struct InfoArgs {
    /// The model to describe.
    #[command(flatten)]
    pub model: ModelSource,
    /// text for reading, json for scripts.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

pub fn cmd_info(a: InfoArgs) -> Result<()> {
    let path = a.model.resolve()?;
    let gguf = open_gguf(&path)?;
    let parts: Vec<String> = gguf
        .paths()
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let arch = gguf.architecture().ok().map(str::to_string);
    let config_result = crate::model::ModelConfig::from_gguf(&gguf);
    let config = config_result.as_ref().ok();
    let has_tokenizer = gguf.get("tokenizer.ggml.tokens").is_some();
    let tokenizer_model = gguf
        .get_str("tokenizer.ggml.model")
        .ok()
        .map(str::to_string);
    let has_template = gguf.get("tokenizer.chat_template").is_some();
    let tensors: Vec<serde_json::Value> = gguf
        .tensors()
        .iter()
        .map(|t| {
            serde_json::json!({
                "name": t.name, "dtype": t.dtype.name(), "dims": t.dims, "bytes": t.n_bytes,
                "supported": crate::tensor::is_supported(t.dtype),
            })
        })
        .collect();
    if a.output == OutputFormat::Json {
        let v = serde_json::json!({
            "file": path.display().to_string(),
            "parts": parts,
            "version": gguf.version(),
            "architecture": arch,
            "config": config.map(config_json),
            "config_error": config_result.as_ref().err().map(|e| e.to_string()),
            "tokenizer": tokenizer_model,
            "chat_template": has_template,
            "tensors": tensors,
        });
        println!("{v}");
        return Ok(());
    }
    println!("file: {}", path.display());
    if parts.len() > 1 {
        println!("split into {} parts:", parts.len());
        for p in &parts {
            println!("  {p}");
        }
    }
    println!("gguf version: {}", gguf.version());
    println!("architecture: {}", arch.as_deref().unwrap_or("(none)"));
    match &config_result {
        Ok(c) => {
            println!("  layers: {}", c.n_layers);
            println!("  hidden: {}", c.hidden);
            println!("  ffn: {}", c.ffn);
            if let Some(m) = c.moe {
                println!(
                    "  experts: {} ({} used per token, expert ffn {}, {})",
                    m.n_experts,
                    m.n_used,
                    m.expert_ffn,
                    if m.normalize {
                        "renormalised"
                    } else {
                        "not renormalised"
                    }
                );
            }
            println!(
                "  heads: {} (kv {}) x head_dim {}",
                c.n_heads, c.n_kv_heads, c.head_dim
            );
            println!("  vocab: {}", c.vocab);
            println!("  context_length: {}", c.context_length);
            println!("  rope_theta: {}", c.rope_theta);
            println!("  rope_scaling: {:?}", c.rope_scaling);
            println!("  rms_eps: {:e}", c.rms_eps);
        }
        Err(e) => println!("  (not runnable: {e})"),
    }
    println!(
        "tokenizer: {}",
        match (&tokenizer_model, has_tokenizer) {
            (Some(m), true) => m.as_str(),
            _ => "(none)",
        }
    );
    println!("chat template: {}", if has_template { "yes" } else { "no" });
    let total: u64 = gguf.tensors().iter().map(|t| t.n_bytes).sum();
    println!(
        "tensors: {} ({:.2} MiB)",
        gguf.tensors().len(),
        total as f64 / 1048576.0
    );
    for t in gguf.tensors() {
        let flag = if crate::tensor::is_supported(t.dtype) {
            ""
        } else {
            "  (unsupported)"
        };
        println!(
            "  {:<32} {:<6} {:?} {} bytes{}",
            t.name,
            t.dtype.name(),
            t.dims,
            t.n_bytes,
            flag
        );
    }
    Ok(())
}

/// A model's hyper-parameters as a JSON object, named as `info` prints them.
fn config_json(c: &crate::model::ModelConfig) -> serde_json::Value {
    // JSON numbers are f64: widen an f32 through its shortest decimal, so 1e-6 stays 1e-6
    // and does not print as 9.99999997e-7.
    let wide = |x: f32| x.to_string().parse::<f64>().unwrap_or(f64::from(x));
    let mut v = serde_json::json!({
        "architecture": c.arch.name(),
        "layers": c.n_layers,
        "hidden": c.hidden,
        "ffn": c.ffn,
        "heads": c.n_heads,
        "kv_heads": c.n_kv_heads,
        "head_dim": c.head_dim,
        "vocab": c.vocab,
        "context_length": c.context_length,
        "rope_theta": wide(c.rope_theta),
        "rms_eps": wide(c.rms_eps),
    });
    if let Some(m) = c.moe {
        v["experts"] = serde_json::json!({
            "count": m.n_experts,
            "used": m.n_used,
            "ffn": m.expert_ffn,
            "normalize": m.normalize,
        });
    }
    v
}
