//! Real paged decode on an NVIDIA GPU through cudarc (SPEC §6, backend `cuda`).
//!
//! A Llama-family decoder in bf16 (RMSNorm, HF rotate-half RoPE with the checkpoint's base
//! and scaling, GQA with 1 to 16 query heads per kv head, SwiGLU, tied or untied
//! embeddings); weights seeded for a named shape or loaded from safetensors or GGUF
//! (`model_files`); kernels in CUDA C (`kernels/`) compiled by NVRTC for sm_90 at start;
//! GEMMs through cuBLAS; a paged KV cache whose pages are the KV pool's page ids;
//! flash-decoding attention over the page table; sampling on the device; decode steps
//! replayed from CUDA graphs per batch bucket; context arrival by real prefill on a second
//! stream or by a KV transfer stand-in (`transfer`). The libraries are probed before any
//! cudarc call, so a host without CUDA gets `BackendError::Unavailable`, never a panic.
//!
//! Host-only parts (shapes, the seeded init, the checkpoint readers, the f32 CPU reference)
//! run and are tested on any machine.

mod backend;
pub mod bench;
pub mod cpu_backend;
pub mod cpu_ref;
mod device;
pub mod draft;
pub mod draft_sets;
pub mod drive;
mod forward;
pub mod gemv_bench;
pub mod gguf_llama;
pub mod init;
pub mod model_files;
pub mod parity;
mod pinned_gemm;
mod probe;
pub mod residents;
pub mod retained_check;
pub mod retained_gpu;
pub mod row_order;
pub mod safetensors;
pub mod sampler_bench;
pub mod shape;
mod staging;
mod step_options;
pub mod tp;
pub mod transfer;
mod weights;

pub use backend::{buckets, CudaBackend, CudaConfig, Launch};
pub use device::{all_attn_shapes, kernel_names, kernel_source, AttnKernel, AttnShape, TcRing};
pub use probe::{probe_libraries, LibraryProbe};
pub use shape::ModelShape;
pub use step_options::{AttnGrid, StepOptions};
pub use transfer::ContextMode;
pub use weights::ModelSource;
