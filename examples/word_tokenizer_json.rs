//! Writes the default word tokenizer as a Hugging Face tokenizer (`tokenizer.json` and
//! `tokenizer_config.json`) into a directory, its vocabulary grown from the given corpora.
//!
//! ```sh
//! cargo run --example word_tokenizer_json -- assets/word-tokenizer \
//!     .venv-aiperf/lib/python3.11/site-packages/aiperf/dataset/generator/assets/shakespeare.txt
//! ```
//! Each corpus is read as AIPerf reads its prompt corpus: non-empty lines, trimmed, joined
//! with single spaces.

use std::path::PathBuf;

use anyhow::Context as _;
use genslot::server::tokenizer_json::{tokenizer_config_json, tokenizer_json, vocabulary};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args_os().skip(1);
    let out = PathBuf::from(
        args.next()
            .context("usage: word_tokenizer_json OUT_DIR [CORPUS…]")?,
    );
    let mut corpora = Vec::new();
    for path in args {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", PathBuf::from(&path).display()))?;
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        corpora.push(lines.join(" "));
    }
    let vocab = vocabulary(corpora.iter().map(String::as_str));
    std::fs::create_dir_all(&out)?;
    let cfg = genslot::config::Config::default();
    std::fs::write(
        out.join("tokenizer.json"),
        serde_json::to_string(&tokenizer_json(&vocab))? + "\n",
    )?;
    std::fs::write(
        out.join("tokenizer_config.json"),
        serde_json::to_string_pretty(&tokenizer_config_json(cfg.max_context_tokens))? + "\n",
    )?;
    println!("{} tokens written to {}", vocab.len(), out.display());
    Ok(())
}
