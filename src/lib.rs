//! genslot: a GEN (decode) server for disaggregated LLM serving whose scheduler protects
//! the TTFT tail by pausing decode requests in place. See README.md for the map.

pub mod gpu;
pub mod policy;
pub mod workload;
