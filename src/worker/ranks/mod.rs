//! Tensor-parallel ranks making identical decisions (SPEC §4.1, §6.1). The leader (rank 0)
//! runs each pass and broadcasts its inputs as wire bytes; every follower decodes them,
//! runs the same pass on its own `WorkerCore` and answers with its decision hash; the
//! leader compares each follower's hash with its own before the pass's step goes out, and
//! a mismatch is a fatal error naming the pass and both hashes, never a silent divergence.
//!
//! This is the one part of the worker that moves bytes between threads or processes
//! (`link`: in-process channels or TCP); the pass itself stays pure.

mod follower;
pub mod frame;
mod leader;
pub mod link;

pub use follower::follow;
pub use leader::{RankGroup, RankStatus};
pub use link::{FrameRx, FrameTx, Link, LinkError};

/// Why the ranks cannot go on. Every variant stops the worker.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RankError {
    #[error(
        "tensor-parallel ranks disagree at pass {pass}: rank {rank}'s decision hash is \
         {follower:016x}, the leader's {leader:016x}"
    )]
    Mismatch {
        pass: u64,
        rank: u32,
        leader: u64,
        follower: u64,
    },
    #[error("rank {rank} answered for pass {got} while the leader checked pass {want}")]
    OutOfStep { rank: u32, want: u64, got: u64 },
    #[error("rank {rank} refused pass {pass}: {why}")]
    Refused { rank: u32, pass: u64, why: String },
    #[error("rank {rank} is gone: {why}")]
    Lost { rank: u32, why: String },
    #[error("rank {rank} did not answer pass {pass} within {secs} s")]
    Timeout { rank: u32, pass: u64, secs: f64 },
    #[error("cannot start rank {rank}: {why}")]
    Start { rank: u32, why: String },
    #[error("the leader checked a pass it had not broadcast")]
    NothingSent,
    #[error("the ranks stopped earlier: {0}")]
    Stopped(String),
}

#[cfg(test)]
mod tests;
