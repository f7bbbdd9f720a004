//! A follower rank: takes each pass's inputs off its link, runs the pass on its own core
//! and answers with the decision hash. It reads no clock: the leader's `now` is in the
//! inputs, so however late this rank runs a pass, it decides as the leader did.

use super::frame::{self, Reply};
use super::link::{Link, LinkError};
use super::RankError;
use crate::worker::wire::decision_hash_with;
use crate::worker::{PassInputs, PassOutput, WorkerCore};

/// Serves passes as rank `rank` until the leader closes the link; returns the passes run.
/// A frame it cannot read is answered with `Refused` and ends the rank with an error.
pub fn follow(rank: u32, core: &mut WorkerCore, link: Link) -> Result<u64, RankError> {
    let Link { mut tx, mut rx, .. } = link;
    let (mut buf, mut reply, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
    let mut inp = PassInputs::default();
    let mut out = PassOutput::default();
    let mut passes = 0;
    let lost = |e: LinkError| RankError::Lost {
        rank,
        why: e.to_string(),
    };
    loop {
        match rx.recv(&mut buf) {
            Ok(()) => {}
            Err(LinkError::Closed) => return Ok(passes),
            Err(e) => return Err(lost(e)),
        }
        let (pass, disable) = match frame::decode_pass(&buf, &mut inp) {
            Ok(p) => p,
            Err(e) => {
                // The pass number sits before anything that can be malformed but the
                // version; `passes + 1` is the pass this rank expected.
                let pass = passes + 1;
                let why = e.to_string();
                frame::encode_reply(
                    &mut reply,
                    &Reply::Refused {
                        pass,
                        why: why.clone(),
                    },
                );
                let _ = tx.send(&reply);
                return Err(RankError::Refused { rank, pass, why });
            }
        };
        if disable {
            core.preemption_mut().disable();
        }
        core.pass_into(&inp, &mut out);
        passes += 1;
        let hash = decision_hash_with(&out, &mut scratch);
        frame::encode_reply(&mut reply, &Reply::Hash { pass, hash });
        match tx.send(&reply) {
            Ok(()) => {}
            Err(LinkError::Closed) => return Ok(passes),
            Err(e) => return Err(lost(e)),
        }
    }
}
