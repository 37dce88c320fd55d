//! Who gets the HTTP listener's capacity: connection slots for clients that have not shown a
//! token, and each token's share once they have.
//!
//! Model: every accepted connection is a [`Connection`], first unauthenticated, holding one of
//! `max_connections` slots. When every slot is taken, a new connection closes the oldest
//! still-unauthenticated one and takes its slot; only when every slot is held by authenticated
//! connections is it refused (`503`). A connection's first request with a valid token
//! authenticates it (`Connection::authenticate`) and takes one of that token's
//! `max_connections_per_token` slots (beyond them: `429`, closed). Each request of a token holds
//! one of its `max_requests_per_token` in-flight slots ([`RequestSlot`]; beyond: `429` with
//! `Retry-After`). Dashboard event streams are capped per token as well ([`super::dashboard`]).
//!
//! Invariants:
//! - Clients without a token never hold the slots a token holder needs (to close a newcomer a
//!   client must open more connections than there are slots before the newcomer's first
//!   request), and one token cannot hold every slot.
//! - There is no fixed share for unauthenticated connections: every connection is one until
//!   its first request is parsed, so a share would close token holders' own connections in any
//!   burst larger than it.
//! - Every slot is a semaphore permit owned by what uses it (the connection's task, the
//!   request, the stream), so it is given back however that ends.
//! - An authenticated connection is never closed to make room.
//! - The unauthenticated connections are ordered under one lock.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::tokens::TokenEntry;

/// The connection slots of one listener.
pub struct Admission {
    /// Every open connection holds one (`max_connections`).
    total: Arc<Semaphore>,
    max_connections: usize,
    /// The unauthenticated connections, oldest first, with their closers.
    unauthenticated: Mutex<VecDeque<(u64, CancellationToken)>>,
    next_id: AtomicU64,
}

/// Why a connection gets no slot.
pub enum Refused {
    /// Every slot is held by authenticated connections.
    Full,
}

impl Admission {
    pub fn new(max_connections: usize) -> Arc<Self> {
        Arc::new(Self {
            total: Arc::new(Semaphore::new(max_connections)),
            max_connections,
            unauthenticated: Mutex::default(),
            next_id: AtomicU64::new(1),
        })
    }

    /// A slot for a connection just accepted, as unauthenticated. When
    /// every slot is taken, the oldest unauthenticated connection is closed
    /// and its slot waited for (at most `evicted_wait`: its task must end).
    /// `Full` when every slot is held by authenticated connections.
    pub async fn admit(self: &Arc<Self>, evicted_wait: std::time::Duration) -> Result<Arc<Connection>, Refused> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let close = CancellationToken::new();
        let evicted = {
            let mut queue = self.lock();
            let mut evicted = false;
            if self.total.available_permits() == 0
                && let Some((_, oldest)) = queue.pop_front()
            {
                oldest.cancel();
                evicted = true;
            }
            queue.push_back((id, close.clone()));
            evicted
        };
        let permit = match self.total.clone().try_acquire_owned() {
            Ok(permit) => Some(permit),
            // An evicted connection gives its slot back when its task ends.
            Err(_) if evicted => {
                tokio::time::timeout(evicted_wait, self.total.clone().acquire_owned()).await.ok().and_then(Result::ok)
            }
            Err(_) => None,
        };
        let Some(permit) = permit else {
            self.forget(id);
            return Err(Refused::Full);
        };
        if evicted {
            tracing::info!(
                limit = self.max_connections,
                "every connection slot was taken: closed the oldest connection without a token to admit a new one"
            );
        }
        Ok(Arc::new(Connection { id, admission: self.clone(), close, state: Mutex::default(), _slot: permit }))
    }

    /// Every slot of the listener.
    pub fn max_connections(&self) -> usize {
        self.max_connections
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, CancellationToken)>> {
        self.unauthenticated.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn forget(&self, id: u64) {
        self.lock().retain(|(held, _)| *held != id);
    }
}

/// One accepted connection; every request on it carries it (an extension).
pub struct Connection {
    id: u64,
    admission: Arc<Admission>,
    /// Cancelled to close the connection (an eviction, or a token over its
    /// connection share).
    close: CancellationToken,
    /// The token it authenticated as, and that token's connection slot.
    state: Mutex<Option<(String, OwnedSemaphorePermit)>>,
    _slot: OwnedSemaphorePermit,
}

/// Why a token's request gets `429`.
#[derive(Debug)]
pub enum OverShare {
    /// The token holds all of its connection slots.
    Connections(usize),
    /// The token has all of its requests in flight.
    Requests(usize),
}

impl Connection {
    /// Cancelled when the connection must close.
    pub fn closed(&self) -> &CancellationToken {
        &self.close
    }

    /// Marks the connection as `entry`'s (on its first request with a valid
    /// token): it leaves the unauthenticated share and takes a connection
    /// slot of the token. Over the token's share: `Err`, and the connection
    /// is to close after the answer.
    pub(crate) fn authenticate(&self, entry: &TokenEntry) -> Result<(), OverShare> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.is_some() {
            return Ok(());
        }
        self.admission.forget(self.id);
        match entry.connections.clone().try_acquire_owned() {
            Ok(permit) => {
                *state = Some((entry.name.clone(), permit));
                Ok(())
            }
            Err(_) => Err(OverShare::Connections(entry.max_connections)),
        }
    }

    /// Whether a request of this connection authenticated it.
    pub fn is_authenticated(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.admission.forget(self.id);
    }
}

/// One request of a token in flight: its slot, given back when dropped.
pub struct RequestSlot(#[allow(dead_code)] OwnedSemaphorePermit);

impl RequestSlot {
    /// A request slot of `entry`, or `Err` when all are in use.
    pub(crate) fn take(entry: &TokenEntry) -> Result<Self, OverShare> {
        entry.requests.clone().try_acquire_owned().map(RequestSlot).map_err(|_| OverShare::Requests(entry.max_requests))
    }
}
