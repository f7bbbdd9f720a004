//! Resident pools (SPEC §4.5): sequence slots, KV pages and page-table rows, recurrent
//! states and drafter slots. Each hands out one lease per request, released exactly once
//! through a checked `release` (a second release is an error, never a double free).
//! With preemption on, each pool that holds one entry per resident request is sized for
//! `max_num_active_requests + paused cap`. Pure: no clock, no I/O.

pub mod budget;
pub mod drafter;
pub mod index;
pub mod kv;
pub mod pages;
pub mod recurrent;
pub mod slot;

pub use budget::{AdmitBudget, KvBudget};
pub use drafter::DrafterArena;
pub use index::IndexPool;
pub use kv::{KvConfig, KvPool};
pub use recurrent::RecurrentPool;
pub use slot::{slot_pool, SlotPool};

use serde::Serialize;

use crate::ids::RequestId;

#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum PoolError {
    #[error("{pool} pool exhausted (capacity {capacity})")]
    Exhausted { pool: &'static str, capacity: u64 },
    #[error("{pool} pool: request {id} holds no lease")]
    NotHeld { pool: &'static str, id: RequestId },
    #[error("{pool} pool: request {id} already holds a lease")]
    AlreadyHeld { pool: &'static str, id: RequestId },
}

/// A pool's state for the debug endpoint and metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PoolUsage {
    pub pool: &'static str,
    pub capacity: u64,
    pub used: u64,
    /// Entries reserved for paused requests (0 with preemption off).
    pub headroom: u64,
}

/// Each pool answers the setup decision (SPEC §4.4) in the decision's own terms.
pub use crate::policy::setup::PoolReport;
