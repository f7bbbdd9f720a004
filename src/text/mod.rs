//! Text for a real checkpoint: its tokenizer through Hugging Face `tokenizers` (a
//! safetensors checkpoint's `tokenizer.json`, or a BPE built from a GGUF file's vocabulary
//! and merges), its chat template rendered by minijinja (ChatML only when the checkpoint
//! has none), and its end-of-sequence token. [`ModelTokenizer`] is the server's
//! [`Tokenizer`] for such a model.

pub mod gguf;
pub mod template;

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::gguf::{gguf_file, Gguf};
use crate::server::tokenize::{render_chatml, ChatTurn, Tokenizer};
use template::ChatTemplate;

/// Why a checkpoint's tokenizer or template cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {msg}")]
pub struct TextError {
    pub path: String,
    pub msg: String,
}

/// A checkpoint's tokenizer and chat template.
pub struct ModelTokenizer {
    tk: tokenizers::Tokenizer,
    /// `None`: ChatML.
    template: Option<ChatTemplate>,
    bos: Option<u32>,
    eos: Option<u32>,
    /// A token decoded in front of each streamed token, and its text: decoders that strip
    /// the first token's leading space (SentencePiece's `▁`) then keep it.
    anchor: Option<(u32, String)>,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("vocab", &self.tk.get_vocab_size(true))
            .field("template", &self.template.is_some())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

/// What the server needs to serve a checkpoint's text.
#[derive(Clone)]
pub struct ModelText {
    pub tokenizer: Arc<ModelTokenizer>,
    /// The token that ends a generation.
    pub eos: Option<u32>,
}

impl ModelText {
    /// The tokenizer, template and EOS of the checkpoint at `path` (a GGUF file, a directory
    /// holding one, or a Hugging Face directory).
    pub fn load(path: &Path) -> Result<Self, TextError> {
        let tokenizer = Arc::new(ModelTokenizer::load(path)?);
        Ok(ModelText {
            eos: tokenizer.eos,
            tokenizer,
        })
    }

    /// The tokenizer as the server's trait object.
    pub fn server_tokenizer(&self) -> Arc<dyn Tokenizer> {
        self.tokenizer.clone()
    }
}

impl ModelTokenizer {
    /// See [`ModelText::load`].
    pub fn load(path: &Path) -> Result<Self, TextError> {
        match gguf_file(path) {
            Some(file) => {
                let g = Gguf::open(&file).map_err(|e| TextError {
                    path: file.display().to_string(),
                    msg: e.to_string(),
                })?;
                Self::from_gguf(&g)
            }
            None => Self::from_hf_dir(path),
        }
    }

    /// From a GGUF file's `tokenizer.*` metadata.
    pub fn from_gguf(g: &Gguf) -> Result<Self, TextError> {
        let bad = |msg: String| TextError {
            path: g.path().to_string(),
            msg,
        };
        let json = gguf::tokenizer_json(g).map_err(bad)?;
        let tk = tokenizers::Tokenizer::from_bytes(json.to_string().as_bytes())
            .map_err(|e| bad(format!("building the tokenizer: {e}")))?;
        let id = |key: &str| {
            g.get(key)
                .and_then(|v| v.as_u64())
                .map(|v| v as u32)
                .filter(|&v| (v as usize) < tk.get_vocab_size(true))
        };
        let (bos, eos) = (
            id("tokenizer.ggml.bos_token_id"),
            id("tokenizer.ggml.eos_token_id"),
        );
        let template = g
            .get("tokenizer.chat_template")
            .and_then(|v| v.as_str())
            .map(str::to_string);
        Self::assemble(tk, template, bos, eos).map_err(bad)
    }

    /// From a Hugging Face directory: `tokenizer.json`, and `tokenizer_config.json` (chat
    /// template, BOS, EOS) with `chat_template.jinja` and `generation_config.json` as the
    /// newer transformers write them.
    pub fn from_hf_dir(dir: &Path) -> Result<Self, TextError> {
        let bad = |msg: String| TextError {
            path: dir.display().to_string(),
            msg,
        };
        if !dir.join("tokenizer.json").is_file() {
            return Err(bad(
                "no tokenizer.json (a checkpoint is served with its own tokenizer)".into(),
            ));
        }
        let tk = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json"))
            .map_err(|e| bad(format!("tokenizer.json: {e}")))?;
        let read_json = |name: &str| -> Result<Option<Value>, TextError> {
            let p = dir.join(name);
            if !p.is_file() {
                return Ok(None);
            }
            let text = std::fs::read_to_string(&p).map_err(|e| bad(format!("{name}: {e}")))?;
            serde_json::from_str(&text).map(Some).map_err(|e| {
                bad(format!(
                    "{name}: line {} column {}: {e}",
                    e.line(),
                    e.column()
                ))
            })
        };
        let cfg = read_json("tokenizer_config.json")?.unwrap_or(Value::Null);
        let token_text = |v: &Value| -> Option<String> {
            v.as_str()
                .map(str::to_string)
                .or_else(|| v.get("content").and_then(Value::as_str).map(str::to_string))
        };
        let special = |key: &str| {
            cfg.get(key)
                .and_then(token_text)
                .and_then(|t| tk.token_to_id(&t))
        };
        let bos = special("bos_token");
        let mut eos = special("eos_token");
        if eos.is_none() {
            // generation_config.json's eos_token_id: one id or a list (the first is taken).
            eos = read_json("generation_config.json")?
                .and_then(|g| g.get("eos_token_id").cloned())
                .and_then(|v| v.as_u64().or_else(|| v.get(0).and_then(Value::as_u64)))
                .map(|v| v as u32);
        }
        let template = match cfg.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            // A list of named templates: the one named "default".
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template").and_then(Value::as_str))
                .map(str::to_string),
            _ => {
                let p = dir.join("chat_template.jinja");
                if p.is_file() {
                    Some(
                        std::fs::read_to_string(&p)
                            .map_err(|e| bad(format!("chat_template.jinja: {e}")))?,
                    )
                } else {
                    None
                }
            }
        };
        Self::assemble(tk, template, bos, eos).map_err(bad)
    }

    fn assemble(
        tk: tokenizers::Tokenizer,
        template: Option<String>,
        bos: Option<u32>,
        eos: Option<u32>,
    ) -> Result<Self, String> {
        let text = |id: Option<u32>| id.and_then(|i| tk.id_to_token(i)).unwrap_or_default();
        let template = template
            .map(|src| ChatTemplate::new(&src, &text(bos), &text(eos)))
            .transpose()
            .map_err(|e| e.to_string())?;
        let anchor = tk
            .encode("a", false)
            .ok()
            .and_then(|e| e.get_ids().last().copied())
            .and_then(|id| tk.decode(&[id], false).ok().map(|t| (id, t)))
            .filter(|(_, t)| !t.is_empty());
        let t = ModelTokenizer {
            tk,
            template,
            bos,
            eos,
            anchor,
        };
        // A template that cannot render one user turn would fail every chat request.
        t.try_render_chat(&[ChatTurn {
            role: "user".into(),
            content: "Hello".into(),
        }])
        .map_err(|e| format!("the chat template cannot render a user turn: {e}"))?;
        Ok(t)
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    pub fn has_template(&self) -> bool {
        self.template.is_some()
    }

    pub fn vocab_size(&self) -> usize {
        self.tk.get_vocab_size(true)
    }

    /// Encodes with the tokenizer's own special tokens (its post-processor), except a BOS
    /// the text already starts with (a chat template's `{{ bos_token }}`) is not doubled.
    pub fn try_encode(&self, text: &str) -> Result<Vec<u32>, String> {
        let enc = self.tk.encode(text, true).map_err(|e| e.to_string())?;
        let mut ids = enc.get_ids().to_vec();
        if let Some(b) = self.bos {
            if ids.len() >= 2 && ids[0] == b && ids[1] == b {
                ids.remove(0);
            }
        }
        Ok(ids)
    }

    /// Decodes ids, special tokens included as text.
    pub fn try_decode(&self, ids: &[u32]) -> Result<String, String> {
        self.tk.decode(ids, false).map_err(|e| e.to_string())
    }
}

impl Tokenizer for ModelTokenizer {
    fn encode(&self, text: &str) -> Vec<u32> {
        // Byte-level BPE encodes every string; an error here would be a broken vocabulary,
        // which loading already rejected.
        self.try_encode(text).unwrap_or_default()
    }

    fn decode_token(&self, id: u32) -> String {
        if let Some((a, text)) = &self.anchor {
            if let Ok(both) = self.try_decode(&[*a, id]) {
                if let Some(rest) = both.strip_prefix(text.as_str()) {
                    return rest.to_string();
                }
            }
        }
        self.try_decode(&[id]).unwrap_or_default()
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.try_decode(ids).unwrap_or_default()
    }

    fn render_chat(&self, messages: &[ChatTurn]) -> String {
        self.try_render_chat(messages)
            .unwrap_or_else(|_| render_chatml(messages))
    }

    fn try_render_chat(&self, messages: &[ChatTurn]) -> Result<String, String> {
        match &self.template {
            Some(t) => t.render(messages).map_err(|e| e.to_string()),
            None => Ok(render_chatml(messages)),
        }
    }
}

#[cfg(test)]
mod tests;
