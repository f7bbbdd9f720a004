//! The context transform: agentic load shrunk to fit one GPU's KV cache, applied to a loaded
//! trace before any replay, so the simulator and the load generator (which both call
//! [`ContextTransform::apply`]) see the same requests.
//!
//! The Weka sessions' prompts run to hundreds of thousands of tokens (mean ≈ 122k): 128
//! residents of an 8B model at those lengths need tens of terabytes of KV, so a one-GPU
//! experiment must shorten them. Two knobs, applied in this order:
//!
//! - **`scale` F** (0 < F ≤ 1): a prompt of L tokens becomes `max(1, round(F·L))`. Its
//!   prefix blocks are thinned, not cut: block i is kept when `⌊F·(i+1)⌋ > ⌊F·i⌋`, a rule of
//!   the position alone, so of any m leading blocks exactly `⌊F·m⌋` are kept. Two prompts
//!   that shared m leading blocks share at least `⌊F·m⌋` after the transform (exactly that
//!   many when their next blocks differ), and a prompt that extended another still extends
//!   it.
//! - **`max_context` N**: a longer prompt keeps its first N tokens (and the blocks that
//!   cover them). Truncating the end, not the start, keeps every prefix relation; prompts
//!   longer than N all become N tokens and share their prefix up to N.
//!
//! What it keeps: the order, timing and gaps of every request and session (arrivals,
//! `api_time`, think time, sub-agent structure), every output length (`max_tokens`), the
//! relative lengths of prompts (up to rounding, and up to the cap), and the prefix-reuse
//! structure (which prompts share how large a share of their prefix). What it changes: the
//! absolute context lengths and so the KV each resident holds, the KV read per decode step,
//! the KV transfer time and the uncached (new) tokens per turn, all by F; with a cap, the
//! longest prompts' lengths, and the new tokens of turns past the cap (zero).

use serde::Serialize;

use super::format::Trace;
use super::types::{HashIds, Session, TimedRequest};

/// Why a transform's settings are refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TransformError {
    #[error("context scale {0} must be in (0, 1]")]
    Scale(f64),
    #[error("max context must be at least 1 token")]
    MaxContext,
}

/// A context-length transform (see the module docs). The identity by default.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ContextTransform {
    scale: f64,
    max_context: Option<u32>,
}

impl Default for ContextTransform {
    fn default() -> Self {
        Self {
            scale: 1.0,
            max_context: None,
        }
    }
}

impl ContextTransform {
    /// `scale` in (0, 1] (default 1), `max_context` ≥ 1 (default none).
    pub fn new(scale: Option<f64>, max_context: Option<u32>) -> Result<Self, TransformError> {
        let scale = scale.unwrap_or(1.0);
        if !(scale > 0.0 && scale <= 1.0) {
            return Err(TransformError::Scale(scale));
        }
        if max_context == Some(0) {
            return Err(TransformError::MaxContext);
        }
        Ok(Self { scale, max_context })
    }

    pub fn scale(&self) -> f64 {
        self.scale
    }

    pub fn max_context(&self) -> Option<u32> {
        self.max_context
    }

    pub fn is_identity(&self) -> bool {
        self.scale == 1.0 && self.max_context.is_none()
    }

    /// A prompt's length after the transform: `min(max(1, round(F·L)), N)`; 0 stays 0.
    /// Monotone in `input`, never above `input` or N.
    pub fn tokens(&self, input: u32) -> u32 {
        if input == 0 {
            return 0;
        }
        let scaled = (self.scale * f64::from(input)).round().max(1.0) as u32;
        let scaled = scaled.min(input);
        self.max_context.map_or(scaled, |n| scaled.min(n))
    }

    /// Whether block position `i` survives the scale: `⌊F·(i+1)⌋ > ⌊F·i⌋`.
    fn keeps_block(&self, i: usize) -> bool {
        self.scale >= 1.0 || (self.scale * (i + 1) as f64).floor() > (self.scale * i as f64).floor()
    }

    /// The prefix blocks of a prompt that becomes `new_tokens` long: the kept positions, cut
    /// to the blocks that cover `new_tokens` (`block_size` 0: no blocks).
    pub fn hash_ids(&self, ids: &HashIds, new_tokens: u32, block_size: u32) -> HashIds {
        if block_size == 0 || ids.is_empty() {
            return HashIds::default();
        }
        let cover = new_tokens.div_ceil(block_size) as usize;
        if self.scale >= 1.0 {
            return if cover >= ids.len() {
                ids.clone()
            } else {
                ids.prefix(cover)
            };
        }
        let mut out = HashIds::default();
        let mut kept = 0usize;
        for (i, id) in ids.iter().enumerate() {
            if kept >= cover {
                break;
            }
            if self.keeps_block(i) {
                out.push(id);
                kept += 1;
            }
        }
        out
    }

    /// Transforms one Weka session tree in place (sub-agents included).
    pub fn apply_session(&self, s: &mut Session) {
        let block = s.block_size;
        for r in &mut s.requests {
            let n = self.tokens(r.input_tokens);
            r.hash_ids = self.hash_ids(&r.hash_ids, n, block);
            r.input_tokens = n;
        }
        for sub in &mut s.subagents {
            self.apply_session(&mut sub.session);
        }
    }

    /// Transforms one open-loop request in place.
    pub fn apply_timed(&self, r: &mut TimedRequest) {
        let n = self.tokens(r.input_tokens);
        r.hash_ids = self.hash_ids(&r.hash_ids, n, r.block_size);
        r.input_tokens = n;
    }

    /// Transforms a loaded trace in place; the identity leaves it untouched.
    pub fn apply(&self, trace: &mut Trace) {
        if self.is_identity() {
            return;
        }
        match trace {
            Trace::Sessions(sessions) => sessions.iter_mut().for_each(|s| self.apply_session(s)),
            Trace::Requests { requests, .. } => {
                requests.iter_mut().for_each(|r| self.apply_timed(r))
            }
        }
    }

    /// One line for logs and reports, e.g. `contexts x0.03125, at most 16384 tokens`.
    pub fn describe(&self) -> String {
        match (self.is_identity(), self.max_context) {
            (true, _) => "contexts as recorded".into(),
            (false, None) => format!("contexts x{}", self.scale),
            (false, Some(n)) if self.scale == 1.0 => format!("contexts cut at {n} tokens"),
            (false, Some(n)) => format!("contexts x{}, at most {n} tokens", self.scale),
        }
    }
}

/// Prompt lengths of a trace (every request, sub-agents included), for sizing a run.
pub fn context_lengths(trace: &Trace) -> Vec<u32> {
    match trace {
        Trace::Sessions(s) => s
            .iter()
            .flat_map(|s| s.all_requests().into_iter().map(|(_, r)| r.input_tokens))
            .collect(),
        Trace::Requests { requests, .. } => requests.iter().map(|r| r.input_tokens).collect(),
    }
}

/// Mean and percentiles of prompt lengths.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LengthStats {
    pub requests: usize,
    pub mean: f64,
    pub p50: u32,
    pub p90: u32,
    pub p99: u32,
    pub max: u32,
}

impl LengthStats {
    /// `None` for no lengths. Nearest-rank percentiles.
    pub fn of(lengths: &[u32]) -> Option<Self> {
        if lengths.is_empty() {
            return None;
        }
        let mut v = lengths.to_vec();
        v.sort_unstable();
        let at = |p: f64| v[((p / 100.0 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Some(Self {
            requests: v.len(),
            mean: v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64,
            p50: at(50.0),
            p90: at(90.0),
            p99: at(99.0),
            max: v[v.len() - 1],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::types::Request;

    fn t(scale: f64, max: Option<u32>) -> ContextTransform {
        ContextTransform::new(Some(scale), max).unwrap()
    }

    #[test]
    fn settings_out_of_range_are_refused() {
        assert_eq!(
            ContextTransform::new(Some(0.0), None),
            Err(TransformError::Scale(0.0))
        );
        assert!(ContextTransform::new(Some(1.5), None).is_err());
        assert!(ContextTransform::new(Some(f64::NAN), None).is_err());
        assert_eq!(
            ContextTransform::new(None, Some(0)),
            Err(TransformError::MaxContext)
        );
        assert!(ContextTransform::new(None, None).unwrap().is_identity());
    }

    #[test]
    fn lengths_scale_round_and_stop_at_the_cap() {
        let x = t(1.0 / 32.0, Some(16_384));
        assert_eq!(x.tokens(71_175), 2_224); // 2224.2
        assert_eq!(x.tokens(894_000), 16_384); // 27,937 before the cap
        assert_eq!(x.tokens(5), 1, "a prompt never vanishes");
        assert_eq!(x.tokens(0), 0);
        assert_eq!(t(1.0, Some(100)).tokens(250), 100);
    }

    #[test]
    fn scale_keeps_the_last_block_of_every_group() {
        // F = 1/4: blocks 3, 7, 11, ... survive; of 10 leading blocks, 2 are kept.
        let x = t(0.25, None);
        let ids = HashIds::from_ids(&(100..110).collect::<Vec<_>>());
        let out = x.hash_ids(&ids, 160, 64);
        assert_eq!(out.to_vec(), vec![103, 107]);
    }

    #[test]
    fn a_cap_cuts_the_blocks_to_those_covering_the_kept_tokens() {
        let x = t(1.0, Some(130));
        let ids = HashIds::from_ids(&[1, 2, 3, 4, 5]);
        assert_eq!(x.hash_ids(&ids, 130, 64).to_vec(), vec![1, 2, 3]);
    }

    #[test]
    fn sessions_keep_outputs_times_and_subagents() {
        let req = |t, input, ids: &[u64]| Request {
            t,
            input_tokens: input,
            output_tokens: 77,
            api_time: Some(2.0),
            think_time: Some(1.0),
            hash_ids: HashIds::from_ids(ids),
            streaming: true,
        };
        let mut s = Session {
            id: "s".into(),
            block_size: 64,
            requests: vec![req(0.0, 640, &(0..10).collect::<Vec<_>>())],
            subagents: vec![crate::workload::Subagent {
                after_request: 1,
                marker_t: 9.0,
                spawn_t: 3.0,
                end_t: 9.0,
                agent_id: "a".into(),
                subagent_type: "x".into(),
                session: Session {
                    id: "s/a".into(),
                    block_size: 64,
                    requests: vec![req(3.0, 1280, &[1])],
                    subagents: vec![],
                },
            }],
        };
        let before = s.clone();
        t(0.5, None).apply_session(&mut s);
        assert_eq!(s.requests[0].input_tokens, 320);
        assert_eq!(s.requests[0].hash_ids.to_vec(), vec![1, 3, 5, 7, 9]);
        assert_eq!(s.subagents[0].session.requests[0].input_tokens, 640);
        assert_eq!(
            s.requests[0].output_tokens,
            before.requests[0].output_tokens
        );
        assert_eq!(s.requests[0].t, before.requests[0].t);
        assert_eq!(s.requests[0].api_time, before.requests[0].api_time);
        assert_eq!(s.subagents[0].spawn_t, before.subagents[0].spawn_t);
    }

    #[test]
    fn length_stats_use_nearest_rank() {
        let s = LengthStats::of(&[4, 1, 3, 2]).unwrap();
        assert_eq!((s.p50, s.p90, s.max, s.requests), (2, 4, 4, 4));
        assert_eq!(s.mean, 2.5);
        assert!(LengthStats::of(&[]).is_none());
    }
}
