//! One actix actor per scheduling component (SPEC §5): the admission queue, the preemption
//! controller, the sequence-slot pool, the KV pool, the recurrent-state pool and the
//! drafter arena. Each is a thin shell over its core struct; what it does for a message is
//! the shared `worker::ports::op` function. The executor drives them through
//! [`ActorPorts`], the actor driver of the one pass (`worker::PassMachine::run`).

mod controller;
mod pools;
mod ports;
mod queue;

pub use controller::{ControllerActor, PreemptionSnapshot, Step, StepDone, TakeStatLine};
pub use pools::{
    Abandon, Admit, BudgetPart, Grow, PageTables, PoolActor, PoolCore, PushTokens, Release, Retain,
    Usage,
};
pub use ports::{ActorPorts, Components};
pub use queue::{Ingest, IngestDone, ObserveTtft, PopAdmissible, QueueActor, QueueSnapshot};

use actix::Message;

/// A component's state for `/debug/actors`: its core's view and the messages it handled.
#[derive(Message)]
#[rtype(result = "serde_json::Value")]
pub struct Describe {
    pub now: f64,
}

/// Stop the actor as a crash would (its mailbox closes; the executor's next message to it
/// fails). For the failure path's tests and for operators.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Halt;

/// The names `/debug/actors` and [`Halt`] use.
pub const NAMES: [&str; 6] = [
    "admission_queue",
    "preemption_controller",
    "sequence_slots",
    "kv_pool",
    "recurrent_state",
    "drafter",
];

fn describe(name: &str, handled: u64, state: serde_json::Value) -> serde_json::Value {
    serde_json::json!({ "actor": name, "messages_handled": handled, "state": state })
}
