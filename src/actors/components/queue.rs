//! The admission-queue actor.

use actix::{Actor, ActorContext, Context, Handler, Message, MessageResult};

use super::{describe, Describe, Halt};
use crate::ids::RequestId;
use crate::policy::admission::{AdmissionQueue, Popped, QueueFacts};
use crate::pools::AdmitBudget;
use crate::worker::ports::{op, QueueIngest};
use crate::worker::{Arrival, QueueView};

pub struct QueueActor {
    core: AdmissionQueue,
    handled: u64,
}

impl QueueActor {
    pub fn new(core: AdmissionQueue) -> Self {
        Self { core, handled: 0 }
    }
}

impl Actor for QueueActor {
    type Context = Context<Self>;
}

/// Ingest then refresh ([`op::queue_ingest`]); the buffers travel back in the reply.
#[derive(Message, Default)]
#[rtype(result = "IngestDone")]
pub struct Ingest {
    pub arrivals: Vec<Arrival>,
    pub step_s: Option<f64>,
    pub transfers: Vec<(u32, f64)>,
    pub cancellations: Vec<RequestId>,
    pub now: f64,
    pub d: Option<f64>,
    pub rejected: Vec<RequestId>,
    pub cancelled: Vec<RequestId>,
}

pub struct IngestDone {
    pub ingest: Ingest,
    pub facts: QueueFacts,
}

impl Handler<Ingest> for QueueActor {
    type Result = MessageResult<Ingest>;
    fn handle(&mut self, mut m: Ingest, _: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        let q = QueueIngest {
            arrivals: &m.arrivals,
            step_s: m.step_s,
            transfers: &m.transfers,
            cancellations: &m.cancellations,
            now: m.now,
            d: m.d,
        };
        let facts = op::queue_ingest(&mut self.core, q, &mut m.rejected, &mut m.cancelled);
        MessageResult(IngestDone { ingest: m, facts })
    }
}

/// The admission phase; the reply is the popped waiters and the queue length.
#[derive(Message)]
#[rtype(result = "(Vec<Popped>, usize)")]
pub struct PopAdmissible {
    pub max: u32,
    pub budget: AdmitBudget,
    pub popped: Vec<Popped>,
}

impl Handler<PopAdmissible> for QueueActor {
    type Result = MessageResult<PopAdmissible>;
    fn handle(&mut self, mut m: PopAdmissible, _: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        let budget = &mut m.budget;
        self.core
            .pop_admissible(m.max, |w| budget.try_take(w.context_tokens), &mut m.popped);
        MessageResult((m.popped, self.core.len()))
    }
}

/// TTFTs of requests that waited for a slot; the buffer comes back.
#[derive(Message)]
#[rtype(result = "Vec<f64>")]
pub struct ObserveTtft(pub Vec<f64>);

impl Handler<ObserveTtft> for QueueActor {
    type Result = MessageResult<ObserveTtft>;
    fn handle(&mut self, m: ObserveTtft, _: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        for &t in &m.0 {
            self.core.observe_ttft(t);
        }
        MessageResult(m.0)
    }
}

impl Handler<Describe> for QueueActor {
    type Result = MessageResult<Describe>;
    fn handle(&mut self, _: Describe, _: &mut Context<Self>) -> Self::Result {
        let view = serde_json::to_value(QueueView::of(&self.core)).unwrap_or_default();
        MessageResult(describe("admission_queue", self.handled, view))
    }
}

impl Handler<Halt> for QueueActor {
    type Result = ();
    fn handle(&mut self, _: Halt, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

/// The queue's view for the worker snapshot.
#[derive(Message)]
#[rtype(result = "QueueView")]
pub struct QueueSnapshot;

impl Handler<QueueSnapshot> for QueueActor {
    type Result = MessageResult<QueueSnapshot>;
    fn handle(&mut self, _: QueueSnapshot, _: &mut Context<Self>) -> Self::Result {
        MessageResult(QueueView::of(&self.core))
    }
}
