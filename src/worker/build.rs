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
use crate::ids::RequestId;
use crate::policy::batch::BatchLimits;
use crate::policy::preemption::Resident;

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
            x.ready().then_some((r.admit_time, id, place))
        };
        let order = |a: &(f64, RequestId, u32), b: &(f64, RequestId, u32)| {
            a.0.total_cmp(&b.0).then(a.1.cmp(&b.1))
        };
        b.head
            .extend(self.first_pending.iter().filter_map(|&id| ready(id)));
        b.head.sort_unstable_by(order);
        let firsts = b.head.len();
        b.head.extend(forced_resumes.iter().filter_map(|&id| {
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
        for &(_, id, place) in &head {
            // The walk passes over every head row, whether or not the cut took it.
            if let Some(r) = self.residents.at_mut(place, id) {
                r.x.set(Res::IN_HEAD, true);
            }
        }
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

        // The rest: neither at the first token nor forced (those are in the head).
        let walk = Walk {
            order: self.residents.admission_order(),
            rows: self.residents.rows(),
            res: self.residents.res(),
            tokens_per_step: self.params.tokens_per_step,
            heads,
            limit,
        };
        let missed_firsts = walk.run(
            &mut out.batch,
            &mut self.batch_places,
            &mut b.grow,
            &mut b.growing,
            left_out,
        );
        debug_assert_eq!(missed_firsts, 0, "a first-token row missed the head");
        // The head's first tokens count in only now: the walk told them by their absence.
        for (k, &(_, id, place)) in self.buf.head.iter().enumerate() {
            if let Some(r) = self.residents.at_mut(place, id) {
                r.x.set(Res::IN_HEAD, false);
                if k < firsts.min(limit) {
                    r.v.first_token_time = Some(now);
                    r.v.output_tokens = 1;
                    r.x.set(Res::STARTED, true);
                }
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
                        r.x.set(Res::STARTED, false);
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
                let paused = self
                    .residents
                    .get(&id)
                    .is_some_and(|(_, x)| x.is(Res::PAUSED));
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
    /// Places, oldest admission first.
    order: &'a [u32],
    rows: &'a [Resident],
    res: &'a [Res],
    tokens_per_step: u32,
    /// Rows in the head, and the batch's size limit.
    heads: usize,
    limit: usize,
}

impl Walk<'_> {
    /// Writes the rows that fit into `batch` and `places`, the rows that outgrow their pages
    /// into `grow` and `growing`, and the rows past the limit into `left_out`. Returns, in debug
    /// builds, how many ready rows at their first token it found outside the head (none
    /// should be).
    ///
    /// Two loops. The first picks the rows that join from each record's state byte alone
    /// (KV arrived and started, neither paused nor in the head): every place is written at
    /// the next free place, which advances only for a row that joins, so the loop is a few
    /// instructions per row with no branch on what it reads. The second writes the picked
    /// rows, with nothing left to test but their growth. (One loop that wrote every row's
    /// batch row that way ran slower than branching; a pick that tested the flags and the
    /// row's first token one by one took more instructions.)
    #[inline(never)]
    fn run(
        &self,
        batch: &mut Vec<BatchRow>,
        places: &mut Vec<u32>,
        grow: &mut Vec<(RequestId, u32)>,
        growing: &mut Vec<Growing>,
        left_out: &mut Vec<RequestId>,
    ) -> usize {
        const JOINS: u8 = Res::KV_READY | Res::STARTED;
        // Ready but not started, and not in the head: a first token the head missed.
        const MISSED_FIRST: u8 = Res::KV_READY;
        let row0 = places.len();
        // Every row could join, and one place more takes the last row's write when it
        // does not.
        places.resize(row0 + self.order.len() + 1, 0);
        let picked = &mut places[row0..];
        let (mut n, mut missed_firsts) = (0, 0);
        for &place in self.order {
            let Some(slot) = picked.get_mut(n) else {
                break;
            };
            let state = self.res.get(place as usize).map_or(0, |x| x.state);
            *slot = place;
            // Only the debug check reads the count.
            if cfg!(debug_assertions) {
                missed_firsts += usize::from(state == MISSED_FIRST);
            }
            n += usize::from(state == JOINS);
        }
        // The cut: the picked rows past it are left out.
        let most = n.min(self.limit.saturating_sub(self.heads));
        left_out.extend(
            picked[most..n]
                .iter()
                .filter_map(|&p| self.rows.get(p as usize).map(|r| r.id)),
        );
        places.truncate(row0 + most);
        let (rows, res, tokens_per_step) = (self.rows, self.res, self.tokens_per_step);
        // Every picked place holds a row (the pick read its state).
        batch.extend(places[row0..].iter().enumerate().map(move |(k, &place)| {
            let (r, x) = (&rows[place as usize], &res[place as usize]);
            // `head_row` writes its rows the same way. One helper for both cost ~0.5 k
            // instructions per pass (these lists lose their no-overlap guarantee), so the
            // few lines stay in both places.
            let context_len = x.cached_tokens(r);
            // Past its first token, a row needs its cached tokens and this step's.
            let need = context_len + tokens_per_step;
            if need > x.kv_capacity {
                grow.push((r.id, need));
                growing.push(Growing {
                    row: row0 + k,
                    place,
                    output_tokens: r.output_tokens,
                });
            }
            BatchRow {
                id: r.id,
                slot: x.slot,
                context_len,
                first_token: false,
            }
        }));
        missed_firsts
    }
}
