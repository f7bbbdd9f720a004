//! KV page bookkeeping in chunks of [`CHUNK`] pages, a two-level page table: a request's
//! pages are a list of chunks, the last one possibly part-filled, and the free pages are
//! whole free chunks plus a few loose pages. Releasing a long context gives its chunks back
//! whole: a 50k-token context at 32 tokens per page is 1,563 pages but 25 chunks.
//!
//! Taking pages counts them at once and numbers them when the page table is first read
//! ([`PageStore::bind`]): a backend that reads page tables (the CUDA one, for the context's
//! transfer and every step) numbers them there, in the same walk that copies the table, and
//! the scheduling pass's decode growth (a few rows every step) only counts. The accounting is
//! exact to the page either way: numbered or not, a taken page is not free.

/// Pages per chunk.
pub const CHUNK: usize = 64;

/// One request's pages, in order.
#[derive(Debug, Clone, Default)]
pub struct PageList {
    chunks: Vec<u32>,
    /// Pages taken.
    len: u32,
    /// Pages numbered (the first `bound` of them); the rest are only counted.
    bound: u32,
}

impl PageList {
    pub fn len(&self) -> u32 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Place in the last chunk of the next page to number, 0 when that chunk is full (or
    /// none).
    fn fill(&self) -> usize {
        self.bound as usize % CHUNK
    }
}

/// Chunk storage and the free pages.
#[derive(Debug, Clone)]
pub struct PageStore {
    total: u32,
    slabs: Vec<[u32; CHUNK]>,
    /// Chunks whose pages are all free.
    full: Vec<u32>,
    /// Free pages outside `full`.
    loose: Vec<u32>,
    /// Chunks that hold no page.
    empty: Vec<u32>,
    /// Pages at or above this were never handed out, so memory stays O(pages in use).
    fresh: u32,
    /// Pages taken but not numbered yet: free page numbers that are spoken for.
    unbound: u32,
}

impl PageStore {
    pub fn new(total: u32) -> Self {
        Self {
            total,
            slabs: Vec::new(),
            full: Vec::new(),
            loose: Vec::new(),
            empty: Vec::new(),
            fresh: 0,
            unbound: 0,
        }
    }

    pub fn free(&self) -> u32 {
        (self.full.len() * CHUNK + self.loose.len()) as u32 + (self.total - self.fresh)
            - self.unbound
    }

    /// A free page. Callers check `free` first.
    fn one(&mut self) -> u32 {
        if let Some(p) = self.loose.pop() {
            return p;
        }
        if let Some(c) = self.full.pop() {
            let [p, rest @ ..] = self.slabs[c as usize];
            self.loose.extend_from_slice(&rest);
            self.empty.push(c);
            return p;
        }
        debug_assert!(self.fresh < self.total, "a page taken past the pool's size");
        self.fresh += 1;
        self.fresh - 1
    }

    fn empty_chunk(&mut self) -> u32 {
        self.empty.pop().unwrap_or_else(|| {
            self.slabs.push([0; CHUNK]);
            (self.slabs.len() - 1) as u32
        })
    }

    /// Free pages into the places `at` of chunk `c`, one by one.
    fn fill_chunk(&mut self, c: u32, at: std::ops::Range<usize>) {
        for i in at {
            let p = self.one();
            self.slabs[c as usize][i] = p;
        }
    }

    /// A chunk of free pages: a whole free one if any, else one filled page by page.
    fn whole_chunk(&mut self) -> u32 {
        if let Some(c) = self.full.pop() {
            return c;
        }
        let c = self.empty_chunk();
        self.fill_chunk(c, 0..CHUNK);
        c
    }

    /// Append `n` free pages to `list`, counted now and numbered by `bind`. Callers check
    /// `free` first.
    pub fn take(&mut self, list: &mut PageList, n: u32) {
        debug_assert!(n <= self.free(), "pages taken past the free ones");
        list.len += n;
        self.unbound += n;
    }

    /// Number every page of `list` taken since the last call: whole free chunks where a
    /// whole chunk is wanted, single pages into a part-filled one.
    pub fn bind(&mut self, list: &mut PageList) {
        let mut n = list.len - list.bound;
        self.unbound -= n;
        let part = list.fill();
        if let Some(&c) = list.chunks.last().filter(|_| n > 0 && part != 0) {
            let k = (n as usize).min(CHUNK - part);
            self.fill_chunk(c, part..part + k);
            list.bound += k as u32;
            n -= k as u32;
        }
        while n as usize >= CHUNK {
            let c = self.whole_chunk();
            list.chunks.push(c);
            list.bound += CHUNK as u32;
            n -= CHUNK as u32;
        }
        if n > 0 {
            let c = self.empty_chunk();
            list.chunks.push(c);
            self.fill_chunk(c, 0..n as usize);
            list.bound += n;
        }
    }

    /// Give every page of `list` back.
    pub fn give_back(&mut self, list: PageList) {
        self.unbound -= list.len - list.bound;
        let part = list.fill();
        let mut chunks = list.chunks;
        if part != 0 {
            if let Some(c) = chunks.pop() {
                self.loose
                    .extend_from_slice(&self.slabs[c as usize][..part]);
                self.empty.push(c);
            }
        }
        self.full.extend_from_slice(&chunks);
        // Loose pages gather into whole chunks again, so they stay fewer than two chunks.
        while self.loose.len() >= 2 * CHUNK {
            let c = self.empty_chunk();
            let from = self.loose.len() - CHUNK;
            self.slabs[c as usize].copy_from_slice(&self.loose[from..]);
            self.loose.truncate(from);
            self.full.push(c);
        }
    }

    /// The numbered pages of `list`, in order (all of them after `bind`).
    pub fn pages<'a>(&'a self, list: &'a PageList) -> impl Iterator<Item = u32> + 'a {
        list.chunks
            .iter()
            .flat_map(|&c| self.slabs[c as usize])
            .take(list.bound as usize)
    }

    /// Every page number handed out is free or in exactly one of `lists`, every chunk is in
    /// exactly one place, and the pages taken but not numbered are exactly the lists'.
    pub fn check<'a>(
        &self,
        lists: impl Iterator<Item = &'a PageList> + Clone,
    ) -> Result<(), String> {
        let unbound: u64 = lists.clone().map(|l| u64::from(l.len - l.bound)).sum();
        if unbound != u64::from(self.unbound) {
            return Err(format!(
                "{unbound} pages taken and unnumbered, {} counted",
                self.unbound
            ));
        }
        let mut seen = vec![false; self.fresh as usize];
        let free_pages = self
            .full
            .iter()
            .flat_map(|&c| self.slabs[c as usize])
            .chain(self.loose.iter().copied());
        let held = lists.clone().flat_map(|l| self.pages(l));
        for p in free_pages.chain(held) {
            match seen.get_mut(p as usize) {
                Some(s) if !*s => *s = true,
                _ => return Err(format!("page {p} appears twice or was never handed out")),
            }
        }
        if let Some(p) = seen.iter().position(|s| !s) {
            return Err(format!(
                "page {p} was handed out and is neither held nor free"
            ));
        }
        let mut chunk_seen = vec![false; self.slabs.len()];
        let chunks = lists
            .flat_map(|l| l.chunks.iter())
            .chain(&self.full)
            .chain(&self.empty);
        for &c in chunks {
            match chunk_seen.get_mut(c as usize) {
                Some(s) if !*s => *s = true,
                _ => return Err(format!("chunk {c} is in two places")),
            }
        }
        if chunk_seen.iter().any(|s| !s) {
            return Err("a chunk leaked".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages(s: &PageStore, l: &PageList) -> Vec<u32> {
        s.pages(l).collect()
    }

    /// A list of `n` pages, taken and numbered.
    fn numbered(s: &mut PageStore, n: u32) -> PageList {
        let mut l = PageList::default();
        s.take(&mut l, n);
        s.bind(&mut l);
        l
    }

    #[test]
    fn long_lists_come_and_go_in_whole_chunks_and_every_page_is_accounted() {
        let mut s = PageStore::new(10_000);
        let mut a = PageList::default();
        s.take(&mut a, 1000);
        assert_eq!(a.len(), 1000);
        assert!(pages(&s, &a).is_empty(), "counted, not numbered yet");
        s.check([&a].into_iter()).unwrap();
        s.bind(&mut a);
        assert_eq!(pages(&s, &a), (0..1000).collect::<Vec<_>>());
        let mut b = PageList::default();
        s.take(&mut b, 70);
        s.bind(&mut b);
        for _ in 0..5 {
            s.take(&mut b, 1);
        }
        s.bind(&mut b);
        assert_eq!(b.len(), 75);
        assert_eq!(pages(&s, &b).len(), 75);
        assert_eq!(s.free(), 10_000 - 1075);
        s.check([&a, &b].into_iter()).unwrap();
        s.give_back(a);
        assert_eq!(s.free(), 10_000 - 75);
        s.check([&b].into_iter()).unwrap();
        // The released chunks are reused whole before any fresh page.
        let c = numbered(&mut s, 640);
        assert!(pages(&s, &c).iter().all(|&p| p < 1000));
        s.check([&b, &c].into_iter()).unwrap();
        s.give_back(b);
        s.give_back(c);
        assert_eq!(s.free(), 10_000);
        s.check(std::iter::empty()).unwrap();
    }

    #[test]
    fn the_check_finds_a_page_held_twice_and_a_page_lost() {
        let mut s = PageStore::new(500);
        let a = numbered(&mut s, 130);
        assert!(s.check([&a, &a].into_iter()).is_err(), "held twice");
        assert!(s.check(std::iter::empty()).is_err(), "lost");
        s.check([&a].into_iter()).unwrap();
    }

    #[test]
    fn a_part_filled_chunk_returns_its_pages_loose_and_they_are_reused_first() {
        let mut s = PageStore::new(200);
        let a = numbered(&mut s, 10);
        let b = numbered(&mut s, 3);
        s.give_back(a);
        let c = numbered(&mut s, 4);
        assert!(pages(&s, &c).iter().all(|&p| p < 10), "{:?}", pages(&s, &c));
        s.check([&b, &c].into_iter()).unwrap();
    }

    #[test]
    fn random_takes_and_releases_never_lose_or_share_a_page() {
        let mut s = PageStore::new(5_000);
        let mut lists: Vec<PageList> = Vec::new();
        let mut x: u64 = 7;
        for _ in 0..3_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = (x >> 33) as u32;
            match r % 3 {
                0 if !lists.is_empty() => {
                    let l = lists.swap_remove(r as usize % lists.len());
                    s.give_back(l);
                }
                1 if !lists.is_empty() => {
                    let i = r as usize % lists.len();
                    if s.free() > 0 {
                        s.take(&mut lists[i], 1);
                    }
                    // Numbered at some reads of the page table, counted only until then.
                    if r & 16 != 0 {
                        s.bind(&mut lists[i]);
                    }
                }
                _ => {
                    let n = (r >> 4) % 400;
                    if n <= s.free() {
                        let mut l = PageList::default();
                        s.take(&mut l, n);
                        if r & 32 != 0 {
                            s.bind(&mut l);
                        }
                        lists.push(l);
                    }
                }
            }
            let held: u32 = lists.iter().map(PageList::len).sum();
            assert_eq!(held + s.free(), 5_000);
        }
        s.check(lists.iter()).unwrap();
        for l in &mut lists {
            s.bind(l);
        }
        s.check(lists.iter()).unwrap();
        let numbered: usize = lists.iter().map(|l| pages(&s, l).len()).sum();
        assert_eq!(numbered as u32 + s.free(), 5_000);
        assert!(s.loose.len() < 2 * CHUNK);
    }
}
