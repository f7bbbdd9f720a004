//! What a real-model step backend keeps per resident request to sample its tokens: the
//! sampling parameters and seed, how many tokens it produced (EOS is banned below
//! `min_tokens`), and its first token (a prefill's, or the one a KV transfer hands over)
//! until the request's first step. That step emits the first token and decodes it in the
//! same pass, as every later step decodes the token before it, so no batch row is spent
//! on a step that computes nothing. Host-only; the CUDA backend and the CPU reference
//! backend share it.

use std::collections::HashMap;

use crate::gpu::{BackendError, ContextArrival, StepRow};
use crate::ids::RequestId;
use crate::sampling::{SampleRow, SamplingParams};

/// One resident request's sampling state.
#[derive(Debug, Clone, PartialEq)]
pub struct ReqState {
    /// Its sequence slot (where its recurrent state and drafter window live).
    pub slot: u32,
    /// The first token (the prefill's, or the one a transfer handed over) until the
    /// request's first step, which emits it and takes it as its input.
    pub first_token: Option<u32>,
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
            sampling: req.sampling,
            seed: req.sampling.seed_for(req.id),
            min_tokens: req.min_tokens,
            produced: 0,
        }
    }

    /// This state with its first token drawn (by a prefill, or handed over with the KV).
    pub fn with_first_token(mut self, token: u32) -> Self {
        self.first_token = Some(token);
        self.produced = 1;
        self
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

/// One step's work, in the order of the batch: every row is computed.
#[derive(Debug, Default)]
pub struct StepPlan {
    /// Each row as computed: it consumes `last_token` at position `context_len`.
    pub run: Vec<StepRow>,
    /// The sampling parameters of each row.
    pub samples: Vec<SampleRow>,
    /// The first token a row emits ahead of its computed ones (on a request's first step).
    pub first: Vec<Option<u32>>,
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

    /// The state of an arriving request and the sampling row of its first token (position
    /// = prompt length).
    pub fn arriving(req: &ContextArrival, eos: Option<u32>) -> (ReqState, SampleRow) {
        let st = ReqState::new(req);
        let row = st.sample_row(req.prompt.len() as u64, eos);
        (st, row)
    }

    /// The request's first token is `token` (its prefill drew it, or its transfer handed it
    /// over): the next step with the request emits it and decodes from it.
    pub fn prefilled(&mut self, id: RequestId, st: ReqState, token: u32) {
        self.reqs.insert(id, st.with_first_token(token));
    }

    /// Each row's input and sampling. A row's input is its `last_token` at `context_len`,
    /// except on a request's first step: there the executor has no token on the host yet
    /// (it streams the first token as the step starts), so the row takes the first token,
    /// whose KV the step writes at the prompt's length. Every row is computed.
    pub fn plan(&self, rows: &[StepRow], eos: Option<u32>) -> Result<StepPlan, BackendError> {
        let mut plan = StepPlan::default();
        for r in rows {
            let st = self
                .reqs
                .get(&r.id)
                .ok_or(BackendError::UnknownRequest(r.id))?;
            let mut row = r.clone();
            if let Some(t) = st.first_token {
                row.last_token = t;
            }
            plan.samples
                .push(st.sample_row(u64::from(row.context_len) + 1, eos));
            plan.first.push(st.first_token);
            plan.run.push(row);
        }
        Ok(plan)
    }

    /// The batch's tokens from the computed `tokens` (one per row), each request's state
    /// advanced.
    pub fn finish(
        &mut self,
        plan: StepPlan,
        tokens: &[u32],
    ) -> Result<Vec<Vec<u32>>, BackendError> {
        self.finish_rows(plan, tokens.iter().map(std::slice::from_ref))
    }

    /// [`finish`](Self::finish) with any number of tokens per row (a verify pass emits its
    /// accepted drafts and one more). A first step's row emits the first token ahead of
    /// them; it was counted when it was drawn.
    pub fn finish_rows<'a>(
        &mut self,
        plan: StepPlan,
        tokens: impl ExactSizeIterator<Item = &'a [u32]>,
    ) -> Result<Vec<Vec<u32>>, BackendError> {
        if tokens.len() != plan.run.len() {
            return Err(BackendError::Failed(format!(
                "{} token rows for {} computed rows",
                tokens.len(),
                plan.run.len()
            )));
        }
        let mut out = Vec::with_capacity(plan.run.len());
        for ((r, first), t) in plan.run.iter().zip(&plan.first).zip(tokens) {
            let mut row = Vec::with_capacity(1 + t.len());
            row.extend(*first);
            row.extend_from_slice(t);
            out.push(row);
            if let Some(st) = self.reqs.get_mut(&r.id) {
                st.first_token = None;
                st.produced += t.len() as u32;
            }
        }
        Ok(out)
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
    fn a_first_step_emits_the_first_token_and_decodes_from_it() {
        let mut r = Residents::default();
        let a = arrival(1, 20, 0, SamplingParams::GREEDY);
        let (st, first) = Residents::arriving(&a, Some(2));
        let seed = st.seed;
        assert_eq!(first.key, crate::sampling::row_key(seed, 20));
        r.prefilled(1, st, 77);
        // The executor's first row: the prompt cached, no input token on the host yet.
        let rows = [row(1, 20, 0)];
        let plan = r.plan(&rows, Some(2)).unwrap();
        // The first token is the input at the prompt's length; the second is drawn at 21,
        // where a step after an empty first step used to draw it.
        assert_eq!((plan.run[0].context_len, plan.run[0].last_token), (20, 77));
        assert_eq!(plan.samples[0].key, crate::sampling::row_key(seed, 21));
        assert_eq!(r.finish(plan, &[5]).unwrap(), vec![vec![77, 5]]);
        assert_eq!(r.get(1).unwrap().produced, 2);
        // Then rows as usual: prompt + tokens out − 1 cached, the last token out as input.
        let plan = r.plan(&[row(1, 21, 5)], Some(2)).unwrap();
        assert_eq!((plan.run[0].context_len, plan.run[0].last_token), (21, 5));
        assert_eq!(plan.samples[0].key, crate::sampling::row_key(seed, 22));
        assert_eq!(r.finish(plan, &[6]).unwrap(), vec![vec![6]]);
        assert_eq!(r.get(1).unwrap().produced, 3);
    }

    #[test]
    fn a_first_step_with_drafts_emits_the_first_token_then_every_accepted_one() {
        let mut r = Residents::default();
        let (st, _) = Residents::arriving(&arrival(3, 8, 0, SamplingParams::GREEDY), None);
        r.prefilled(3, st, 40);
        let plan = r.plan(&[row(3, 8, 0)], None).unwrap();
        let verified: [&[u32]; 1] = [&[41, 42, 43]];
        let out = r.finish_rows(plan, verified.into_iter()).unwrap();
        assert_eq!(out, vec![vec![40, 41, 42, 43]]);
        assert_eq!(r.get(3).unwrap().produced, 4);
    }

    #[test]
    fn a_batch_mixes_first_steps_and_later_ones_row_by_row() {
        let mut r = Residents::default();
        for id in [1, 2] {
            let (st, _) = Residents::arriving(&arrival(id, 10, 0, SamplingParams::GREEDY), None);
            r.prefilled(id, st, 100 + id as u32);
        }
        let plan = r.plan(&[row(1, 10, 0)], None).unwrap();
        r.finish(plan, &[7]).unwrap();
        let rows = [row(2, 10, 0), row(1, 11, 7)];
        let plan = r.plan(&rows, None).unwrap();
        assert_eq!(plan.first, [Some(102), None]);
        assert_eq!(plan.run[0].last_token, 102);
        assert_eq!(plan.run[1].last_token, 7);
        assert_eq!(
            r.finish(plan, &[8, 9]).unwrap(),
            vec![vec![102, 8], vec![9]]
        );
    }

    #[test]
    fn eos_is_banned_until_min_tokens_were_produced() {
        let mut r = Residents::default();
        let a = arrival(2, 5, 3, SamplingParams::GREEDY);
        let (st, first) = Residents::arriving(&a, Some(9));
        assert_eq!(first.banned, 9, "token 0 of 3");
        r.prefilled(2, st, 40);
        let mut banned = Vec::new();
        // The first step computes token 1 (token 0 is the prefill's), the next 2 and 3.
        for ctx in [5, 6, 7] {
            let plan = r.plan(&[row(2, ctx, 40)], Some(9)).unwrap();
            banned.push(plan.samples[0].banned);
            r.finish(plan, &[40]).unwrap();
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
        let plan = r.plan(&[row(1, 3, 1)], None).unwrap();
        assert!(r.finish(plan, &[]).is_err());
        r.remove(1);
        assert!(r.is_empty());
    }
}
