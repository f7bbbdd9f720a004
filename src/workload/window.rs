//! Per-id states over densely numbered ids (the replays number issues with a counter): a
//! state is found by its offset from the oldest id still open, and finished ids retire from
//! the front, so the window spans only the ids in play. The simulator's request table and
//! the AgentX replay's issue ledger both keep one.

use std::collections::VecDeque;

#[derive(Debug, Clone)]
pub(crate) struct IdWindow<S> {
    /// Id of `slots[0]`.
    base: u64,
    slots: VecDeque<S>,
}

impl<S> Default for IdWindow<S> {
    fn default() -> Self {
        Self {
            base: 0,
            slots: VecDeque::new(),
        }
    }
}

impl<S> IdWindow<S> {
    /// The oldest id still in the window.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// The id the next `push` gets.
    pub fn end(&self) -> u64 {
        self.base + self.slots.len() as u64
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn push(&mut self, s: S) {
        self.slots.push_back(s);
    }

    /// Extends the window with `fill()` states until it covers `id` (the caller bounds how
    /// far ahead `id` may be).
    pub fn cover(&mut self, id: u64, fill: impl FnMut() -> S) {
        if id >= self.end() {
            let len = (id - self.base + 1) as usize;
            self.slots.resize_with(len, fill);
        }
    }

    fn offset(&self, id: u64) -> Option<usize> {
        let k = usize::try_from(id.checked_sub(self.base)?).ok()?;
        (k < self.slots.len()).then_some(k)
    }

    pub fn get(&self, id: u64) -> Option<&S> {
        self.slots.get(self.offset(id)?)
    }

    pub fn get_mut(&mut self, id: u64) -> Option<&mut S> {
        let k = self.offset(id)?;
        self.slots.get_mut(k)
    }

    /// Drops the front states while `done` holds for them.
    pub fn retire(&mut self, done: impl Fn(&S) -> bool) {
        while self.slots.front().is_some_and(&done) {
            self.slots.pop_front();
            self.base += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_found_by_offset_and_retire_only_from_the_front() {
        let mut w = IdWindow::default();
        w.cover(2, || 0u8);
        assert_eq!((w.base(), w.end()), (0, 3));
        *w.get_mut(2).unwrap() = 9;
        *w.get_mut(0).unwrap() = 9;
        w.retire(|s| *s == 9);
        assert_eq!((w.base(), w.len()), (1, 2), "id 1 is still open");
        assert_eq!(w.get(0), None, "retired");
        assert_eq!(w.get(2), Some(&9));
        assert_eq!(w.get(3), None, "past the end");
        w.push(5);
        assert_eq!(w.get(3), Some(&5));
    }
}
