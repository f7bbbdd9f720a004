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
use super::{BatchRow, FirstToken, PassOutput, Res};
use crate::policy::batch::BatchLimits;
use crate::policy::preemption::{AdmitRow, Resident};
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
        self.batch_places.clear();
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
            (x.kv_ready && !x.paused).then_some((r.admit_time, id, place))
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
        for &(_, id, place) in head.iter().take(limit) {
            self.head_row(id, place, now, out);
        }
        let heads = head.len();
        self.buf.head = head;
        let b = &mut self.buf;
        let left_out = if size_cut {
            &mut b.displaced_now
        } else {
            &mut b.token_limited
        };
        left_out.extend(b.head.iter().skip(limit).map(|&(_, id, _)| id));

        // The rest: not at the first token (those are in the head), not forced.
        let walk = Walk {
            order: self.residents.admission_order(),
            rows: self.residents.rows(),
            res: self.residents.res(),
            forced: &b.forced,
            tokens_per_step: self.params.tokens_per_step,
            heads,
            limit,
        };
        let skipped_firsts = walk.run(
            &mut out.batch,
            &mut self.batch_places,
            &mut b.grow,
            &mut b.growing,
            left_out,
        );
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
        self.batch_places.push(place);
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
            // The batch and its places stay aligned.
            let mut kept = 0;
            for i in 0..out.batch.len() {
                if !kv_waiting.contains(&out.batch[i].id) {
                    out.batch[kept] = out.batch[i];
                    self.batch_places[kept] = self.batch_places[i];
                    kept += 1;
                }
            }
            out.batch.truncate(kept);
            self.batch_places.truncate(kept);
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

/// The walk over the residents after the head, oldest admission first. Its own function
/// with the lists as parameters, so the compiler knows they do not overlap and keeps their
/// lengths in registers instead of reloading them after every row written.
struct Walk<'a> {
    order: &'a [AdmitRow],
    rows: &'a [Resident],
    res: &'a [Res],
    /// This pass's forced resumes, sorted (they are in the head).
    forced: &'a [RequestId],
    tokens_per_step: u32,
    /// Rows in the head, and the batch's size limit.
    heads: usize,
    limit: usize,
}

impl Walk<'_> {
    /// Writes the rows that fit into `batch` and `places`, the rows that outgrow their pages
    /// into `grow` and `growing`, and the rows past the limit into `left_out`. Returns how
    /// many rows at their first token it skipped (they are in the head).
    #[inline(never)]
    fn run(
        &self,
        batch: &mut Vec<BatchRow>,
        places: &mut Vec<u32>,
        grow: &mut Vec<(RequestId, u32)>,
        growing: &mut Vec<Growing>,
        left_out: &mut Vec<RequestId>,
    ) -> usize {
        let mut skipped_firsts = 0;
        // Rows are written into slices sized for every row the walk could take and cut to
        // length after: pushing reloaded and stored each list's length per row.
        let row0 = batch.len();
        let most = self.order.len().min(self.limit.saturating_sub(self.heads));
        batch.resize(row0 + most, BatchRow::default());
        places.resize(row0 + most, 0);
        let (rows_out, places_out) = (&mut batch[row0..], &mut places[row0..]);
        let mut n = 0;
        for a in self.order {
            let place = a.slot as usize;
            let (Some(r), Some(x)) = (self.rows.get(place), self.res.get(place)) else {
                continue;
            };
            if !x.kv_ready || x.paused {
                continue;
            }
            if r.first_token_time.is_none() {
                skipped_firsts += 1;
                continue;
            }
            if !self.forced.is_empty() && self.forced.binary_search(&r.id).is_ok() {
                continue;
            }
            let (Some(out), Some(out_place)) = (rows_out.get_mut(n), places_out.get_mut(n)) else {
                left_out.push(r.id);
                continue;
            };
            // `head_row` writes its rows the same way. One helper for both cost ~0.5 k
            // instructions per pass (these lists lose their no-overlap guarantee), so the
            // few lines stay in both places.
            let need = x.kv_need(r, self.tokens_per_step);
            if need > x.kv_capacity {
                grow.push((r.id, need));
                growing.push(Growing {
                    row: row0 + n,
                    place: a.slot,
                    output_tokens: r.output_tokens,
                });
            }
            *out_place = a.slot;
            *out = BatchRow {
                id: r.id,
                slot: x.slot,
                context_len: x.cached_tokens(r),
                first_token: false,
            };
            n += 1;
        }
        batch.truncate(row0 + n);
        places.truncate(row0 + n);
        skipped_firsts
    }
}
