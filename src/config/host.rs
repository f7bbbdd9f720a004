//! The checks that depend on the machine: whether what the config sizes fits the host's
//! memory, and whether the model files the backend reads are there. Run by `check-config`
//! and `serve` after command-line overrides; the rest of validation stays pure.
//!
//! The memory check is arithmetic on the config alone, before anything is allocated: the
//! host-side structures whose size the config fixes, at their worst (every pool full).

use std::path::Path;

use super::error::Issue;
use super::schema::{Backend, Config};
use super::validate::backend_name;

/// What the machine offers.
#[derive(Debug, Clone, Copy)]
pub struct Host {
    /// Physical memory; `None` when it cannot be read (the memory check is then skipped).
    pub memory_bytes: Option<u64>,
    /// Whether a path exists (a file or a directory).
    pub exists: fn(&Path) -> bool,
}

impl Host {
    /// This machine: `MemTotal` of `/proc/meminfo` (Linux; elsewhere unknown).
    pub fn current() -> Host {
        Host {
            memory_bytes: std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|t| proc_kib_field(&t, "MemTotal:")),
            exists: |p| p.exists(),
        }
    }
}

/// A `/proc` file's `KEY  N kB` field in bytes, `key` with its colon: `MemTotal:` of
/// `/proc/meminfo`, `VmHWM:` of `/proc/self/status`.
pub fn proc_kib_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Host bytes per entry of an index pool (slots): std's B-tree holds 11 `u32` keys in a
/// 56-byte leaf and keeps every non-root node at least half full, so ≤ 11.2 bytes per key in
/// leaves; 16 covers the internal nodes and the held map's share.
const INDEX_ENTRY_BYTES: u64 = 16;
/// Host bytes per KV page at full use: its 4-byte id in a pool chunk and in one request's
/// page table.
const KV_PAGE_BYTES: u64 = 8;
/// Host bytes per sample of X's window: an `f64` and its place in the sorted copy.
const WINDOW_SAMPLE_BYTES: u64 = 16;

/// One structure's worst-case host bytes, and the field that sizes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cost {
    pub field: &'static str,
    pub bytes: u64,
}

/// The host-side structures the config sizes, at their largest. Saturates instead of
/// overflowing (the validated sizes keep every product far below `u64::MAX`).
pub fn host_costs(cfg: &Config) -> Vec<Cost> {
    // The slot pool and every resident pool hold up to 1.375× the slots (the paused cap).
    let residents = u64::from(cfg.max_num_active_requests()).saturating_mul(2);
    let kv = &cfg.kv_cache_config;
    let pages = kv.max_tokens / u64::from(kv.tokens_per_block.max(1));
    let mut v = vec![
        Cost {
            field: "max_num_active_requests",
            bytes: residents.saturating_mul(INDEX_ENTRY_BYTES),
        },
        Cost {
            field: "kv_cache_config.max_tokens",
            bytes: pages.saturating_mul(KV_PAGE_BYTES),
        },
        Cost {
            field: "scheduler_config.gen_admission.target_window",
            bytes: u64::from(cfg.scheduler_config.gen_admission.target_window)
                .saturating_mul(WINDOW_SAMPLE_BYTES),
        },
    ];
    if let Some(n) = cfg.recurrent_state.slots {
        v.push(Cost {
            field: "recurrent_state.slots",
            bytes: u64::from(n).saturating_mul(INDEX_ENTRY_BYTES),
        });
    }
    if let Some(n) = cfg.drafter.slots {
        v.push(Cost {
            field: "drafter.slots",
            bytes: u64::from(n).saturating_mul(INDEX_ENTRY_BYTES),
        });
    }
    v
}

/// Every rule the host breaks for `cfg`, without positions.
pub(crate) fn issues(cfg: &Config, host: &Host) -> Vec<Issue> {
    let mut out = Vec::new();
    if let Some(total) = host.memory_bytes {
        let costs = host_costs(cfg);
        let sum = costs.iter().fold(0u64, |a, c| a.saturating_add(c.bytes));
        if sum > total {
            if let Some(worst) = costs.iter().max_by_key(|c| c.bytes) {
                out.push(Issue::new(
                    worst.field,
                    format!(
                        "the sizes in this config need up to {} of host memory ({} for this \
                         field alone), more than this machine's {}",
                        gib(sum),
                        gib(worst.bytes),
                        gib(total)
                    ),
                ));
            }
        }
    }
    if let Some(path) = &cfg.model.path {
        // Only a backend that loads weights reads the path (the timing model reads none).
        if cfg.backend == Backend::Cuda && !(host.exists)(path) {
            out.push(Issue::new(
                "model.path",
                format!(
                    "{} does not exist (backend `{}` loads the model from it)",
                    path.display(),
                    backend_name(cfg.backend)
                ),
            ));
        }
    }
    out
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(memory_gib: u64) -> Host {
        Host {
            memory_bytes: Some(memory_gib << 30),
            exists: |_| false,
        }
    }

    #[test]
    fn mem_total_is_read_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:  1 kB\n";
        assert_eq!(proc_kib_field(text, "MemTotal:"), Some(24_576_000 * 1024));
        assert_eq!(proc_kib_field("nothing", "MemTotal:"), None);
    }

    #[test]
    fn the_default_config_fits_a_small_machine() {
        assert_eq!(issues(&Config::default().resolved(), &host(1)), vec![]);
    }

    #[test]
    fn a_kv_pool_larger_than_memory_is_refused_at_its_field() {
        let mut cfg = Config::default().resolved();
        cfg.kv_cache_config.tokens_per_block = 1;
        cfg.kv_cache_config.max_tokens = 4_000_000_000; // 4e9 pages × 8 B = 32 GB
        let found = issues(&cfg, &host(16));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].field, "kv_cache_config.max_tokens");
        assert!(
            found[0].message.contains("16.0 GiB"),
            "{}",
            found[0].message
        );
    }

    #[test]
    fn a_missing_model_path_is_refused_only_where_the_backend_reads_it() {
        let mut cfg = Config::default();
        cfg.model.shape = None;
        cfg.model.path = Some("/no/such/model".into());
        assert_eq!(issues(&cfg, &host(64)), vec![]);
        cfg.backend = Backend::Cuda;
        let found = issues(&cfg, &host(64));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].field, "model.path");
    }
}
