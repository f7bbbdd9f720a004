//! The decision core (SPEC §4): admission queue, preemption controller, batch building,
//! running statistics. Pure: no clock, no I/O, no randomness, no hash-map iteration order.

/// A request's id, unique on this worker. Assigned by the leader, identical on every rank.
pub type RequestId = u64;
