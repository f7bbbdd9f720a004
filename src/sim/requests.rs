//! The requests of one run, indexed by issue id. Both replay engines number issues with a
//! dense counter, so a window of slots starting at the oldest unfinished id replaces an
//! ordered map: every decode row looks its request up, and that lookup was a tree search.

use crate::workload::window::IdWindow;

/// Refuse ids this far past the window start rather than allocate for them: a replay that
/// skips ids wholesale breaks the dense-counter assumption.
const MAX_SPAN: u64 = 1 << 24;

#[derive(Debug)]
enum Slot<T> {
    /// Not inserted yet (scheduled by the replay, not yet issued).
    Empty,
    Live(T),
    /// Removed; never reused.
    Done,
}

#[derive(Debug)]
pub struct Requests<T> {
    slots: IdWindow<Slot<T>>,
}

impl<T> Default for Requests<T> {
    fn default() -> Self {
        Self {
            slots: IdWindow::default(),
        }
    }
}

impl<T> Requests<T> {
    /// Adds request `id`. Fails for an id already used or implausibly far ahead.
    pub fn insert(&mut self, id: u64, value: T) -> Result<(), String> {
        let base = self.slots.base();
        let Some(k) = id.checked_sub(base) else {
            return Err(format!("request id {id} issued twice"));
        };
        if k >= MAX_SPAN {
            return Err(format!(
                "request id {id} is {k} past the oldest unfinished one ({base}); ids must be dense"
            ));
        }
        self.slots.cover(id, || Slot::Empty);
        match self.slots.get_mut(id) {
            Some(s @ Slot::Empty) => {
                *s = Slot::Live(value);
                Ok(())
            }
            _ => Err(format!("request id {id} issued twice")),
        }
    }

    pub fn get(&self, id: u64) -> Option<&T> {
        match self.slots.get(id)? {
            Slot::Live(v) => Some(v),
            _ => None,
        }
    }

    pub fn get_mut(&mut self, id: u64) -> Option<&mut T> {
        match self.slots.get_mut(id)? {
            Slot::Live(v) => Some(v),
            _ => None,
        }
    }

    pub fn remove(&mut self, id: u64) -> Option<T> {
        let slot = self.slots.get_mut(id)?;
        if !matches!(slot, Slot::Live(_)) {
            return None;
        }
        let Slot::Live(v) = std::mem::replace(slot, Slot::Done) else {
            return None;
        };
        self.slots.retire(|s| matches!(s, Slot::Done));
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_order_ids_are_found_until_removed() {
        let mut r = Requests::default();
        r.insert(2, "c").unwrap();
        r.insert(0, "a").unwrap();
        assert_eq!(r.get(2), Some(&"c"));
        assert_eq!(r.get(1), None);
        assert_eq!(r.remove(0), Some("a"));
        // Id 1 was scheduled but not issued yet: it can still arrive after 0 is gone.
        r.insert(1, "b").unwrap();
        assert_eq!(r.get(1), Some(&"b"));
        if let Some(v) = r.get_mut(1) {
            *v = "B";
        }
        assert_eq!(r.remove(1), Some("B"));
        assert_eq!(r.remove(1), None);
        assert_eq!(r.remove(2), Some("c"));
        assert_eq!(r.slots.len(), 0, "every slot retired");
        assert_eq!(r.get(7), None);
    }

    #[test]
    fn reused_or_far_ids_are_refused() {
        let mut r = Requests::default();
        r.insert(0, 1).unwrap();
        assert!(r.insert(0, 2).is_err());
        assert_eq!(r.remove(0), Some(1));
        assert!(r.insert(0, 3).is_err(), "a finished id is never reused");
        assert!(r.insert(MAX_SPAN + 5, 4).is_err());
        assert!(r.insert(5, 5).is_ok());
    }

    #[test]
    fn the_window_shrinks_as_the_oldest_finish() {
        let mut r = Requests::default();
        for id in 0..100u64 {
            r.insert(id, id).unwrap();
        }
        for id in 0..99u64 {
            assert_eq!(r.remove(id), Some(id));
        }
        assert_eq!(r.slots.len(), 1);
        assert_eq!(r.slots.base(), 99);
    }
}
