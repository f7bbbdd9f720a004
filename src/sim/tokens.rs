//! Tokens each decode step emits per request when the plant yields a fractional
//! `tokens_per_step` (speculative decoding): the request's running total is `floor(k × tps)`
//! after `k` steps, accumulated in `f64`. This runs for every decode row of every step.
//!
//! When `tps` is a multiple of 1/64 the accumulated sums are exact, so the emitted counts
//! repeat with period `q` (the smallest power of two with `q × tps` whole): one table lookup
//! per row replaces the float accumulation and its float-to-int conversion, with identical
//! results. Other rates keep the accumulator.

use crate::worker::{BatchRow, Stepped};

/// Largest period tabulated (`tps` a multiple of `1 / MAX_PERIOD`).
const MAX_PERIOD: usize = 64;
/// Largest rate tabulated.
const MAX_TABULATED: f64 = 1024.0;

/// One resident request's count, kept by slot.
#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    id: u64,
    /// Steps taken modulo the period (table mode).
    phase: u32,
    /// Running `k × tps` and the whole tokens emitted so far (accumulator mode).
    acc: f64,
    emitted: u64,
}

#[derive(Debug, Clone)]
enum Rate {
    /// `table[k % q]` tokens on a request's `k`-th step (0-based); `mask = q - 1`.
    Periodic {
        table: Box<[u32; MAX_PERIOD]>,
        mask: u32,
    },
    Accumulated(f64),
}

/// Per-slot token accounting for one run.
#[derive(Debug, Clone)]
pub struct StepTokens {
    rate: Rate,
    slots: Vec<Slot>,
}

impl StepTokens {
    pub fn new(tokens_per_step: f64) -> Self {
        Self {
            rate: periodic(tokens_per_step).unwrap_or(Rate::Accumulated(tokens_per_step)),
            slots: Vec::new(),
        }
    }

    /// Request `id` was admitted into `slot`: its count starts from zero.
    pub fn admit(&mut self, slot: u32, id: u64) {
        let slot = slot as usize;
        if self.slots.len() <= slot {
            self.slots.resize(slot + 1, Slot::default());
        }
        self.slots[slot] = Slot {
            id,
            ..Slot::default()
        };
    }

    /// Tokens request `id` (in `slot`) emits on its next step.
    #[cfg(test)]
    fn step(&mut self, slot: u32, id: u64) -> u32 {
        let row = BatchRow {
            id,
            slot,
            context_len: 0,
            first_token: false,
        };
        let mut out = [Stepped::default()];
        self.step_rows(&[row], &mut out);
        out[0].tokens
    }

    /// One decode step: sets each of `out`'s rows to its batch row's id and the tokens it
    /// emits, and returns the batch's KV tokens. A row whose slot does not hold it (never
    /// the case: every scheduled row was admitted into its slot first) emits one token.
    pub fn step_rows(&mut self, batch: &[BatchRow], out: &mut [Stepped]) -> u64 {
        let mut kv = 0u64;
        let rows = batch.iter().zip(out.iter_mut());
        // The rate is matched once per step, not per row.
        match &self.rate {
            Rate::Periodic { table, mask } => {
                for (row, st) in rows {
                    kv += u64::from(row.context_len);
                    st.id = row.id;
                    st.tokens = match self.slots.get_mut(row.slot as usize) {
                        Some(s) if s.id == row.id => {
                            let tokens = table[s.phase as usize % MAX_PERIOD];
                            s.phase = (s.phase + 1) & mask;
                            tokens
                        }
                        _ => 1,
                    };
                }
            }
            Rate::Accumulated(tps) => {
                for (row, st) in rows {
                    kv += u64::from(row.context_len);
                    st.id = row.id;
                    st.tokens = match self.slots.get_mut(row.slot as usize) {
                        Some(s) if s.id == row.id => accumulate(&mut s.acc, &mut s.emitted, *tps),
                        _ => 1,
                    };
                }
            }
        }
        kv
    }
}

/// The reference accumulation: add `tps`, emit the whole tokens it newly crossed.
fn accumulate(acc: &mut f64, emitted: &mut u64, tps: f64) -> u32 {
    *acc += tps;
    let now_emitted = *acc as u64;
    let tokens = now_emitted.saturating_sub(*emitted);
    *emitted = now_emitted;
    tokens.min(u64::from(u32::MAX)) as u32
}

/// The period table for `tps`, filled by the reference accumulation itself, when `tps` is a
/// positive multiple of `1 / MAX_PERIOD` of at most `MAX_TABULATED`. A request's sum stays
/// near its output (under 2^33 tokens), so with 6 fractional bits it needs fewer than 2^40
/// of the 2^53 exact steps an `f64` has.
fn periodic(tps: f64) -> Option<Rate> {
    let scaled = tps * MAX_PERIOD as f64;
    if !(tps > 0.0 && tps <= MAX_TABULATED && scaled.fract() == 0.0) {
        return None;
    }
    let mut q = 1usize;
    while (tps * q as f64).fract() != 0.0 {
        q *= 2;
    }
    let mut table = Box::new([0u32; MAX_PERIOD]);
    let (mut acc, mut emitted) = (0.0f64, 0u64);
    for t in table.iter_mut().take(q) {
        *t = accumulate(&mut acc, &mut emitted, tps);
    }
    Some(Rate::Periodic {
        table,
        mask: q as u32 - 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine's original per-slot accounting, step by step.
    fn reference(tps: f64, steps: usize) -> Vec<u32> {
        let (mut acc, mut emitted) = (0.0f64, 0u64);
        (0..steps)
            .map(|_| accumulate(&mut acc, &mut emitted, tps))
            .collect()
    }

    fn metered(tps: f64, steps: usize) -> Vec<u32> {
        let mut m = StepTokens::new(tps);
        m.admit(3, 42);
        (0..steps).map(|_| m.step(3, 42)).collect()
    }

    #[test]
    fn tabulated_rates_emit_exactly_what_the_accumulator_emits() {
        for tps in [3.75, 1.0, 2.5, 1.015625, 7.0, 0.25, 1.0 / 64.0] {
            assert!(
                matches!(StepTokens::new(tps).rate, Rate::Periodic { .. }),
                "{tps}"
            );
            assert_eq!(metered(tps, 20_000), reference(tps, 20_000), "{tps}");
        }
    }

    #[test]
    fn other_rates_keep_the_accumulator() {
        for tps in [
            1.3,
            0.1,
            2.0 / 3.0,
            0.0,
            -1.0,
            f64::NAN,
            1.0 / 128.0,
            2048.0,
        ] {
            assert!(
                matches!(StepTokens::new(tps).rate, Rate::Accumulated(_)),
                "{tps}"
            );
            let (a, b) = (metered(tps, 5_000), reference(tps, 5_000));
            assert_eq!(a, b, "{tps}");
        }
    }

    #[test]
    fn a_step_sets_every_row_and_sums_the_batch_kv() {
        for tps in [3.75, 1.3] {
            let mut m = StepTokens::new(tps);
            m.admit(0, 10);
            m.admit(1, 11);
            let row = |id, slot, context_len| BatchRow {
                id,
                slot,
                context_len,
                first_token: false,
            };
            let batch = [row(11, 1, 1000), row(10, 0, 24)];
            let mut out = vec![Stepped::default(); 2];
            assert_eq!(m.step_rows(&batch, &mut out), 1024);
            assert_eq!([out[0].id, out[1].id], [11, 10]);
            assert_eq!([out[0].tokens, out[1].tokens], [tps as u32; 2]);
        }
    }

    #[test]
    fn readmission_restarts_the_count_and_strangers_emit_one() {
        let mut m = StepTokens::new(3.75);
        m.admit(0, 7);
        assert_eq!([m.step(0, 7), m.step(0, 7)], [3, 4]);
        m.admit(0, 8);
        assert_eq!(
            m.step(0, 8),
            3,
            "a new request in the slot starts at step 0"
        );
        assert_eq!(m.step(0, 7), 1, "the slot no longer holds request 7");
        assert_eq!(m.step(9, 8), 1, "no such slot");
    }
}
