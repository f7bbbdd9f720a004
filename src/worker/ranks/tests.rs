//! The rank protocol's failure paths: every way a follower can fail stops the group with an
//! error naming the rank, and nothing waits forever. (Agreement over long loads on both
//! transports: tests/tensor_parallel_ranks.rs.)

use std::time::Duration;

use super::frame::{self, Reply};
use super::*;
use crate::policy::Mode;
use crate::worker::{Arrival, PassInputs, PassOutput, WorkerCore, WorkerParams};

fn params() -> WorkerParams {
    WorkerParams::simple(4, Mode::TpotBudget(0.1), 2, 100_000)
}

fn arrivals(now: f64, ids: std::ops::Range<u64>) -> PassInputs {
    PassInputs {
        now,
        arrivals: ids
            .map(|id| Arrival {
                id,
                arrival: now,
                context_tokens: 100,
                max_tokens: 10,
            })
            .collect(),
        ..PassInputs::default()
    }
}

/// One follower on a thread of this test, running `body` on its end of the link. The
/// leader waits `timeout` for a reply: short where the test wants the timeout, long where
/// an answer is due (a loaded machine may not run the follower's thread for a while).
fn with_follower(timeout: Duration, body: impl FnOnce(Link) + Send + 'static) -> RankGroup {
    let (ours, theirs) = Link::channel_pair();
    std::thread::spawn(move || body(theirs));
    RankGroup::new(vec![ours]).unwrap().with_timeout(timeout)
}

const ANSWER_DUE: Duration = Duration::from_secs(20);

#[tokio::test]
async fn local_followers_agree_and_count_the_passes_checked() {
    let mut g = RankGroup::spawn_local(&params(), 3).unwrap();
    let mut leader = WorkerCore::new(params());
    for pass in 0..20 {
        let inp = arrivals(pass as f64 * 0.1, pass * 2..pass * 2 + 2);
        g.broadcast(&inp).unwrap();
        let out = leader.pass(&inp);
        g.check(&out).await.unwrap();
    }
    let s = g.status();
    assert_eq!((s.ranks, s.transport, s.passes_checked), (3, "channel", 20));
    assert_eq!(s.failure, None);
}

/// Rank `rank` behind a relay that rewrites each pass frame with `edit` on its way.
fn tampered(
    rank: u32,
    mut edit: impl FnMut(&mut Vec<u8>) + Send + 'static,
) -> (Link, std::thread::JoinHandle<Result<u64, RankError>>) {
    let (ours, theirs) = Link::channel_pair();
    let (relay, inner) = Link::channel_pair();
    let follower = std::thread::spawn(move || follow(rank, &mut WorkerCore::new(params()), inner));
    std::thread::spawn(move || {
        let (
            Link { mut tx, mut rx, .. },
            Link {
                tx: mut up,
                rx: mut down,
                ..
            },
        ) = (theirs, relay);
        let mut buf = Vec::new();
        while rx.recv(&mut buf).is_ok() {
            edit(&mut buf);
            if up.send(&buf).is_err() || down.recv(&mut buf).is_err() || tx.send(&buf).is_err() {
                return;
            }
        }
    });
    (ours, follower)
}

#[tokio::test]
async fn a_follower_that_cannot_read_a_frame_refuses_it_and_the_group_stops() {
    let (link, follower) = tampered(1, |frame| frame[0] = 9); // another wire version
    let mut g = RankGroup::new(vec![link]).unwrap();
    g.broadcast(&PassInputs::default()).unwrap();
    let e = g.check(&PassOutput::default()).await.unwrap_err();
    assert!(
        matches!(&e, RankError::Refused { rank: 1, pass: 1, why } if why.contains("version 9")),
        "{e}"
    );
    assert!(matches!(
        follower.join().unwrap(),
        Err(RankError::Refused { .. })
    ));
    assert!(matches!(
        g.broadcast(&PassInputs::default()),
        Err(RankError::Stopped(_))
    ));
    assert_eq!(g.status().failure, Some(e.to_string()));
}

#[tokio::test]
async fn a_follower_that_leaves_is_lost_and_one_that_hangs_times_out() {
    let mut gone = with_follower(ANSWER_DUE, drop);
    // The send fails, or the reply reader finds the link closed: either way rank 1 is lost.
    let sent = gone.broadcast(&PassInputs::default());
    let checked = gone.check(&PassOutput::default()).await;
    assert!(sent.is_err() || checked.is_err());
    assert!(
        matches!(gone.failure(), Some(RankError::Lost { rank: 1, .. })),
        "{:?}",
        gone.failure()
    );

    let (keep, hold) = std::sync::mpsc::channel();
    let mut hung = with_follower(Duration::from_millis(200), move |link| {
        let _ = keep.send(link); // holds the link open and never answers
    });
    hung.broadcast(&PassInputs::default()).unwrap();
    let e = hung.check(&PassOutput::default()).await.unwrap_err();
    assert!(
        matches!(
            e,
            RankError::Timeout {
                rank: 1,
                pass: 1,
                ..
            }
        ),
        "{e}"
    );
    drop(hold);
}

#[tokio::test]
async fn a_reply_for_another_pass_is_out_of_step() {
    let mut g = with_follower(ANSWER_DUE, |mut link| {
        let mut buf = Vec::new();
        let mut reply = Vec::new();
        while link.rx.recv(&mut buf).is_ok() {
            frame::encode_reply(&mut reply, &Reply::Hash { pass: 41, hash: 0 });
            let _ = link.tx.send(&reply);
        }
    });
    g.broadcast(&PassInputs::default()).unwrap();
    let e = g.check(&PassOutput::default()).await.unwrap_err();
    assert_eq!(
        e,
        RankError::OutOfStep {
            rank: 1,
            want: 1,
            got: 41
        }
    );
}

#[tokio::test]
async fn the_leader_must_broadcast_once_before_each_check() {
    let mut g = RankGroup::spawn_local(&params(), 2).unwrap();
    assert_eq!(
        g.check(&PassOutput::default()).await,
        Err(RankError::NothingSent)
    );
    let mut g = RankGroup::spawn_local(&params(), 2).unwrap();
    g.broadcast(&PassInputs::default()).unwrap();
    assert!(matches!(
        g.broadcast(&PassInputs::default()),
        Err(RankError::OutOfStep { rank: 0, .. })
    ));
}

#[tokio::test]
async fn a_follower_that_runs_other_inputs_is_a_mismatch_with_both_hashes() {
    // Rank 2 loses the arrivals of the third pass on its way.
    let (ours1, theirs1) = Link::channel_pair();
    std::thread::spawn(move || follow(1, &mut WorkerCore::new(params()), theirs1));
    let (ours2, _) = tampered(2, |buf| {
        let mut inp = PassInputs::default();
        if let Ok((3, off)) = frame::decode_pass(buf, &mut inp) {
            inp.arrivals.clear();
            frame::encode_pass(buf, 3, off, &inp);
        }
    });
    let mut g = RankGroup::new(vec![ours1, ours2]).unwrap();
    let mut leader = WorkerCore::new(params());
    let mut shadow = WorkerCore::new(params());
    for pass in 1..=3u64 {
        let inp = arrivals(pass as f64, pass * 10..pass * 10 + 3);
        g.broadcast(&inp).unwrap();
        let out = leader.pass(&inp);
        let mut fed = inp.clone();
        if pass == 3 {
            fed.arrivals.clear();
        }
        let theirs = shadow.pass(&fed);
        let r = g.check(&out).await;
        if pass < 3 {
            r.unwrap();
            continue;
        }
        let want = RankError::Mismatch {
            pass: 3,
            rank: 2,
            leader: crate::worker::wire::decision_hash(&out),
            follower: crate::worker::wire::decision_hash(&theirs),
        };
        assert_eq!(r, Err(want.clone()));
        let msg = want.to_string();
        assert!(msg.contains("pass 3") && msg.contains("rank 2"), "{msg}");
        assert_ne!(out, theirs);
    }
    assert_eq!(g.status().passes_checked, 2);
}
