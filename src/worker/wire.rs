//! The stable byte form of a pass: `PassInputs` as the leader broadcasts them to the other
//! ranks, and the decision hash every rank computes over its `PassOutput` (SPEC §4.1, §6.1).
//!
//! Layout, version [`WIRE_VERSION`]: little-endian, fixed width, every list as a `u32`
//! count and then its elements in their order (no map, so no hash order), floats as their
//! IEEE-754 bits (NaN payloads and −0.0 survive). The inputs open with the version; a
//! decoder refuses another version, a short buffer, a list longer than the bytes left and
//! trailing bytes, so bytes off a socket can fail a decode but never panic it. The layout
//! is written out here rather than derived through serde, so reordering a struct's fields
//! cannot change what crosses the wire or what the hash reads without this file changing.

use super::inputs::{Arrival, KvReady, PassInputs, PassOutput, Stepped};

/// Version of the layout below; bumped on any change to it.
pub const WIRE_VERSION: u16 = 1;

/// Why bytes are not a `PassInputs`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("pass inputs of wire version {got}, this build reads version {WIRE_VERSION}")]
    Version { got: u16 },
    #[error("pass inputs end early: {what} needs {need} bytes at offset {at}, {left} left")]
    Short {
        what: &'static str,
        need: usize,
        at: usize,
        left: usize,
    },
    #[error("pass inputs: {what} is tagged {tag}, expected 0 or 1")]
    Tag { what: &'static str, tag: u8 },
    #[error("pass inputs: {0} bytes after the last field")]
    Trailing(usize),
}

/// FNV-1a, 64 bits: specified byte by byte, so every build, toolchain and host computes the
/// same value (unlike `DefaultHasher`). `examples/pass_decisions.rs` chains it over passes;
/// the ranks use XXH3 (below), which is as stable and runs several bytes a cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fnv1a(pub u64);

impl Fnv1a {
    pub const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x100_0000_01b3;

    pub fn new() -> Self {
        Fnv1a(Self::OFFSET)
    }

    /// One little-endian word.
    pub fn word(&mut self, x: u64) {
        self.put(&x.to_le_bytes());
    }

    pub fn put(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(Self::PRIME);
        }
    }
}

impl Default for Fnv1a {
    fn default() -> Self {
        Self::new()
    }
}

/// Little-endian writers appending to a buffer (reserved once for the whole value).
struct W<'a>(&'a mut Vec<u8>);

impl W<'_> {
    fn u8(&mut self, x: u8) {
        self.0.push(x);
    }
    fn bool(&mut self, x: bool) {
        self.u8(u8::from(x));
    }
    fn u16(&mut self, x: u16) {
        self.0.extend_from_slice(&x.to_le_bytes());
    }
    fn u32(&mut self, x: u32) {
        self.0.extend_from_slice(&x.to_le_bytes());
    }
    fn u64(&mut self, x: u64) {
        self.0.extend_from_slice(&x.to_le_bytes());
    }
    fn f64(&mut self, x: f64) {
        self.u64(x.to_bits());
    }
    fn opt_f64(&mut self, x: Option<f64>) {
        match x {
            None => self.u8(0),
            Some(v) => {
                self.u8(1);
                self.f64(v);
            }
        }
    }
    /// A list's length. Longer than `u32::MAX` cannot happen for one pass; saturating keeps
    /// the writer total (the decoder would then refuse the bytes, not misread them).
    fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).unwrap_or(u32::MAX));
    }
    fn ids(&mut self, ids: &[u64]) {
        self.len(ids.len());
        ids.iter().for_each(|&id| self.u64(id));
    }
}

/// Bytes per element of each list, for the decoder's length check.
const ARRIVAL: usize = 8 + 8 + 4 + 4;
const KV_READY: usize = 8 + 8;
const STEPPED: usize = 8 + 4 + 4 + 1;

/// The encoded size of `inp`.
pub fn inputs_len(inp: &PassInputs) -> usize {
    2 + 8
        + 5 * 4
        + inp.arrivals.len() * ARRIVAL
        + inp.cancellations.len() * 8
        + inp.kv_ready.len() * KV_READY
        + inp.stepped.len() * STEPPED
        + inp.stepped_ids.len() * 4
        + 1
        + inp.step_s.map_or(0, |_| 8)
}

/// Appends `inp`'s bytes to `buf`.
pub fn encode_inputs(inp: &PassInputs, buf: &mut Vec<u8>) {
    buf.reserve(inputs_len(inp));
    let mut w = W(buf);
    w.u16(WIRE_VERSION);
    w.f64(inp.now);
    w.len(inp.arrivals.len());
    for a in &inp.arrivals {
        w.u64(a.id);
        w.f64(a.arrival);
        w.u32(a.context_tokens);
        w.u32(a.max_tokens);
    }
    w.ids(&inp.cancellations);
    w.len(inp.kv_ready.len());
    for k in &inp.kv_ready {
        w.u64(k.id);
        w.f64(k.at);
    }
    w.len(inp.stepped.len());
    for s in &inp.stepped {
        w.u64(s.id);
        w.u32(s.tokens);
        w.u32(s.ids);
        w.bool(s.stop);
    }
    w.len(inp.stepped_ids.len());
    inp.stepped_ids.iter().for_each(|&t| w.u32(t));
    w.opt_f64(inp.step_s);
}

/// `inp` as a new buffer.
pub fn inputs_bytes(inp: &PassInputs) -> Vec<u8> {
    let mut v = Vec::new();
    encode_inputs(inp, &mut v);
    v
}

/// A little-endian reader that fails, never panics, past the end.
pub(crate) struct R<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> R<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        R { bytes, at: 0 }
    }

    fn take<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], WireError> {
        let end = self.at.checked_add(N).filter(|&e| e <= self.bytes.len());
        let Some(end) = end else {
            return Err(self.short(what, N));
        };
        let mut a = [0u8; N];
        a.copy_from_slice(&self.bytes[self.at..end]);
        self.at = end;
        Ok(a)
    }

    fn short(&self, what: &'static str, need: usize) -> WireError {
        WireError::Short {
            what,
            need,
            at: self.at,
            left: self.bytes.len() - self.at,
        }
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, WireError> {
        Ok(self.take::<1>(what)?[0])
    }
    pub(crate) fn bool(&mut self, what: &'static str) -> Result<bool, WireError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(WireError::Tag { what, tag }),
        }
    }
    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        self.take(what).map(u16::from_le_bytes)
    }
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        self.take(what).map(u32::from_le_bytes)
    }
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, WireError> {
        self.take(what).map(u64::from_le_bytes)
    }
    fn f64(&mut self, what: &'static str) -> Result<f64, WireError> {
        self.u64(what).map(f64::from_bits)
    }
    fn opt_f64(&mut self, what: &'static str) -> Result<Option<f64>, WireError> {
        match self.bool(what)? {
            false => Ok(None),
            true => self.f64(what).map(Some),
        }
    }
    /// A list's length, refused when its elements could not fit in the bytes left (so a
    /// forged count never reserves memory).
    fn len(&mut self, what: &'static str, elem: usize) -> Result<usize, WireError> {
        let n = self.u32(what)? as usize;
        let need = n.saturating_mul(elem);
        if need > self.bytes.len() - self.at {
            return Err(self.short(what, need));
        }
        Ok(n)
    }
    /// Appends a list of `elem`-byte entries, each read by `item`, to `into`.
    fn list<T>(
        &mut self,
        what: &'static str,
        elem: usize,
        into: &mut Vec<T>,
        mut item: impl FnMut(&mut Self) -> Result<T, WireError>,
    ) -> Result<(), WireError> {
        let n = self.len(what, elem)?;
        into.reserve(n);
        for _ in 0..n {
            into.push(item(self)?);
        }
        Ok(())
    }
    pub(crate) fn rest(&self) -> &'a [u8] {
        &self.bytes[self.at..]
    }
    pub(crate) fn end(&self) -> Result<(), WireError> {
        match self.bytes.len() - self.at {
            0 => Ok(()),
            n => Err(WireError::Trailing(n)),
        }
    }
}

/// Decodes `bytes` into `into`, reusing its lists' buffers. On an error `into` holds a
/// partial decode and must not be used.
pub fn decode_inputs_into(bytes: &[u8], into: &mut PassInputs) -> Result<(), WireError> {
    let mut r = R::new(bytes);
    let got = r.u16("version")?;
    if got != WIRE_VERSION {
        return Err(WireError::Version { got });
    }
    into.clear();
    into.now = r.f64("now")?;
    r.list("arrivals", ARRIVAL, &mut into.arrivals, |r| {
        Ok(Arrival {
            id: r.u64("arrival id")?,
            arrival: r.f64("arrival time")?,
            context_tokens: r.u32("arrival context")?,
            max_tokens: r.u32("arrival max_tokens")?,
        })
    })?;
    r.list("cancellations", 8, &mut into.cancellations, |r| {
        r.u64("cancellation")
    })?;
    r.list("kv_ready", KV_READY, &mut into.kv_ready, |r| {
        Ok(KvReady {
            id: r.u64("kv_ready id")?,
            at: r.f64("kv_ready at")?,
        })
    })?;
    r.list("stepped", STEPPED, &mut into.stepped, |r| {
        Ok(Stepped {
            id: r.u64("stepped id")?,
            tokens: r.u32("stepped tokens")?,
            ids: r.u32("stepped ids")?,
            stop: r.bool("stepped stop")?,
        })
    })?;
    r.list("stepped_ids", 4, &mut into.stepped_ids, |r| {
        r.u32("stepped id")
    })?;
    into.step_s = r.opt_f64("step_s")?;
    r.end()
}

/// Decodes one `PassInputs`.
pub fn decode_inputs(bytes: &[u8]) -> Result<PassInputs, WireError> {
    let mut inp = PassInputs::default();
    decode_inputs_into(bytes, &mut inp)?;
    Ok(inp)
}

/// Appends every field of `out` to `buf`, in declaration order: what the ranks compare.
pub fn encode_output(out: &PassOutput, buf: &mut Vec<u8>) {
    let ids = out.rejected.len()
        + out.cancelled.len()
        + out.pauses.len()
        + out.resumes.len()
        + out.forced_resumes.len()
        + out.displaced.len()
        + out.token_limited.len()
        + out.kv_waiting.len()
        + out.kv_aborted.len();
    buf.reserve(
        2 + 8
            + 8
            + 13 * 4
            + ids * 8
            + out.admitted.len() * (8 + 3 * 4)
            + out.batch.len() * (8 + 2 * 4 + 1)
            + out.first_tokens.len() * (8 + 8 + 1)
            + out.departed.len() * (8 + 1 + 9 + 8 + 4)
            + 4
            + 8
            + 8
            + 8,
    );
    let mut w = W(buf);
    w.u16(WIRE_VERSION);
    w.f64(out.now);
    w.u64(out.pass);
    w.ids(&out.rejected);
    w.ids(&out.cancelled);
    w.len(out.admitted.len());
    for a in &out.admitted {
        w.u64(a.id);
        w.u32(a.slot);
        w.u32(a.context_tokens);
        w.u32(a.max_tokens);
    }
    w.ids(&out.pauses);
    w.ids(&out.resumes);
    w.ids(&out.forced_resumes);
    w.ids(&out.displaced);
    w.ids(&out.token_limited);
    w.ids(&out.kv_waiting);
    w.ids(&out.kv_aborted);
    w.len(out.batch.len());
    for b in &out.batch {
        w.u64(b.id);
        w.u32(b.slot);
        w.u32(b.context_len);
        w.bool(b.first_token);
    }
    w.len(out.first_tokens.len());
    for f in &out.first_tokens {
        w.u64(f.id);
        w.f64(f.ttft);
        w.bool(f.waited);
    }
    w.len(out.departed.len());
    for d in &out.departed {
        w.u64(d.id);
        w.bool(d.completed);
        w.opt_f64(d.first_token_time);
        w.f64(d.finish_time);
        w.u32(d.output_tokens);
    }
    w.u32(out.admission_count);
    w.f64(out.window);
    w.u64(out.queue_len as u64);
    w.u64(out.paused as u64);
}

/// The hash the ranks compare every pass: XXH3 (64 bits) over `out`'s stable encoding, so
/// two outputs hash alike exactly when every decision, count and float bit agrees (up to
/// collisions).
pub fn decision_hash(out: &PassOutput) -> u64 {
    decision_hash_with(out, &mut Vec::new())
}

/// [`decision_hash`] encoding into `scratch` (its content replaced), so a rank that keeps
/// the buffer allocates nothing per pass.
pub fn decision_hash_with(out: &PassOutput, scratch: &mut Vec<u8>) -> u64 {
    scratch.clear();
    encode_output(out, scratch);
    xxhash_rust::xxh3::xxh3_64(scratch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::preemption::Departure;
    use crate::worker::{Admitted, BatchRow, FirstToken};
    use proptest::prelude::*;

    fn sample() -> PassInputs {
        let mut inp = PassInputs {
            now: 12.5,
            arrivals: vec![Arrival {
                id: 7,
                arrival: 11.0,
                context_tokens: 4000,
                max_tokens: 300,
            }],
            cancellations: vec![3, 9],
            kv_ready: vec![KvReady { id: 5, at: 12.25 }],
            step_s: Some(0.03),
            ..PassInputs::default()
        };
        inp.push_stepped(5, 2, false, &[101, 102]);
        inp.push_stepped(6, 1, true, &[2]);
        inp
    }

    #[test]
    fn the_layout_is_little_endian_and_opens_with_the_version() {
        let b = inputs_bytes(&PassInputs {
            now: 1.0,
            step_s: None,
            ..PassInputs::default()
        });
        let mut want = vec![1, 0];
        want.extend(1.0f64.to_bits().to_le_bytes());
        want.extend([0u8; 4 * 5]); // five empty lists
        want.push(0); // no step_s
        assert_eq!(b, want);
    }

    #[test]
    fn a_sample_round_trips_and_its_size_is_the_sum_of_its_fields() {
        let inp = sample();
        let b = inputs_bytes(&inp);
        let fields = 2 + 8 + 5 * 4 + ARRIVAL + 2 * 8 + KV_READY + 2 * STEPPED + 3 * 4 + 1 + 8;
        assert_eq!(b.len(), fields);
        assert_eq!(decode_inputs(&b), Ok(inp));
    }

    #[test]
    fn another_version_a_cut_a_forged_count_and_trailing_bytes_are_refused() {
        let b = inputs_bytes(&sample());
        let mut v2 = b.clone();
        v2[0] = 2;
        assert_eq!(decode_inputs(&v2), Err(WireError::Version { got: 2 }));
        for cut in 0..b.len() {
            assert!(
                matches!(decode_inputs(&b[..cut]), Err(WireError::Short { .. })),
                "cut at {cut}"
            );
        }
        let mut forged = b.clone();
        forged[10..14].copy_from_slice(&u32::MAX.to_le_bytes()); // the arrivals' count
        assert!(matches!(
            decode_inputs(&forged),
            Err(WireError::Short {
                what: "arrivals",
                ..
            })
        ));
        let mut long = b.clone();
        long.push(0);
        assert_eq!(decode_inputs(&long), Err(WireError::Trailing(1)));
        let mut tag = b;
        let last_tag = tag.len() - 9;
        tag[last_tag] = 2;
        assert_eq!(
            decode_inputs(&tag),
            Err(WireError::Tag {
                what: "step_s",
                tag: 2
            })
        );
    }

    #[test]
    fn float_bits_cross_exactly() {
        let mut inp = sample();
        inp.now = -0.0;
        inp.step_s = Some(f64::from_bits(0x7ff8_0000_dead_beef)); // a NaN with a payload
        let back = decode_inputs(&inputs_bytes(&inp)).unwrap();
        assert_eq!(back.now.to_bits(), (-0.0f64).to_bits());
        assert_eq!(back.step_s.map(f64::to_bits), Some(0x7ff8_0000_dead_beef));
    }

    #[test]
    fn decoding_into_a_used_value_replaces_every_list() {
        let mut into = sample();
        into.arrivals.push(into.arrivals[0]);
        let fresh = PassInputs {
            now: 3.0,
            ..PassInputs::default()
        };
        decode_inputs_into(&inputs_bytes(&fresh), &mut into).unwrap();
        assert_eq!(into, fresh);
    }

    fn output() -> PassOutput {
        PassOutput {
            now: 4.0,
            pass: 9,
            admitted: vec![Admitted {
                id: 1,
                slot: 0,
                context_tokens: 10,
                max_tokens: 20,
            }],
            pauses: vec![2],
            batch: vec![BatchRow {
                id: 3,
                slot: 1,
                context_len: 50,
                first_token: false,
            }],
            first_tokens: vec![FirstToken {
                id: 1,
                ttft: 0.5,
                waited: true,
            }],
            departed: vec![Departure {
                id: 4,
                completed: true,
                first_token_time: Some(1.0),
                finish_time: 3.5,
                output_tokens: 12,
            }],
            window: 0.25,
            queue_len: 3,
            paused: 1,
            ..PassOutput::default()
        }
    }

    #[test]
    fn the_decision_hash_moves_with_any_decision_and_with_the_order_of_a_list() {
        let base = decision_hash(&output());
        assert_eq!(base, decision_hash(&output().clone()));
        type Change = (&'static str, fn(&mut PassOutput));
        let changes: Vec<Change> = vec![
            ("pass", |o| o.pass += 1),
            ("now", |o| o.now = f64::from_bits(o.now.to_bits() + 1)),
            ("a pause", |o| o.pauses.push(5)),
            ("a pause moved to resumes", |o| {
                o.resumes = std::mem::take(&mut o.pauses)
            }),
            ("a batch slot", |o| o.batch[0].slot = 2),
            ("first token flag", |o| o.batch[0].first_token = true),
            ("batch order", |o| {
                o.batch.push(BatchRow {
                    id: 9,
                    ..o.batch[0]
                });
                o.batch.swap(0, 1);
            }),
            ("a departure's first token", |o| {
                o.departed[0].first_token_time = None
            }),
            ("the window", |o| o.window = 0.5),
            ("the queue", |o| o.queue_len = 4),
            ("admission count", |o| o.admission_count = 1),
            ("a rejection", |o| o.rejected.push(8)),
            ("kv waiting", |o| o.kv_waiting.push(8)),
            ("a kv abort", |o| o.kv_aborted.push(8)),
        ];
        let mut seen = vec![base];
        for (what, change) in changes {
            let mut o = output();
            change(&mut o);
            let h = decision_hash(&o);
            assert!(!seen.contains(&h), "{what} left the hash at a value seen");
            seen.push(h);
        }
    }

    #[test]
    fn the_decision_hash_is_xxh3_of_the_encoding_and_reuses_its_buffer() {
        let mut bytes = Vec::new();
        encode_output(&output(), &mut bytes);
        assert_eq!(decision_hash(&output()), xxhash_rust::xxh3::xxh3_64(&bytes));
        assert_eq!(xxhash_rust::xxh3::xxh3_64(b""), 0x2d06_8005_38d3_94c2);
        let mut scratch = vec![7; 3];
        assert_eq!(
            decision_hash_with(&output(), &mut scratch),
            decision_hash(&output())
        );
        assert_eq!(scratch, bytes);
    }

    #[test]
    fn the_reserved_sizes_are_the_encoded_sizes() {
        let inp = sample();
        assert_eq!(inputs_bytes(&inp).len(), inputs_len(&inp));
    }

    #[test]
    fn fnv1a_matches_its_published_vectors() {
        let h = |s: &str| {
            let mut f = Fnv1a::new();
            f.put(s.as_bytes());
            f.0
        };
        assert_eq!(h(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(h("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(h("foobar"), 0x8594_4171_f739_67e8);
    }

    fn f64s() -> impl Strategy<Value = f64> {
        prop_oneof![
            any::<f64>().prop_filter("a NaN is never == itself", |x| !x.is_nan()),
            Just(f64::INFINITY),
            Just(-0.0),
        ]
    }

    fn inputs() -> impl Strategy<Value = PassInputs> {
        let arrival = (any::<u64>(), f64s(), any::<u32>(), any::<u32>()).prop_map(
            |(id, arrival, context_tokens, max_tokens)| Arrival {
                id,
                arrival,
                context_tokens,
                max_tokens,
            },
        );
        let kv = (any::<u64>(), f64s()).prop_map(|(id, at)| KvReady { id, at });
        let stepped = (any::<u64>(), any::<u32>(), 0u32..4, any::<bool>());
        (
            f64s(),
            prop::collection::vec(arrival, 0..6),
            prop::collection::vec(any::<u64>(), 0..4),
            prop::collection::vec(kv, 0..4),
            prop::collection::vec(stepped, 0..6),
            prop::option::of(f64s()),
        )
            .prop_map(
                |(now, arrivals, cancellations, kv_ready, stepped, step_s)| {
                    let mut inp = PassInputs {
                        now,
                        arrivals,
                        cancellations,
                        kv_ready,
                        step_s,
                        ..PassInputs::default()
                    };
                    for (i, (id, tokens, n, stop)) in stepped.into_iter().enumerate() {
                        let ids: Vec<u32> = (0..n).map(|k| i as u32 * 10 + k).collect();
                        inp.push_stepped(id, tokens, stop, &ids);
                    }
                    inp
                },
            )
    }

    proptest! {
        #[test]
        fn encode_then_decode_is_the_identity(inp in inputs()) {
            let bytes = inputs_bytes(&inp);
            prop_assert_eq!(decode_inputs(&bytes), Ok(inp.clone()));
            // And decoding into a value that held other inputs gives the same.
            let mut into = sample();
            decode_inputs_into(&bytes, &mut into).unwrap();
            prop_assert_eq!(into, inp);
        }

        #[test]
        fn any_bytes_decode_to_an_error_or_a_value_that_encodes_back_to_them(
            bytes in prop::collection::vec(any::<u8>(), 0..160),
            version_ok in any::<bool>(),
        ) {
            let mut bytes = bytes;
            if version_ok && bytes.len() >= 2 {
                bytes[..2].copy_from_slice(&WIRE_VERSION.to_le_bytes());
            }
            if let Ok(inp) = decode_inputs(&bytes) {
                prop_assert_eq!(inputs_bytes(&inp), bytes);
            }
        }
    }
}
