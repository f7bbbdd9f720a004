//! Where each issue of a replay stands (scheduled, in flight, done), by id. Replays number
//! issues with a dense counter, so a window of states from the oldest unfinished id replaces
//! two ordered maps that every schedule, pop and completion searched and rebalanced.

use super::window::IdWindow;

#[derive(Debug, Clone, Copy, PartialEq)]
enum State<T> {
    Scheduled(T),
    InFlight(T),
    Done,
}

#[derive(Debug)]
pub(crate) struct Ledger<T> {
    states: IdWindow<State<T>>,
    scheduled: usize,
    in_flight: usize,
}

impl<T> Default for Ledger<T> {
    fn default() -> Self {
        Self {
            states: IdWindow::default(),
            scheduled: 0,
            in_flight: 0,
        }
    }
}

impl<T: Copy> Ledger<T> {
    /// Records the next id, which must be one past the last one recorded.
    pub fn schedule(&mut self, id: u64, at: T) {
        debug_assert_eq!(id, self.states.end(), "ids must be dense");
        self.states.push(State::Scheduled(at));
        self.scheduled += 1;
    }

    /// A scheduled issue was handed to the caller.
    pub fn send(&mut self, id: u64) {
        if let Some(s) = self.states.get_mut(id) {
            if let State::Scheduled(at) = *s {
                *s = State::InFlight(at);
                self.scheduled -= 1;
                self.in_flight += 1;
            }
        }
    }

    /// An in-flight issue completed: its payload, or `None` when `id` is not in flight.
    pub fn complete(&mut self, id: u64) -> Option<T> {
        let s = self.states.get_mut(id)?;
        let State::InFlight(at) = *s else {
            return None;
        };
        *s = State::Done;
        self.in_flight -= 1;
        self.states.retire(|s| matches!(s, State::Done));
        Some(at)
    }

    pub fn scheduled(&self) -> usize {
        self.scheduled
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issue_completes_once_and_only_after_it_was_sent() {
        let mut l = Ledger::default();
        l.schedule(0, 'a');
        l.schedule(1, 'b');
        assert_eq!(l.complete(0), None, "scheduled, not sent");
        l.send(0);
        l.send(1);
        assert_eq!((l.scheduled(), l.in_flight()), (0, 2));
        assert_eq!(l.complete(1), Some('b'));
        assert_eq!(l.complete(1), None, "already done");
        assert_eq!(l.complete(0), Some('a'));
        assert_eq!(l.complete(7), None, "never scheduled");
        assert_eq!((l.scheduled(), l.in_flight()), (0, 0));
        assert_eq!(l.states.len(), 0, "every finished id retired");
        assert_eq!(l.states.base(), 2);
    }

    #[test]
    fn sending_twice_or_an_unknown_id_changes_nothing() {
        let mut l = Ledger::default();
        l.schedule(0, 1u8);
        l.send(0);
        l.send(0);
        l.send(5);
        assert_eq!((l.scheduled(), l.in_flight()), (0, 1));
    }
}
