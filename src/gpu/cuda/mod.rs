//! Real paged decode on an NVIDIA GPU through cudarc (SPEC §6, backend `cuda`).
//!
//! A Llama-family decoder in bf16 (RMSNorm, HF rotate-half RoPE, GQA, SwiGLU); kernels in
//! CUDA C (`kernels/`) compiled by NVRTC for sm_90 at start; GEMMs through cuBLAS; a paged
//! KV cache whose pages are the KV pool's page ids; flash-decoding attention over the page
//! table; decode steps replayed from CUDA graphs per batch bucket; real prefill on a second
//! stream. The libraries are probed before any cudarc call, so a host without CUDA gets
//! `BackendError::Unavailable`, never a panic.
//!
//! Host-only parts (shapes, the seeded init, the safetensors reader, the f32 CPU reference)
//! run and are tested on any machine.

mod backend;
pub mod bench;
pub mod cpu_ref;
mod device;
mod forward;
pub mod init;
pub mod parity;
mod probe;
pub mod safetensors;
pub mod shape;
pub mod tp;
mod weights;

pub use backend::{buckets, CudaBackend, CudaConfig, Launch};
pub use device::{kernel_names, kernel_source};
pub use probe::{probe_libraries, LibraryProbe};
pub use shape::ModelShape;
pub use weights::ModelSource;
