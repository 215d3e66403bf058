//! Which GGUF file of a repository a reference means. A repository usually holds one model
//! in several quantizations, named in the files (`Qwen3-0.6B-Q8_0.gguf`,
//! `Q4_K_M/Model-Q4_K_M-00001-of-00002.gguf`); a model split into parts counts once, by its
//! first part. Vision projectors (`mmproj-*.gguf`) are not models to run.
//!
//! Without a quantization the choice is Q4_K_M where the repository has it, else Q8_0, else
//! the first GGUF model (by path), as llama.cpp's `-hf` and Ollama's `hf.co/` choose. A
//! quantization matches a model whose file name carries it as a word (case-insensitive); one
//! that matches no model, or several, is an error that lists what the repository offers.

use inferno_gguf::split::parse_part_name;

/// One runnable model of a repository: a GGUF file, or the parts of a split one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepoModel {
    /// Paths in the repository, first part first (one for an unsplit file).
    pub parts: Vec<String>,
    /// How many parts the names say there are (1 for an unsplit file): more than
    /// `parts.len()` when the repository lacks some.
    pub expected_parts: usize,
    /// The quantization the name carries (`Q4_K_M`, `UD-Q4_K_XL`, `F16`), upper case.
    pub quant: Option<String>,
}

impl RepoModel {
    /// The first (or only) file.
    pub fn first(&self) -> &str {
        &self.parts[0]
    }

    /// The parts the repository lacks, by the names they would have.
    pub fn missing_parts(&self) -> Vec<String> {
        let Some((prefix, _, count)) = parse_part_name(self.first()) else {
            return Vec::new();
        };
        (1..=count)
            .map(|no| format!("{prefix}-{no:05}-of-{count:05}.gguf"))
            .filter(|name| !self.parts.contains(name))
            .collect()
    }

    /// How the model is named in a list: its quantization, else its first file.
    pub fn label(&self) -> String {
        self.quant
            .clone()
            .unwrap_or_else(|| self.first().to_string())
    }
}

/// The runnable GGUF models among a repository's file paths, ordered by their first file.
pub fn models(files: &[&str]) -> Vec<RepoModel> {
    let mut out: Vec<RepoModel> = Vec::new();
    let mut paths: Vec<&str> = files
        .iter()
        .copied()
        .filter(|f| f.to_ascii_lowercase().ends_with(".gguf") && !is_projector(f))
        .collect();
    paths.sort_unstable();
    for path in paths {
        match parse_part_name(path) {
            Some((prefix, _, count)) => {
                let same = |m: &RepoModel| {
                    parse_part_name(m.first()).is_some_and(|(p, _, c)| p == prefix && c == count)
                };
                match out.iter_mut().find(|m| same(m)) {
                    // Sorted paths put part 1 first.
                    Some(m) => m.parts.push(path.to_string()),
                    None => out.push(RepoModel {
                        parts: vec![path.to_string()],
                        expected_parts: count as usize,
                        quant: quant_of(prefix),
                    }),
                }
            }
            None => out.push(RepoModel {
                parts: vec![path.to_string()],
                expected_parts: 1,
                quant: quant_of(path.strip_suffix(".gguf").unwrap_or(path)),
            }),
        }
    }
    out
}

/// A multimodal projector file, not a language model.
fn is_projector(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path).to_ascii_lowercase();
    name.starts_with("mmproj") || name.contains("-mmproj")
}

/// The quantization a file name (without `.gguf`) carries: its last word (between `-`, `.`
/// and `/`) that reads as one, upper case, with an `UD-` (Unsloth's dynamic quants) before it
/// kept.
pub fn quant_of(stem: &str) -> Option<String> {
    let words: Vec<&str> = stem.split(['-', '.', '/']).collect();
    let i = words.iter().rposition(|w| is_quant_word(w))?;
    let q = words[i].to_ascii_uppercase();
    Some(match i.checked_sub(1).map(|j| words[j]) {
        Some(ud) if ud.eq_ignore_ascii_case("ud") => format!("UD-{q}"),
        _ => q,
    })
}

fn is_quant_word(w: &str) -> bool {
    let u = w.to_ascii_uppercase();
    let body_ok = |rest: &str| {
        rest.starts_with(|c: char| c.is_ascii_digit())
            && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    };
    if matches!(
        u.as_str(),
        "F16" | "F32" | "F64" | "BF16" | "FP16" | "FP32" | "MXFP4"
    ) {
        return true;
    }
    // Q8_0, Q4_K_M, IQ4_XS, TQ1_0: a digit after the prefix and an underscore somewhere, so
    // words such as "Q3" of "Qwen"-style names are not taken.
    ["IQ", "TQ", "Q"]
        .iter()
        .find_map(|p| u.strip_prefix(p))
        .is_some_and(|rest| body_ok(rest) && rest.contains('_'))
}

/// Whether `quant` names this model: its quantization, or a word of its first file's path.
fn matches(m: &RepoModel, quant: &str) -> bool {
    let q = quant.to_ascii_uppercase();
    if m.quant.as_deref() == Some(q.as_str()) {
        return true;
    }
    let path = m.first().to_ascii_uppercase();
    let bytes = path.as_bytes();
    path.match_indices(&q).any(|(at, _)| {
        let before = at.checked_sub(1).map(|i| bytes[i]);
        let after = bytes.get(at + q.len()).copied();
        matches!(before, None | Some(b'/' | b'-' | b'.' | b'_'))
            && matches!(after, None | Some(b'/' | b'-' | b'.'))
    })
}

/// Picks the model a reference means among a repository's models (see the module doc).
pub fn select<'a>(
    models: &'a [RepoModel],
    repo: &str,
    quant: Option<&str>,
    file: Option<&str>,
) -> Result<&'a RepoModel, String> {
    let offered = || offered(models);
    if models.is_empty() {
        return Err(format!("{repo} has no GGUF model files"));
    }
    if let Some(file) = file {
        return models
            .iter()
            .find(|m| m.parts.iter().any(|p| p == file))
            .ok_or_else(|| format!("{repo} has no file {file}; it offers {}", offered()));
    }
    let Some(quant) = quant else {
        let exact = |q: &str| models.iter().find(|m| m.quant.as_deref() == Some(q));
        return Ok(exact("Q4_K_M")
            .or_else(|| exact("Q8_0"))
            .unwrap_or(&models[0]));
    };
    let found: Vec<&RepoModel> = models.iter().filter(|m| matches(m, quant)).collect();
    match found.as_slice() {
        [one] => Ok(one),
        [] => Err(format!(
            "{repo} has no {quant} GGUF file; it offers {}",
            offered()
        )),
        many => {
            // A word inside several names: the one whose quantization it is exactly wins.
            let q = quant.to_ascii_uppercase();
            let exact: Vec<&&RepoModel> = many
                .iter()
                .filter(|m| m.quant.as_deref() == Some(q.as_str()))
                .collect();
            match exact.as_slice() {
                [one] => Ok(one),
                _ => Err(format!(
                    "{quant} matches several GGUF models of {repo}: {}; name one with \
                     {repo}/FILE.gguf",
                    many.iter()
                        .map(|m| m.first())
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            }
        }
    }
}

/// What a repository offers, for an error message: each model's label.
pub fn offered(models: &[RepoModel]) -> String {
    if models.is_empty() {
        return "no GGUF models".into();
    }
    models
        .iter()
        .map(RepoModel::label)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN: &[&str] = &[
        ".gitattributes",
        "README.md",
        "Qwen3-0.6B-Q8_0.gguf",
        "Qwen3-0.6B-F16.gguf",
        "params",
    ];

    const BIG: &[&str] = &[
        "Big-Q8_0-00002-of-00002.gguf",
        "Big-Q8_0-00001-of-00002.gguf",
        "Q4_K_M/Big-Q4_K_M-00001-of-00003.gguf",
        "Q4_K_M/Big-Q4_K_M-00002-of-00003.gguf",
        "Q4_K_M/Big-Q4_K_M-00003-of-00003.gguf",
        "Big-UD-Q4_K_XL.gguf",
        "Big-IQ4_XS.gguf",
        "mmproj-Big-F16.gguf",
    ];

    fn pick(files: &[&str], quant: Option<&str>) -> Result<String, String> {
        let m = models(files);
        select(&m, "u/r", quant, None).map(|m| m.first().to_string())
    }

    #[test]
    fn quantizations_are_read_from_names() {
        assert_eq!(quant_of("Qwen3-0.6B-Q8_0").as_deref(), Some("Q8_0"));
        assert_eq!(
            quant_of("qwen2.5-coder-0.5b-instruct-q4_k_m").as_deref(),
            Some("Q4_K_M")
        );
        assert_eq!(quant_of("Big-UD-Q4_K_XL").as_deref(), Some("UD-Q4_K_XL"));
        assert_eq!(quant_of("ggml-model-f16").as_deref(), Some("F16"));
        assert_eq!(quant_of("Model-IQ4_XS").as_deref(), Some("IQ4_XS"));
        assert_eq!(quant_of("Q4_K_M/Big-Q4_K_M").as_deref(), Some("Q4_K_M"));
        assert_eq!(quant_of("Qwen3-Q3"), None);
        assert_eq!(quant_of("model"), None);
    }

    #[test]
    fn split_parts_group_into_one_model_and_projectors_are_left_out() {
        let m = models(BIG);
        let labels: Vec<String> = m.iter().map(RepoModel::label).collect();
        assert_eq!(labels, ["IQ4_XS", "Q8_0", "UD-Q4_K_XL", "Q4_K_M"]);
        let q8 = &m[1];
        assert_eq!(
            q8.parts,
            [
                "Big-Q8_0-00001-of-00002.gguf",
                "Big-Q8_0-00002-of-00002.gguf"
            ]
        );
        assert!(q8.missing_parts().is_empty());
        let partial = models(&["A-Q8_0-00001-of-00003.gguf", "A-Q8_0-00003-of-00003.gguf"]);
        assert_eq!(partial[0].missing_parts(), ["A-Q8_0-00002-of-00003.gguf"]);
    }

    #[test]
    fn the_default_is_q4_k_m_then_q8_0_then_the_first() {
        assert_eq!(
            pick(BIG, None).unwrap(),
            "Q4_K_M/Big-Q4_K_M-00001-of-00003.gguf"
        );
        assert_eq!(pick(QWEN, None).unwrap(), "Qwen3-0.6B-Q8_0.gguf");
        assert_eq!(
            pick(&["m-F32.gguf", "m-F16.gguf"], None).unwrap(),
            "m-F16.gguf"
        );
    }

    #[test]
    fn a_quantization_matches_any_case_and_a_missing_one_lists_the_offer() {
        assert_eq!(pick(QWEN, Some("f16")).unwrap(), "Qwen3-0.6B-F16.gguf");
        assert_eq!(pick(BIG, Some("iq4_xs")).unwrap(), "Big-IQ4_XS.gguf");
        assert_eq!(
            pick(BIG, Some("ud-q4_k_xl")).unwrap(),
            "Big-UD-Q4_K_XL.gguf"
        );
        // Q4_K is a word of no name (Q4_K_M and Q4_K_XL go on past it).
        let err = pick(BIG, Some("Q4_K")).unwrap_err();
        assert!(
            err.contains("no Q4_K GGUF file") && err.contains("IQ4_XS, Q8_0, UD-Q4_K_XL, Q4_K_M"),
            "{err}"
        );
        let err = pick(QWEN, Some("Q4_K_M")).unwrap_err();
        assert!(err.contains("it offers F16, Q8_0"), "{err}");
    }

    #[test]
    fn an_ambiguous_quantization_names_the_files() {
        let files = ["a/Model-Q8_0.gguf", "b/Other-Q8_0.gguf"];
        let err = pick(&files, Some("q8_0")).unwrap_err();
        assert!(
            err.contains("several") && err.contains("a/Model-Q8_0.gguf, b/Other-Q8_0.gguf"),
            "{err}"
        );
        // A folder name matches too, and one exact quantization settles it.
        assert_eq!(
            pick(BIG, Some("q4_k_m")).unwrap(),
            "Q4_K_M/Big-Q4_K_M-00001-of-00003.gguf"
        );
    }

    #[test]
    fn a_file_names_its_model() {
        let m = models(BIG);
        let one = select(
            &m,
            "u/r",
            None,
            Some("Q4_K_M/Big-Q4_K_M-00002-of-00003.gguf"),
        )
        .unwrap();
        assert_eq!(one.parts.len(), 3);
        let err = select(&m, "u/r", None, Some("nope.gguf")).unwrap_err();
        assert!(err.contains("has no file nope.gguf"), "{err}");
        assert!(select(&[], "u/r", None, None)
            .unwrap_err()
            .contains("no GGUF model files"));
    }
}
