//! Small id-keyed maps for the controller's per-request state. A few hundred entries at
//! most, read every pass in id order and changed a few times a pass: a sorted vector walks
//! in a few instructions per entry where a B-tree's iterator takes tens, and insertion and
//! removal move at most a few kilobytes.

use crate::ids::RequestId;

/// A map from request id to `V`, kept in id order.
#[derive(Debug, Clone)]
pub struct IdMap<V>(Vec<(RequestId, V)>);

impl<V> Default for IdMap<V> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<V> IdMap<V> {
    fn find(&self, id: RequestId) -> Result<usize, usize> {
        self.0.binary_search_by_key(&id, |e| e.0)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, id: RequestId) -> bool {
        self.find(id).is_ok()
    }

    pub fn get(&self, id: RequestId) -> Option<&V> {
        self.find(id).ok().map(|i| &self.0[i].1)
    }

    pub fn get_mut(&mut self, id: RequestId) -> Option<&mut V> {
        self.find(id).ok().map(|i| &mut self.0[i].1)
    }

    pub fn remove(&mut self, id: RequestId) -> Option<V> {
        self.find(id).ok().map(|i| self.0.remove(i).1)
    }

    /// The value for `id`, inserted with `make` when absent.
    pub fn get_or_insert_with(&mut self, id: RequestId, make: impl FnOnce() -> V) -> &mut V {
        let i = match self.find(id) {
            Ok(i) => i,
            Err(i) => {
                self.0.insert(i, (id, make()));
                i
            }
        };
        &mut self.0[i].1
    }

    /// Entries in id order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (RequestId, &V)> {
        self.0.iter().map(|(k, v)| (*k, v))
    }

    /// Entries in id order, values mutable.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (RequestId, &mut V)> {
        self.0.iter_mut().map(|(k, v)| (*k, v))
    }

    /// Ids in id order.
    pub fn ids(&self) -> impl DoubleEndedIterator<Item = RequestId> + '_ {
        self.0.iter().map(|e| e.0)
    }
}

/// The direction a merge walks its id-ordered sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdOrder {
    Ascending,
    Descending,
}

/// Advance an id-ordered iterator to `id` and return its item there, if any. Called with
/// ids in the iterator's own direction, a run over two id-ordered sequences (the residents
/// and a map's entries) is one merge.
#[inline(always)]
pub fn merge_find<I, T>(
    order: IdOrder,
    it: &mut std::iter::Peekable<I>,
    id: RequestId,
    id_of: impl Fn(&T) -> RequestId,
) -> Option<T>
where
    I: Iterator<Item = T>,
{
    let before = match order {
        IdOrder::Ascending => std::cmp::Ordering::Less,
        IdOrder::Descending => std::cmp::Ordering::Greater,
    };
    while it.peek().is_some_and(|x| id_of(x).cmp(&id) == before) {
        it.next();
    }
    it.next_if(|x| id_of(x) == id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_stay_in_id_order_through_inserts_and_removals() {
        let mut m = IdMap::default();
        for id in [5, 1, 9, 3] {
            *m.get_or_insert_with(id, || 0) += id;
        }
        *m.get_or_insert_with(9, || 100) += 1;
        assert_eq!(m.remove(1), Some(1));
        assert_eq!(m.remove(1), None);
        assert_eq!(
            m.iter().map(|(k, v)| (k, *v)).collect::<Vec<_>>(),
            [(3, 3), (5, 5), (9, 10)]
        );
        assert!(m.contains(5) && !m.contains(4));
        assert_eq!(m.get(9), Some(&10));
        assert_eq!(m.len(), 3);
    }
}
