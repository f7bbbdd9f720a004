//! Drives a step backend the way the executor does, without a scheduler: each request's row
//! carries its sequence slot, `context_len` = prompt + tokens out − 1 and the last token out
//! as input; a step may emit several tokens for a row (accepted drafts). `solo` runs one
//! request alone; `interleaved` runs several, leaving each out of chosen steps as a paused or
//! displaced request is left out (it keeps every state; the backend just sees no row). The
//! retained-state checks compare the two, on the CPU reference and on the GPU.

use crate::gpu::{BackendError, ContextArrival, StepBackend, StepRow};
use crate::ids::RequestId;

/// One request's tokens and how many steps computed it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Generated {
    pub tokens: Vec<u32>,
    /// Steps that included the request (its first token's step included).
    pub steps: u32,
}

/// Where each request's pages are (`pages[id]`), for backends that want page tables.
pub type PageFor<'a> = &'a dyn Fn(RequestId) -> Vec<u32>;

fn row(req: &ContextArrival, g: &Generated, pages: PageFor<'_>) -> StepRow {
    let out = g.tokens.len() as u32;
    StepRow {
        id: req.id,
        slot: req.slot,
        context_len: req.prompt.len() as u32 + out.saturating_sub(1),
        last_token: g.tokens.last().copied().unwrap_or(0),
        pages: pages(req.id),
    }
}

/// `req` alone until it has `n` tokens (a step's extra tokens past `n` are dropped, as the
/// executor drops tokens past `max_tokens`).
pub fn solo(
    b: &mut dyn StepBackend,
    req: &ContextArrival,
    n: usize,
    pages: PageFor<'_>,
) -> Result<Generated, BackendError> {
    let mut all = interleaved(b, std::slice::from_ref(req), n, pages, |_, _| true)?;
    Ok(all.remove(0))
}

/// Every request of `reqs` until each has `n` tokens. Before each step, `run(step, i)` says
/// whether request i is in the batch; one left out keeps its state and is simply absent from
/// the step's rows. A request that is out of every step for long is still finished: after
/// 64 steps without it, it runs regardless. Releases every request at the end.
pub fn interleaved(
    b: &mut dyn StepBackend,
    reqs: &[ContextArrival],
    n: usize,
    pages: PageFor<'_>,
    mut run: impl FnMut(u32, usize) -> bool,
) -> Result<Vec<Generated>, BackendError> {
    for r in reqs {
        b.context_arrival(r)?;
    }
    let mut gen = vec![Generated::default(); reqs.len()];
    let mut idle = vec![0u32; reqs.len()];
    let mut step = 0u32;
    while gen.iter().any(|g| g.tokens.len() < n) {
        let mut batch = Vec::new();
        for (i, (r, g)) in reqs.iter().zip(&gen).enumerate() {
            if g.tokens.len() < n && (run(step, i) || idle[i] >= 64) {
                batch.push((i, row(r, g, pages)));
            }
        }
        step += 1;
        let rows: Vec<StepRow> = batch.iter().map(|(_, r)| r.clone()).collect();
        let out = b.step(&rows)?;
        for (i, x) in idle.iter_mut().enumerate() {
            *x = if batch.iter().any(|&(j, _)| j == i) {
                0
            } else {
                *x + 1
            };
        }
        for ((i, _), toks) in batch.iter().zip(out.tokens) {
            let g = &mut gen[*i];
            g.steps += 1;
            let room = n - g.tokens.len();
            g.tokens.extend(toks.into_iter().take(room));
        }
    }
    for r in reqs {
        b.release(r.id);
    }
    Ok(gen)
}
