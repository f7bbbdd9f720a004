//! Seeded send jitter for closed-loop lanes: the library's draw
//! ([`genslot::workload::jitter`]), shared with the simulator's `--send-jitter`.

pub use genslot::workload::jitter::{mix, unit, SendJitter};
