//! GGUF (llama.cpp's model file format): a reader with dequantisation to f32. It knows the
//! file, not the model: `gpu::cuda::gguf_llama` maps a Llama-family GGUF onto the model, and
//! `text::gguf` builds the tokenizer its metadata describes. Host-only: none of it needs CUDA.

mod kquant;
mod locate;
pub mod quant;
mod reader;
mod smollm2;
#[cfg(test)]
pub(crate) mod testfile;
mod value;

pub use locate::gguf_file;
pub use quant::{dequantize, GgmlType, QuantError};
pub use reader::{Gguf, GgufError, TensorInfo};
pub use smollm2::smollm2_gguf;
pub use value::Value;
