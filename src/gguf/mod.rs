//! GGUF (llama.cpp's model file format): a reader with dequantisation to f32, the GPT-2
//! byte-level BPE tokenizer its metadata describes, and a loader of Llama-family GGUF files
//! into the f32 CPU reference. Host-only: none of it needs CUDA.

pub mod llama;
pub mod quant;
mod reader;
#[cfg(test)]
pub(crate) mod testfile;
pub mod tokenizer;
mod value;

pub use quant::{dequantize, GgmlType, QuantError};
pub use reader::{Gguf, GgufError, TensorInfo};
pub use value::Value;
