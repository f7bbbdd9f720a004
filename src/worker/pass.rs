//! The scheduling pass (SPEC §4.1), the one place its order exists:
//! ingest → track/resume/pause → admit → build batch.
//! [`PassMachine`] is the executor-side state (the resident table, the last batch, the
//! displaced list, totals, reused buffers); the components answer through [`Ports`].
//! No clock, no I/O, no randomness.

use super::ports::{AdmitOutcome, Ports, QueueIngest, RetainOp};
use super::table::ResidentTable;
use super::{Admitted, PassInputs, PassOutput, Res, WorkerParams, WorkerTotals};
use crate::ids::RequestId;
use crate::policy::admission::Popped;
use crate::policy::kv_stall;
use crate::policy::preemption::{Departure, KvRoom, PreemptDecision, Resident, StepView};
use crate::pools::AdmitBudget;

#[derive(Debug, Clone)]
pub struct PassMachine {
    pub(super) params: WorkerParams,
    pub(super) residents: ResidentTable,
    /// The places in the table of the last pass's batch rows, aligned with its batch: step
    /// results usually come back in this order, and the table does not change between the
    /// batch and them.
    pub(super) batch_places: Vec<u32>,
    /// Residents whose first token is not out yet (and some that left or got it since:
    /// the batch build prunes them).
    pub(super) first_pending: Vec<RequestId>,
    /// Requests left out of the last batch by its limits (they keep all state).
    pub(super) displaced: Vec<RequestId>,
    /// D as of the last controller step (the admission queue's refresh uses it).
    d: Option<f64>,
    /// Waiters after the last pass.
    queue_len: usize,
    pub(super) pass_no: u64,
    pub(super) totals: WorkerTotals,
    pub(super) last_batch: usize,
    /// Rows that waited for a KV page in the last pass (`kv_stall`'s growth first).
    kv_waited: usize,
    /// The resident a stalled pass chose to abort; the next pass departs it.
    abort_next: Option<RequestId>,
    pub(super) buf: Buffers,
}

/// Buffers reused every pass, so a pass allocates little.
#[derive(Debug, Clone, Default)]
pub(super) struct Buffers {
    /// The batch's head: first tokens, then forced resumes, as (admit time, id, place).
    pub(super) head: Vec<(f64, RequestId, u32)>,
    finished: Vec<RequestId>,
    leaving: Vec<RequestId>,
    gone: Vec<RequestId>,
    transfers: Vec<(u32, f64)>,
    cancelled: Vec<RequestId>,
    popped: Vec<Popped>,
    outcomes: Vec<AdmitOutcome>,
    abandoned: Vec<RequestId>,
    pub(super) grow: Vec<(RequestId, u32)>,
    pub(super) grown: Vec<Option<u32>>,
    pub(super) growing: Vec<super::build::Growing>,
    pub(super) ttfts: Vec<f64>,
    pub(super) retain: Vec<RetainOp>,
    /// Left out of this pass's batch by `max_batch_size` and by `max_num_tokens`.
    pub(super) displaced_now: Vec<RequestId>,
    pub(super) token_limited: Vec<RequestId>,
    pub(super) displaced: Vec<RequestId>,
}

impl PassMachine {
    pub fn new(params: WorkerParams) -> Self {
        Self {
            params,
            residents: ResidentTable::default(),
            batch_places: Vec::new(),
            first_pending: Vec::new(),
            displaced: Vec::new(),
            d: None,
            queue_len: 0,
            pass_no: 0,
            totals: WorkerTotals::default(),
            last_batch: 0,
            kv_waited: 0,
            abort_next: None,
            buf: Buffers::default(),
        }
    }

    pub fn params(&self) -> &WorkerParams {
        &self.params
    }
    pub fn totals(&self) -> WorkerTotals {
        self.totals
    }
    pub fn resident_count(&self) -> usize {
        self.residents.len()
    }
    pub fn is_resident(&self, id: RequestId) -> bool {
        self.residents.contains_key(&id)
    }
    pub fn pass_no(&self) -> u64 {
        self.pass_no
    }
    pub fn displaced(&self) -> &[RequestId] {
        &self.displaced
    }
    pub fn last_batch(&self) -> usize {
        self.last_batch
    }

    /// One scheduling pass into `out`, every field overwritten: a caller that keeps `out`
    /// across passes reuses its buffers, and the pass then allocates next to nothing.
    /// The order of the phases and their port calls is here; each phase's own work is a
    /// plain method below.
    pub async fn run<P: Ports>(&mut self, ports: &mut P, inp: &PassInputs, out: &mut PassOutput) {
        let now = inp.now;
        self.pass_no += 1;
        out.reset(now, self.pass_no);
        let has_drafter = self.params.drafter_window.is_some();

        // Ingest: arrivals, step results, KV arrivals, cancellations.
        self.kv_arrivals(inp);
        self.buf.cancelled.clear();
        // W₀ uses D as of the previous pass.
        let q = QueueIngest {
            arrivals: &inp.arrivals,
            step_s: inp.step_s,
            transfers: &self.buf.transfers,
            cancellations: &inp.cancellations,
            now,
            d: self.d,
        };
        let facts = ports
            .queue_ingest(q, &mut out.rejected, &mut self.buf.cancelled)
            .await;
        self.step_results(inp);
        if has_drafter && !inp.stepped.is_empty() {
            ports.drafter_push(inp).await;
        }
        self.departures(inp, out);

        // Track, resume, pause.
        let kv = self.kv_room(facts.head_tokens);
        let reply = ports
            .step(StepView {
                now,
                residents: self.residents.rows(),
                by_admission: Some(self.residents.admission_order()),
                departed: &out.departed,
                queue: facts,
                kv,
            })
            .await;
        self.d = reply.d;
        let dec = reply.decision;
        self.apply_decision(&dec, has_drafter);

        // Admit: paused requests already took their slots; the rest go to the queue, in
        // order, while every pool has room. The departed release their leases first (the
        // step never reads a pool), and the pools say how much room that leaves.
        let free = if kv_stall::admissions_wait(self.kv_waited, !dec.pauses.is_empty()) {
            0
        } else {
            self.params.max_active.saturating_sub(dec.admission_count)
        };
        let budget = if !self.buf.gone.is_empty() || free > 0 {
            ports.release(&self.buf.gone).await
        } else {
            AdmitBudget::empty(&self.params.kv)
        };
        self.buf.popped.clear();
        // The queue's length follows from the last pass's and this ingest's answers; an
        // empty queue has nothing to pop or to mark, so it is not asked.
        let queued = (self.queue_len + inp.arrivals.len())
            .saturating_sub(out.rejected.len() + self.buf.cancelled.len());
        let queue_len = match queued {
            0 => 0,
            _ => {
                ports
                    .pop_admissible(free, budget, &mut self.buf.popped)
                    .await
            }
        };
        self.queue_len = queue_len;
        if !self.buf.popped.is_empty() {
            ports.admit(&self.buf.popped, &mut self.buf.outcomes).await;
            self.admitted(now, out);
            if !self.buf.abandoned.is_empty() {
                ports.abandon(&self.buf.abandoned).await;
            }
        }

        // Build the batch; rows that outgrow their pages ask the KV pool, in batch order.
        self.build_batch(&dec.forced_resumes, now, out);
        if !self.buf.grow.is_empty() {
            ports.kv_grow(&self.buf.grow, &mut self.buf.grown).await;
            self.settle_growth(out);
        }
        if !self.buf.ttfts.is_empty() {
            ports.observe_ttft(&self.buf.ttfts).await;
        }
        self.displacement(has_drafter, out);
        if !self.buf.retain.is_empty() {
            ports.drafter_retention(&self.buf.retain).await;
        }

        self.kv_waited = out.kv_waiting.len();
        self.abort_next = None;
        let res = self.residents.res();
        let awaiting = || res.iter().filter(|x| !x.is(Res::KV_READY)).count();
        if kv_stall::stalled(out.batch.len(), self.kv_waited, awaiting) {
            let order = self.residents.admission_order().iter();
            let rows = self.residents.rows();
            self.abort_next = kv_stall::abort_victim(order.map(|&p| rows[p as usize].id));
        }

        out.pauses = dec.pauses;
        out.resumes = dec.resumes;
        out.forced_resumes = dec.forced_resumes;
        out.admission_count = dec.admission_count;
        out.window = dec.window;
        out.queue_len = queue_len;
        out.paused = reply.paused;
    }

    /// What the KV pool can promise a pause (`policy::preemption::kv_room`): the pages every
    /// resident and the head need to finish (context and `max_tokens`, with a step's extra
    /// tokens and the sliding-window reservation), against the pool's pages.
    fn kv_room(&self, head_tokens: Option<u64>) -> KvRoom {
        let kv = &self.params.kv;
        let tpb = u64::from(kv.tokens_per_block.max(1));
        let extra = u64::from(self.params.tokens_per_step.saturating_sub(1));
        let swa = u64::from(kv.swa_pages_per_resident());
        let pages = |tokens: u64| (tokens + extra).div_ceil(tpb) + swa;
        let committed_pages = self
            .residents
            .rows()
            .iter()
            .zip(self.residents.res())
            .map(|(r, x)| pages(u64::from(x.context_tokens) + u64::from(r.max_tokens)))
            .sum();
        KvRoom {
            committed_pages,
            head_pages: head_tokens.map(pages),
            total_pages: u64::from(kv.total_pages),
        }
    }

    /// KV arrivals: the resident's record, and the transfer times the queue learns from.
    fn kv_arrivals(&mut self, inp: &PassInputs) {
        let b = &mut self.buf;
        b.transfers.clear();
        for k in &inp.kv_ready {
            if let Some(r) = self.residents.get_mut(&k.id) {
                if !r.x.is(Res::KV_READY) {
                    r.x.set(Res::KV_READY, true);
                    b.transfers
                        .push((r.x.context_tokens, (k.at - r.v.admit_time).max(0.0)));
                }
            }
        }
    }

    /// The last step's tokens; the requests it finished, sorted and deduplicated.
    fn step_results(&mut self, inp: &PassInputs) {
        let b = &mut self.buf;
        b.finished.clear();
        // Plain slices, so the lists' lengths and buffers stay in registers while rows are
        // written (through the table they were reloaded for every result).
        let places = &self.batch_places[..];
        let rows = self.residents.rows_mut();
        for (i, st) in inp.stepped.iter().enumerate() {
            let place = match places.get(i) {
                Some(&p) if rows.get(p as usize).is_some_and(|r| r.id == st.id) => p as usize,
                _ => match rows.binary_search_by_key(&st.id, |r| r.id) {
                    Ok(p) => p,
                    Err(_) => continue,
                },
            };
            let r = &mut rows[place];
            r.output_tokens = (r.output_tokens + st.tokens).min(r.max_tokens);
            r.decode_iters += 1;
            if st.stop || r.output_tokens >= r.max_tokens {
                b.finished.push(st.id);
            }
        }
        b.finished.sort_unstable();
        b.finished.dedup();
    }

    /// Finished and cancelled residents leave (their ids into `gone`, for the pools).
    fn departures(&mut self, inp: &PassInputs, out: &mut PassOutput) {
        let now = inp.now;
        let b = &mut self.buf;
        self.totals.arrivals += inp.arrivals.len() as u64;
        self.totals.rejected += out.rejected.len() as u64;
        self.totals.cancelled += b.cancelled.len() as u64;
        out.cancelled.extend_from_slice(&b.cancelled);
        b.leaving.clear();
        b.leaving.extend_from_slice(&b.finished);
        // `cancelled` is the queued part of `cancellations`, in order: the rest may be resident.
        let mut queued = b.cancelled.iter().peekable();
        for &id in &inp.cancellations {
            if queued.next_if_eq(&&id).is_some() {
                continue;
            }
            if self.residents.contains_key(&id) && b.finished.binary_search(&id).is_err() {
                b.leaving.push(id);
            }
        }
        // A stalled last pass chose a resident to abort (`kv_stall`): nothing stepped since.
        let aborted = self
            .abort_next
            .take()
            .filter(|&id| self.residents.contains_key(&id) && !b.leaving.contains(&id));
        b.leaving.extend(aborted);
        b.leaving.sort_unstable();
        b.leaving.dedup();
        b.gone.clear();
        let (totals, displaced) = (&mut self.totals, &mut self.displaced);
        self.residents.remove_sorted(&b.leaving, |r, _| {
            let id = r.id;
            let completed = b.finished.binary_search(&id).is_ok();
            if completed {
                totals.completed += 1;
            } else if aborted == Some(id) {
                totals.kv_aborts += 1;
                out.kv_aborted.push(id);
            } else {
                totals.cancelled += 1;
                out.cancelled.push(id);
            }
            out.departed.push(Departure {
                id,
                completed,
                first_token_time: r.first_token_time,
                finish_time: now,
                output_tokens: r.output_tokens,
            });
            b.gone.push(id);
            displaced.retain(|x| *x != id);
        });
    }

    /// The controller's pauses and resumes in the table, and the drafter's retention.
    fn apply_decision(&mut self, dec: &PreemptDecision, has_drafter: bool) {
        for id in &dec.pauses {
            if let Some(r) = self.residents.get_mut(id) {
                r.x.set(Res::PAUSED, true);
            }
        }
        for id in dec.resumes.iter().chain(&dec.forced_resumes) {
            if let Some(r) = self.residents.get_mut(id) {
                r.x.set(Res::PAUSED, false);
            }
        }
        let b = &mut self.buf;
        b.retain.clear();
        if has_drafter {
            b.retain
                .extend(dec.pauses.iter().map(|&id| RetainOp::Retain(id)));
            b.retain.extend(
                dec.resumes
                    .iter()
                    .chain(&dec.forced_resumes)
                    .map(|&id| RetainOp::Unretain(id)),
            );
        }
    }

    /// The popped waiters with a lease in every pool become residents.
    fn admitted(&mut self, now: f64, out: &mut PassOutput) {
        let b = &mut self.buf;
        b.abandoned.clear();
        for (p, o) in b.popped.iter().zip(&b.outcomes) {
            let w = p.waiter;
            let Some((slot, kv_pages)) = o.lease() else {
                // Should not happen within the budget; the request fails rather than leaks.
                out.rejected.push(w.id);
                b.abandoned.push(w.id);
                continue;
            };
            self.residents.insert(
                Resident {
                    id: w.id,
                    arrival: w.arrival,
                    admit_time: now,
                    first_token_time: None,
                    output_tokens: 0,
                    decode_iters: 0,
                    max_tokens: w.max_tokens,
                },
                Res::new(
                    w.context_tokens,
                    slot,
                    kv_pages * self.params.kv.tokens_per_block,
                    p.waited,
                ),
            );
            self.first_pending.push(w.id);
            self.totals.admitted += 1;
            out.admitted.push(Admitted {
                id: w.id,
                slot,
                context_tokens: w.context_tokens,
                max_tokens: w.max_tokens,
            });
        }
    }
}
