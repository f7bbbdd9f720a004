//! The decision core (SPEC §4): admission queue, preemption controller, batch building,
//! running statistics and the setup decision. Pure: no clock, no I/O, no randomness, no
//! hash-map iteration order. Every time is a leader clock reading in seconds, passed in.

pub mod admission;
pub mod batch;
pub mod kv_stall;
pub mod names;
pub mod preemption;
pub mod setup;
pub mod stats;
pub mod transfer;

pub use admission::{AdmissionParams, AdmissionPolicy, AdmissionQueue};
pub use preemption::{GenPreemption, Mode, PreemptDecision, PreemptParams};
