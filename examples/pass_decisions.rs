//! The policy bench's live workload, run for a fixed number of passes per mode, printing a
//! hash of every pass's decisions (pauses, resumes, forced resumes, admissions, batch,
//! admission count). Two builds that print the same hashes made the same decisions; the
//! fixed pass count also makes it a stable subject for instruction counting:
//!
//! `cargo run --release --example pass_decisions -- [passes] [residents] [waiters] [mode]`
//! (mode: `tpot_budget` or `target_output_tps`; both when left out).

use genslot::policy::Mode;
use genslot::worker::wire::Fnv1a;

#[path = "../benches/support/live_workload.rs"]
mod live_workload;
use live_workload::LiveWorkload;

/// The library's FNV-1a (`genslot::worker::wire`), chained over every pass's decisions.
struct Fnv(Fnv1a);

impl Fnv {
    fn word(&mut self, x: u64) {
        self.0.word(x);
    }
    fn ids(&mut self, ids: impl Iterator<Item = u64>) {
        let mut n = 0;
        for id in ids {
            self.word(id);
            n += 1;
        }
        self.word(n);
    }
    fn value(&self) -> u64 {
        self.0 .0
    }
}

struct Run(LiveWorkload);

impl Run {
    fn hash_into(&self, h: &mut Fnv) {
        let o = &self.0.out;
        h.ids(o.pauses.iter().copied());
        h.ids(o.resumes.iter().copied());
        h.ids(o.forced_resumes.iter().copied());
        h.ids(o.admitted.iter().map(|a| a.id));
        h.ids(o.batch.iter().map(|b| b.id));
        h.word(o.admission_count as u64);
    }
}

fn arg(args: &[String], i: usize, default: u64) -> Result<u64, String> {
    args.get(i).map_or(Ok(default), |s| {
        s.parse().map_err(|e| format!("argument {i} ({s:?}): {e}"))
    })
}

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().collect();
    let passes = arg(&args, 1, 20_000)?;
    let residents = u32::try_from(arg(&args, 2, 256)?).map_err(|e| e.to_string())?;
    let waiters = arg(&args, 3, 2048)?;
    let only = args.get(4);
    for (name, mode) in [
        ("tpot_budget", Mode::TpotBudget(0.1)),
        ("target_output_tps", Mode::TargetOutputTps(20.0)),
    ] {
        if only.is_some_and(|m| m != name) {
            continue;
        }
        let mut run = Run(LiveWorkload::new(residents, waiters, mode));
        let mut h = Fnv(Fnv1a::new());
        let (mut pauses, mut resumes, mut forced, mut admitted) = (0, 0, 0, 0);
        for _ in 0..passes {
            run.0.step();
            run.hash_into(&mut h);
            let o = &run.0.out;
            pauses += o.pauses.len();
            resumes += o.resumes.len();
            forced += o.forced_resumes.len();
            admitted += o.admitted.len();
        }
        println!(
            "{name} {residents}res {waiters}wait {passes} passes: hash {:016x} \
             ({pauses} pauses, {resumes} resumes, {forced} forced, {admitted} admitted)",
            h.value()
        );
    }
    Ok(())
}
