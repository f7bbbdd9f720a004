//! The frames ranks exchange each pass. Leader → follower: `Pass` (the pass number, whether
//! preemption is turned off before it, and the pass inputs' wire bytes). Follower → leader:
//! `Hash` (its decision hash for that pass) or `Refused` (it could not run the pass, and
//! why). Each opens with the wire version and a kind byte; little-endian like the inputs.

use super::super::wire::{self, WireError, R, WIRE_VERSION};
use super::super::PassInputs;

const PASS: u8 = 1;
const HASH: u8 = 2;
const REFUSED: u8 = 3;

/// Flag bit of a `Pass` frame: the supervisor turned preemption off before this pass.
const DISABLE_PREEMPTION: u8 = 1;

/// A follower's answer to one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Hash { pass: u64, hash: u64 },
    Refused { pass: u64, why: String },
}

fn header(buf: &mut Vec<u8>, kind: u8, pass: u64) {
    buf.clear();
    buf.extend_from_slice(&WIRE_VERSION.to_le_bytes());
    buf.push(kind);
    buf.extend_from_slice(&pass.to_le_bytes());
}

/// Writes pass `pass`'s frame into `buf`.
pub fn encode_pass(buf: &mut Vec<u8>, pass: u64, disable_preemption: bool, inp: &PassInputs) {
    header(buf, PASS, pass);
    buf.push(if disable_preemption {
        DISABLE_PREEMPTION
    } else {
        0
    });
    wire::encode_inputs(inp, buf);
}

/// A `Pass` frame read into `into`: `(pass, disable_preemption)`.
pub fn decode_pass(bytes: &[u8], into: &mut PassInputs) -> Result<(u64, bool), FrameError> {
    let mut r = R::new(bytes);
    let pass = open(&mut r, PASS)?;
    let flags = r.u8("flags")?;
    if flags & !DISABLE_PREEMPTION != 0 {
        return Err(FrameError::Flags(flags));
    }
    wire::decode_inputs_into(r.rest(), into)?;
    Ok((pass, flags & DISABLE_PREEMPTION != 0))
}

/// Writes a follower's reply into `buf`.
pub fn encode_reply(buf: &mut Vec<u8>, reply: &Reply) {
    match reply {
        Reply::Hash { pass, hash } => {
            header(buf, HASH, *pass);
            buf.extend_from_slice(&hash.to_le_bytes());
        }
        Reply::Refused { pass, why } => {
            header(buf, REFUSED, *pass);
            buf.extend_from_slice(why.as_bytes());
        }
    }
}

pub fn decode_reply(bytes: &[u8]) -> Result<Reply, FrameError> {
    let mut r = R::new(bytes);
    let kind = kind(&mut r)?;
    let pass = r.u64("pass")?;
    match kind {
        HASH => {
            let hash = r.u64("hash")?;
            r.end()?;
            Ok(Reply::Hash { pass, hash })
        }
        REFUSED => Ok(Reply::Refused {
            pass,
            why: String::from_utf8_lossy(r.rest()).into_owned(),
        }),
        other => Err(FrameError::Kind(other)),
    }
}

fn kind(r: &mut R<'_>) -> Result<u8, FrameError> {
    let got = r.u16("version")?;
    if got != WIRE_VERSION {
        return Err(WireError::Version { got }.into());
    }
    Ok(r.u8("kind")?)
}

fn open(r: &mut R<'_>, want: u8) -> Result<u64, FrameError> {
    match kind(r)? {
        k if k == want => Ok(r.u64("pass")?),
        other => Err(FrameError::Kind(other)),
    }
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("frame of unexpected kind {0}")]
    Kind(u8),
    #[error("unknown flags {0:#04x} in a pass frame")]
    Flags(u8),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_frame_carries_its_number_flag_and_inputs() {
        let inp = PassInputs {
            now: 2.5,
            cancellations: vec![4],
            ..PassInputs::default()
        };
        let mut buf = Vec::new();
        encode_pass(&mut buf, 77, true, &inp);
        let mut back = PassInputs::default();
        assert_eq!(decode_pass(&buf, &mut back), Ok((77, true)));
        assert_eq!(back, inp);
        encode_pass(&mut buf, 78, false, &inp);
        assert_eq!(decode_pass(&buf, &mut back), Ok((78, false)));
        assert_eq!(&buf[12..], wire::inputs_bytes(&inp).as_slice());
    }

    #[test]
    fn replies_round_trip_and_a_reply_is_not_a_pass() {
        let mut buf = Vec::new();
        for reply in [
            Reply::Hash {
                pass: 3,
                hash: 0xfeed,
            },
            Reply::Refused {
                pass: 4,
                why: "bad inputs".into(),
            },
        ] {
            encode_reply(&mut buf, &reply);
            assert_eq!(decode_reply(&buf), Ok(reply));
            assert_eq!(
                decode_pass(&buf, &mut PassInputs::default()),
                Err(FrameError::Kind(buf[2]))
            );
        }
    }

    #[test]
    fn unknown_flags_and_short_frames_are_refused() {
        let mut buf = Vec::new();
        encode_pass(&mut buf, 1, false, &PassInputs::default());
        buf[11] = 0x80;
        assert_eq!(
            decode_pass(&buf, &mut PassInputs::default()),
            Err(FrameError::Flags(0x80))
        );
        assert!(matches!(
            decode_reply(&buf[..5]),
            Err(FrameError::Wire(WireError::Short { .. }))
        ));
    }
}
