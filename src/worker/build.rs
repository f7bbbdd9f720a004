//! The batch build (SPEC §4.6) inside the pass: the batch's rows, first tokens and the
//! KV growth its rows need, then the KV pool's answers and the displacement that follows.
//!
//! The batch is first tokens, then forced resumes, then the rest, each oldest admission
//! first, cut at the limits. Every request costs the same tokens, so the cut is a count
//! known before any row is seen (`max_batch_size`, and `max_num_tokens` over the tokens
//! per request): a row is in the batch exactly when its place in that order is below
//! the count, and one walk over the residents oldest admission first writes the batch.
//! The first two classes are few (admissions and forced resumes of this pass), so they
//! come from their own short lists and the walk skips them.

use super::pass::PassMachine;
use super::ports::RetainOp;
use super::table::RowMut;
use super::{BatchRow, FirstToken, PassOutput};
use crate::policy::batch::BatchLimits;
use crate::policy::RequestId;

/// A batch row that outgrows its pages, until the KV pool answers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Growing {
    /// Its place in the pass's batch.
    row: usize,
    /// Its place in the resident table.
    place: u32,
    /// Its output tokens before the pass counted a first token in.
    output_tokens: u32,
}

impl PassMachine {
    /// The batch rows and first tokens, every row counted in; the rows that outgrow their
    /// pages are listed in `grow` (with their place) for the KV pool; the rows the limits
    /// leave out in `displaced_now` or `token_limited`.
    pub(super) fn build_batch(
        &mut self,
        forced_resumes: &[RequestId],
        now: f64,
        out: &mut PassOutput,
    ) {
        self.batch_rows.clear();
        let b = &mut self.buf;
        b.ttfts.clear();
        b.grow.clear();
        b.growing.clear();
        b.displaced_now.clear();
        b.token_limited.clear();
        b.forced.clear();
        b.forced.extend_from_slice(forced_resumes);
        b.forced.sort_unstable();

        // The head: residents at their first token, then forced resumes, each oldest
        // admission first; only those whose KV arrived and that are not paused.
        let table = &self.residents;
        self.first_pending.retain(|id| {
            table
                .get(id)
                .is_some_and(|(r, _)| r.first_token_time.is_none())
        });
        b.head.clear();
        let ready = |id: RequestId| {
            let place = table.place(id)?;
            let (r, x) = table.at(place);
            (x.kv_ready.is_some() && !x.paused).then_some((r.admit_time, id, place))
        };
        let order = |a: &(f64, RequestId, u32), b: &(f64, RequestId, u32)| {
            a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
        };
        b.head
            .extend(self.first_pending.iter().filter_map(|&id| ready(id)));
        b.head.sort_unstable_by(order);
        let firsts = b.head.len();
        b.head.extend(b.forced.iter().filter_map(|&id| {
            ready(id).filter(|&(_, _, p)| table.at(p).0.first_token_time.is_some())
        }));
        b.head[firsts..].sort_unstable_by(order);

        // Anything left out is left out by the limit that set the cut.
        let (limit, size_cut) = BatchLimits {
            max_batch_size: self.params.max_batch_size,
            max_num_tokens: self.params.max_num_tokens,
            tokens_per_request: self.params.tokens_per_step,
        }
        .cut();
        out.batch.reserve(self.residents.len().min(limit));
        let head = std::mem::take(&mut b.head);
        for (i, &(_, id, place)) in head.iter().enumerate() {
            if i < limit {
                self.head_row(id, place, now, out);
            } else {
                self.left_out(id, size_cut);
            }
        }
        let heads = head.len();
        self.buf.head = head;

        // The rest: not at the first token (those are in the head), not forced.
        let tps = self.params.tokens_per_step;
        let b = &mut self.buf;
        let mut skipped_firsts = 0;
        // Place in the batch order of the next row.
        let mut at = heads;
        for a in self.residents.admission_order() {
            let (r, x) = self.residents.at(a.slot);
            if x.kv_ready.is_none() || x.paused {
                continue;
            }
            if r.first_token_time.is_none() {
                skipped_firsts += 1;
                continue;
            }
            if !b.forced.is_empty() && b.forced.binary_search(&r.id).is_ok() {
                continue;
            }
            at += 1;
            if at > limit {
                if size_cut {
                    b.displaced_now.push(r.id);
                } else {
                    b.token_limited.push(r.id);
                }
                continue;
            }
            let need = x.kv_need(r, tps);
            if need > x.kv_capacity {
                b.grow.push((r.id, need));
                b.growing.push(Growing {
                    row: out.batch.len(),
                    place: a.slot,
                    output_tokens: r.output_tokens,
                });
            }
            self.batch_rows.push((r.id, a.slot));
            out.batch.push(BatchRow {
                id: r.id,
                slot: x.slot,
                context_len: x.cached_tokens(r),
                first_token: false,
            });
        }
        debug_assert_eq!(skipped_firsts, firsts, "a first-token row missed the head");
        // The head's first tokens count in only now: the walk told them by their absence.
        for &(_, id, place) in &self.buf.head[..firsts.min(limit)] {
            if let Some(r) = self.residents.at_mut(place, id) {
                r.v.first_token_time = Some(now);
                r.v.output_tokens = 1;
            }
        }
        self.last_batch = out.batch.len();
    }

    fn left_out(&mut self, id: RequestId, size_cut: bool) {
        if size_cut {
            self.buf.displaced_now.push(id);
        } else {
            self.buf.token_limited.push(id);
        }
    }

    /// A head row into the batch, its growth listed; a first token is reported here and
    /// counted into the record after the walk.
    fn head_row(&mut self, id: RequestId, place: u32, now: f64, out: &mut PassOutput) {
        let b = &mut self.buf;
        let Some(RowMut { v: r, x }) = self.residents.at_mut(place, id) else {
            return;
        };
        let first = r.first_token_time.is_none();
        let need = x.kv_need(r, self.params.tokens_per_step);
        if need > x.kv_capacity {
            b.grow.push((id, need));
            b.growing.push(Growing {
                row: out.batch.len(),
                place,
                output_tokens: r.output_tokens,
            });
        }
        if first {
            debug_assert_eq!(r.output_tokens, 0, "a first token after output");
            let ttft = now - r.arrival;
            if x.waited {
                b.ttfts.push(ttft);
            }
            out.first_tokens.push(FirstToken {
                id,
                ttft,
                waited: x.waited,
            });
        }
        self.batch_rows.push((id, place));
        out.batch.push(BatchRow {
            id,
            slot: x.slot,
            context_len: x.cached_tokens(r),
            first_token: first,
        });
    }

    /// The KV pool's answers for the growing rows: a row whose growth found no page
    /// leaves the batch and waits, as if never scheduled (its first token too).
    pub(super) fn settle_growth(&mut self, out: &mut PassOutput) {
        let b = &mut self.buf;
        let tpb = self.params.kv.tokens_per_block;
        let mut waiting = 0;
        for (g, pages) in b.growing.iter().zip(&b.grown) {
            let row = out.batch[g.row];
            let Some(r) = self.residents.at_mut(g.place, row.id) else {
                continue;
            };
            match pages {
                Some(pages) => r.x.kv_capacity = pages * tpb,
                None => {
                    if row.first_token {
                        if !self.first_pending.contains(&row.id) {
                            self.first_pending.push(row.id);
                        }
                        r.v.first_token_time = None;
                        r.v.output_tokens = g.output_tokens;
                        let at = out.first_tokens.iter().position(|f| f.id == row.id);
                        if let Some(f) = at.map(|i| out.first_tokens.remove(i)) {
                            if f.waited {
                                // TTFTs are in first-token order, waited ones only.
                                let k = out.first_tokens[..at.unwrap_or(0)]
                                    .iter()
                                    .filter(|f| f.waited)
                                    .count();
                                b.ttfts.remove(k);
                            }
                        }
                    }
                    self.totals.kv_waits += 1;
                    out.kv_waiting.push(row.id);
                    waiting += 1;
                }
            }
        }
        if waiting > 0 {
            let kv_waiting = &out.kv_waiting[out.kv_waiting.len() - waiting..];
            out.batch.retain(|r| !kv_waiting.contains(&r.id));
            self.batch_rows.retain(|(id, _)| !kv_waiting.contains(id));
            self.last_batch = out.batch.len();
        }
    }

    /// Displaced requests keep their drafter state until they are back in a batch.
    pub(super) fn displacement(&mut self, has_drafter: bool, out: &mut PassOutput) {
        let b = &mut self.buf;
        let now_displaced = &mut b.displaced;
        now_displaced.clear();
        now_displaced.extend(b.displaced_now.iter().chain(&b.token_limited));
        if has_drafter {
            now_displaced.sort_unstable();
            for &id in &self.displaced {
                let paused = self.residents.get(&id).is_some_and(|(_, x)| x.paused);
                if now_displaced.binary_search(&id).is_err() && !paused {
                    b.retain.push(RetainOp::Unretain(id));
                }
            }
            b.retain
                .extend(now_displaced.iter().map(|&id| RetainOp::Retain(id)));
        }
        self.totals.displaced += b.displaced_now.len() as u64;
        std::mem::swap(&mut self.displaced, &mut b.displaced);
        out.displaced.extend_from_slice(&b.displaced_now);
        out.token_limited.extend_from_slice(&b.token_limited);
    }
}
