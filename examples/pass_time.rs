//! The policy bench's live workload timed in blocks of 20,000 passes after 20,000 warm-up
//! passes, printing the fastest, first-quartile and median block per mode. On a shared
//! machine whose speed wanders by a fifth from minute to minute, builds compared by running
//! this alternately are easier to read than criterion's means:
//!
//! `cargo run --release --example pass_time -- [residents] [waiters] [blocks] [series]`
//!
//! With `series`, every block's time is printed too, in the order run: on a machine whose
//! speed drifts, the drift shows as runs of slow blocks.

use genslot::policy::Mode;

#[path = "../benches/support/live_workload.rs"]
mod live_workload;
use live_workload::LiveWorkload;

const PASSES: u32 = 20_000;

fn arg(i: usize, default: u64) -> Result<u64, String> {
    std::env::args().nth(i).map_or(Ok(default), |s| {
        s.parse().map_err(|e| format!("argument {i} ({s:?}): {e}"))
    })
}

fn main() -> Result<(), String> {
    let residents = u32::try_from(arg(1, 256)?).map_err(|e| e.to_string())?;
    let waiters = arg(2, 2048)?;
    let blocks = arg(3, 12)?.max(1) as usize;
    let series = match std::env::args().nth(4).as_deref() {
        None => false,
        Some("series") => true,
        Some(other) => return Err(format!("argument 4 ({other:?}): expected `series`")),
    };
    for (name, mode) in [
        ("tpot_budget", Mode::TpotBudget(0.1)),
        ("target_output_tps", Mode::TargetOutputTps(20.0)),
    ] {
        let mut w = LiveWorkload::new(residents, waiters, mode);
        for _ in 0..PASSES {
            w.step();
        }
        let mut us: Vec<f64> = (0..blocks)
            .map(|_| {
                let t = std::time::Instant::now();
                for _ in 0..PASSES {
                    w.step();
                }
                t.elapsed().as_secs_f64() / f64::from(PASSES) * 1e6
            })
            .collect();
        if series {
            let each: Vec<String> = us.iter().map(|t| format!("{t:.2}")).collect();
            println!("{name} blocks in order, µs per pass: {}", each.join(" "));
        }
        us.sort_by(f64::total_cmp);
        println!(
            "{name} {residents} residents / {waiters} waiters, µs per pass over {blocks} blocks: \
             fastest {:.2}, first quartile {:.2}, median {:.2}",
            us[0],
            us[blocks / 4],
            us[blocks / 2]
        );
    }
    Ok(())
}
