//! Stop strings in the detokenized output (SPEC §7, `stop`): a stop string may span several
//! tokens, so text that could still be the start of one is held back until it either
//! completes a match (the text is cut before it; nothing of it or after it is sent) or turns
//! out not to (it is sent). Only that text is ever held back. Pure.

/// Finds the first stop string in a stream of text pieces.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released: the longest tail that is a prefix of a stop.
    held: String,
}

/// What one piece of text gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// Text safe to send now.
    pub text: String,
    /// A stop string completed: `text` ends where it began, and the output ends.
    pub stopped: bool,
}

impl StopMatcher {
    /// `stops` must be non-empty strings (validated with the request).
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Takes the next piece of output text.
    pub fn push(&mut self, piece: &str) -> Released {
        if self.stops.is_empty() {
            return Released {
                text: piece.to_owned(),
                stopped: false,
            };
        }
        self.held.push_str(piece);
        // As soon as the text holds a stop the output ends, cut at the earliest stop in it.
        // No match can start in text already released: any tail that could begin one was
        // held.
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let mut text = std::mem::take(&mut self.held);
            text.truncate(at);
            return Released {
                text,
                stopped: true,
            };
        }
        let keep = self.longest_partial_tail();
        let text = self.held[..self.held.len() - keep].to_owned();
        self.held.drain(..self.held.len() - keep);
        Released {
            text,
            stopped: false,
        }
    }

    /// The output ended without a match: whatever was held is text after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length in bytes of the longest tail of `held` that is a proper prefix of a stop.
    fn longest_partial_tail(&self) -> usize {
        let held = self.held.as_str();
        self.stops
            .iter()
            .filter_map(|stop| {
                // Longest first; a prefix ends on a character boundary of the stop and the
                // tail starts on one of the held text.
                (1..stop.len().min(held.len() + 1))
                    .rev()
                    .filter(|&k| stop.is_char_boundary(k) && held.is_char_boundary(held.len() - k))
                    .find(|&k| held.ends_with(&stop[..k]))
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs pieces through a matcher; returns the text sent and whether a stop matched.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let r = m.push(p);
            out.push_str(&r.text);
            if r.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn a_stop_split_across_two_tokens_cuts_before_it() {
        assert_eq!(
            run(&["END"], &[" the", " E", "ND", " after"]),
            (" the ".into(), true)
        );
    }

    #[test]
    fn a_stop_split_across_three_tokens_cuts_before_it() {
        assert_eq!(
            run(&["<|eot|>"], &["Hello", "<|", "eo", "t|>", "more"]),
            ("Hello".into(), true)
        );
    }

    #[test]
    fn a_partial_match_that_fails_is_sent_in_full() {
        assert_eq!(
            run(&["END"], &[" the", " EN", "X", " done"]),
            (" the ENX done".into(), false)
        );
        // Held at the end of the output, then released.
        assert_eq!(run(&["END"], &["a", "EN"]), ("aEN".into(), false));
    }

    #[test]
    fn only_a_possible_start_is_held_back() {
        let mut m = StopMatcher::new(vec!["stop".into()]);
        assert_eq!(m.push("non-s").text, "non-");
        assert_eq!(m.push("x").text, "sx");
    }

    #[test]
    fn the_earliest_of_several_stops_wins_and_nothing_after_it_is_sent() {
        assert_eq!(run(&["b", "xa"], &["x", "ab"]), ("".into(), true));
        assert_eq!(
            run(&["\n\n", "."], &["one.", " two\n\n"]),
            ("one".into(), true)
        );
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        assert_eq!(run(&["é!"], &["caf", "é", "é", "!"]), ("café".into(), true));
        assert_eq!(
            run(&["日本"], &["東京", "日", "は"]),
            ("東京日は".into(), false)
        );
    }

    proptest::proptest! {
        /// After each piece, the text so far is checked; the first time it holds a stop, the
        /// output is that text cut at the earliest stop in it.
        #[test]
        fn streamed_output_equals_the_text_cut_when_a_stop_first_appears(
            pieces in proptest::collection::vec("[ab ]{0,3}", 0..12),
            stops in proptest::collection::vec("[ab]{1,3}", 1..3),
        ) {
            let mut so_far = String::new();
            let mut expected = None;
            for p in &pieces {
                so_far.push_str(p);
                if let Some(at) = stops.iter().filter_map(|s| so_far.find(s.as_str())).min() {
                    expected = Some((so_far[..at].to_owned(), true));
                    break;
                }
            }
            let expected = expected.unwrap_or((so_far, false));
            let stops: Vec<&str> = stops.iter().map(String::as_str).collect();
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            proptest::prop_assert_eq!(run(&stops, &pieces), expected);
        }
    }
}
