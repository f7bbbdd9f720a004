//! `genslot serve --record FILE`: one JSON line per request that leaves the scheduler (the
//! format and its clock: `crate::workload::recording`). The executor only sends a finished
//! request's record down an unbounded channel; a thread of its own serialises and writes
//! them through a buffer, flushing whenever the channel has been quiet for a second and at
//! the end, so no pass ever waits on the file.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use crate::server::latency::now_unix_s;
use crate::timing::Clock;
use crate::workload::recording::{Outcome, ServedRecord};

/// Flush after this long without a record.
const IDLE_FLUSH: Duration = Duration::from_secs(1);

enum Msg {
    Record(Box<ServedRecord>),
    Close,
}

/// The executor's end: cheap to clone, never blocks.
#[derive(Debug, Clone)]
pub struct Recorder {
    tx: Sender<Msg>,
    run_start_unix: f64,
}

impl std::fmt::Debug for Msg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Msg::Record(r) => write!(f, "Record({})", r.id),
            Msg::Close => f.write_str("Close"),
        }
    }
}

/// What the executor knows of a request when it leaves.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Leaving<'a> {
    pub id: u64,
    pub arrival_s: f64,
    pub context_tokens: u32,
    pub max_tokens: u32,
    pub output_tokens: u32,
    pub admitted_s: Option<f64>,
    pub kv_ready_s: Option<f64>,
    pub first_token_s: Option<f64>,
    pub finish_s: f64,
    pub pauses: u32,
    pub outcome: Outcome,
    pub error: Option<&'a str>,
}

impl Recorder {
    /// Unix seconds at the serving clock's zero.
    pub fn run_start_unix(&self) -> f64 {
        self.run_start_unix
    }

    /// Queues one record; a closed writer drops it (the file is already final).
    pub fn record(&self, r: Leaving<'_>) {
        // A clock reading cannot come before the arrival it follows, but an arrival taken
        // from upstream is rounded through unix time; and a context that arrives while the
        // pass that ends its request is in flight is stamped after that pass's time. Keep
        // the line's times in order: arrival ≤ admitted ≤ KV ready ≤ finish.
        let finish_s = r.finish_s.max(r.arrival_s);
        let admitted_s = r.admitted_s.map(|a| a.clamp(r.arrival_s, finish_s));
        let kv_ready_s = r
            .kv_ready_s
            .map(|k| k.clamp(admitted_s.unwrap_or(r.arrival_s), finish_s));
        let rec = ServedRecord {
            id: r.id,
            run_start_unix: self.run_start_unix,
            arrival_s: r.arrival_s,
            context_tokens: r.context_tokens,
            max_tokens: r.max_tokens,
            output_tokens: r.output_tokens,
            admitted_s,
            kv_ready_s,
            first_token_s: r.first_token_s,
            finish_s,
            pauses: r.pauses,
            outcome: r.outcome,
            error: r.error.map(str::to_owned),
        };
        let _ = self.tx.send(Msg::Record(Box::new(rec)));
    }
}

/// The writing thread; [`RecordWriter::finish`] drains, flushes and joins it.
#[derive(Debug)]
pub struct RecordWriter {
    tx: Sender<Msg>,
    thread: Option<JoinHandle<std::io::Result<u64>>>,
    path: PathBuf,
}

/// Creates `path` (truncating it) and starts the writer; times are on `clock`, whose zero
/// is stamped on every line as `run_start_unix`.
pub fn start(path: &Path, clock: &dyn Clock) -> std::io::Result<(Recorder, RecordWriter)> {
    let file = File::create(path)?;
    let (tx, rx) = crossbeam_channel::unbounded();
    let shown = path.display().to_string();
    let thread = std::thread::Builder::new()
        .name("genslot-record".into())
        .spawn(move || {
            let written = write_loop(BufWriter::with_capacity(1 << 16, file), rx);
            // Said when it happens (a full disk, say), not only when the server stops.
            if let Err(e) = &written {
                tracing::error!("--record {shown}: {e}; no further lines are written");
            }
            written
        })?;
    let recorder = Recorder {
        tx: tx.clone(),
        run_start_unix: now_unix_s() - clock.now(),
    };
    Ok((
        recorder,
        RecordWriter {
            tx,
            thread: Some(thread),
            path: path.to_path_buf(),
        },
    ))
}

fn write_loop(mut w: BufWriter<File>, rx: Receiver<Msg>) -> std::io::Result<u64> {
    let mut lines = 0u64;
    loop {
        match rx.recv_timeout(IDLE_FLUSH) {
            Ok(Msg::Record(r)) => {
                serde_json::to_writer(&mut w, &r)?;
                w.write_all(b"\n")?;
                lines += 1;
            }
            Ok(Msg::Close) | Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => w.flush()?,
        }
    }
    w.flush()?;
    Ok(lines)
}

impl RecordWriter {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes everything queued before this call, flushes and stops; returns the lines written.
    pub fn finish(mut self) -> std::io::Result<u64> {
        let _ = self.tx.send(Msg::Close);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(std::io::Error::other("the record writer panicked")),
            None => Ok(0),
        }
    }
}

impl Drop for RecordWriter {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            let _ = self.tx.send(Msg::Close);
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::VirtualClock;
    use crate::workload::recording::load_recording;

    fn leaving(id: u64, outcome: Outcome) -> Leaving<'static> {
        Leaving {
            id,
            arrival_s: 1.0,
            context_tokens: 100,
            max_tokens: 8,
            output_tokens: 8,
            admitted_s: Some(1.1),
            kv_ready_s: Some(1.3),
            first_token_s: Some(1.5),
            finish_s: 2.0,
            pauses: 0,
            outcome,
            error: None,
        }
    }

    #[test]
    fn every_record_sent_before_finish_is_in_the_file_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rec.jsonl");
        let clock = VirtualClock::new();
        clock.pass(30.0);
        let (rec, writer) = start(&path, &clock).unwrap();
        let start_unix = rec.run_start_unix();
        assert!((now_unix_s() - 30.0 - start_unix).abs() < 5.0);
        for id in 0..1000 {
            rec.clone().record(leaving(id, Outcome::Completed));
        }
        rec.record(Leaving {
            output_tokens: 0,
            admitted_s: None,
            kv_ready_s: None,
            first_token_s: None,
            error: Some("the waiting queue is full"),
            ..leaving(1000, Outcome::Failed)
        });
        assert_eq!(writer.finish().unwrap(), 1001);
        rec.record(leaving(2000, Outcome::Completed)); // after finish: dropped, no panic
        let back = load_recording(&path).unwrap();
        assert_eq!(back.records.len(), 1001);
        assert_eq!(back.run_start_unix, start_unix);
        let failed = back.records.iter().find(|r| r.id == 1000).unwrap();
        assert_eq!(failed.outcome, Outcome::Failed);
        assert_eq!(failed.error.as_deref(), Some("the waiting queue is full"));
        assert_eq!((failed.admitted_s, failed.kv_ready_s), (None, None));
        let done = back.records.iter().find(|r| r.id == 7).unwrap();
        assert_eq!((done.admitted_s, done.kv_ready_s), (Some(1.1), Some(1.3)));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_write_error_ends_the_writer_and_finish_reports_it() {
        // /dev/full takes the open and fails every write with ENOSPC, as a full disk would.
        let full = Path::new("/dev/full");
        if !full.exists() {
            eprintln!("skipping: this machine has no /dev/full");
            return;
        }
        let (rec, writer) = start(full, &VirtualClock::new()).unwrap();
        for id in 0..2000 {
            rec.record(leaving(id, Outcome::Completed));
        }
        let e = writer.finish().expect_err("a full device");
        // ENOSPC.
        assert_eq!(e.raw_os_error(), Some(28), "{e}");
        // Records after the failure are dropped, never a panic or a block.
        rec.record(leaving(5000, Outcome::Completed));
    }

    #[test]
    fn times_out_of_order_are_written_in_order_so_the_file_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rec.jsonl");
        let (rec, writer) = start(&path, &VirtualClock::new()).unwrap();
        // Cancelled by a pass that began before its context arrived; admitted by a clock a
        // hair before the upstream arrival stamp.
        rec.record(Leaving {
            output_tokens: 0,
            first_token_s: None,
            admitted_s: Some(0.999),
            kv_ready_s: Some(2.5),
            ..leaving(1, Outcome::Cancelled)
        });
        writer.finish().unwrap();
        let r = &load_recording(&path).unwrap().records[0];
        assert_eq!((r.admitted_s, r.kv_ready_s), (Some(1.0), Some(2.0)));
    }
}
