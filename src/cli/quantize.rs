//! `inferno quantize`: rewrites a GGUF model with its weight matrices in another type
//! (e.g. a Q4_K_M file requantized to Q8_0 for a like-for-like benchmark), keeping the
//! metadata, the tokenizer and the 1-D tensors (norms, biases) as they are.

use crate::gguf::{GgufWriter, Value};
use crate::tensor::{self, GgmlType};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// GGUF model to read.
    #[arg(long, short = 'm')]
    pub model: PathBuf,
    /// Type of the weight matrices in the output: q8_0, q5_0, q4_0, f16, bf16 or f32.
    #[arg(long, default_value = "q8_0")]
    pub dtype: String,
    /// Where to write the new GGUF file.
    #[arg(long, short = 'o')]
    pub out: PathBuf,
}

pub fn cmd_quantize(a: QuantizeArgs) -> Result<()> {
    let dtype =
        GgmlType::from_name(&a.dtype).with_context(|| format!("unknown --dtype {:?}", a.dtype))?;
    let Some(ftype) = tensor::file_type(dtype) else {
        bail!("cannot write {dtype} weights (use q8_0, q5_0, q4_0, f16, bf16 or f32)");
    };
    if a.out == a.model {
        bail!("--out must differ from --model (the input is memory-mapped while it is read)");
    }
    let gguf = super::open_gguf(&a.model)?;
    let mut w = GgufWriter::new();
    w.set_alignment(gguf.alignment() as u32);
    for (key, value) in gguf.metadata() {
        match key.as_str() {
            // The writer sets the alignment; the file type changes with the weights.
            "general.alignment" => {}
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
    let (mut converted, mut kept) = (0usize, 0usize);
    for t in gguf.tensors() {
        let data = gguf.tensor_data(&t.name)?;
        let cols = t.dims.first().copied().unwrap_or(0) as usize;
        // Matrices whose rows split into whole blocks of the new type; 1-D tensors (norm
        // gains, biases) stay in their type, as llama.cpp's quantizer leaves them.
        let convert = t.dims.len() >= 2
            && t.dtype != dtype
            && cols > 0
            && cols % dtype.block_size() == 0
            && tensor::is_supported(t.dtype);
        let bytes = if convert {
            let rows = (t.n_elements() as usize) / cols;
            let row_bytes = data.len() / rows.max(1);
            let mut vals = vec![0f32; cols];
            let mut out = Vec::with_capacity(dtype.row_size(t.n_elements()).unwrap_or(0) as usize);
            for r in 0..rows {
                tensor::dequantize_row(
                    t.dtype,
                    &data.as_slice()[r * row_bytes..(r + 1) * row_bytes],
                    &mut vals,
                )
                .with_context(|| format!("cannot read tensor {}", t.name))?;
                out.extend_from_slice(&tensor::encode(&vals, dtype)?);
            }
            converted += 1;
            out
        } else {
            kept += 1;
            data.as_slice().to_vec()
        };
        let dt = if convert { dtype } else { t.dtype };
        w.add_tensor(t.name.clone(), &t.dims, dt, bytes)?;
    }
    if let Some(dir) = a.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    w.write_to(&a.out)
        .with_context(|| format!("cannot write {}", a.out.display()))?;
    eprintln!(
        "wrote {}: {converted} tensors converted to {dtype}, {kept} kept as they were",
        a.out.display()
    );
    Ok(())
}
