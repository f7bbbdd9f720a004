//! genslot: a GEN (decode) server for disaggregated LLM serving whose scheduler protects
//! the TTFT tail by pausing decode requests in place. See README.md for the map.

pub mod actors;
pub mod config;
pub mod gguf;
pub mod gpu;
pub mod ids;
pub mod metrics;
pub mod policy;
pub mod pools;
pub mod sampling;
pub mod server;
pub mod signal;
pub mod sim;
pub mod text;
pub mod timing;
pub mod worker;
pub mod workload;
