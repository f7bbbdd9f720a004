//! Which GGUF file a model path names, so that the weight loader and the tokenizer read the
//! same file.

use std::path::{Path, PathBuf};

/// The GGUF file `path` names: the file itself, or the only `*.gguf` in a directory
/// without `config.json`.
pub fn gguf_file(path: &Path) -> Option<PathBuf> {
    if path.is_file() {
        return (path.extension().is_some_and(|e| e == "gguf")).then(|| path.to_path_buf());
    }
    if path.join("config.json").is_file() {
        return None;
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(path)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "gguf"))
        .collect();
    (found.len() == 1).then(|| found.remove(0))
}
