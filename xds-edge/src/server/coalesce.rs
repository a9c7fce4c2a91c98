//! Writes gathered for the length of a task's poll, then given to the socket at once.
//!
//! `h2` flushes its connection after every DATA frame longer than a few hundred bytes
//! (it hands the frame's payload to the writer beside its head, as one vectored write,
//! and only then buffers the next frame). A release gives each of a connection's streams
//! one response, so without this every response was a `writev` of its own: a system call
//! and, over loopback or a LAN, a TCP segment, at both ends. An ADS connection carrying
//! fifty sidecars' streams spent more of a release in the kernel than in xDS.
//!
//! [`CoalescedIo`] is the connection `h2` is given: its writes land in a buffer and its
//! flushes return at once, and [`FlushAfterPoll`] — wrapped around the task that polls
//! `h2` — writes the buffer to the real connection each time that task's poll ends,
//! when everything the poll queued is in it. Nothing waits on a timer; the bytes leave in
//! the same wake they were produced in. The buffer is bounded: a write finding
//! [`HIGH_WATER_BYTES`] already queued first gives them to the socket, and waits for it as
//! any write would (that is `h2`'s back-pressure, as before). A failed write is kept and
//! returned to `h2`'s next write or flush, so the connection ends as it would have.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Queued bytes at which a write first gives the queue to the socket: a release's
/// responses for a whole connection of streams fit in a few writes of this size.
pub(super) const HIGH_WATER_BYTES: usize = 64 * 1024;
/// What a queue is allocated with, once, when its first write of a burst arrives: the
/// high-water mark and one more of `h2`'s largest frames (16 KiB of payload and its
/// head), so a burst never grows it by copying. It is given back once written out, so an
/// idle connection holds none.
const QUEUE_CAPACITY_BYTES: usize = HIGH_WATER_BYTES + 16 * 1024 + 64;

/// The connection and what is queued for it, shared by the two halves.
struct Shared<C> {
    io: C,
    queued: BytesMut,
    /// Why the connection can no longer be written, once a write failed.
    failed: Option<(io::ErrorKind, String)>,
}

impl<C: AsyncWrite + Unpin> Shared<C> {
    /// Give everything queued to the connection; `Pending` (with the task registered for
    /// writability) while the connection cannot take it all.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some((kind, message)) = &self.failed {
            return Poll::Ready(Err(io::Error::new(*kind, message.clone())));
        }
        while !self.queued.is_empty() {
            match Pin::new(&mut self.io).poll_write(cx, &self.queued) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(self.fail(io::ErrorKind::WriteZero.into())));
                }
                Poll::Ready(Ok(n)) => self.queued.advance(n),
                Poll::Ready(Err(error)) => return Poll::Ready(Err(self.fail(error))),
            }
        }
        self.queued = BytesMut::new();
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn fail(&mut self, error: io::Error) -> io::Error {
        self.failed = Some((error.kind(), error.to_string()));
        error
    }
}

/// Wrap `io`: the half `h2` reads and writes, and the half that writes out what it queued.
pub(super) fn coalesce<C>(io: C) -> (CoalescedIo<C>, Flusher<C>) {
    let shared = Arc::new(Mutex::new(Shared {
        io,
        queued: BytesMut::new(),
        failed: None,
    }));
    (CoalescedIo(shared.clone()), Flusher(shared))
}

fn lock<C>(shared: &Mutex<Shared<C>>) -> std::sync::MutexGuard<'_, Shared<C>> {
    // Nothing runs while the lock is held but the connection's own read or write, so a
    // poisoned lock holds nothing half-done.
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The connection as `h2` uses it: reads pass through, writes are queued.
pub(super) struct CoalescedIo<C>(Arc<Mutex<Shared<C>>>);

/// Writes out what [`CoalescedIo`] queued.
pub(super) struct Flusher<C>(Arc<Mutex<Shared<C>>>);

impl<C: AsyncWrite + Unpin> Flusher<C> {
    /// Write out everything queued (see [`Shared::poll_write_out`]).
    pub(super) fn poll_write_out(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        lock(&self.0).poll_write_out(cx)
    }

    /// Bytes queued and not yet given to the connection.
    #[cfg(test)]
    fn queued(&self) -> usize {
        lock(&self.0).queued.len()
    }
}

impl<C: AsyncRead + Unpin> AsyncRead for CoalescedIo<C> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut lock(&self.0).io).poll_read(cx, buf)
    }
}

impl<C: AsyncWrite + Unpin> AsyncWrite for CoalescedIo<C> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut shared = lock(&self.0);
        if let Some((kind, message)) = &shared.failed {
            return Poll::Ready(Err(io::Error::new(*kind, message.clone())));
        }
        if shared.queued.len() >= HIGH_WATER_BYTES {
            ready!(shared.poll_write_out(cx))?;
        }
        let len = bufs.iter().map(|b| b.len()).sum();
        if shared.queued.capacity() == 0 {
            shared.queued = BytesMut::with_capacity(QUEUE_CAPACITY_BYTES.max(len));
        }
        for buf in bufs {
            shared.queued.extend_from_slice(buf);
        }
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Ready at once: what is queued is written when the task's poll ends
    /// ([`FlushAfterPoll`]). Only a write that already failed is reported.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &lock(&self.0).failed {
            Some((kind, message)) => Poll::Ready(Err(io::Error::new(*kind, message.clone()))),
            None => Poll::Ready(Ok(())),
        }
    }

    /// Write out what is queued, then shut the connection's write side.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut shared = lock(&self.0);
        ready!(shared.poll_write_out(cx))?;
        Pin::new(&mut shared.io).poll_shutdown(cx)
    }
}

/// `future` (the task that polls `h2`), writing out what it queued each time it has been
/// polled. Ends when `future` does; what is still queued then is written if the
/// connection takes it at once (a connection that `h2` closed cleanly was already
/// written out by its shutdown).
pub(super) struct FlushAfterPoll<F, C> {
    future: Pin<Box<F>>,
    writes: Flusher<C>,
}

impl<F, C> FlushAfterPoll<F, C> {
    pub(super) fn new(future: F, writes: Flusher<C>) -> Self {
        Self {
            future: Box::pin(future),
            writes,
        }
    }
}

impl<F: Future<Output = ()>, C: AsyncWrite + Unpin> Future for FlushAfterPoll<F, C> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let done = this.future.as_mut().poll(cx).is_ready();
        // A failure is kept and reported to `h2` by its next write or flush; a pending
        // write registered this task to be woken when the connection can take more.
        let _ = this.writes.poll_write_out(cx);
        if done { Poll::Ready(()) } else { Poll::Pending }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    #[tokio::test]
    async fn what_a_poll_queued_is_written_when_the_poll_ends() {
        let (near, mut far) = tokio::io::duplex(1 << 20);
        let (mut io, writes) = coalesce(near);
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(FlushAfterPoll::new(
            async move {
                io.write_all(b"one ").await.unwrap();
                io.flush().await.unwrap();
                io.write_all(b"two").await.unwrap();
                io.flush().await.unwrap();
                // Pending here: only the end of the poll writes the queue out.
                let _ = rx.await;
            },
            writes,
        ));
        let mut got = [0; 7];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"one two");
        tx.send(()).unwrap();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn nothing_is_written_before_the_poll_ends() {
        let (near, mut far) = tokio::io::duplex(1 << 20);
        let (mut io, writes) = coalesce(near);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let written = Pin::new(&mut io).poll_write(&mut cx, b"queued");
        assert!(matches!(written, Poll::Ready(Ok(6))));
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_ready());
        assert_eq!(writes.queued(), 6, "a flush only queues");
        let mut probe = [0; 1];
        let read = Pin::new(&mut far).poll_read(&mut cx, &mut ReadBuf::new(&mut probe));
        assert!(read.is_pending(), "nothing reached the far side");
        assert!(writes.poll_write_out(&mut cx).is_ready());
        assert_eq!(writes.queued(), 0);
        let mut got = [0; 6];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"queued");
    }

    #[tokio::test]
    async fn a_full_queue_waits_for_the_connection_and_a_failed_write_is_reported_after() {
        // The far side holds at most 8 bytes unread.
        let (near, mut far) = tokio::io::duplex(8);
        let (mut io, writes) = coalesce(near);
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let big = vec![7u8; HIGH_WATER_BYTES];
        assert!(matches!(
            Pin::new(&mut io).poll_write(&mut cx, &big),
            Poll::Ready(Ok(n)) if n == HIGH_WATER_BYTES
        ));
        assert!(
            Pin::new(&mut io).poll_write(&mut cx, b"more").is_pending(),
            "over the high-water mark, a write waits for the connection"
        );
        let mut got = [0; 8];
        far.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [7; 8], "the queue went to the connection in order");
        drop(far);
        let failed = writes.poll_write_out(&mut cx);
        assert!(
            matches!(failed, Poll::Ready(Err(_))),
            "the far side is gone"
        );
        assert!(
            matches!(Pin::new(&mut io).poll_flush(&mut cx), Poll::Ready(Err(_))),
            "the failure is h2's to see on its next flush"
        );
        assert!(matches!(
            Pin::new(&mut io).poll_write(&mut cx, b"x"),
            Poll::Ready(Err(_))
        ));
    }
}
