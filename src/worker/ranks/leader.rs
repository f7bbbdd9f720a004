//! The leader's side of the ranks: broadcasts each pass's inputs, then collects every
//! follower's decision hash for that pass and compares it with its own. One reader thread
//! per follower forwards its replies, so the leader awaits them without blocking a thread.

use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use super::frame::{self, Reply};
use super::link::{FrameRx, FrameTx, Link, LinkError};
use super::{follow, RankError};
use crate::worker::wire::decision_hash_with;
use crate::worker::{PassInputs, PassOutput, WorkerCore, WorkerParams};

/// How long the leader waits for a follower's hash before declaring it hung: a pass takes
/// micro- to milliseconds, so this only fires on a rank that stopped answering.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

type Answer = (u32, Result<Reply, RankError>);

/// The leader's view of its followers, for `/debug/actors` and the stat line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankStatus {
    /// Ranks in the group, the leader included.
    pub ranks: u32,
    pub transport: &'static str,
    /// Passes whose hashes every follower matched.
    pub passes_checked: u64,
    /// The last pass's decision hash, hex.
    pub last_hash: Option<String>,
    /// Why the ranks stopped, once they did.
    pub failure: Option<String>,
}

/// The leader's links to ranks 1..N, and the check of every pass.
pub struct RankGroup {
    tx: Vec<Box<dyn FrameTx>>,
    replies: UnboundedReceiver<Answer>,
    /// Follower threads this process runs (`spawn_local`), joined at drop.
    local: Vec<JoinHandle<()>>,
    transport: &'static str,
    frame: Vec<u8>,
    /// Passes broadcast; the last one's number.
    sent: u64,
    awaiting: bool,
    disable_next: bool,
    checked: u64,
    last_hash: Option<u64>,
    failure: Option<RankError>,
    timeout: Duration,
    got: Vec<Option<Reply>>,
    /// The leader's output encoded for its hash, reused pass to pass.
    scratch: Vec<u8>,
}

impl std::fmt::Debug for RankGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankGroup")
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl RankGroup {
    /// A group over the leader's ends of links to ranks 1..=links.len(), in rank order.
    pub fn new(links: Vec<Link>) -> Result<Self, RankError> {
        let (answers, replies) = unbounded_channel();
        let transport = links.first().map_or("none", |l| l.kind);
        let mut tx = Vec::with_capacity(links.len());
        for (i, link) in links.into_iter().enumerate() {
            let rank = i as u32 + 1;
            tx.push(link.tx);
            let (rx, answers) = (link.rx, answers.clone());
            // Not joined: it ends when its follower closes the link, which a remote
            // process may do late; the leader never waits on it.
            std::thread::Builder::new()
                .name(format!("genslot-rank{rank}-replies"))
                .spawn(move || read_replies(rank, rx, answers))
                .map_err(|e| RankError::Start {
                    rank,
                    why: e.to_string(),
                })?;
        }
        Ok(RankGroup {
            got: vec![None; tx.len()],
            tx,
            replies,
            local: Vec::new(),
            transport,
            frame: Vec::new(),
            sent: 0,
            awaiting: false,
            disable_next: false,
            checked: 0,
            last_hash: None,
            failure: None,
            timeout: DEFAULT_TIMEOUT,
            scratch: Vec::new(),
        })
    }

    /// `ranks − 1` followers on threads of this process, each with its own core for
    /// `params`, linked by channels.
    pub fn spawn_local(params: &WorkerParams, ranks: u32) -> Result<Self, RankError> {
        let mut links = Vec::new();
        let mut local = Vec::new();
        for rank in 1..ranks {
            let (ours, theirs) = Link::channel_pair();
            let mut core = WorkerCore::new(params.clone());
            let h = std::thread::Builder::new()
                .name(format!("genslot-rank{rank}"))
                .spawn(move || {
                    if let Err(e) = follow(rank, &mut core, theirs) {
                        tracing::error!("{e}");
                    }
                })
                .map_err(|e| RankError::Start {
                    rank,
                    why: e.to_string(),
                })?;
            links.push(ours);
            local.push(h);
        }
        let mut g = RankGroup::new(links)?;
        g.local = local;
        Ok(g)
    }

    /// How long `check` waits for a follower.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Ranks, the leader included.
    pub fn ranks(&self) -> u32 {
        self.tx.len() as u32 + 1
    }

    /// Preemption was turned off at run time: the followers turn it off before the next
    /// pass, as the leader's controller does.
    pub fn disable_preemption(&mut self) {
        self.disable_next = true;
    }

    /// The error that stopped the ranks, if one did.
    pub fn failure(&self) -> Option<&RankError> {
        self.failure.as_ref()
    }

    pub fn status(&self) -> RankStatus {
        RankStatus {
            ranks: self.ranks(),
            transport: self.transport,
            passes_checked: self.checked,
            last_hash: self.last_hash.map(|h| format!("{h:016x}")),
            failure: self.failure.as_ref().map(ToString::to_string),
        }
    }

    fn fail(&mut self, e: RankError) -> Result<(), RankError> {
        self.failure.get_or_insert(e.clone());
        Err(e)
    }

    fn stopped(&self) -> Result<(), RankError> {
        match &self.failure {
            Some(f) => Err(RankError::Stopped(f.to_string())),
            None => Ok(()),
        }
    }

    /// Sends the next pass's inputs to every follower (before the leader runs the pass, so
    /// the ranks run it side by side).
    pub fn broadcast(&mut self, inp: &PassInputs) -> Result<(), RankError> {
        self.stopped()?;
        if self.awaiting {
            return self.fail(RankError::OutOfStep {
                rank: 0,
                want: self.sent,
                got: self.sent + 1,
            });
        }
        self.sent += 1;
        frame::encode_pass(&mut self.frame, self.sent, self.disable_next, inp);
        self.disable_next = false;
        for i in 0..self.tx.len() {
            if let Err(e) = self.tx[i].send(&self.frame) {
                return self.fail(RankError::Lost {
                    rank: i as u32 + 1,
                    why: e.to_string(),
                });
            }
        }
        self.awaiting = true;
        Ok(())
    }

    /// Compares every follower's hash of the pass just broadcast with the hash of `out`,
    /// the leader's output of it. Needs a tokio runtime with timers (the wait is bounded).
    pub async fn check(&mut self, out: &PassOutput) -> Result<(), RankError> {
        self.stopped()?;
        if !std::mem::take(&mut self.awaiting) {
            return self.fail(RankError::NothingSent);
        }
        let leader = decision_hash_with(out, &mut self.scratch);
        self.got.iter_mut().for_each(|g| *g = None);
        let mut missing = self.got.len();
        while missing > 0 {
            let first_missing = self.got.iter().position(Option::is_none).unwrap_or(0) as u32 + 1;
            match tokio::time::timeout(self.timeout, self.replies.recv()).await {
                Err(_) => {
                    return self.fail(RankError::Timeout {
                        rank: first_missing,
                        pass: self.sent,
                        secs: self.timeout.as_secs_f64(),
                    })
                }
                Ok(None) => {
                    return self.fail(RankError::Lost {
                        rank: first_missing,
                        why: "every reply reader stopped".into(),
                    })
                }
                Ok(Some((_, Err(e)))) => return self.fail(e),
                Ok(Some((rank, Ok(reply)))) => {
                    let slot = &mut self.got[rank as usize - 1];
                    if slot.is_some() {
                        let got = match reply {
                            Reply::Hash { pass, .. } | Reply::Refused { pass, .. } => pass,
                        };
                        let want = self.sent;
                        return self.fail(RankError::OutOfStep { rank, want, got });
                    }
                    *slot = Some(reply);
                    missing -= 1;
                }
            }
        }
        // Judged in rank order, so the error names the lowest rank that disagrees.
        for i in 0..self.got.len() {
            let rank = i as u32 + 1;
            let verdict = match self.got[i].take() {
                Some(Reply::Hash { pass, .. }) if pass != self.sent => RankError::OutOfStep {
                    rank,
                    want: self.sent,
                    got: pass,
                },
                Some(Reply::Hash { hash, .. }) if hash == leader => continue,
                Some(Reply::Hash { hash, .. }) => RankError::Mismatch {
                    pass: self.sent,
                    rank,
                    leader,
                    follower: hash,
                },
                Some(Reply::Refused { pass, why }) => RankError::Refused { rank, pass, why },
                None => continue, // every slot was filled above
            };
            return self.fail(verdict);
        }
        self.checked += 1;
        self.last_hash = Some(leader);
        Ok(())
    }
}

impl Drop for RankGroup {
    /// Closing the links ends the followers; this process's own are joined.
    fn drop(&mut self) {
        self.tx.clear();
        for h in self.local.drain(..) {
            let _ = h.join();
        }
    }
}

fn read_replies(rank: u32, mut rx: Box<dyn FrameRx>, answers: UnboundedSender<Answer>) {
    let mut buf = Vec::new();
    loop {
        let answer = match rx.recv(&mut buf) {
            Ok(()) => frame::decode_reply(&buf).map_err(|e| RankError::Lost {
                rank,
                why: format!("unreadable reply: {e}"),
            }),
            Err(LinkError::Closed) => Err(RankError::Lost {
                rank,
                why: "it closed its link".into(),
            }),
            Err(e) => Err(RankError::Lost {
                rank,
                why: e.to_string(),
            }),
        };
        let last = answer.is_err();
        if answers.send((rank, answer)).is_err() || last {
            return;
        }
    }
}
