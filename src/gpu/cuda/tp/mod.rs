//! Tensor parallelism for the CUDA decoder (SPEC §6.1): the Megatron sharding of each
//! weight over N ranks (`shard`), proven on the CPU by a sharded f32 forward with an
//! emulated all-reduce that reproduces the unsharded reference (`cpu`), and the NCCL
//! communicators and in-place all-reduce the ranks' forward runs on the GPUs (`nccl`).

pub mod cpu;
pub mod nccl;
pub mod roofline;
pub mod shard;

pub use shard::{allreduce_bytes_per_step, Shard, ShardError};
