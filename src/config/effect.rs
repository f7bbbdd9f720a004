//! Fields that a valid config may set but that change nothing on the chosen backend: each is
//! one warning naming it (printed once by `check-config` and at `serve` start), so a setting
//! never silently does nothing. Pure.

use super::error::Issue;
use super::schema::{Backend, Config, ContextMode, TimingConfig};
use super::validate::backend_name;

/// One warning per field set away from its default that the chosen backend ignores.
pub(crate) fn warnings(cfg: &Config) -> Vec<Issue> {
    let mut out = Vec::new();
    let backend = backend_name(cfg.backend);
    match cfg.backend {
        Backend::Model => {
            if cfg.model.seed != 0 {
                out.push(Issue::new(
                    "model.seed",
                    format!(
                        "has no effect on backend `{backend}`: the timing model has no weights"
                    ),
                ));
            }
            if cfg.context != ContextMode::Prefill || cfg.transfer_gbps.is_some() {
                let field = if cfg.context != ContextMode::Prefill {
                    "context"
                } else {
                    "transfer_gbps"
                };
                out.push(Issue::new(
                    field,
                    format!(
                        "has no effect on backend `{backend}`: its context arrival follows \
                         `timing.transfer_*`"
                    ),
                ));
            }
            if cfg.batch_invariant {
                out.push(Issue::new(
                    "batch_invariant",
                    format!(
                        "has no effect on backend `{backend}`: the timing model computes no \
                         tokens"
                    ),
                ));
            }
            if cfg.model.path.is_some() {
                out.push(Issue::new(
                    "model.path",
                    format!(
                        "has no effect on backend `{backend}`: no weights are read (the path \
                         only names the model; `server.served_model_name` names it too)"
                    ),
                ));
            }
        }
        Backend::Cuda => {
            let t = &cfg.timing;
            let d = TimingConfig::default();
            let unused = [
                ("timing.base_ms", t.base_ms != d.base_ms),
                (
                    "timing.per_request_ms",
                    t.per_request_ms != d.per_request_ms,
                ),
                (
                    "timing.per_kv_token_ns",
                    t.per_kv_token_ns != d.per_kv_token_ns,
                ),
                ("timing.jump_above", t.jump_above != d.jump_above),
                ("timing.jump_ms", t.jump_ms != d.jump_ms),
                (
                    "timing.per_request_above_ms",
                    t.per_request_above_ms != d.per_request_above_ms,
                ),
                (
                    "timing.transfer_base_ms",
                    t.transfer_base_ms != d.transfer_base_ms,
                ),
                (
                    "timing.transfer_per_token_us",
                    t.transfer_per_token_us != d.transfer_per_token_us,
                ),
                (
                    "timing.prefill_per_token_us",
                    t.prefill_per_token_us != d.prefill_per_token_us,
                ),
            ];
            for (field, _) in unused.iter().filter(|(_, set)| *set) {
                out.push(Issue::new(
                    field,
                    format!(
                        "has no effect on backend `{backend}`: the GPU's own step times apply \
                         (the simulator and backend `model` read it)"
                    ),
                ));
            }
        }
    }
    // With preemption on these are errors (validate.rs); off, they are ignored everywhere.
    let p = &cfg.parallel;
    if p.pipeline_parallel_size > 1 && cfg.preemption().is_ok_and(|m| !m.is_on()) {
        out.push(Issue::new(
            "parallel.pipeline_parallel_size",
            format!(
                "has no effect: genslot serves one pipeline stage (got {})",
                p.pipeline_parallel_size
            ),
        ));
    }
    if p.enable_attention_dp && cfg.preemption().is_ok_and(|m| !m.is_on()) {
        out.push(Issue::new(
            "parallel.enable_attention_dp",
            "has no effect: genslot has no attention data parallelism",
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(cfg: &Config) -> Vec<String> {
        warnings(cfg).into_iter().map(|i| i.field).collect()
    }

    #[test]
    fn the_defaults_warn_about_nothing() {
        assert!(fields(&Config::default().resolved()).is_empty());
        let cuda = Config {
            backend: Backend::Cuda,
            ..Config::default()
        };
        assert!(fields(&cuda).is_empty());
    }

    #[test]
    fn weights_settings_warn_on_the_timing_model_and_timing_settings_on_cuda() {
        let mut cfg = Config::default();
        cfg.model.seed = 7;
        cfg.timing.base_ms = 10.0;
        assert_eq!(fields(&cfg), ["model.seed"]);
        cfg.backend = Backend::Cuda;
        assert_eq!(fields(&cfg), ["timing.base_ms"]);
    }

    #[test]
    fn batch_invariance_warns_on_the_timing_model_only() {
        let cfg = Config::from_yaml_str("batch_invariant: true\n", "test").unwrap();
        assert!(cfg.batch_invariant);
        assert_eq!(fields(&cfg), ["batch_invariant"]);
        let cuda = Config {
            backend: Backend::Cuda,
            ..cfg
        };
        assert!(fields(&cuda).is_empty());
    }

    #[test]
    fn parallel_settings_without_preemption_warn() {
        let mut cfg = Config::default();
        cfg.parallel.pipeline_parallel_size = 2;
        cfg.parallel.enable_attention_dp = true;
        assert_eq!(
            fields(&cfg),
            [
                "parallel.pipeline_parallel_size",
                "parallel.enable_attention_dp"
            ]
        );
    }
}
