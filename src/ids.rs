//! Identifiers shared by the decision core and the pools, below both.

/// A request's id, unique on this worker. Assigned by the leader, identical on every rank.
pub type RequestId = u64;
