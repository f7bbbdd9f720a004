//! The link between the leader and one follower rank: whole frames each way, in order.
//! Two transports: in-process channels (ranks as threads of one process) and TCP with a
//! `u32` little-endian length before each frame (ranks as processes; tested on loopback).
//! A link is two halves so that one thread can wait for replies while another sends.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};

use crossbeam_channel::{Receiver, Sender};

/// The largest frame a TCP half accepts: a pass's inputs are kilobytes, so a bigger length
/// is a corrupt stream, refused before any allocation.
pub const MAX_FRAME: usize = 64 << 20;

/// Why a link failed. `Closed` is the other end leaving, which a follower takes as the
/// end of the run.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("the other rank closed the link")]
    Closed,
    #[error("frame of {0} bytes, over the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("link i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// The sending half.
pub trait FrameTx: Send {
    fn send(&mut self, frame: &[u8]) -> Result<(), LinkError>;
}

/// The receiving half: waits for the next frame and puts it in `buf` (replacing its content).
pub trait FrameRx: Send {
    fn recv(&mut self, buf: &mut Vec<u8>) -> Result<(), LinkError>;
}

/// One end of a link.
pub struct Link {
    pub tx: Box<dyn FrameTx>,
    pub rx: Box<dyn FrameRx>,
    /// Which transport, for `/debug/actors`.
    pub kind: &'static str,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Link({})", self.kind)
    }
}

impl Link {
    /// Two connected ends over in-process channels.
    pub fn channel_pair() -> (Link, Link) {
        let (a_tx, b_rx) = crossbeam_channel::unbounded();
        let (b_tx, a_rx) = crossbeam_channel::unbounded();
        let end = |tx, rx| Link {
            tx: Box::new(ChanTx(tx)),
            rx: Box::new(ChanRx(rx)),
            kind: "channel",
        };
        (end(a_tx, a_rx), end(b_tx, b_rx))
    }

    /// One end over a connected TCP stream (Nagle off: frames are small and latency-bound).
    pub fn tcp(stream: TcpStream) -> std::io::Result<Link> {
        stream.set_nodelay(true)?;
        let read = stream.try_clone()?;
        Ok(Link {
            tx: Box::new(TcpTx(stream)),
            rx: Box::new(TcpRx(read)),
            kind: "tcp",
        })
    }
}

struct ChanTx(Sender<Vec<u8>>);
struct ChanRx(Receiver<Vec<u8>>);

impl FrameTx for ChanTx {
    fn send(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        self.0.send(frame.to_vec()).map_err(|_| LinkError::Closed)
    }
}

impl FrameRx for ChanRx {
    fn recv(&mut self, buf: &mut Vec<u8>) -> Result<(), LinkError> {
        *buf = self.0.recv().map_err(|_| LinkError::Closed)?;
        Ok(())
    }
}

struct TcpTx(TcpStream);
struct TcpRx(TcpStream);

impl FrameTx for TcpTx {
    fn send(&mut self, frame: &[u8]) -> Result<(), LinkError> {
        if frame.len() > MAX_FRAME {
            return Err(LinkError::TooLarge(frame.len()));
        }
        let len = (frame.len() as u32).to_le_bytes();
        self.0.write_all(&len)?;
        self.0.write_all(frame)?;
        Ok(())
    }
}

impl Drop for TcpTx {
    /// The reading clone keeps the socket open: shut the write side so the peer sees the end.
    fn drop(&mut self) {
        let _ = self.0.shutdown(Shutdown::Write);
    }
}

impl FrameRx for TcpRx {
    fn recv(&mut self, buf: &mut Vec<u8>) -> Result<(), LinkError> {
        let mut len = [0u8; 4];
        match self.0.read_exact(&mut len) {
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(LinkError::Closed)
            }
            r => r?,
        }
        let n = u32::from_le_bytes(len) as usize;
        if n > MAX_FRAME {
            return Err(LinkError::TooLarge(n));
        }
        buf.clear();
        buf.resize(n, 0);
        self.0.read_exact(buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => LinkError::Closed,
            _ => LinkError::Io(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn tcp_pair() -> (Link, Link) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        (Link::tcp(a).unwrap(), Link::tcp(b).unwrap())
    }

    fn frames_cross_in_order_and_a_dropped_end_reads_as_closed(a: Link, mut b: Link) {
        let Link { mut tx, mut rx, .. } = a;
        let frames: Vec<Vec<u8>> = vec![vec![], vec![1], (0..=255).collect(), vec![7; 100_000]];
        for f in &frames {
            tx.send(f).unwrap();
        }
        let mut buf = vec![9; 3];
        for f in &frames {
            b.rx.recv(&mut buf).unwrap();
            assert_eq!(&buf, f);
        }
        b.tx.send(&[4, 2]).unwrap();
        rx.recv(&mut buf).unwrap();
        assert_eq!(buf, [4, 2]);
        drop(tx);
        assert!(matches!(b.rx.recv(&mut buf), Err(LinkError::Closed)));
    }

    #[test]
    fn channel_frames_cross_in_order_and_a_dropped_end_reads_as_closed() {
        let (a, b) = Link::channel_pair();
        frames_cross_in_order_and_a_dropped_end_reads_as_closed(a, b);
    }

    #[test]
    fn tcp_frames_cross_in_order_and_a_dropped_end_reads_as_closed() {
        let (a, b) = tcp_pair();
        frames_cross_in_order_and_a_dropped_end_reads_as_closed(a, b);
    }

    #[test]
    fn a_tcp_length_over_the_limit_is_refused_without_reading_it() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut raw = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let mut b = Link::tcp(b).unwrap();
        raw.write_all(&u32::MAX.to_le_bytes()).unwrap();
        let mut buf = Vec::new();
        assert!(matches!(
            b.rx.recv(&mut buf),
            Err(LinkError::TooLarge(n)) if n == u32::MAX as usize
        ));
        assert!(buf.capacity() < 1024);
    }

    #[test]
    fn a_tcp_frame_cut_short_reads_as_closed() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut raw = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        let mut b = Link::tcp(b).unwrap();
        raw.write_all(&10u32.to_le_bytes()).unwrap();
        raw.write_all(&[1, 2, 3]).unwrap();
        drop(raw);
        assert!(matches!(b.rx.recv(&mut Vec::new()), Err(LinkError::Closed)));
    }
}
