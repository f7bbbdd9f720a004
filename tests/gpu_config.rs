//! The CUDA backend's configs: every config/cuda-*.yaml parses; `context` selects a prefill
//! or the KV transfer stand-in, whose bandwidth must be a positive number. No GPU needed.

use genslot::config::{Backend, Config, ContextMode, ModelSource, DEFAULT_TRANSFER_GBPS};

fn cuda_configs() -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("cuda-") && n.ends_with(".yaml"))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn every_cuda_config_parses_for_the_cuda_backend() {
    let files = cuda_configs();
    assert!(files.len() >= 3, "{files:?}");
    for f in files {
        let cfg = Config::from_file(&f).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cfg.backend, Backend::Cuda, "{}", f.display());
    }
}

#[test]
fn smollm2_config_loads_its_gguf_with_a_real_prefill() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/cuda-smollm2.yaml");
    let cfg = Config::from_file(path).unwrap();
    assert_eq!(cfg.context, ContextMode::Prefill);
    match cfg.model_source() {
        ModelSource::Path(p) => assert!(p.ends_with("SmolLM2-135M-Instruct.Q4_1.gguf")),
        other => panic!("expected a checkpoint path, got {other:?}"),
    }
}

#[test]
fn context_transfer_takes_a_positive_bandwidth_and_defaults_to_prefill() {
    // A line appended to a config selects it (how the experiment's staging does it).
    let cfg = Config::from_yaml_str(
        "backend: cuda\nmodel: { shape: llama-8b }\ncontext: transfer\ntransfer_gbps: 25\n",
        "t.yaml",
    )
    .unwrap();
    assert_eq!(cfg.context, ContextMode::Transfer);
    assert_eq!(cfg.transfer_gbps, Some(25.0));
    let plain = Config::from_yaml_str("backend: cuda\n", "p.yaml").unwrap();
    assert_eq!(plain.context, ContextMode::Prefill);
    assert_eq!(plain.transfer_gbps, None);
    const { assert!(DEFAULT_TRANSFER_GBPS > 0.0) };
    for bad in ["0", "-3", ".nan"] {
        let e = Config::from_yaml_str(
            &format!("backend: cuda\ncontext: transfer\ntransfer_gbps: {bad}\n"),
            "b.yaml",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("transfer_gbps") && e.contains("b.yaml:3"),
            "{bad}: {e}"
        );
    }
    let e = Config::from_yaml_str("context: teleport\n", "c.yaml")
        .unwrap_err()
        .to_string();
    assert!(e.contains("teleport"), "{e}");
}
