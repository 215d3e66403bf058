//! Memory for the KV cache: the machine's physical memory, what of it the KV cache may take,
//! and the context window that follows when none is asked for.
//!
//! The KV cache may take the memory available when the model is loaded, less the model's
//! own resident size and a safety margin of [`MARGIN_PERCENT`] of the total (at least
//! [`MIN_MARGIN_BYTES`]) left to the rest of the system. The default context is the model's
//! trained one when one full sequence of it fits in that; else the largest that does. The
//! engine's default budget ([`super::Limits`]) is then as many positions as fit, at least one
//! context: an upper limit, since caches are only allocated per admitted sequence.

use inferno_backend::KvType;

/// Percent of the machine's total memory left free for the rest of the system.
pub const MARGIN_PERCENT: u64 = 20;
/// The least memory left free, whatever the total.
pub const MIN_MARGIN_BYTES: u64 = 1 << 30;
/// What the KV cache may take where the system's memory cannot be read.
pub const FALLBACK_KV_BYTES: u64 = 2 << 30;

const GIB: f64 = (1u64 << 30) as f64;

/// Bytes as GiB, for messages.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB
}

/// The machine's physical memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SystemMemory {
    pub total: u64,
    /// What can be used now without swapping (Linux: `MemAvailable`).
    pub available: u64,
}

impl SystemMemory {
    /// This machine's memory, where the system reports it (Linux: `/proc/meminfo`, within
    /// the memory limit of the process's cgroup, v2 or v1, as a container has).
    pub fn read() -> Option<Self> {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let limit = [
            "/sys/fs/cgroup/memory.max",
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
        ]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok());
        Self::from_figures(&text, limit.as_deref())
    }

    /// The figures of a `/proc/meminfo` text, both capped at a cgroup's memory limit (its
    /// `memory.max` or `memory.limit_in_bytes` text: bytes, or `max` for none).
    pub fn from_figures(meminfo: &str, cgroup_limit: Option<&str>) -> Option<Self> {
        let mut m = Self::parse_meminfo(meminfo)?;
        if let Some(limit) = cgroup_limit.and_then(|s| s.trim().parse::<u64>().ok()) {
            m.total = m.total.min(limit);
            m.available = m.available.min(limit);
        }
        Some(m)
    }

    /// The figures of a `/proc/meminfo` text (values in kB).
    pub fn parse_meminfo(text: &str) -> Option<Self> {
        let field = |name: &str| -> Option<u64> {
            let line = text.lines().find(|l| l.starts_with(name))?;
            let kib: u64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
            Some(kib.saturating_mul(1024))
        };
        let total = field("MemTotal:")?;
        // Kernels before 3.14 lack MemAvailable; free memory is the lower bound then.
        let available = field("MemAvailable:").or_else(|| field("MemFree:"))?;
        Some(Self { total, available })
    }
}

/// This process's resident memory (Linux: `VmRSS`), where the system reports it.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The margin left free on a machine of `total` bytes.
pub fn margin(total: u64) -> u64 {
    (total / 100 * MARGIN_PERCENT).max(MIN_MARGIN_BYTES)
}

/// Bytes the KV cache may take, for a model of `resident` bytes (with the process around it)
/// loaded on a machine with `memory` (read before the model was loaded; `None`: unknown,
/// [`FALLBACK_KV_BYTES`]).
pub fn kv_memory(memory: Option<SystemMemory>, resident: u64) -> u64 {
    match memory {
        Some(m) => m
            .available
            .min(m.total)
            .saturating_sub(resident)
            .saturating_sub(margin(m.total)),
        None => FALLBACK_KV_BYTES,
    }
}

/// The context window chosen for a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// Positions one sequence may hold.
    pub ctx: usize,
    /// Set when one sequence of the context does not fit in the KV memory (the model's was
    /// cut to `ctx`, or the asked one is kept as asked): a sentence saying so, with the
    /// numbers.
    pub warning: Option<String>,
}

/// The context window: `asked` (up to the model's `model_ctx`; above it an error naming
/// both), or the model's when one full sequence of `bytes_per_token` per position fits in
/// `kv_memory` bytes, else the largest that does; at least 2 (a prompt token and one more).
pub fn context_window(
    asked: Option<usize>,
    model_ctx: usize,
    bytes_per_token: usize,
    kv_memory: u64,
) -> Result<Window, String> {
    let per = bytes_per_token.max(1) as u64;
    if let Some(n) = asked {
        if n > model_ctx {
            return Err(format!(
                "--ctx-size {n} exceeds the model's context window of {model_ctx} tokens"
            ));
        }
        let ctx = n.max(2);
        let need = ctx as u64 * per;
        return Ok(Window {
            ctx,
            warning: (need > kv_memory).then(|| {
                format!(
                    "a sequence of the asked context of {ctx} tokens needs {:.2} GiB of KV \
                     cache but only {:.2} GiB is free for it",
                    gib(need),
                    gib(kv_memory)
                )
            }),
        });
    }
    let fits = usize::try_from(kv_memory / per).unwrap_or(usize::MAX);
    if fits >= model_ctx {
        return Ok(Window {
            ctx: model_ctx.max(2),
            warning: None,
        });
    }
    let ctx = fits.max(2);
    let need = model_ctx as u64 * per;
    Ok(Window {
        ctx,
        warning: Some(format!(
            "the model's context of {model_ctx} tokens needs {:.2} GiB of KV cache but only \
             {:.2} GiB is free for it, so the context is {ctx} tokens ({} fewer); pass \
             --ctx-size, or a smaller --cache-type-k/-v, to choose",
            gib(need),
            gib(kv_memory),
            model_ctx - ctx.min(model_ctx),
        )),
    })
}

/// The KV cache of a loaded model: its element types and size per position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvMemory {
    pub types: (KvType, KvType),
    /// Keys and values of every layer for one position, in bytes.
    pub bytes_per_token: usize,
    /// Bytes the KV cache may take (see [`kv_memory`]).
    pub available: u64,
}

impl KvMemory {
    /// Bytes of `positions` positions.
    pub fn bytes(&self, positions: usize) -> u64 {
        positions as u64 * self.bytes_per_token as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn meminfo_is_parsed_in_bytes() {
        let text = "MemTotal:       16318504 kB\nMemFree:          512000 kB\n\
                    MemAvailable:    8159252 kB\nBuffers:          100 kB\n";
        assert_eq!(
            SystemMemory::parse_meminfo(text),
            Some(SystemMemory {
                total: 16318504 * 1024,
                available: 8159252 * 1024
            })
        );
        // Without MemAvailable, free memory stands in.
        let old = "MemTotal: 2048 kB\nMemFree: 1024 kB\n";
        assert_eq!(
            SystemMemory::parse_meminfo(old).map(|m| m.available),
            Some(1024 * 1024)
        );
        assert_eq!(SystemMemory::parse_meminfo("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn a_cgroup_limit_caps_both_figures() {
        let text = "MemTotal: 67108864 kB\nMemAvailable: 33554432 kB\n";
        let capped = SystemMemory::from_figures(text, Some("3221225472\n")).unwrap();
        assert_eq!(
            capped,
            SystemMemory {
                total: 3 * G,
                available: 3 * G
            }
        );
        let free = SystemMemory::from_figures(text, Some("max\n")).unwrap();
        assert_eq!(
            free,
            SystemMemory {
                total: 64 * G,
                available: 32 * G
            }
        );
        assert_eq!(SystemMemory::from_figures(text, None), Some(free));
    }

    #[test]
    fn kv_memory_leaves_the_model_and_a_margin() {
        // 20% of 64 GiB stays free, and the model's 1 GiB: 40 GiB available gives 26.2 GiB.
        let m = SystemMemory {
            total: 64 * G,
            available: 40 * G,
        };
        assert_eq!(margin(64 * G), 64 * G / 100 * 20);
        assert_eq!(kv_memory(Some(m), G), 40 * G - G - 64 * G / 100 * 20);
        // On a small machine the margin is at least 1 GiB.
        let small = SystemMemory {
            total: 2 * G,
            available: 2 * G,
        };
        assert_eq!(kv_memory(Some(small), G / 2), 2 * G - G / 2 - G);
        // Nothing left is nothing, not an underflow.
        assert_eq!(kv_memory(Some(small), 4 * G), 0);
        assert_eq!(kv_memory(None, 4 * G), FALLBACK_KV_BYTES);
    }

    #[test]
    fn default_context_is_the_models_when_one_sequence_fits() {
        // Qwen3-0.6B with F16 caches: 114,688 bytes per position, 40,960 positions: 4.4 GiB.
        let per = 114_688;
        let w = context_window(None, 40_960, per, 5 * G).unwrap();
        assert_eq!(
            w,
            Window {
                ctx: 40_960,
                warning: None
            }
        );
        // Exactly one full context still fits.
        let exact = 40_960 * per as u64;
        assert_eq!(
            context_window(None, 40_960, per, exact).unwrap().ctx,
            40_960
        );
    }

    #[test]
    fn default_context_shrinks_to_what_fits_and_says_so() {
        let per = 114_688;
        let w = context_window(None, 40_960, per, 2 * G).unwrap();
        // 2 GiB / 114,688 bytes = 18,724 positions.
        assert_eq!(w.ctx, 18_724);
        let msg = w.warning.unwrap();
        assert!(msg.contains("40960 tokens"), "{msg}");
        let need = format!("{:.2} GiB", gib(40_960 * per as u64));
        assert!(msg.contains(&need), "{msg}");
        assert!(msg.contains("2.00 GiB"), "{msg}");
        assert!(msg.contains("18724 tokens (22236 fewer)"), "{msg}");
        // No memory at all still leaves the smallest usable window.
        assert_eq!(context_window(None, 40_960, per, 0).unwrap().ctx, 2);
    }

    #[test]
    fn asked_context_goes_up_to_the_models() {
        // Kept as asked even where it does not fit, with a warning.
        let w = context_window(Some(40_960), 40_960, 1 << 20, 0).unwrap();
        assert_eq!(w.ctx, 40_960);
        assert!(w.warning.unwrap().contains("40960 tokens needs 40.00 GiB"));
        let w = context_window(Some(64), 128, 1, G).unwrap();
        assert_eq!(
            w,
            Window {
                ctx: 64,
                warning: None
            }
        );
        assert_eq!(context_window(Some(0), 128, 1, G).unwrap().ctx, 2);
        let e = context_window(Some(40_961), 40_960, 1, G).unwrap_err();
        assert!(e.contains("40961") && e.contains("40960"), "{e}");
    }
}
