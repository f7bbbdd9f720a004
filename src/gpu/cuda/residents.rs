//! What a real-model step backend keeps per resident request to sample its tokens: the
//! sampling parameters and seed, how many tokens it produced (EOS is banned below
//! `min_tokens`), and how its first token comes: a prefill's token waiting to be emitted, or
//! (`context: transfer`) the last prompt token the first step must compute. Host-only; the
//! CUDA backend and the CPU reference backend share it.

use std::collections::HashMap;

use crate::gpu::{BackendError, ContextArrival, StepRow};
use crate::ids::RequestId;
use crate::sampling::{SampleRow, SamplingParams};

/// One resident request's sampling state.
#[derive(Debug, Clone, PartialEq)]
pub struct ReqState {
    /// Its sequence slot (where its recurrent state and drafter window live).
    pub slot: u32,
    /// `context: prefill`: the prefill's token, emitted by the next step with the request.
    pub first_token: Option<u32>,
    /// `context: transfer`: the last prompt token, the first step's input (the transfer
    /// brings the KV of the tokens before it).
    pub first_input: Option<u32>,
    pub sampling: SamplingParams,
    /// `sampling.seed_for(id)`.
    pub seed: u64,
    pub min_tokens: u32,
    /// Tokens sampled so far.
    pub produced: u32,
}

impl ReqState {
    pub fn new(req: &ContextArrival) -> Self {
        ReqState {
            slot: req.slot,
            first_token: None,
            first_input: None,
            sampling: req.sampling,
            seed: req.sampling.seed_for(req.id),
            min_tokens: req.min_tokens,
            produced: 0,
        }
    }

    /// The device parameters for the next token, at `position` (tokens before it); `eos` is
    /// banned while fewer than `min_tokens` were produced.
    pub fn sample_row(&self, position: u64, eos: Option<u32>) -> SampleRow {
        self.sample_row_ahead(position, 0, eos)
    }

    /// The parameters of the token `ahead` places after the next one (a verify pass samples
    /// each draft's position as plain decoding would once the tokens before it were out).
    pub fn sample_row_ahead(&self, position: u64, ahead: u32, eos: Option<u32>) -> SampleRow {
        let banned = eos.filter(|_| self.produced.saturating_add(ahead) < self.min_tokens);
        self.sampling
            .device_row(self.seed, position + u64::from(ahead), banned)
    }
}

/// One step's work, in the order of the batch.
#[derive(Debug, Default)]
pub struct StepPlan {
    /// Each batch row's tokens; rows that need computing are filled by [`Residents::finish`].
    pub tokens: Vec<Vec<u32>>,
    /// Rows to compute: each consumes `last_token` at position `context_len`.
    pub run: Vec<StepRow>,
    /// The sampling parameters of each row of `run`.
    pub samples: Vec<SampleRow>,
    /// The batch index of each row of `run`.
    pub run_idx: Vec<usize>,
}

/// The resident requests of a backend.
#[derive(Debug, Default)]
pub struct Residents {
    reqs: HashMap<RequestId, ReqState>,
}

impl Residents {
    pub fn len(&self) -> usize {
        self.reqs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn contains(&self, id: RequestId) -> bool {
        self.reqs.contains_key(&id)
    }

    pub fn get(&self, id: RequestId) -> Option<&ReqState> {
        self.reqs.get(&id)
    }

    /// Another resident that holds sequence slot `slot` (a scheduler bug the backend must
    /// not turn into two requests sharing a state).
    pub fn slot_holder(&self, slot: u32, except: RequestId) -> Option<RequestId> {
        self.reqs
            .iter()
            .find(|(&id, st)| st.slot == slot && id != except)
            .map(|(&id, _)| id)
    }

    pub fn insert(&mut self, id: RequestId, st: ReqState) {
        self.reqs.insert(id, st);
    }

    pub fn remove(&mut self, id: RequestId) {
        self.reqs.remove(&id);
    }

    /// `context: prefill`: the state of an arriving request and the sampling row of its
    /// first token (position = prompt length).
    pub fn arriving(req: &ContextArrival, eos: Option<u32>) -> (ReqState, SampleRow) {
        let st = ReqState::new(req);
        let row = st.sample_row(req.prompt.len() as u64, eos);
        (st, row)
    }

    /// The prefill drew `token`: the next step with the request emits it.
    pub fn prefilled(&mut self, id: RequestId, mut st: ReqState, token: u32) {
        st.first_token = Some(token);
        st.produced = 1;
        self.reqs.insert(id, st);
    }

    /// Which rows of a step need computing, with what input and sampling. A prefill's first
    /// token is emitted as it is; a transfer arrival's first step computes its last prompt
    /// token at its own position (`context_len - 1`).
    pub fn plan(&self, rows: &[StepRow], eos: Option<u32>) -> Result<StepPlan, BackendError> {
        let mut plan = StepPlan {
            tokens: vec![Vec::new(); rows.len()],
            ..StepPlan::default()
        };
        for (i, r) in rows.iter().enumerate() {
            let st = self
                .reqs
                .get(&r.id)
                .ok_or(BackendError::UnknownRequest(r.id))?;
            if let Some(t) = st.first_token {
                plan.tokens[i] = vec![t];
                continue;
            }
            let mut row = r.clone();
            if let Some(t) = st.first_input {
                row.last_token = t;
                row.context_len = r.context_len.saturating_sub(1);
            }
            plan.samples
                .push(st.sample_row(u64::from(row.context_len) + 1, eos));
            plan.run.push(row);
            plan.run_idx.push(i);
        }
        Ok(plan)
    }

    /// Puts the computed `tokens` (one per `plan.run` row) into the plan and advances each
    /// request's state; returns the batch's tokens.
    pub fn finish(
        &mut self,
        rows: &[StepRow],
        plan: StepPlan,
        tokens: &[u32],
    ) -> Result<Vec<Vec<u32>>, BackendError> {
        self.finish_rows(rows, plan, tokens.iter().map(std::slice::from_ref))
    }

    /// [`finish`](Self::finish) with any number of tokens per computed row (a verify pass
    /// emits its accepted drafts and one more).
    pub fn finish_rows<'a>(
        &mut self,
        rows: &[StepRow],
        mut plan: StepPlan,
        tokens: impl ExactSizeIterator<Item = &'a [u32]>,
    ) -> Result<Vec<Vec<u32>>, BackendError> {
        if tokens.len() != plan.run.len() {
            return Err(BackendError::Failed(format!(
                "{} token rows for {} computed rows",
                tokens.len(),
                plan.run.len()
            )));
        }
        for (&i, t) in plan.run_idx.iter().zip(tokens) {
            plan.tokens[i].clear();
            plan.tokens[i].extend_from_slice(t);
        }
        for (r, toks) in rows.iter().zip(&plan.tokens) {
            if let Some(st) = self.reqs.get_mut(&r.id) {
                if st.first_token.take().is_none() {
                    st.produced += toks.len() as u32;
                }
                st.first_input = None;
            }
        }
        Ok(plan.tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(
        id: u64,
        prompt_len: usize,
        min_tokens: u32,
        sampling: SamplingParams,
    ) -> ContextArrival {
        ContextArrival {
            id,
            slot: 0,
            prompt: (0..prompt_len as u32).map(|t| t + 10).collect(),
            pages: vec![0],
            sampling,
            min_tokens,
        }
    }

    fn row(id: u64, ctx: u32, last: u32) -> StepRow {
        StepRow {
            id,
            slot: 0,
            context_len: ctx,
            last_token: last,
            pages: vec![0],
        }
    }

    #[test]
    fn a_prefilled_request_emits_its_token_first_then_computes_at_the_next_position() {
        let mut r = Residents::default();
        let a = arrival(1, 20, 0, SamplingParams::GREEDY);
        let (st, first) = Residents::arriving(&a, Some(2));
        assert_eq!(first.key, crate::sampling::row_key(st.seed, 20));
        r.prefilled(1, st, 77);
        let rows = [row(1, 20, 0)];
        let plan = r.plan(&rows, Some(2)).unwrap();
        assert!(plan.run.is_empty());
        assert_eq!(r.finish(&rows, plan, &[]).unwrap(), vec![vec![77]]);
        // The executor's next row: context 20 (the first token sits at position 20).
        let rows = [row(1, 20, 77)];
        let plan = r.plan(&rows, Some(2)).unwrap();
        assert_eq!((plan.run[0].context_len, plan.run[0].last_token), (20, 77));
        assert_eq!(
            plan.samples[0].key,
            crate::sampling::row_key(r.get(1).unwrap().seed, 21)
        );
        assert_eq!(r.finish(&rows, plan, &[5]).unwrap(), vec![vec![5]]);
        assert_eq!(r.get(1).unwrap().produced, 2);
    }

    #[test]
    fn a_transfer_arrival_computes_its_last_prompt_token_first() {
        let mut r = Residents::default();
        let a = arrival(4, 9, 0, SamplingParams::GREEDY);
        let mut st = ReqState::new(&a);
        st.first_input = a.prompt.last().copied();
        r.insert(4, st);
        let rows = [row(4, 9, 0)];
        let plan = r.plan(&rows, None).unwrap();
        assert_eq!((plan.run[0].context_len, plan.run[0].last_token), (8, 18));
        // Its token sits at position 9, as a prefill's first token would.
        assert_eq!(
            plan.samples[0].key,
            crate::sampling::row_key(r.get(4).unwrap().seed, 9)
        );
        r.finish(&rows, plan, &[3]).unwrap();
        let plan = r.plan(&[row(4, 9, 3)], None).unwrap();
        assert_eq!((plan.run[0].context_len, plan.run[0].last_token), (9, 3));
    }

    #[test]
    fn eos_is_banned_until_min_tokens_were_produced() {
        let mut r = Residents::default();
        let a = arrival(2, 5, 3, SamplingParams::GREEDY);
        let (st, first) = Residents::arriving(&a, Some(9));
        assert_eq!(first.banned, 9, "token 0 of 3");
        r.prefilled(2, st, 40);
        let mut ctx = 5;
        let mut banned = Vec::new();
        for k in 0..4 {
            let rows = [row(2, ctx, 40)];
            let plan = r.plan(&rows, Some(9)).unwrap();
            if k > 0 {
                banned.push(plan.samples[0].banned);
                ctx += 1;
            }
            let n = plan.run.len();
            r.finish(&rows, plan, &vec![40; n]).unwrap();
        }
        // Tokens 1 and 2 banned, token 3 free.
        assert_eq!(banned, [9, 9, -1]);
        let none = Residents::arriving(&a, None).1;
        assert_eq!(none.banned, -1);
    }

    #[test]
    fn unknown_requests_and_token_count_mismatches_are_errors() {
        let mut r = Residents::default();
        assert!(matches!(
            r.plan(&[row(8, 1, 1)], None),
            Err(BackendError::UnknownRequest(8))
        ));
        r.insert(1, ReqState::new(&arrival(1, 3, 0, SamplingParams::GREEDY)));
        let rows = [row(1, 3, 1)];
        let plan = r.plan(&rows, None).unwrap();
        assert!(r.finish(&rows, plan, &[]).is_err());
        r.remove(1);
        assert!(r.is_empty());
    }
}
