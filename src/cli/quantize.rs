//! `inferno quantize`: rewrites a GGUF model with its weight matrices in another type or in
//! one of llama.cpp's K-quant mixtures (e.g. an F16 file to Q4_K_M, or a Q4_K_M file
//! requantized to Q8_0 for a like-for-like benchmark), keeping the metadata, the tokenizer
//! and the tensors quantization leaves alone (norms, biases) as they are.

use crate::gguf::{GgufWriter, Value};
use crate::tensor::{self, mixture, GgmlType};
use anyhow::{bail, Context, Result};
use clap::Args;
use rayon::prelude::*;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// The model to read.
    #[command(flatten)]
    pub model: super::args::ModelSource,
    /// Type of the weight matrices in the output: q8_0, q6_k, q5_k, q4_k, q5_0, q4_0,
    /// f16, bf16 or f32 (every matrix that type), or a llama.cpp mixture: q4_k_m, q4_k_s, q5_k_m,
    /// q5_k_s (q6_k is also that mixture: the same types).
    #[arg(long, default_value = "q8_0")]
    pub dtype: String,
    /// Where to write the new GGUF file.
    #[arg(long, short = 'o')]
    pub out: PathBuf,
}

pub fn cmd_quantize(a: QuantizeArgs) -> Result<()> {
    let scheme = mixture::Scheme::from_name(&a.dtype)
        .with_context(|| format!("unknown --dtype {:?}", a.dtype))?;
    let writable = tensor::can_encode(scheme.base());
    let Some(ftype) = scheme.file_type().filter(|_| writable) else {
        bail!(
            "cannot write {} weights (use q8_0, q6_k, q5_k, q4_k, q5_0, q4_0, f16, bf16, f32, \
             q4_k_m, q4_k_s, q5_k_m or q5_k_s)",
            a.dtype
        );
    };
    let input = a.model.resolve()?;
    let gguf = super::common::open_gguf(&input)?;
    let canon = |p: &std::path::Path| std::fs::canonicalize(p).ok();
    let same = |p: &std::path::Path| {
        p == a.out || matches!((canon(p), canon(&a.out)), (Some(x), Some(y)) if x == y)
    };
    if gguf.paths().into_iter().any(same) || input == a.out {
        bail!("--out must differ from --model (the input is memory-mapped while it is read)");
    }
    let mut w = GgufWriter::new();
    w.set_alignment(gguf.alignment() as u32);
    for (key, value) in gguf.metadata() {
        match key.as_str() {
            // The writer sets the alignment; the file type changes with the weights.
            "general.alignment" => {}
            // The output is one file, whatever the input was split into.
            k if k.starts_with("split.") => {}
            "general.file_type" => {
                w.add(key.clone(), Value::U32(ftype));
            }
            _ => {
                w.try_add(key.clone(), value.clone())?;
            }
        }
    }
    if gguf.get("general.file_type").is_none() {
        w.add("general.file_type", Value::U32(ftype));
    }
    let list: Vec<(&str, &[u64])> = gguf
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.dims.as_slice()))
        .collect();
    let plan = mixture::plan(scheme, &list, block_count(&gguf, &list));
    let (mut converted, mut kept) = (0usize, 0usize);
    for (t, target) in gguf.tensors().iter().zip(plan) {
        let data = gguf.tensor_data(&t.name)?;
        // Tensors already in their target type are copied, not requantized; types this
        // build cannot read are kept as they are.
        let target = target.filter(|&dt| dt != t.dtype && tensor::is_supported(t.dtype));
        let (dt, bytes) = match target {
            Some(dt) => {
                let cols = t.dims[0] as usize;
                let bytes = convert(t.dtype, data.as_slice(), cols, dt)
                    .with_context(|| format!("cannot convert tensor {} to {dt}", t.name))?;
                converted += 1;
                (dt, bytes)
            }
            None => {
                kept += 1;
                (t.dtype, data.as_slice().to_vec())
            }
        };
        w.add_tensor(t.name.clone(), &t.dims, dt, bytes)?;
    }
    if let Some(dir) = a.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    w.write_to(&a.out)
        .with_context(|| format!("cannot write {}", a.out.display()))?;
    eprintln!(
        "wrote {}: {converted} tensors converted ({}), {kept} kept as they were",
        a.out.display(),
        a.dtype
    );
    Ok(())
}

/// The model's layer count (`<arch>.block_count`), or one past the highest `blk.N.` in the
/// tensor names when the metadata lacks it. The mixtures' layer rules count against it.
fn block_count(gguf: &crate::gguf::GgufFile, list: &[(&str, &[u64])]) -> usize {
    let key = gguf
        .get_str("general.architecture")
        .map(|arch| format!("{arch}.block_count"));
    if let Some(n) = key.ok().and_then(|k| gguf.get_u64(&k).ok()) {
        return n as usize;
    }
    list.iter()
        .filter_map(|(n, _)| {
            n.strip_prefix("blk.")?
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .max()
        .map_or(0, |m| m + 1)
}

/// Rows of `cols` values stored as `from` in `src`, rewritten as `to`; rows are converted
/// in parallel (each on its own, so the result does not depend on the thread count).
fn convert(from: GgmlType, src: &[u8], cols: usize, to: GgmlType) -> Result<Vec<u8>> {
    let row_bytes = from
        .row_size(cols as u64)
        .with_context(|| format!("{cols} columns do not fill whole {from} blocks"))?
        as usize;
    if row_bytes == 0 || !src.len().is_multiple_of(row_bytes) {
        bail!("{} bytes are not whole rows of {row_bytes}", src.len());
    }
    let rows: Vec<Vec<u8>> = src
        .par_chunks(row_bytes)
        .map(|row| -> Result<Vec<u8>> {
            let mut vals = vec![0f32; cols];
            tensor::dequantize_row(from, row, &mut vals)?;
            Ok(tensor::encode(&vals, to)?)
        })
        .collect::<Result<_>>()?;
    Ok(rows.concat())
}
