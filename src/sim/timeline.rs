//! The controller's state over simulated time: one point per interval (30 s, the stat line's
//! period) with the queue's target X, the waited TTFTs' p90 of the interval, the paused count,
//! g, W, D and the pause counts. Tables of means hide dynamics such as X drifting for an
//! hour; this shows them.

use serde::Serialize;

use crate::worker::{PassOutput, WorkerCore};

/// Seconds between points.
pub const INTERVAL_S: f64 = 30.0;

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TimelinePoint {
    /// End of the interval (simulated seconds).
    pub t_s: f64,
    /// The queue's target X at the interval's last pass (`None` until formed).
    pub x_s: Option<f64>,
    /// p90 of the TTFTs of the interval's first tokens that had waited (the samples X takes).
    pub waited_ttft_p90_s: Option<f64>,
    pub queue: usize,
    pub paused: usize,
    pub g: Option<f64>,
    pub window_s: f64,
    pub d_s: Option<f64>,
    pub pauses: u64,
    pub resumes: u64,
    pub forced_resumes: u64,
}

/// Collects points from the passes of one run.
#[derive(Debug, Default)]
pub struct Recorder {
    points: Vec<TimelinePoint>,
    next_at: f64,
    waited: Vec<f64>,
    counts: (u64, u64, u64),
}

impl Recorder {
    pub fn new() -> Self {
        Self {
            next_at: INTERVAL_S,
            ..Self::default()
        }
    }

    /// After every pass. The point closing an interval takes the state of the first pass
    /// at or past its end.
    pub fn pass(&mut self, o: &PassOutput, worker: &WorkerCore) {
        self.waited
            .extend(o.first_tokens.iter().filter(|f| f.waited).map(|f| f.ttft));
        self.counts.0 += o.pauses.len() as u64;
        self.counts.1 += o.resumes.len() as u64;
        self.counts.2 += o.forced_resumes.len() as u64;
        if o.now < self.next_at {
            return;
        }
        let p90 = (!self.waited.is_empty()).then(|| {
            let k = ((self.waited.len() as f64 * 0.9).ceil() as usize).clamp(1, self.waited.len());
            *self.waited.select_nth_unstable_by(k - 1, f64::total_cmp).1
        });
        self.points.push(TimelinePoint {
            t_s: self.next_at,
            x_s: worker.queue().target(),
            waited_ttft_p90_s: p90,
            queue: o.queue_len,
            paused: o.paused,
            g: worker.preemption().g(),
            window_s: o.window,
            d_s: worker.preemption().d(),
            pauses: self.counts.0,
            resumes: self.counts.1,
            forced_resumes: self.counts.2,
        });
        self.waited.clear();
        self.counts = (0, 0, 0);
        // A gap with no pass (an idle worker) yields no point rather than repeated ones.
        while self.next_at <= o.now {
            self.next_at += INTERVAL_S;
        }
    }

    pub fn finish(self) -> Vec<TimelinePoint> {
        self.points
    }
}

/// One arm's timeline (the first seed's run), as written to the JSON and drawn.
#[derive(Debug, Clone, Serialize)]
pub struct ArmTimeline {
    pub arm: String,
    pub seed: u64,
    pub points: Vec<TimelinePoint>,
}

/// The timeline chart: X and the interval's waited-TTFT p90, g (`tpot_budget` arms), the
/// paused count, the queue.
pub fn svg(title: &str, timelines: &[ArmTimeline]) -> String {
    use super::svg::{stacked, Panel, Series};
    let series = |f: &dyn Fn(&TimelinePoint) -> Option<f64>| -> Vec<Series> {
        timelines
            .iter()
            .map(|t| {
                (
                    t.arm.clone(),
                    t.points.iter().map(|p| (p.t_s, f(p))).collect(),
                )
            })
            .collect()
    };
    stacked(
        title,
        "simulated time (s)",
        &[
            Panel {
                y_label: "target X (s)".into(),
                series: series(&|p| p.x_s),
            },
            Panel {
                y_label: "p90 waited TTFT, per 30 s (s)".into(),
                series: series(&|p| p.waited_ttft_p90_s),
            },
            Panel {
                y_label: "window gain g (tpot_budget)".into(),
                series: series(&|p| p.g),
            },
            Panel {
                y_label: "paused requests".into(),
                series: series(&|p| Some(p.paused as f64)),
            },
            Panel {
                y_label: "waiting requests".into(),
                series: series(&|p| Some(p.queue as f64)),
            },
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Mode;
    use crate::worker::{FirstToken, WorkerParams};

    fn out(now: f64, waited_ttfts: &[f64], pauses: usize) -> PassOutput {
        PassOutput {
            now,
            first_tokens: waited_ttfts
                .iter()
                .map(|&ttft| FirstToken {
                    id: 0,
                    ttft,
                    waited: true,
                })
                .collect(),
            pauses: vec![1; pauses],
            ..PassOutput::default()
        }
    }

    #[test]
    fn a_point_closes_each_interval_with_its_waited_p90_and_pause_count() {
        let w = WorkerCore::new(WorkerParams::simple(8, Mode::Off, 0, 1 << 20));
        let mut r = Recorder::new();
        let ttfts: Vec<f64> = (1..=10).map(f64::from).collect();
        r.pass(&out(10.0, &ttfts, 1), &w);
        r.pass(&out(20.0, &[], 2), &w);
        r.pass(&out(31.0, &[], 0), &w); // closes [0, 30)
        r.pass(&out(95.0, &[100.0], 0), &w); // closes [30, 60); no point for the idle gap
        let p = r.finish();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].t_s, 30.0);
        assert_eq!(p[0].waited_ttft_p90_s, Some(9.0));
        assert_eq!(p[0].pauses, 3);
        assert_eq!(p[1].t_s, 60.0);
        assert_eq!(p[1].waited_ttft_p90_s, Some(100.0));
        assert_eq!(p[1].pauses, 0);
        assert_eq!(p[1].x_s, None, "no target before min_samples");
    }
}
