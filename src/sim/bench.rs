//! `genslot sim --bench`: the simulator's own speed and memory (SPEC §11 keeps speed targets
//! in benchmarks). One experiment run several times in one process; each run's speed, their
//! median and best, and the process's peak resident memory. Wall-clock rates on a shared
//! machine swing, so one run is not a measurement.

use std::time::Instant;

use super::{run_experiment, Experiment, Speed};
use crate::config::host::proc_kib_field;

/// The speeds of `runs` runs of one experiment.
#[derive(Debug, Clone)]
pub struct Bench {
    pub runs: Vec<Speed>,
    /// Peak resident set of this process so far (trace loading included), where the OS
    /// reports it.
    pub peak_rss_bytes: Option<u64>,
}

/// Runs `exp` `runs` times (without a progress bar), calling `each` after every run.
pub fn bench(
    exp: &Experiment,
    runs: usize,
    mut each: impl FnMut(usize, &Speed),
) -> Result<Bench, String> {
    let exp = Experiment {
        base: exp.base.clone(),
        arms: exp.arms.clone(),
        progress: false,
        ..*exp
    };
    let mut speeds = Vec::with_capacity(runs);
    for i in 0..runs {
        let t0 = Instant::now();
        let mut speed = run_experiment(&exp)?.speed;
        // The experiment's wall time, reporting included, as a user waits for it.
        speed.wall_s = t0.elapsed().as_secs_f64();
        each(i, &speed);
        speeds.push(speed);
    }
    Ok(Bench {
        runs: speeds,
        peak_rss_bytes: peak_rss_bytes(),
    })
}

/// The median (the upper one of an even count) and the best of `v`.
fn median_and_best(mut v: Vec<f64>, best_is_max: bool) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let best = if best_is_max { v.last() } else { v.first() };
    (
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN),
        best.copied().unwrap_or(f64::NAN),
    )
}

/// One line for run `i`.
pub fn run_line(i: usize, s: &Speed) -> String {
    format!(
        "run {}: {:.0} simulated s per wall s per core, {:.2e} events/s, {:.0} passes/s, {} in {:.2} s wall",
        i + 1,
        s.simulated_s_per_wall_s,
        s.events_per_s,
        s.passes_per_s,
        super::count(s.runs as u64, "run"),
        s.wall_s
    )
}

/// The summary lines.
pub fn summary(b: &Bench) -> String {
    let (rate_med, rate_best) = median_and_best(
        b.runs.iter().map(|s| s.simulated_s_per_wall_s).collect(),
        true,
    );
    let (wall_med, wall_best) = median_and_best(b.runs.iter().map(|s| s.wall_s).collect(), false);
    let (passes_med, _) = median_and_best(b.runs.iter().map(|s| s.passes_per_s).collect(), true);
    let memory = b
        .peak_rss_bytes
        .map_or("not reported by this OS".into(), |x| {
            format!("{:.1} MiB", x as f64 / (1024.0 * 1024.0))
        });
    format!(
        "{}: median {rate_med:.0}x real time per core (best {rate_best:.0}x), \
         median {passes_med:.0} passes/s; wall per experiment median {wall_med:.2} s \
         (best {wall_best:.2} s)\npeak resident memory: {memory}\n",
        super::count(b.runs.len() as u64, "run")
    )
}

/// `VmHWM` of `/proc/self/status` (Linux).
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    proc_kib_field(&status, "VmHWM:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_resident_set_is_read_from_vm_hwm_in_kib() {
        let status = "Name:\tgenslot\nVmPeak:\t  900 kB\nVmHWM:\t   2048 kB\nVmRSS:\t 1024 kB\n";
        assert_eq!(proc_kib_field(status, "VmHWM:"), Some(2048 * 1024));
        assert_eq!(proc_kib_field("Name:\tx\n", "VmHWM:"), None);
    }

    #[test]
    fn the_median_is_the_middle_run_and_the_best_the_fastest() {
        assert_eq!(
            median_and_best(vec![3.0, 1.0, 2.0, 9.0, 5.0], true),
            (3.0, 9.0)
        );
        assert_eq!(median_and_best(vec![4.0, 1.0], false), (4.0, 1.0));
    }
}
