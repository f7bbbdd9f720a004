//! The typed messages the actors exchange. Executor-bound messages are actix messages; the
//! GPU-step actor lives on its own OS thread and takes [`GpuMsg`] over a channel.

use actix::Message;
use tokio::sync::mpsc::UnboundedSender;

use crate::gpu::{Arrived, BackendError, ContextArrival, StepOutput, StepRow};
use crate::ids::RequestId;
use crate::server::engine::{EngineEvent, GenRequest};
use crate::worker::{PassInputs, PassOutput};

// ---- to the executor ----

/// A new request from the HTTP layer; `arrival` is on the leader clock.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Submit {
    pub id: RequestId,
    pub arrival: f64,
    pub req: GenRequest,
    pub events: UnboundedSender<EngineEvent>,
}

/// The client went away or asked to stop: release every lease. Unknown ids are no-ops.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Cancel(pub RequestId);

/// The GPU-step actor finished the step of pass `pass`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StepDone {
    pub pass: u64,
    pub result: Result<StepOutput, BackendError>,
    /// The step's rows, handed back so the executor reuses their buffer.
    pub rows: Vec<StepRow>,
}

/// An admitted request's context (KV) is resident.
#[derive(Message)]
#[rtype(result = "()")]
pub struct KvArrived {
    pub id: RequestId,
    pub result: Result<Arrived, BackendError>,
}

/// The GPU-step actor stopped for good (its thread ended or panicked).
#[derive(Message)]
#[rtype(result = "()")]
pub struct BackendDown(pub String);

/// Turn preemption off in the core (from the supervisor only).
#[derive(Message)]
#[rtype(result = "()")]
pub struct DisablePreemption;

/// The executor's and the worker core's state as JSON.
#[derive(Message)]
#[rtype(result = "serde_json::Value")]
pub struct DebugState;

/// Resolves once no request is in flight (at once if none is).
#[derive(Message)]
#[rtype(result = "()")]
pub struct WaitIdle;

/// Fail every in-flight request with `reason` and stop stepping.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown {
    pub reason: String,
}

/// The recorded pass inputs and outputs so far (empty unless recording was asked for).
#[derive(Message)]
#[rtype(result = "Vec<(PassInputs, PassOutput)>")]
pub struct TakeRecord;

// ---- to the supervisor ----

/// Disable preemption at run time (operator call, actor failure).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Disable {
    pub why: String,
}

/// The supervisor's state.
#[derive(Message)]
#[rtype(result = "super::supervisor::SupervisorState")]
pub struct GetSupervisorState;

// ---- to the GPU-step actor ----

/// Start the context arrival (KV transfer or prefill) of an admitted request.
#[derive(Debug, Clone)]
pub struct Admit(pub ContextArrival);

/// Requests paused in place this pass: they keep every device-side state.
#[derive(Debug, Clone)]
pub struct Pause(pub Vec<RequestId>);

/// Paused requests back in the batch (normal and forced).
#[derive(Debug, Clone)]
pub struct Resume(pub Vec<RequestId>);

/// Requests out of this step (displaced, token-limited) whose state must be kept.
#[derive(Debug, Clone)]
pub struct Retain(pub Vec<RequestId>);

/// The request left the worker: drop its device-side state.
#[derive(Debug, Clone, Copy)]
pub struct Release(pub RequestId);

/// One decode step over the pass's batch.
#[derive(Debug, Clone)]
pub struct Step {
    pub pass: u64,
    pub rows: Vec<StepRow>,
    /// Buffers of an earlier step's output for this one's (the backend refills them).
    pub out: StepOutput,
}

#[derive(Debug)]
pub enum GpuMsg {
    Admit(Admit),
    Pause(Pause),
    Resume(Resume),
    Retain(Retain),
    Release(Release),
    Step(Step),
    /// Reply with the backend's capacity.
    Capacity(crossbeam_channel::Sender<crate::gpu::BackendCapacity>),
    Stop,
}
