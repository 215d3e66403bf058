//! Model references: what a user may pass where a model file is taken. A path to a local
//! file always wins; otherwise the text names a model on the Hugging Face Hub:
//!
//! - `USER/REPO` (the repository's default quantization, see [`super::quant`]),
//! - `USER/REPO:QUANT` (the GGUF file whose name carries that quantization, any case),
//! - `USER/REPO/FILE.gguf` (that file; `FILE` may sit in folders of the repository),
//!
//! each optionally written `hf.co/...` or `huggingface.co/...` (with or without `https://`),
//! and each with an optional `@REVISION` (a branch, tag or commit; default `main`) before or
//! after the `:QUANT`.

use std::fmt;
use std::path::{Path, PathBuf};

/// A model on the Hub.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelRef {
    /// `USER/REPO`.
    pub repo: String,
    /// A file of the repository (its path there), when the reference names one.
    pub file: Option<String>,
    /// A quantization to look for in the file names (`Q4_K_M`, `q8_0`, ...).
    pub quant: Option<String>,
    /// Branch, tag or commit; `None` is `main`.
    pub revision: Option<String>,
}

/// The revision a reference without `@REV` takes.
pub const DEFAULT_REVISION: &str = "main";

impl ModelRef {
    /// The revision asked for (`main` by default).
    pub fn revision(&self) -> &str {
        self.revision.as_deref().unwrap_or(DEFAULT_REVISION)
    }

    /// Parses a Hub reference (without looking at local files).
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = |why: &str| {
            format!(
                "{text:?} is not a model reference ({why}): expected USER/REPO[:QUANT], \
                 hf.co/USER/REPO[:QUANT] or USER/REPO/FILE.gguf, with an optional @REVISION"
            )
        };
        let mut s = text.trim();
        for scheme in ["https://", "http://"] {
            s = s.strip_prefix(scheme).unwrap_or(s);
        }
        for host in ["hf.co/", "huggingface.co/"] {
            s = s.strip_prefix(host).unwrap_or(s);
        }
        // `@REV` runs to the end or to a `:QUANT` after it; a quant may also come before.
        let (left, revision, quant_after) = match s.split_once('@') {
            Some((l, r)) => match r.rsplit_once(':') {
                Some((rev, q)) => (l, Some(rev), Some(q)),
                None => (l, Some(r), None),
            },
            None => (s, None, None),
        };
        let (path, quant_before) = match left.split_once(':') {
            Some((p, q)) => (p, Some(q)),
            None => (left, None),
        };
        let quant = match (quant_before, quant_after) {
            (Some(_), Some(_)) => return Err(bad("two quantizations")),
            (q, None) | (None, q) => q,
        };
        if let Some(q) = quant {
            if q.is_empty()
                || !q
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(bad("the quantization must be letters, digits, _ and -"));
            }
        }
        if let Some(r) = revision {
            if r.is_empty() || r.contains("..") || r.chars().any(char::is_whitespace) {
                return Err(bad("an invalid revision"));
            }
        }
        let segments: Vec<&str> = path.split('/').collect();
        if segments.len() < 2 {
            return Err(bad("no USER/REPO"));
        }
        for part in &segments[..2] {
            if !valid_repo_name(part) {
                return Err(bad("USER and REPO take letters, digits, '-', '_' and '.'"));
            }
        }
        let file = if segments.len() > 2 {
            let file = segments[2..].join("/");
            if segments[2..]
                .iter()
                .any(|p| p.is_empty() || *p == "." || *p == "..")
            {
                return Err(bad("an invalid file path"));
            }
            if !file.to_ascii_lowercase().ends_with(".gguf") {
                return Err(bad("a file in the repository must be a .gguf file"));
            }
            if quant.is_some() {
                return Err(bad("a file and a quantization"));
            }
            Some(file)
        } else {
            None
        };
        Ok(ModelRef {
            repo: format!("{}/{}", segments[0], segments[1]),
            file,
            quant: quant.map(str::to_string),
            revision: revision.map(str::to_string),
        })
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.repo)?;
        if let Some(file) = &self.file {
            write!(f, "/{file}")?;
        }
        if let Some(q) = &self.quant {
            write!(f, ":{q}")?;
        }
        if let Some(r) = &self.revision {
            write!(f, "@{r}")?;
        }
        Ok(())
    }
}

/// A Hub user, organisation or repository name.
fn valid_repo_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 96
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !s.starts_with(['-', '.'])
        && !s.ends_with(['-', '.'])
        && !s.contains("--")
        && !s.contains("..")
}

/// What a `--model` value names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSpec {
    /// A file on this machine.
    Local(PathBuf),
    /// A model on the Hub.
    Hub(ModelRef),
}

impl ModelSpec {
    /// Reads a `--model` value: an existing path wins; text that can only be a path (it
    /// starts with `/`, `.` or `~`, or is `DIR/NAME.gguf`) is a path even when the file is
    /// missing, so the error says so; anything else must be a Hub reference.
    pub fn parse(text: &str) -> Result<Self, String> {
        let path = Path::new(text);
        let missing = match std::fs::metadata(path) {
            Ok(_) => return Ok(ModelSpec::Local(path.to_path_buf())),
            Err(e) => e,
        };
        let looks_local = text.starts_with(['/', '.', '~', '\\'])
            || text.contains('\\')
            || (text.split('/').count() <= 2 && text.to_ascii_lowercase().ends_with(".gguf"));
        if looks_local {
            return Err(format!("cannot read GGUF file {text}: {missing}"));
        }
        ModelRef::parse(text).map(ModelSpec::Hub).map_err(|e| {
            if text.contains('/') {
                format!("no file {text} here, and {e}")
            } else {
                format!("no such model file: {text} (nor is it a Hub reference USER/REPO[:QUANT])")
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(repo: &str, file: Option<&str>, quant: Option<&str>, rev: Option<&str>) -> ModelRef {
        ModelRef {
            repo: repo.into(),
            file: file.map(Into::into),
            quant: quant.map(Into::into),
            revision: rev.map(Into::into),
        }
    }

    #[test]
    fn the_forms_of_a_reference() {
        let p = |s| ModelRef::parse(s).unwrap();
        assert_eq!(
            p("Qwen/Qwen3-0.6B-GGUF"),
            r("Qwen/Qwen3-0.6B-GGUF", None, None, None)
        );
        assert_eq!(
            p("Qwen/Qwen3-0.6B-GGUF:Q8_0"),
            r("Qwen/Qwen3-0.6B-GGUF", None, Some("Q8_0"), None)
        );
        assert_eq!(
            p("hf.co/bartowski/Foo-GGUF:q4_k_m"),
            r("bartowski/Foo-GGUF", None, Some("q4_k_m"), None)
        );
        assert_eq!(
            p("https://huggingface.co/a/b:IQ4_XS"),
            r("a/b", None, Some("IQ4_XS"), None)
        );
        assert_eq!(
            p("a/b/sub/model-Q4_K_M-00001-of-00002.gguf"),
            r(
                "a/b",
                Some("sub/model-Q4_K_M-00001-of-00002.gguf"),
                None,
                None
            )
        );
        assert_eq!(p("a/b:F16@v1.0"), r("a/b", None, Some("F16"), Some("v1.0")));
        assert_eq!(p("a/b@v1.0:F16"), r("a/b", None, Some("F16"), Some("v1.0")));
        assert_eq!(
            p("a/b/m.gguf@refs/pr/1"),
            r("a/b", Some("m.gguf"), None, Some("refs/pr/1"))
        );
        assert_eq!(p("a/b:UD-Q4_K_XL").quant.as_deref(), Some("UD-Q4_K_XL"));
        assert_eq!(p("a/b@v1:Q8_0").to_string(), "a/b:Q8_0@v1");
        assert_eq!(p("a/b").revision(), "main");
    }

    #[test]
    fn malformed_references_are_refused() {
        for bad in [
            "justaname",
            "a/",
            "/b",
            "a/b:",
            "a/b:Q4:Q8",
            "a/b:Q4@main:Q8",
            "a/b/notes.txt",
            "a/b/../c.gguf",
            "a/b/m.gguf:Q8_0",
            "a--x/b",
            "a/b@",
            "a b/c",
        ] {
            assert!(ModelRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_existing_path_wins_and_a_path_like_text_stays_a_path() {
        let dir = tempfile::tempdir().unwrap();
        // A local file whose path also reads as USER/REPO/FILE.gguf.
        let user = dir.path().join("user").join("repo");
        std::fs::create_dir_all(&user).unwrap();
        let file = user.join("m.gguf");
        std::fs::write(&file, b"GGUF").unwrap();
        let text = file.to_str().unwrap();
        assert_eq!(ModelSpec::parse(text), Ok(ModelSpec::Local(file.clone())));
        let err = ModelSpec::parse("./missing.gguf").unwrap_err();
        assert!(
            err.contains("cannot read GGUF file ./missing.gguf: "),
            "{err}"
        );
        let err = ModelSpec::parse("models/missing.gguf").unwrap_err();
        assert!(
            err.contains("models/missing.gguf") && err.contains("os error"),
            "{err}"
        );
        assert_eq!(
            ModelSpec::parse("Qwen/Qwen3-0.6B-GGUF:Q8_0"),
            Ok(ModelSpec::Hub(r(
                "Qwen/Qwen3-0.6B-GGUF",
                None,
                Some("Q8_0"),
                None
            )))
        );
        let err = ModelSpec::parse("model").unwrap_err();
        assert!(err.contains("nor is it a Hub reference"), "{err}");
    }
}
