//! The preemption-controller actor.

use actix::{Actor, ActorContext, Context, Handler, Message, MessageResult};

use super::{describe, Describe, Halt};
use crate::actors::messages::DisablePreemption;
use crate::policy::admission::QueueFacts;
use crate::policy::preemption::{Departure, GenPreemption, KvRoom, Resident, StatLine, StepView};
use crate::worker::ports::{op, StepReply};
use crate::worker::PreemptionView;

pub struct ControllerActor {
    core: GenPreemption,
    handled: u64,
}

impl ControllerActor {
    pub fn new(core: GenPreemption) -> Self {
        Self { core, handled: 0 }
    }
}

impl Actor for ControllerActor {
    type Context = Context<Self>;
}

/// One controller step over the pass's view; the buffers travel back in the reply.
#[derive(Message, Default)]
#[rtype(result = "StepDone")]
pub struct Step {
    pub now: f64,
    pub residents: Vec<Resident>,
    pub by_admission: Vec<u32>,
    pub departed: Vec<Departure>,
    pub queue: QueueFacts,
    pub kv: KvRoom,
}

pub struct StepDone {
    pub step: Step,
    pub reply: StepReply,
}

impl Handler<Step> for ControllerActor {
    type Result = MessageResult<Step>;
    fn handle(&mut self, m: Step, _: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        let view = StepView {
            now: m.now,
            residents: &m.residents,
            by_admission: Some(&m.by_admission),
            departed: &m.departed,
            queue: m.queue,
            kv: m.kv,
        };
        let reply = op::step(&mut self.core, &view);
        MessageResult(StepDone { step: m, reply })
    }
}

impl Handler<DisablePreemption> for ControllerActor {
    type Result = ();
    fn handle(&mut self, _: DisablePreemption, _: &mut Context<Self>) {
        self.handled += 1;
        self.core.disable();
    }
}

/// The counts since the last stat line.
#[derive(Message)]
#[rtype(result = "StatLine")]
pub struct TakeStatLine;

impl Handler<TakeStatLine> for ControllerActor {
    type Result = MessageResult<TakeStatLine>;
    fn handle(&mut self, _: TakeStatLine, _: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        MessageResult(self.core.take_stat_line())
    }
}

impl Handler<Describe> for ControllerActor {
    type Result = MessageResult<Describe>;
    fn handle(&mut self, m: Describe, _: &mut Context<Self>) -> Self::Result {
        let view = PreemptionView::of(&self.core, m.now);
        let state = serde_json::to_value(view).unwrap_or_default();
        MessageResult(describe("preemption_controller", self.handled, state))
    }
}

impl Handler<Halt> for ControllerActor {
    type Result = ();
    fn handle(&mut self, _: Halt, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

/// The controller's view for the worker snapshot.
#[derive(Message)]
#[rtype(result = "PreemptionView")]
pub struct PreemptionSnapshot {
    pub now: f64,
}

impl Handler<PreemptionSnapshot> for ControllerActor {
    type Result = MessageResult<PreemptionSnapshot>;
    fn handle(&mut self, m: PreemptionSnapshot, _: &mut Context<Self>) -> Self::Result {
        MessageResult(PreemptionView::of(&self.core, m.now))
    }
}
