//! Which type each tensor of a model gets when it is quantized: one type for every matrix,
//! or one of llama.cpp's K-quant mixtures (Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K), which
//! spend more bits on the tensors that hurt most when squeezed (the output projection, a
//! share of the attention value and FFN down projections), chosen by the same rules so a
//! file made here has the per-tensor types llama.cpp's `llama-quantize` gives it.
//!
//! Not modelled: llama.cpp's special cases for Falcon, 8-expert MoE models and 70B Llama
//! (which only move those architectures' tensors between the same types).

use super::GgmlType;

/// What `quantize` is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Every quantizable matrix as this type (K types fall back where rows do not split
    /// into 256-value blocks, as in the mixtures).
    Pure(GgmlType),
    Q4KS,
    Q4KM,
    Q5KS,
    Q5KM,
    Q6K,
}

impl Scheme {
    /// Parses a `--dtype` name: a GGML type name (`q8_0`, `q4_k`, `f16`, ...) or a mixture
    /// (`q4_k_s`, `q4_k_m`, `q5_k_s`, `q5_k_m`; `q6_k` is both). Case-insensitive.
    pub fn from_name(s: &str) -> Option<Scheme> {
        Some(match s.to_ascii_lowercase().as_str() {
            "q4_k_s" => Scheme::Q4KS,
            "q4_k_m" => Scheme::Q4KM,
            "q5_k_s" => Scheme::Q5KS,
            "q5_k_m" => Scheme::Q5KM,
            "q6_k" => Scheme::Q6K,
            _ => Scheme::Pure(GgmlType::from_name(s)?),
        })
    }

    /// The type most matrices get.
    pub fn base(self) -> GgmlType {
        match self {
            Scheme::Pure(t) => t,
            Scheme::Q4KS | Scheme::Q4KM => GgmlType::Q4_K,
            Scheme::Q5KS | Scheme::Q5KM => GgmlType::Q5_K,
            Scheme::Q6K => GgmlType::Q6_K,
        }
    }

    /// llama.cpp's `general.file_type` (`llama_ftype`) for a file made with this scheme;
    /// `None` for types with no such code here. A pure Q4_K/Q5_K file is recorded as the
    /// `_S` mixture, the one that keeps most matrices at the base type.
    pub fn file_type(self) -> Option<u32> {
        Some(match self {
            Scheme::Pure(GgmlType::F32) => 0,
            Scheme::Pure(GgmlType::F16) => 1,
            Scheme::Pure(GgmlType::Q8_0) => 7,
            Scheme::Pure(GgmlType::BF16) => 32,
            Scheme::Pure(GgmlType::Q4_K) | Scheme::Q4KS => 14,
            Scheme::Q4KM => 15,
            Scheme::Pure(GgmlType::Q5_K) | Scheme::Q5KS => 16,
            Scheme::Q5KM => 17,
            Scheme::Pure(GgmlType::Q6_K) | Scheme::Q6K => 18,
            // The legacy types' codes (Q4_0, Q5_0).
            Scheme::Pure(t) => return super::file_type(t),
        })
    }
}

/// The roles the mixtures tell apart, from the tensor's GGUF name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Output,
    TokenEmbd,
    /// Value projections (alone or fused into QKV / KV-B): counted for the share rule.
    Value,
    FfnDown,
    Other,
}

fn role(name: &str) -> Role {
    if name == "output.weight" {
        Role::Output
    } else if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        Role::TokenEmbd
    } else if ["attn_qkv.weight", "attn_kv_b.weight", "attn_v.weight"]
        .iter()
        .any(|p| name.contains(p))
    {
        Role::Value
    } else if name.contains("ffn_down") {
        Role::FfnDown
    } else {
        Role::Other
    }
}

/// Whether a tensor is a weight matrix that quantization may touch: at least 2-D, named
/// `*weight`, and not one of the small or precision-critical tensors llama.cpp always
/// keeps (norms, MoE routers, position and token-type embeddings, convolution kernels).
pub fn is_quantizable(name: &str, dims: &[u64]) -> bool {
    const KEEP: [&str; 9] = [
        "_norm.weight",
        "ffn_gate_inp.weight",
        "position_embd.weight",
        "token_types.weight",
        "ssm_conv1d",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "attn_rel_b.weight",
    ];
    // GGML counts dimensions up to the last one longer than 1.
    let n_dims = dims.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
    n_dims >= 2
        && name.ends_with("weight")
        && !KEEP.iter().any(|k| name.contains(k))
        && !name.contains("time_mix_")
}

/// llama.cpp's "spend more bits here" rule for layer `i` of `n`: the first and last
/// eighth of the layers, and every third one in between.
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// A type whose blocks fit rows of `cols` values, stepping down as llama.cpp does when
/// they do not: Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, then F16.
fn fit_rows(t: GgmlType, cols: u64) -> GgmlType {
    use GgmlType::*;
    let fits = |t: GgmlType| cols.is_multiple_of(t.block_size() as u64);
    if fits(t) {
        return t;
    }
    let smaller = match t {
        Q2_K | Q3_K => Q4_0,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        other => other,
    };
    if fits(smaller) {
        smaller
    } else {
        F16
    }
}

/// The type of every tensor of a model under `scheme`, in the order given (the file's
/// order, which the share rules count in): `None` for tensors left as they are. `tensors`
/// are (name, dims) with dims innermost first; `n_layer` is the model's block count.
pub fn plan(scheme: Scheme, tensors: &[(&str, &[u64])], n_layer: usize) -> Vec<Option<GgmlType>> {
    let n_value = tensors
        .iter()
        .filter(|(n, d)| is_quantizable(n, d) && role(n) == Role::Value)
        .count();
    let tied = !tensors.iter().any(|(n, _)| *n == "output.weight");
    let (mut i_value, mut i_down) = (0usize, 0usize);
    tensors
        .iter()
        .map(|&(name, dims)| {
            if !is_quantizable(name, dims) {
                return None;
            }
            let cols = dims[0];
            let base = scheme.base();
            let t = match (scheme, role(name)) {
                (Scheme::Pure(t), _) => t,
                (_, Role::Output) => output_type(cols),
                (_, Role::TokenEmbd) if tied => output_type(cols),
                (_, Role::Value) => {
                    let i = i_value;
                    i_value += 1;
                    match scheme {
                        Scheme::Q4KM | Scheme::Q5KM if use_more_bits(i, n_value) => GgmlType::Q6_K,
                        Scheme::Q4KS if i < 4 => GgmlType::Q5_K,
                        _ => base,
                    }
                }
                (_, Role::FfnDown) => {
                    let i = i_down;
                    i_down += 1;
                    match scheme {
                        Scheme::Q4KM | Scheme::Q5KM if use_more_bits(i, n_layer) => GgmlType::Q6_K,
                        Scheme::Q4KS if i < n_layer / 8 => GgmlType::Q5_K,
                        _ => base,
                    }
                }
                _ => base,
            };
            Some(match t {
                GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => t,
                _ => fit_rows(t, cols),
            })
        })
        .collect()
}

/// The output projection (and a tied embedding) in every K mixture: Q6_K, or Q8_0 when
/// rows do not split into 256-value blocks.
fn output_type(cols: u64) -> GgmlType {
    if cols.is_multiple_of(256) {
        GgmlType::Q6_K
    } else {
        GgmlType::Q8_0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use GgmlType::*;

    /// A Qwen3-like tensor list (file order: embedding, then per block, then norm/output).
    fn model(layers: usize, hidden: u64, ffn: u64, output: bool) -> Vec<(String, Vec<u64>)> {
        let mut t = vec![("token_embd.weight".to_string(), vec![hidden, 1000])];
        for i in 0..layers {
            for (n, d) in [
                ("attn_norm.weight", vec![hidden]),
                ("attn_q.weight", vec![hidden, hidden]),
                ("attn_k.weight", vec![hidden, 256]),
                ("attn_v.weight", vec![hidden, 256]),
                ("attn_output.weight", vec![hidden, hidden]),
                ("attn_q_norm.weight", vec![128]),
                ("ffn_gate.weight", vec![hidden, ffn]),
                ("ffn_up.weight", vec![hidden, ffn]),
                ("ffn_down.weight", vec![ffn, hidden]),
            ] {
                t.push((format!("blk.{i}.{n}"), d));
            }
        }
        t.push(("output_norm.weight".into(), vec![hidden]));
        if output {
            t.push(("output.weight".into(), vec![hidden, 1000]));
        }
        t
    }

    fn run(scheme: Scheme, m: &[(String, Vec<u64>)], layers: usize) -> Vec<Option<GgmlType>> {
        let v: Vec<(&str, &[u64])> = m.iter().map(|(n, d)| (n.as_str(), d.as_slice())).collect();
        plan(scheme, &v, layers)
    }

    fn type_of(m: &[(String, Vec<u64>)], p: &[Option<GgmlType>], name: &str) -> Option<GgmlType> {
        p[m.iter().position(|(n, _)| n == name).unwrap()]
    }

    #[test]
    fn the_more_bits_layers_of_a_28_layer_model() {
        // 28 layers: the first 3, the last 4 (from 24) and every third from layer 5.
        let picked: Vec<usize> = (0..28).filter(|&i| use_more_bits(i, 28)).collect();
        assert_eq!(picked, [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]);
    }

    #[test]
    fn q4_k_m_of_a_tied_model() {
        let m = model(28, 1024, 3072, false);
        let p = run(Scheme::Q4KM, &m, 28);
        assert_eq!(type_of(&m, &p, "token_embd.weight"), Some(Q6_K));
        for i in 0..28 {
            let more = use_more_bits(i, 28);
            let want = if more { Q6_K } else { Q4_K };
            assert_eq!(
                type_of(&m, &p, &format!("blk.{i}.attn_v.weight")),
                Some(want)
            );
            assert_eq!(
                type_of(&m, &p, &format!("blk.{i}.ffn_down.weight")),
                Some(want)
            );
            for n in ["attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up"] {
                assert_eq!(type_of(&m, &p, &format!("blk.{i}.{n}.weight")), Some(Q4_K));
            }
            assert_eq!(type_of(&m, &p, &format!("blk.{i}.attn_norm.weight")), None);
            assert_eq!(
                type_of(&m, &p, &format!("blk.{i}.attn_q_norm.weight")),
                None
            );
        }
        assert_eq!(type_of(&m, &p, "output_norm.weight"), None);
    }

    #[test]
    fn untied_embeddings_keep_the_base_type_and_the_output_gets_q6_k() {
        let m = model(8, 512, 1536, true);
        for (scheme, base) in [
            (Scheme::Q4KS, Q4_K),
            (Scheme::Q4KM, Q4_K),
            (Scheme::Q5KM, Q5_K),
            (Scheme::Q6K, Q6_K),
        ] {
            let p = run(scheme, &m, 8);
            assert_eq!(
                type_of(&m, &p, "token_embd.weight"),
                Some(base),
                "{scheme:?}"
            );
            assert_eq!(type_of(&m, &p, "output.weight"), Some(Q6_K), "{scheme:?}");
        }
        // Q4_K_S: the first four value projections and the first eighth of FFN down.
        let p = run(Scheme::Q4KS, &m, 8);
        for i in 0..8 {
            let v = type_of(&m, &p, &format!("blk.{i}.attn_v.weight"));
            assert_eq!(v, Some(if i < 4 { Q5_K } else { Q4_K }));
            let d = type_of(&m, &p, &format!("blk.{i}.ffn_down.weight"));
            assert_eq!(d, Some(if i < 1 { Q5_K } else { Q4_K }));
        }
    }

    #[test]
    fn rows_that_do_not_fill_256_value_blocks_fall_back() {
        // 992-wide rows split into 32-value blocks but not 256-value ones; 1001 into neither.
        let m: Vec<(String, Vec<u64>)> = vec![
            ("token_embd.weight".into(), vec![992, 50]),
            ("blk.0.attn_q.weight".into(), vec![992, 992]),
            ("blk.0.attn_v.weight".into(), vec![992, 64]),
            ("blk.0.ffn_up.weight".into(), vec![1001, 64]),
            ("output.weight".into(), vec![992, 50]),
        ];
        let p = run(Scheme::Q4KM, &m, 1);
        assert_eq!(
            p,
            [Some(Q5_0), Some(Q5_0), Some(Q8_0), Some(F16), Some(Q8_0)]
        );
        let p = run(Scheme::Q5KS, &m, 1);
        assert_eq!(
            p,
            [Some(Q5_1), Some(Q5_1), Some(Q5_1), Some(F16), Some(Q8_0)]
        );
        let p = run(Scheme::Pure(Q6_K), &m, 1);
        assert_eq!(
            p,
            [Some(Q8_0), Some(Q8_0), Some(Q8_0), Some(F16), Some(Q8_0)]
        );
    }

    #[test]
    fn names_and_file_types() {
        assert_eq!(Scheme::from_name("Q4_K_M"), Some(Scheme::Q4KM));
        assert_eq!(Scheme::from_name("q4_k"), Some(Scheme::Pure(Q4_K)));
        assert_eq!(Scheme::from_name("q6_k"), Some(Scheme::Q6K));
        assert_eq!(Scheme::from_name("q4_k_x"), None);
        assert_eq!(Scheme::Q4KM.file_type(), Some(15));
        assert_eq!(Scheme::Q5KM.file_type(), Some(17));
        assert_eq!(Scheme::Q6K.file_type(), Some(18));
        assert_eq!(Scheme::Q4KS.file_type(), Some(14));
        assert_eq!(Scheme::Q5KS.file_type(), Some(16));
        assert_eq!(Scheme::Pure(Q8_0).file_type(), Some(7));
        // The legacy types `inferno quantize` writes have llama.cpp's codes too.
        assert_eq!(Scheme::Pure(GgmlType::Q4_0).file_type(), Some(2));
        assert_eq!(Scheme::Pure(GgmlType::Q5_0).file_type(), Some(8));
        assert_eq!(Scheme::Pure(Q3_K).file_type(), None);
    }
}
