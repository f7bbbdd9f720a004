//! What the executor shows: the gauges, the periodic preemption stat line and the
//! `/debug/actors` payload, each read from the component actors off the pass's path.

use actix::{ActorFutureExt, AsyncContext, Context, Handler, ResponseActFuture, WrapFuture};
use metrics::gauge;
use serde_json::json;

use super::Executor;
use crate::actors::components::{QueueSnapshot, TakeStatLine};
use crate::actors::gpu::GpuHandle;
use crate::actors::messages::DebugState;
use crate::metrics as m;
use crate::worker::ranks::RankStatus;
use crate::worker::{PassOutput, QueueView};

impl Executor {
    pub(super) fn metrics(&self, residents: usize, out: &PassOutput) {
        gauge!(m::NUM_REQUESTS_RUNNING).set(residents.saturating_sub(out.paused) as f64);
        gauge!(m::NUM_REQUESTS_WAITING).set(out.queue_len as f64);
        gauge!(m::NUM_REQUESTS_PAUSED).set(out.paused as f64);
    }

    /// Pool gauges, read from the pool actors off the pass's path.
    pub(super) fn pool_metrics(&self, ctx: &mut Context<Self>) {
        let c = self.components.clone();
        ctx.spawn(
            async move {
                for p in c.usage().await {
                    gauge!(m::POOL_USED, m::LABEL_POOL => p.pool).set(p.used as f64);
                    gauge!(m::POOL_CAPACITY, m::LABEL_POOL => p.pool).set(p.capacity as f64);
                    gauge!(m::POOL_HEADROOM, m::LABEL_POOL => p.pool).set(p.headroom as f64);
                }
            }
            .into_actor(self),
        );
    }

    fn rank_status(&self) -> Option<RankStatus> {
        self.state.as_ref()?.ranks.as_ref().map(|r| r.status())
    }

    pub(super) fn stat_line(&mut self, ctx: &mut Context<Self>) {
        let controller = self.components.controller.clone();
        let queue = self.components.queue.clone();
        let ranks = self.rank_status();
        let kv = std::mem::take(&mut self.kv);
        ctx.spawn(
            async move {
                let (s, q) =
                    futures::join!(controller.send(TakeStatLine), queue.send(QueueSnapshot));
                if let (Ok(s), Ok(q)) = (s, q) {
                    tracing::info!("{}", stat_line(&s, &q, ranks, kv));
                }
            }
            .into_actor(self),
        );
    }
}

/// Rows that waited for a KV page and requests aborted for one, since the last stat line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct KvCounts {
    pub waits: u64,
    pub aborts: u64,
}

/// SPEC §4.7's stat line, with the KV pool's waits and aborts since the last line (a pool
/// too small for the load shows waits climbing and then aborts, `policy::kv_stall`) and the
/// queue's state after it.
fn stat_line(
    s: &crate::policy::preemption::StatLine,
    q: &QueueView,
    ranks: Option<RankStatus>,
    kv: KvCounts,
) -> String {
    let fmt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.3}"));
    let target = match (s.below_target, s.credit) {
        (Some(b), c) => format!(" below_target={b} credit={}", fmt(c)),
        _ => String::new(),
    };
    let t = q.tiers;
    let ranks = ranks.map_or(String::new(), |r| {
        format!(" ranks={} passes_checked={}", r.ranks, r.passes_checked)
    });
    format!(
        "preemption: pauses={} resumes={} forced={} paused={}/{} g={} W={:.3}s D={}s tpot_inflation={:.4} completions={}{} kv_waits={} kv_aborts={} | queue: waiting={} X={} overdue={} late={} guard={} on_time={}{}",
        s.pauses,
        s.resumes,
        s.forced_resumes,
        s.paused,
        s.paused_cap,
        fmt(s.g),
        s.window_s,
        fmt(s.d_s),
        s.tpot_inflation,
        s.completions,
        target,
        kv.waits,
        kv.aborts,
        q.len,
        x_text(q),
        t.overdue,
        t.late,
        t.guard,
        t.on_time,
        ranks
    )
}

/// X, or while it forms how far it has come: until then nothing is at risk and nothing
/// pauses, which an operator otherwise reads as preemption not working. FCFS never forms X.
fn x_text(q: &QueueView) -> String {
    match q.target_x_s {
        Some(x) => format!("{x:.3}"),
        None if q.policy != crate::policy::AdmissionPolicy::Fcfs => format!(
            "- (forming: {}/{} waited TTFTs)",
            q.target_samples, q.min_samples
        ),
        None => "-".to_owned(),
    }
}

impl Handler<DebugState> for Executor {
    type Result = ResponseActFuture<Self, serde_json::Value>;
    fn handle(&mut self, _: DebugState, _: &mut Context<Self>) -> Self::Result {
        let now = self.clock.now();
        let c = self.components.clone();
        let fut = async move {
            futures::join!(
                c.queue.send(crate::actors::components::QueueSnapshot),
                c.controller
                    .send(crate::actors::components::PreemptionSnapshot { now }),
                c.usage(),
                c.describe(now),
            )
        };
        Box::pin(
            fut.into_actor(self)
                .map(move |(q, p, pools, components), act, _| {
                    let worker = match (q, p, act.state.as_ref()) {
                        (Ok(q), Ok(p), Some(st)) => json!(st.machine.snapshot(now, q, p, pools)),
                        _ => json!("a component or the pass is unavailable"),
                    };
                    act.debug_json(now, worker, components)
                }),
        )
    }
}

impl Executor {
    fn debug_json(
        &self,
        now: f64,
        worker: serde_json::Value,
        components: Vec<serde_json::Value>,
    ) -> serde_json::Value {
        let stepping = self
            .stepping
            .as_ref()
            // The clock read now, not `now`: that was read before the components answered,
            // and the step may have been sent since.
            .map(|(p, b)| {
                json!({"pass": p, "batch": b.len(), "for_s": self.clock.now() - self.stepping_since})
            });
        json!({
            "executor": {
                "now": now,
                "live_requests": self.live.len(),
                "stepping": stepping,
                "last_step_s": self.last_step.map(|s| s.0),
                "last_batch": self.last_step.map(|s| s.1),
                "backend_down": self.shared.down_reason(),
                "stopped": self.stopped,
            },
            "ranks": self.rank_status(),
            "worker": worker,
            "components": components,
            "gpu_step": self.gpu.as_ref().map(GpuHandle::state),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{AdmissionParams, AdmissionPolicy, AdmissionQueue};

    #[test]
    fn the_stat_line_says_how_far_x_has_formed_until_it_has() {
        let view = |policy| {
            QueueView::of(&AdmissionQueue::new(AdmissionParams {
                policy,
                ..AdmissionParams::default()
            }))
        };
        let q = view(AdmissionPolicy::Auto);
        assert_eq!(x_text(&q), "- (forming: 0/200 waited TTFTs)");
        assert!(stat_line(&line(), &q, None, KvCounts::default())
            .contains("X=- (forming: 0/200 waited TTFTs) "));
        assert_eq!(x_text(&view(AdmissionPolicy::Fcfs)), "-");
        let fixed = QueueView::of(&AdmissionQueue::new(AdmissionParams {
            fixed_target: Some(13.5),
            ..AdmissionParams::default()
        }));
        // A fixed X too waits for min_samples waited TTFTs before it counts.
        assert_eq!(x_text(&fixed), "- (forming: 0/200 waited TTFTs)");
    }

    #[test]
    fn the_stat_line_counts_the_rows_that_waited_for_a_kv_page_and_the_aborts() {
        let q = QueueView::of(&AdmissionQueue::new(AdmissionParams::default()));
        let kv = |waits, aborts| KvCounts { waits, aborts };
        assert!(stat_line(&line(), &q, None, kv(7, 2)).contains(" kv_waits=7 kv_aborts=2 | queue:"));
        assert!(stat_line(&line(), &q, None, kv(0, 0)).contains(" kv_waits=0 kv_aborts=0 | queue:"));
    }

    fn line() -> crate::policy::preemption::StatLine {
        crate::policy::preemption::StatLine {
            pauses: 0,
            resumes: 0,
            forced_resumes: 0,
            paused: 0,
            paused_cap: 48,
            g: Some(1.0),
            window_s: 0.0,
            d_s: None,
            tpot_inflation: 0.0,
            completions: 0,
            below_target: None,
            credit: None,
        }
    }
}
