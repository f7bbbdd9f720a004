//! The pool actors: sequence slots, KV pages, recurrent states and drafter slots, one
//! actor each over its pool. Every pool takes `Release`, `Admit`, `Abandon`; the KV pool
//! also `Grow` and `PageTables`, the drafter arena `PushTokens` and `Retain`.

use actix::{Actor, ActorContext, Context, Handler, Message, MessageResult};

use super::{describe, Describe, Halt};
use crate::ids::RequestId;
use crate::policy::admission::Popped;
use crate::pools::{DrafterArena, IndexPool, KvBudget, KvPool, PoolUsage, RecurrentPool, SlotPool};
use crate::worker::ports::{op, AdmitOutcome, RetainOp};
use crate::worker::split_ids;

/// A pool's part of the admission budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetPart {
    Slots(u32),
    Kv(KvBudget),
    Recurrent(u32),
    Drafter(u32),
}

/// What a pool actor needs of its core.
pub trait PoolCore: Unpin + 'static {
    const NAME: &'static str;
    fn release(&mut self, ids: &[RequestId]) -> BudgetPart;
    fn admit(&mut self, popped: &[Popped], into: &mut [AdmitOutcome]);
    /// Drop a lease if held (an admission another pool refused).
    fn abandon(&mut self, id: RequestId);
    fn usage(&self) -> Vec<PoolUsage>;
}

impl PoolCore for SlotPool {
    const NAME: &'static str = "sequence_slots";
    fn release(&mut self, ids: &[RequestId]) -> BudgetPart {
        BudgetPart::Slots(op::release_index(self, ids))
    }
    fn admit(&mut self, popped: &[Popped], into: &mut [AdmitOutcome]) {
        op::admit_slots(self, popped, into);
    }
    fn abandon(&mut self, id: RequestId) {
        let _ = SlotPool::release(self, id);
    }
    fn usage(&self) -> Vec<PoolUsage> {
        vec![SlotPool::usage(self)]
    }
}

impl PoolCore for KvPool {
    const NAME: &'static str = "kv_pool";
    fn release(&mut self, ids: &[RequestId]) -> BudgetPart {
        BudgetPart::Kv(op::release_kv(self, ids))
    }
    fn admit(&mut self, popped: &[Popped], into: &mut [AdmitOutcome]) {
        op::admit_kv(self, popped, into);
    }
    fn abandon(&mut self, id: RequestId) {
        let _ = KvPool::release(self, id);
    }
    fn usage(&self) -> Vec<PoolUsage> {
        KvPool::usage(self).to_vec()
    }
}

impl PoolCore for RecurrentPool {
    const NAME: &'static str = "recurrent_state";
    fn release(&mut self, ids: &[RequestId]) -> BudgetPart {
        BudgetPart::Recurrent(op::release_index(self, ids))
    }
    fn admit(&mut self, popped: &[Popped], into: &mut [AdmitOutcome]) {
        op::admit_other(|id| self.acquire(id), popped, into);
    }
    fn abandon(&mut self, id: RequestId) {
        let _ = IndexPool::release(self, id);
    }
    fn usage(&self) -> Vec<PoolUsage> {
        vec![(**self).usage()]
    }
}

impl PoolCore for DrafterArena {
    const NAME: &'static str = "drafter";
    fn release(&mut self, ids: &[RequestId]) -> BudgetPart {
        BudgetPart::Drafter(op::release_drafter(self, ids))
    }
    fn admit(&mut self, popped: &[Popped], into: &mut [AdmitOutcome]) {
        op::admit_other(|id| self.acquire(id), popped, into);
    }
    fn abandon(&mut self, id: RequestId) {
        let _ = DrafterArena::release(self, id);
    }
    fn usage(&self) -> Vec<PoolUsage> {
        vec![DrafterArena::usage(self)]
    }
}

pub struct PoolActor<P> {
    core: P,
    handled: u64,
}

impl<P: PoolCore> PoolActor<P> {
    pub fn new(core: P) -> Self {
        Self { core, handled: 0 }
    }
}

impl<P: PoolCore> Actor for PoolActor<P> {
    type Context = Context<Self>;
}

/// Release the leases of requests that left; the reply is the buffer and the pool's part
/// of the admission budget.
#[derive(Message)]
#[rtype(result = "(Vec<RequestId>, BudgetPart)")]
pub struct Release(pub Vec<RequestId>);

impl<P: PoolCore> Handler<Release> for PoolActor<P> {
    type Result = MessageResult<Release>;
    fn handle(&mut self, m: Release, _: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        let part = self.core.release(&m.0);
        MessageResult((m.0, part))
    }
}

/// Leases for popped waiters: each pool fills its part of the outcomes.
#[derive(Message)]
#[rtype(result = "Admit")]
pub struct Admit {
    pub popped: Vec<Popped>,
    pub outcomes: Vec<AdmitOutcome>,
}

impl<P: PoolCore> Handler<Admit> for PoolActor<P> {
    type Result = MessageResult<Admit>;
    fn handle(&mut self, mut m: Admit, _: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        self.core.admit(&m.popped, &mut m.outcomes);
        MessageResult(m)
    }
}

/// Drop whatever leases these requests hold.
#[derive(Message)]
#[rtype(result = "Vec<RequestId>")]
pub struct Abandon(pub Vec<RequestId>);

impl<P: PoolCore> Handler<Abandon> for PoolActor<P> {
    type Result = MessageResult<Abandon>;
    fn handle(&mut self, m: Abandon, _: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        for &id in &m.0 {
            self.core.abandon(id);
        }
        MessageResult(m.0)
    }
}

impl<P: PoolCore> Handler<Describe> for PoolActor<P> {
    type Result = MessageResult<Describe>;
    fn handle(&mut self, _: Describe, _: &mut Context<Self>) -> Self::Result {
        let state = serde_json::to_value(self.core.usage()).unwrap_or_default();
        MessageResult(describe(P::NAME, self.handled, state))
    }
}

/// The pool's usage, for the metrics.
#[derive(Message)]
#[rtype(result = "Vec<PoolUsage>")]
pub struct Usage;

impl<P: PoolCore> Handler<Usage> for PoolActor<P> {
    type Result = MessageResult<Usage>;
    fn handle(&mut self, _: Usage, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.core.usage())
    }
}

impl<P: PoolCore> Handler<Halt> for PoolActor<P> {
    type Result = ();
    fn handle(&mut self, _: Halt, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

/// KV decode growth, row by row in batch order; the buffers travel back.
#[derive(Message)]
#[rtype(result = "Grow")]
pub struct Grow {
    pub rows: Vec<(RequestId, u32)>,
    pub grown: Vec<Option<u32>>,
}

impl Handler<Grow> for PoolActor<KvPool> {
    type Result = MessageResult<Grow>;
    fn handle(&mut self, mut m: Grow, _: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        op::kv_grow(&mut self.core, &m.rows, &mut m.grown);
        MessageResult(m)
    }
}

/// The page tables of these requests, in order (empty for one not resident).
#[derive(Message)]
#[rtype(result = "Vec<Vec<u32>>")]
pub struct PageTables(pub Vec<RequestId>);

impl Handler<PageTables> for PoolActor<KvPool> {
    type Result = MessageResult<PageTables>;
    fn handle(&mut self, m: PageTables, _: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        let pages =
            m.0.iter()
                .map(|&id| self.core.pages_of(id).unwrap_or_default());
        MessageResult(pages.collect())
    }
}

/// A step's tokens for the drafter windows, flattened: (id, token count) rows and the
/// tokens of every row in order. The buffers travel back.
#[derive(Message, Default)]
#[rtype(result = "PushTokens")]
pub struct PushTokens {
    pub rows: Vec<(RequestId, u32)>,
    pub tokens: Vec<u32>,
}

impl Handler<PushTokens> for PoolActor<DrafterArena> {
    type Result = MessageResult<PushTokens>;
    fn handle(&mut self, m: PushTokens, _: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        op::drafter_push(&mut self.core, split_ids(m.rows.iter().copied(), &m.tokens));
        MessageResult(m)
    }
}

/// Drafter retention changes, in order; the buffer comes back.
#[derive(Message)]
#[rtype(result = "Vec<RetainOp>")]
pub struct Retain(pub Vec<RetainOp>);

impl Handler<Retain> for PoolActor<DrafterArena> {
    type Result = MessageResult<Retain>;
    fn handle(&mut self, m: Retain, _: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        op::drafter_retention(&mut self.core, &m.0);
        MessageResult(m.0)
    }
}
