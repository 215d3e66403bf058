//! Accepting connections with limits, for gRPC and HTTP alike: at most `max_connections`
//! open over every listener that shares a [`Registry`] (past the cap, a new connection
//! closes the idle one nearest its deadline, or is refused when none is idle), a deadline
//! for a connection's first request (it covers the TLS and HTTP/2 handshakes), an idle
//! timeout once its requests have ended, and a back-off instead of a busy loop when
//! accepting fails (out of file descriptors).
//!
//! A connection counts as busy while any request on it is open, from its headers until its
//! response body is finished or dropped ([`TrackRequests`] follows gRPC's, `TrackedBody`
//! any body), so a stream that sends nothing for minutes (a health Watch, a request waiting
//! in the queue) is never idle.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};
use tonic::body::Body;
use tonic::transport::server::{Connected, TlsConnectInfo};
use tracing::{debug, warn};

/// How long accepted connections may stay open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnLimits {
    pub max_connections: usize,
    /// From accept to the first request.
    pub handshake_timeout: Duration,
    /// From the end of a connection's last request to the next.
    pub idle_timeout: Duration,
}

/// Longest pause between two accept attempts after a failure.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// One accepted connection's state, shared by its I/O, its requests and the accept loop.
struct ConnState {
    id: u64,
    accepted: Instant,
    /// Requests open on the connection.
    open: AtomicUsize,
    /// Some request has arrived.
    used: AtomicBool,
    /// When the last request ended, in milliseconds after `accepted`.
    idle_since_ms: AtomicU64,
    closing: AtomicBool,
    close: Notify,
}

impl ConnState {
    /// When the connection times out; `None` while a request is open.
    fn deadline(&self, limits: &ConnLimits) -> Option<Instant> {
        if self.open.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(if self.used.load(Ordering::SeqCst) {
            let idle = Duration::from_millis(self.idle_since_ms.load(Ordering::SeqCst));
            self.accepted + idle + limits.idle_timeout
        } else {
            self.accepted + limits.handshake_timeout
        })
    }

    /// Makes the connection's I/O fail, which ends it; the client sees it closed.
    fn shut(&self) {
        if !self.closing.swap(true, Ordering::SeqCst) {
            // A stored permit: the I/O sees it even if it is not waiting right now.
            self.close.notify_one();
        }
    }
}

/// The open connections of one or more listeners, which share the connection cap.
#[derive(Default)]
pub struct Registry {
    conns: Mutex<HashMap<u64, Arc<ConnState>>>,
    next: AtomicU64,
}

impl Registry {
    /// A new connection's id, unique among the listeners sharing the registry.
    fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<ConnState>>> {
        self.conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Open connections not yet told to close.
    fn live(&self) -> usize {
        self.lock()
            .values()
            .filter(|c| !c.closing.load(Ordering::SeqCst))
            .count()
    }

    /// Closes the idle connection that would time out first; false when none is idle.
    fn evict_one(&self, limits: &ConnLimits) -> bool {
        let victim = self
            .lock()
            .values()
            .filter(|c| !c.closing.load(Ordering::SeqCst))
            .filter_map(|c| Some((c.deadline(limits)?, Arc::clone(c))))
            .min_by_key(|(d, _)| *d);
        match victim {
            Some((_, c)) => {
                debug!(
                    connection = c.id,
                    "connection cap reached: closing an idle connection"
                );
                c.shut();
                true
            }
            None => false,
        }
    }

    /// Closes every connection past its deadline; returns the next deadline.
    fn reap(&self, limits: &ConnLimits, now: Instant) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for c in self.lock().values() {
            if c.closing.load(Ordering::SeqCst) {
                continue;
            }
            match c.deadline(limits) {
                Some(d) if d <= now => {
                    debug!(connection = c.id, "closing an idle connection");
                    c.shut();
                }
                Some(d) => next = Some(next.map_or(d, |n| n.min(d))),
                None => {}
            }
        }
        next
    }
}

/// An accepted TCP connection whose I/O fails once the server decides to close it.
pub struct Conn {
    io: TcpStream,
    remote: Option<SocketAddr>,
    state: Arc<ConnState>,
    registry: Arc<Registry>,
    /// Resolves when the connection is to be closed; `None` once it has.
    close: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl Conn {
    /// Fails the call once the connection is being closed.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if let Some(f) = &mut self.close {
            if f.as_mut().poll(cx).is_pending() {
                return Ok(());
            }
            self.close = None;
        }
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "connection closed by the server (idle or over the connection cap)",
        ))
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.state.id);
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// What a request learns of its connection (tonic puts it in the request's extensions).
#[derive(Clone)]
pub struct ConnInfo {
    pub remote: Option<SocketAddr>,
    state: Arc<ConnState>,
}

impl ConnInfo {
    /// Marks the connection busy until the returned guard is dropped.
    pub(crate) fn open_request(&self) -> OpenRequest {
        OpenRequest::new(&self.state)
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        ConnInfo {
            remote: self.remote,
            state: Arc::clone(&self.state),
        }
    }
}

/// Accepts connections on `listener` within `limits` (counted in `registry` with those of
/// the listeners that share it) and hands them to the server through the returned
/// channel. The listener closes when the receiver is dropped.
pub fn accept_loop(
    listener: TcpListener,
    limits: ConnLimits,
    registry: Arc<Registry>,
) -> mpsc::Receiver<Result<Conn, io::Error>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut backoff = Duration::ZERO;
        let mut warned_full = false;
        loop {
            let next_deadline = registry.reap(&limits, Instant::now());
            let reap_at = async {
                match next_deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            let accepted = tokio::select! {
                r = listener.accept() => r,
                _ = reap_at => continue,
                _ = tx.closed() => return,
            };
            let (io, remote) = match accepted {
                Ok(a) => {
                    backoff = Duration::ZERO;
                    a
                }
                Err(e) => {
                    // Out of file descriptors (or memory): the pending connection stays in
                    // the backlog and accept fails again at once; wait instead of spinning,
                    // and free a descriptor held by an idle connection.
                    if backoff.is_zero() {
                        warn!(error = %e, "cannot accept connections; backing off");
                    }
                    registry.evict_one(&limits);
                    backoff = (backoff * 2).clamp(Duration::from_millis(5), MAX_BACKOFF);
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => continue,
                        _ = tx.closed() => return,
                    }
                }
            };
            if registry.live() >= limits.max_connections && !registry.evict_one(&limits) {
                if !warned_full {
                    warn!(
                        max_connections = limits.max_connections,
                        "connection cap reached with every connection busy; refusing new ones"
                    );
                    warned_full = true;
                }
                drop(io);
                continue;
            }
            warned_full = false;
            let _ = io.set_nodelay(true);
            let state = Arc::new(ConnState {
                id: registry.next_id(),
                accepted: Instant::now(),
                open: AtomicUsize::new(0),
                used: AtomicBool::new(false),
                idle_since_ms: AtomicU64::new(0),
                closing: AtomicBool::new(false),
                close: Notify::new(),
            });
            registry.lock().insert(state.id, Arc::clone(&state));
            let watched = Arc::clone(&state);
            let conn = Conn {
                io,
                remote: Some(remote),
                state,
                registry: Arc::clone(&registry),
                close: Some(Box::pin(async move { watched.close.notified().await })),
            };
            if tx.send(Ok(conn)).await.is_err() {
                return;
            }
        }
    });
    rx
}

/// Marks a connection busy while one of its requests is open.
pub(crate) struct OpenRequest(Arc<ConnState>);

impl OpenRequest {
    fn new(state: &Arc<ConnState>) -> Self {
        state.used.store(true, Ordering::SeqCst);
        state.open.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(state))
    }
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        let s = &self.0;
        let ms = s.accepted.elapsed().as_millis().min(u64::MAX as u128) as u64;
        s.idle_since_ms.store(ms, Ordering::SeqCst);
        s.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its request counted as open until it is finished or dropped.
pub(crate) struct TrackedBody<B> {
    pub inner: B,
    pub _open: OpenRequest,
}

impl<B: http_body::Body + Unpin> http_body::Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Wraps the server's routes so each request marks its connection busy until its response
/// ends, and a message over the size limit is answered as the service's `oversize`
/// says.
#[derive(Clone)]
pub struct TrackRequests<S> {
    pub routes: S,
    pub max_message_bytes: usize,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tonic::codegen::Service<http::Request<Body>> for TrackRequests<S>
where
    S: tonic::codegen::Service<
        http::Request<Body>,
        Response = http::Response<Body>,
        Error = Infallible,
    >,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.routes.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let ext = req.extensions();
        let state = ext
            .get::<ConnInfo>()
            .or_else(|| ext.get::<TlsConnectInfo<ConnInfo>>().map(|t| t.get_ref()))
            .map(|c| OpenRequest::new(&c.state));
        let fut = self.routes.call(req);
        let limit = self.max_message_bytes;
        Box::pin(async move {
            let mut resp = fut.await?;
            super::service::oversize(resp.headers_mut(), limit);
            Ok(match state {
                Some(open) => resp.map(|inner| Body::new(TrackedBody { inner, _open: open })),
                None => resp,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ConnLimits = ConnLimits {
        max_connections: 2,
        handshake_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(300),
    };

    fn state(accepted: Instant) -> ConnState {
        ConnState {
            id: 1,
            accepted,
            open: AtomicUsize::new(0),
            used: AtomicBool::new(false),
            idle_since_ms: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            close: Notify::new(),
        }
    }

    #[test]
    fn deadlines_follow_the_handshake_then_the_idle_timeout_and_pause_while_busy() {
        let limits = LIMITS;
        let t0 = Instant::now();
        let s = Arc::new(state(t0));
        assert_eq!(s.deadline(&limits), Some(t0 + Duration::from_secs(10)));
        let open = OpenRequest::new(&s);
        assert_eq!(s.deadline(&limits), None, "busy while a request is open");
        let second = OpenRequest::new(&s);
        drop(open);
        assert_eq!(s.deadline(&limits), None, "one request still open");
        drop(second);
        let d = s.deadline(&limits).unwrap();
        assert!(d >= t0 + Duration::from_secs(300), "idle timeout after use");
        assert!(d <= Instant::now() + Duration::from_secs(300));
    }

    #[test]
    fn eviction_picks_the_idle_connection_nearest_its_deadline() {
        let limits = LIMITS;
        let r = Registry::default();
        let t0 = Instant::now();
        let used_idle = Arc::new(ConnState { id: 1, ..state(t0) });
        drop(OpenRequest::new(&used_idle));
        let fresh = Arc::new(ConnState { id: 2, ..state(t0) });
        let busy = Arc::new(ConnState { id: 3, ..state(t0) });
        let _open = OpenRequest::new(&busy);
        for c in [&used_idle, &fresh, &busy] {
            r.lock().insert(c.id, Arc::clone(c));
        }
        assert!(r.evict_one(&limits));
        assert!(
            fresh.closing.load(Ordering::SeqCst),
            "never used: due first"
        );
        assert!(r.evict_one(&limits));
        assert!(used_idle.closing.load(Ordering::SeqCst));
        assert!(!r.evict_one(&limits), "the busy one is never evicted");
        assert!(!busy.closing.load(Ordering::SeqCst));
        assert_eq!(r.live(), 1);
        // Reaping closes what is past its deadline and reports the next one.
        let later = Arc::new(ConnState { id: 4, ..state(t0) });
        r.lock().insert(4, Arc::clone(&later));
        assert_eq!(r.reap(&limits, t0), Some(t0 + Duration::from_secs(10)));
        assert!(!later.closing.load(Ordering::SeqCst));
        assert_eq!(r.reap(&limits, t0 + Duration::from_secs(11)), None);
        assert!(later.closing.load(Ordering::SeqCst));
    }
}
