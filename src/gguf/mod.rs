//! GGUF (llama.cpp's model file format): a reader with dequantisation to f32 and a loader of
//! Llama-family GGUF files into the f32 CPU reference. Host-only: none of it needs CUDA. The
//! tokenizer its metadata describes is built with Hugging Face `tokenizers` in `text::gguf`.

mod kquant;
pub mod llama;
pub mod quant;
mod reader;
mod smollm2;
#[cfg(test)]
pub(crate) mod testfile;
mod value;

pub use quant::{dequantize, GgmlType, QuantError};
pub use reader::{Gguf, GgufError, TensorInfo};
pub use smollm2::smollm2_gguf;
pub use value::Value;
