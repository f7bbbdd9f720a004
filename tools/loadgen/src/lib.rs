//! `loadgen`: drives any OpenAI-compatible server over HTTP/SSE with agentic traffic.
//!
//! - [`source`]: what to send when (closed-loop AgentX lanes, open-loop timestamps), on top of
//!   `genslot::workload`'s trace loaders and replay engines ([`replay`] adapts them);
//!   [`poisson`]: open-loop arrivals at a request rate.
//! - [`client`]: one streaming request, timed at the first content chunk.
//! - [`runner`]: the bounded run loop, with [`jitter`] desynchronising closed-loop lanes and
//!   [`backoff`] keeping them off a server that is down or shedding load;
//!   [`summary`] / [`stats`]: AIPerf-named statistics;
//!   [`scrape`]: genslot's counters from `/metrics`; [`compare`]: two runs side by side.

pub mod app;
pub mod backoff;
pub mod cli;
pub mod client;
pub mod compare;
pub mod jitter;
pub mod poisson;
pub mod prompt;
pub mod record;
pub mod replay;
pub mod runner;
pub mod scrape;
pub mod source;
pub mod sse;
pub mod stats;
pub mod summary;
