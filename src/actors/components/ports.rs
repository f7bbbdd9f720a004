//! The actor driver of the pass: every port call is a message to the component's actor,
//! its buffers moved into the message and back out of the reply, so a steady pass
//! allocates little. A component that stopped answers nothing: the call records why and
//! gives a neutral answer (no room, no decision), and the executor fails the worker.

use actix::dev::ToEnvelope;
use actix::{Actor, Addr, Handler, Message};

use super::controller::{ControllerActor, Step};
use super::pools::{
    Abandon, Admit, BudgetPart, Grow, PageTables, PoolActor, PushTokens, Release, Retain,
};
use super::queue::{Ingest, ObserveTtft, PopAdmissible, QueueActor};
use super::{Describe, Halt, NAMES};
use crate::actors::messages::DisablePreemption;
use crate::ids::RequestId;
use crate::policy::admission::{Popped, QueueFacts};
use crate::policy::preemption::StepView;
use crate::pools::{
    AdmitBudget, DrafterArena, KvBudget, KvConfig, KvPool, PoolUsage, RecurrentPool, SlotPool,
};
use crate::worker::ports::{AdmitOutcome, Ports, QueueIngest, RetainOp, StepReply};
use crate::worker::{LocalPorts, PassInputs, WorkerParams};

/// The addresses of a worker's component actors.
#[derive(Clone)]
pub struct Components {
    pub queue: Addr<QueueActor>,
    pub controller: Addr<ControllerActor>,
    pub slots: Addr<PoolActor<SlotPool>>,
    pub kv: Addr<PoolActor<KvPool>>,
    pub recurrent: Option<Addr<PoolActor<RecurrentPool>>>,
    pub drafter: Option<Addr<PoolActor<DrafterArena>>>,
}

impl Components {
    /// Start one actor per component, each owning the core a worker of `params` starts
    /// with. Must run inside an actix system.
    pub fn start(params: &WorkerParams) -> Self {
        let c = LocalPorts::new(params);
        Components {
            queue: QueueActor::new(c.queue).start(),
            controller: ControllerActor::new(c.preempt).start(),
            slots: PoolActor::new(c.slots).start(),
            kv: PoolActor::new(c.kv).start(),
            recurrent: c.recurrent.map(|p| PoolActor::new(p).start()),
            drafter: c.drafter.map(|p| PoolActor::new(p).start()),
        }
    }

    /// Every component's `/debug/actors` entry (a stopped one says so).
    pub async fn describe(&self, now: f64) -> Vec<serde_json::Value> {
        let stopped = |name: &str| serde_json::json!({ "actor": name, "stopped": true });
        let mut v = vec![
            self.queue
                .send(Describe { now })
                .await
                .unwrap_or_else(|_| stopped(NAMES[0])),
            self.controller
                .send(Describe { now })
                .await
                .unwrap_or_else(|_| stopped(NAMES[1])),
            self.slots
                .send(Describe { now })
                .await
                .unwrap_or_else(|_| stopped(NAMES[2])),
            self.kv
                .send(Describe { now })
                .await
                .unwrap_or_else(|_| stopped(NAMES[3])),
        ];
        if let Some(a) = &self.recurrent {
            v.push(
                a.send(Describe { now })
                    .await
                    .unwrap_or_else(|_| stopped(NAMES[4])),
            );
        }
        if let Some(a) = &self.drafter {
            v.push(
                a.send(Describe { now })
                    .await
                    .unwrap_or_else(|_| stopped(NAMES[5])),
            );
        }
        v
    }

    /// Every pool's usage, for the metrics (pools that stopped are left out).
    pub async fn usage(&self) -> Vec<PoolUsage> {
        use super::pools::Usage;
        let mut v = self.slots.send(Usage).await.unwrap_or_default();
        v.extend(self.kv.send(Usage).await.unwrap_or_default());
        if let Some(a) = &self.recurrent {
            v.extend(a.send(Usage).await.unwrap_or_default());
        }
        if let Some(a) = &self.drafter {
            v.extend(a.send(Usage).await.unwrap_or_default());
        }
        v
    }

    /// Stop the named component actor; false for an unknown name or an absent pool.
    pub fn halt(&self, name: &str) -> bool {
        match name {
            "admission_queue" => self.queue.do_send(Halt),
            "preemption_controller" => self.controller.do_send(Halt),
            "sequence_slots" => self.slots.do_send(Halt),
            "kv_pool" => self.kv.do_send(Halt),
            "recurrent_state" => match &self.recurrent {
                Some(a) => a.do_send(Halt),
                None => return false,
            },
            "drafter" => match &self.drafter {
                Some(a) => a.do_send(Halt),
                None => return false,
            },
            _ => return false,
        }
        true
    }

    pub fn disable_preemption(&self) {
        self.controller.do_send(DisablePreemption);
    }
}

/// The pass's ports over the component actors.
pub struct ActorPorts {
    pub components: Components,
    kv_cfg: KvConfig,
    /// Why the last calls could not be answered (the first component found stopped).
    failed: Option<String>,
    ingest: Ingest,
    step: Step,
    ids: Vec<RequestId>,
    popped: Vec<Popped>,
    outcomes: Vec<AdmitOutcome>,
    grow: Grow,
    ttfts: Vec<f64>,
    retain: Vec<RetainOp>,
    push: PushTokens,
    pages: Vec<RequestId>,
}

async fn ask<A, M>(
    addr: &Addr<A>,
    m: M,
    failed: &mut Option<String>,
    who: &str,
) -> Option<M::Result>
where
    A: Actor + Handler<M>,
    A::Context: ToEnvelope<A, M>,
    M: Message + Send + 'static,
    M::Result: Send,
{
    match addr.send(m).await {
        Ok(r) => Some(r),
        Err(e) => {
            failed.get_or_insert_with(|| format!("the {who} actor stopped ({e})"));
            None
        }
    }
}

impl ActorPorts {
    pub fn new(components: Components, params: &WorkerParams) -> Self {
        Self {
            components,
            kv_cfg: params.kv,
            failed: None,
            ingest: Ingest::default(),
            step: Step::default(),
            ids: Vec::new(),
            popped: Vec::new(),
            outcomes: Vec::new(),
            grow: Grow {
                rows: Vec::new(),
                grown: Vec::new(),
            },
            ttfts: Vec::new(),
            retain: Vec::new(),
            push: PushTokens::default(),
            pages: Vec::new(),
        }
    }

    /// Why a component could not be reached, once one could not.
    pub fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// The page tables of `ids`, in order (outside the pass: the executor hands them to
    /// the GPU-step actor).
    pub async fn page_tables(&mut self, ids: impl Iterator<Item = RequestId>) -> Vec<Vec<u32>> {
        let mut m = std::mem::take(&mut self.pages);
        m.clear();
        m.extend(ids);
        let n = m.len();
        let pages = ask(
            &self.components.kv,
            PageTables(m),
            &mut self.failed,
            NAMES[3],
        )
        .await;
        pages.unwrap_or_else(|| vec![Vec::new(); n])
    }
}

impl Ports for ActorPorts {
    async fn queue_ingest(
        &mut self,
        q: QueueIngest<'_>,
        rejected: &mut Vec<RequestId>,
        cancelled: &mut Vec<RequestId>,
    ) -> QueueFacts {
        let mut m = std::mem::take(&mut self.ingest);
        m.arrivals.clear();
        m.arrivals.extend_from_slice(q.arrivals);
        m.step_s = q.step_s;
        m.transfers.clear();
        m.transfers.extend_from_slice(q.transfers);
        m.cancellations.clear();
        m.cancellations.extend_from_slice(q.cancellations);
        m.now = q.now;
        m.d = q.d;
        m.rejected.clear();
        m.cancelled.clear();
        let Some(done) = ask(&self.components.queue, m, &mut self.failed, NAMES[0]).await else {
            return QueueFacts::default();
        };
        rejected.extend_from_slice(&done.ingest.rejected);
        cancelled.extend_from_slice(&done.ingest.cancelled);
        self.ingest = done.ingest;
        done.facts
    }

    async fn drafter_push(&mut self, inp: &PassInputs) {
        let Some(d) = &self.components.drafter else {
            return;
        };
        let mut m = std::mem::take(&mut self.push);
        m.rows.clear();
        m.tokens.clear();
        for (s, ids) in inp.stepped_with_ids().filter(|(_, ids)| !ids.is_empty()) {
            m.rows.push((s.id, ids.len() as u32));
            m.tokens.extend_from_slice(ids);
        }
        if let Some(back) = ask(d, m, &mut self.failed, NAMES[5]).await {
            self.push = back;
        }
    }

    async fn release(&mut self, ids: &[RequestId]) -> AdmitBudget {
        let c = &self.components;
        let mut budget = AdmitBudget {
            slots: 0,
            kv: KvBudget::empty(&self.kv_cfg),
            recurrent: c.recurrent.as_ref().map(|_| 0),
            drafter: c.drafter.as_ref().map(|_| 0),
        };
        let mut m = std::mem::take(&mut self.ids);
        m.clear();
        m.extend_from_slice(ids);
        let f = &mut self.failed;
        let mut parts = Vec::with_capacity(4);
        if let Some((back, p)) = ask(&c.slots, Release(m), f, NAMES[2]).await {
            parts.push(p);
            m = back;
            if let Some((back, p)) = ask(&c.kv, Release(m), f, NAMES[3]).await {
                parts.push(p);
                m = back;
                if let Some(a) = &c.recurrent {
                    match ask(a, Release(m.clone()), f, NAMES[4]).await {
                        Some((_, p)) => parts.push(p),
                        None => return budget,
                    }
                }
                if let Some(a) = &c.drafter {
                    match ask(a, Release(m.clone()), f, NAMES[5]).await {
                        Some((_, p)) => parts.push(p),
                        None => return budget,
                    }
                }
                self.ids = m;
            }
        }
        if self.failed.is_some() {
            return budget; // nothing admits on a worker going down
        }
        for p in parts {
            match p {
                BudgetPart::Slots(n) => budget.slots = n,
                BudgetPart::Kv(k) => budget.kv = k,
                BudgetPart::Recurrent(n) => budget.recurrent = Some(n),
                BudgetPart::Drafter(n) => budget.drafter = Some(n),
            }
        }
        budget
    }

    async fn step(&mut self, view: StepView<'_>) -> StepReply {
        let mut m = std::mem::take(&mut self.step);
        m.now = view.now;
        m.residents.clear();
        m.residents.extend_from_slice(view.residents);
        m.by_admission.clear();
        m.by_admission
            .extend_from_slice(view.by_admission.unwrap_or_default());
        m.departed.clear();
        m.departed.extend_from_slice(view.departed);
        m.queue = view.queue;
        m.kv = view.kv;
        match ask(&self.components.controller, m, &mut self.failed, NAMES[1]).await {
            Some(done) => {
                self.step = done.step;
                done.reply
            }
            None => StepReply::default(),
        }
    }

    async fn pop_admissible(
        &mut self,
        max: u32,
        budget: AdmitBudget,
        into: &mut Vec<Popped>,
    ) -> usize {
        let mut popped = std::mem::take(&mut self.popped);
        popped.clear();
        let m = PopAdmissible {
            max,
            budget,
            popped,
        };
        match ask(&self.components.queue, m, &mut self.failed, NAMES[0]).await {
            Some((mut popped, len)) => {
                std::mem::swap(into, &mut popped);
                self.popped = popped;
                len
            }
            None => 0,
        }
    }

    async fn admit(&mut self, popped: &[Popped], into: &mut Vec<AdmitOutcome>) {
        let c = &self.components;
        let mut outcomes = std::mem::take(&mut self.outcomes);
        outcomes.clear();
        outcomes.resize(
            popped.len(),
            AdmitOutcome {
                others: true,
                ..AdmitOutcome::default()
            },
        );
        let mut m = Admit {
            popped: popped.to_vec(),
            outcomes,
        };
        let f = &mut self.failed;
        // One pool after the other, the outcomes travelling through all of them.
        let Some(back) = ask(&c.slots, m, f, NAMES[2]).await else {
            return;
        };
        m = back;
        let Some(back) = ask(&c.kv, m, f, NAMES[3]).await else {
            return;
        };
        m = back;
        if let Some(a) = &c.recurrent {
            let Some(back) = ask(a, m, f, NAMES[4]).await else {
                return;
            };
            m = back;
        }
        if let Some(a) = &c.drafter {
            let Some(back) = ask(a, m, f, NAMES[5]).await else {
                return;
            };
            m = back;
        }
        std::mem::swap(into, &mut m.outcomes);
        self.outcomes = m.outcomes;
    }

    async fn abandon(&mut self, ids: &[RequestId]) {
        let c = &self.components;
        let f = &mut self.failed;
        let _ = ask(&c.slots, Abandon(ids.to_vec()), f, NAMES[2]).await;
        let _ = ask(&c.kv, Abandon(ids.to_vec()), f, NAMES[3]).await;
        if let Some(a) = &c.recurrent {
            let _ = ask(a, Abandon(ids.to_vec()), f, NAMES[4]).await;
        }
        if let Some(a) = &c.drafter {
            let _ = ask(a, Abandon(ids.to_vec()), f, NAMES[5]).await;
        }
    }

    async fn kv_grow(&mut self, rows: &[(RequestId, u32)], into: &mut Vec<Option<u32>>) {
        let mut m = std::mem::replace(
            &mut self.grow,
            Grow {
                rows: Vec::new(),
                grown: Vec::new(),
            },
        );
        m.rows.clear();
        m.rows.extend_from_slice(rows);
        m.grown.clear();
        match ask(&self.components.kv, m, &mut self.failed, NAMES[3]).await {
            Some(mut back) => {
                std::mem::swap(into, &mut back.grown);
                self.grow = back;
            }
            // No growth: every row waits.
            None => into.resize(rows.len(), None),
        }
    }

    async fn observe_ttft(&mut self, ttfts: &[f64]) {
        let mut m = std::mem::take(&mut self.ttfts);
        m.clear();
        m.extend_from_slice(ttfts);
        if let Some(back) = ask(
            &self.components.queue,
            ObserveTtft(m),
            &mut self.failed,
            NAMES[0],
        )
        .await
        {
            self.ttfts = back;
        }
    }

    async fn drafter_retention(&mut self, ops: &[RetainOp]) {
        let Some(d) = &self.components.drafter else {
            return;
        };
        let mut m = std::mem::take(&mut self.retain);
        m.clear();
        m.extend_from_slice(ops);
        if let Some(back) = ask(d, Retain(m), &mut self.failed, NAMES[5]).await {
            self.retain = back;
        }
    }
}
