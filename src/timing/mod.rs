//! Time, below both the step backends and the simulator: the leader's [`Clock`] and the
//! timing models of the plant (step, transfer, prefill). Imports only the config schema.

mod clock;
mod model;

pub use clock::{Clock, RealClock, VirtualClock};
pub use model::{ContextModel, StepModel, TransferModel};
