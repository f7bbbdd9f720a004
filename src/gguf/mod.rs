//! GGUF (llama.cpp's model file format): a reader with dequantisation to f32. Host-only:
//! none of it needs CUDA.

pub mod quant;
mod reader;
#[cfg(test)]
pub(crate) mod testfile;
mod value;

pub use quant::{dequantize, GgmlType, QuantError};
pub use reader::{Gguf, GgufError, TensorInfo};
pub use value::Value;
