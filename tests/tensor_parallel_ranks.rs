//! Tensor-parallel ranks decide identically (SPEC §4.1, §6.1): the leader broadcasts each
//! pass's inputs as wire bytes, N−1 follower cores run the same pass on their own threads,
//! and every pass each follower's decision hash must equal the leader's. Tested over a long
//! generated load with idle gaps and preemption pauses, in both modes, over in-process
//! channels and over loopback TCP, while every rank runs at its own real-time pace; and the
//! control: a rank fed other inputs, or left out of a run-time disable, is caught at the
//! first pass it diverges, with both hashes in the error.

use std::net::{TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::Duration;

use genslot::ids::RequestId;
use genslot::policy::admission::AdmissionParams;
use genslot::policy::preemption::paused_cap;
use genslot::policy::Mode;
use genslot::worker::ranks::{follow, FrameRx, Link, LinkError, RankError, RankGroup};
use genslot::worker::wire::decision_hash;
use genslot::worker::{Arrival, KvReady, PassInputs, PassOutput, WorkerCore, WorkerParams};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const MODES: [Mode; 2] = [Mode::TpotBudget(0.1), Mode::TargetOutputTps(20.0)];

fn params(mode: Mode) -> WorkerParams {
    let mut p = WorkerParams::simple(8, mode, paused_cap(8), 1_000_000);
    p.admission = AdmissionParams {
        min_samples: 5,
        target_window: 50,
        ..AdmissionParams::default()
    };
    p.drafter_window = Some(8);
    p
}

/// A follower's receiving half that now and then makes its rank late: each rank reaches
/// each pass at a different real time, as ranks with their own clocks and loads would.
struct Late {
    inner: Box<dyn FrameRx>,
    rng: SmallRng,
}

impl FrameRx for Late {
    fn recv(&mut self, buf: &mut Vec<u8>) -> Result<(), LinkError> {
        if self.rng.random_bool(0.02) {
            std::thread::sleep(Duration::from_micros(self.rng.random_range(50..1500)));
        }
        self.inner.recv(buf)
    }
}

#[derive(Clone, Copy, Debug)]
enum Transport {
    Channel,
    Tcp,
}

/// A follower thread for rank `rank` on `link`, running late now and then.
fn spawn_follower(rank: u32, mode: Mode, link: Link) -> JoinHandle<Result<u64, RankError>> {
    std::thread::spawn(move || {
        let late = Link {
            rx: Box::new(Late {
                inner: link.rx,
                rng: SmallRng::seed_from_u64(u64::from(rank) * 7919),
            }),
            ..link
        };
        follow(rank, &mut WorkerCore::new(params(mode)), late)
    })
}

/// The leader's group over `ranks − 1` followers on `transport`, and their threads.
fn group(
    transport: Transport,
    mode: Mode,
    ranks: u32,
) -> (RankGroup, Vec<JoinHandle<Result<u64, RankError>>>) {
    let mut links = Vec::new();
    let mut threads = Vec::new();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    for rank in 1..ranks {
        match transport {
            Transport::Channel => {
                let (ours, theirs) = Link::channel_pair();
                threads.push(spawn_follower(rank, mode, theirs));
                links.push(ours);
            }
            Transport::Tcp => {
                // Connected before the next rank is, so accept order is rank order.
                let theirs = Link::tcp(TcpStream::connect(addr).unwrap()).unwrap();
                let (ours, _) = listener.accept().unwrap();
                threads.push(spawn_follower(rank, mode, theirs));
                links.push(Link::tcp(ours).unwrap());
            }
        }
    }
    (RankGroup::new(links).unwrap(), threads)
}

/// The plant around the leader: bursts of arrivals with idle gaps between them, KV ready
/// 0.1 s after admission, steps of 30 ms plus 1 ms a row emitting one token each, now and
/// then a request stopping early or a client cancelling.
struct Load {
    rng: SmallRng,
    now: f64,
    next_id: RequestId,
    busy_until: f64,
    in_transfer: Vec<(RequestId, f64)>,
    last_batch: Vec<RequestId>,
    resident: Vec<RequestId>,
    /// Idle gaps so far.
    gaps: usize,
}

impl Load {
    fn new(seed: u64) -> Self {
        Load {
            rng: SmallRng::seed_from_u64(seed),
            now: 0.0,
            next_id: 1,
            busy_until: 30.0,
            in_transfer: Vec::new(),
            last_batch: Vec::new(),
            resident: Vec::new(),
            gaps: 0,
        }
    }

    fn inputs(&mut self) -> PassInputs {
        let mut inp = PassInputs {
            now: self.now,
            ..PassInputs::default()
        };
        if self.now < self.busy_until {
            // Above the ~0.04 completions a pass that 8 slots allow: the queue builds.
            while self.rng.random_bool(0.07) {
                inp.arrivals.push(Arrival {
                    id: self.next_id,
                    arrival: self.now - self.rng.random_range(0.0..0.05),
                    context_tokens: self.rng.random_range(100..5000),
                    max_tokens: self.rng.random_range(20..400),
                });
                self.next_id += 1;
            }
        } else if self.last_batch.is_empty() && self.in_transfer.is_empty() {
            // Drained: an idle gap, then the next burst.
            self.now += self.rng.random_range(1.0..20.0);
            self.gaps += 1;
            inp.now = self.now;
            self.busy_until = self.now + self.rng.random_range(10.0..40.0);
        }
        let now = self.now;
        self.in_transfer.retain(|&(id, at)| {
            let ready = at <= now;
            if ready {
                inp.kv_ready.push(KvReady { id, at });
            }
            !ready
        });
        if !self.resident.is_empty() && self.rng.random_bool(0.002) {
            let i = self.rng.random_range(0..self.resident.len());
            inp.cancellations.push(self.resident[i]);
        }
        for &id in &self.last_batch {
            let stop = self.rng.random_bool(0.002);
            inp.push_stepped(id, 1, stop, &[(id % 1000) as u32]);
        }
        if !self.last_batch.is_empty() {
            inp.step_s = Some(0.03 + 0.001 * self.last_batch.len() as f64);
        }
        inp
    }

    fn apply(&mut self, out: &PassOutput) {
        for a in &out.admitted {
            self.in_transfer.push((a.id, self.now + 0.1));
            self.resident.push(a.id);
        }
        self.resident
            .retain(|id| !out.departed.iter().any(|d| d.id == *id));
        self.last_batch.clear();
        self.last_batch.extend(out.batch.iter().map(|b| b.id));
        self.now += 0.03 + 0.001 * out.batch.len() as f64;
    }
}

#[derive(Debug, Default)]
struct Seen {
    pauses: usize,
    resumes: usize,
    admitted: usize,
    gaps: usize,
}

/// Runs `passes` passes of the load on the leader and its group, checking every pass.
async fn run(g: &mut RankGroup, mode: Mode, seed: u64, passes: usize) -> Seen {
    let mut leader = WorkerCore::new(params(mode));
    let mut load = Load::new(seed);
    let mut out = PassOutput::default();
    let mut seen = Seen::default();
    for i in 0..passes {
        let inp = load.inputs();
        g.broadcast(&inp).unwrap();
        leader.pass_into(&inp, &mut out);
        if let Err(e) = g.check(&out).await {
            panic!("pass {i} in {mode:?}: {e}");
        }
        load.apply(&out);
        seen.pauses += out.pauses.len();
        seen.resumes += out.resumes.len() + out.forced_resumes.len();
        seen.admitted += out.admitted.len();
    }
    seen.gaps = load.gaps;
    seen
}

async fn ranks_agree_over_a_long_load(transport: Transport, ranks: u32) {
    for mode in MODES {
        let (mut g, threads) = group(transport, mode, ranks);
        let passes = 6000;
        let seen = run(&mut g, mode, 11, passes).await;
        let s = g.status();
        assert_eq!(s.passes_checked, passes as u64);
        assert_eq!((s.ranks, s.failure), (ranks, None));
        assert!(
            seen.pauses > 10 && seen.resumes > 10 && seen.admitted > 200 && seen.gaps > 2,
            "the load must exercise preemption in {mode:?}: {seen:?}"
        );
        drop(g); // closing the links ends the followers
        for t in threads {
            assert_eq!(t.join().unwrap(), Ok(passes as u64));
        }
    }
}

#[tokio::test]
async fn four_ranks_over_channels_decide_identically_in_both_modes() {
    ranks_agree_over_a_long_load(Transport::Channel, 4).await;
}

#[tokio::test]
async fn three_ranks_over_loopback_tcp_decide_identically_in_both_modes() {
    ranks_agree_over_a_long_load(Transport::Tcp, 3).await;
}

#[tokio::test]
async fn a_rank_fed_other_inputs_stops_the_group_at_that_pass_with_both_hashes() {
    for transport in [Transport::Channel, Transport::Tcp] {
        let mode = MODES[0];
        let (mut g, threads) = group(transport, mode, 3);
        let mut leader = WorkerCore::new(params(mode));
        // What the followers compute when, from pass 700 on, their inputs lose the arrivals.
        let mut shadow = WorkerCore::new(params(mode));
        let mut load = Load::new(5);
        let mut failure = None;
        for pass in 1..=1000u64 {
            let inp = load.inputs();
            let out = leader.pass(&inp);
            let mut fed = inp.clone();
            if pass >= 700 {
                fed.arrivals.clear();
            }
            let theirs = shadow.pass(&fed);
            // The leader broadcasts the altered inputs to everyone, runs its own pass on
            // the true ones: the followers are the ranks "fed different inputs".
            g.broadcast(&fed).unwrap();
            if let Err(e) = g.check(&out).await {
                failure = Some((pass, e, decision_hash(&out), decision_hash(&theirs)));
                break;
            }
            assert_eq!(
                decision_hash(&theirs),
                decision_hash(&out),
                "pass {pass}: the shadow must agree until it is fed otherwise"
            );
            load.apply(&out);
        }
        let (pass, e, leader_hash, follower_hash) = failure.expect("the group must stop");
        assert!(pass >= 700, "{transport:?}: stopped at {pass}");
        assert_eq!(
            e,
            RankError::Mismatch {
                pass,
                rank: 1,
                leader: leader_hash,
                follower: follower_hash,
            },
            "{transport:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains(&format!("{leader_hash:016x}"))
                && msg.contains(&format!("{follower_hash:016x}"))
                && msg.contains(&format!("pass {pass}")),
            "{msg}"
        );
        assert!(g.broadcast(&PassInputs::default()).is_err());
        drop(g);
        for t in threads {
            t.join().unwrap().unwrap();
        }
    }
}

#[tokio::test]
async fn a_run_time_disable_reaches_every_rank_before_the_same_pass() {
    let mode = MODES[0];
    for forwarded in [true, false] {
        let (mut g, _threads) = group(Transport::Channel, mode, 2);
        let mut leader = WorkerCore::new(params(mode));
        let mut load = Load::new(3);
        let mut out = PassOutput::default();
        let mut disabled_at = None;
        let mut result = Ok(());
        for pass in 1..=3000 {
            // Off while requests are paused: they must resume on every rank alike.
            if disabled_at.is_none() && pass >= 300 && leader.preemption().paused_count() > 0 {
                disabled_at = Some(pass);
                leader.preemption_mut().disable();
                if forwarded {
                    g.disable_preemption();
                }
            }
            let inp = load.inputs();
            g.broadcast(&inp).unwrap();
            leader.pass_into(&inp, &mut out);
            result = g.check(&out).await.map(|_| ());
            if result.is_err() {
                break;
            }
            if disabled_at.is_some() {
                assert!(out.pauses.is_empty(), "pass {pass}: paused while off");
            }
            load.apply(&out);
        }
        let at = disabled_at.expect("requests paused after pass 300");
        if forwarded {
            result.unwrap();
            assert_eq!(g.status().passes_checked, 3000);
        } else {
            // The control: a follower that kept preemption on keeps its requests paused.
            assert!(
                matches!(result, Err(RankError::Mismatch { pass, .. }) if pass == at),
                "disabled at {at}: {result:?}"
            );
        }
    }
}
