//! The bounded request queue between the service's handlers and the engine thread.
//!
//! Producers never wait: a full queue is reported at once so the caller can answer
//! `RESOURCE_EXHAUSTED`. The consumer blocks on a condition variable, so an idle engine
//! thread uses no CPU.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

/// Why an item was not queued; the item comes back.
#[derive(Debug, PartialEq, Eq)]
pub enum PushError<T> {
    /// The queue holds `capacity` items already.
    Full { item: T, capacity: usize },
    /// The queue was closed (the server is shutting down).
    Closed(T),
}

struct Inner<T> {
    items: VecDeque<T>,
    closed: bool,
}

/// A FIFO of at most `capacity` items with any number of producers and blocking consumers.
pub struct BoundedQueue<T> {
    inner: Mutex<Inner<T>>,
    ready: Condvar,
    capacity: usize,
}

impl<T> BoundedQueue<T> {
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Mutex::new(Inner {
                items: VecDeque::with_capacity(capacity),
                closed: false,
            }),
            ready: Condvar::new(),
            capacity,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Items waiting now.
    pub fn len(&self) -> usize {
        self.lock().items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Queues `item` unless the queue is closed or full. When it is full, items for which
    /// `is_dead` holds (e.g. whose client has gone) are dropped first to make room.
    pub fn try_push(&self, item: T, is_dead: impl Fn(&T) -> bool) -> Result<(), PushError<T>> {
        let mut g = self.lock();
        if g.closed {
            return Err(PushError::Closed(item));
        }
        if g.items.len() >= self.capacity {
            g.items.retain(|t| !is_dead(t));
        }
        if g.items.len() >= self.capacity {
            return Err(PushError::Full {
                item,
                capacity: self.capacity,
            });
        }
        g.items.push_back(item);
        drop(g);
        self.ready.notify_one();
        Ok(())
    }

    /// Queues all of `items` together (adjacent, in order) or none of them: the queue
    /// must have room for them all, after dropping dead items when it lacks it. The items
    /// come back in the error.
    pub fn try_push_all(
        &self,
        items: Vec<T>,
        is_dead: impl Fn(&T) -> bool,
    ) -> Result<(), PushError<Vec<T>>> {
        let mut g = self.lock();
        if g.closed {
            return Err(PushError::Closed(items));
        }
        if g.items.len() + items.len() > self.capacity {
            g.items.retain(|t| !is_dead(t));
        }
        if g.items.len() + items.len() > self.capacity {
            return Err(PushError::Full {
                item: items,
                capacity: self.capacity,
            });
        }
        g.items.extend(items);
        drop(g);
        self.ready.notify_all();
        Ok(())
    }

    /// Whether a push would now fail for lack of room, after dropping items for which
    /// `is_dead` holds when the queue is full.
    pub fn is_full(&self, is_dead: impl Fn(&T) -> bool) -> bool {
        let mut g = self.lock();
        if g.items.len() >= self.capacity {
            g.items.retain(|t| !is_dead(t));
        }
        g.items.len() >= self.capacity
    }

    /// Takes the oldest item, blocking while the queue is empty; `None` once the queue is
    /// closed and empty.
    pub fn pop(&self) -> Option<T> {
        let mut g = self.lock();
        loop {
            if let Some(item) = g.items.pop_front() {
                return Some(item);
            }
            if g.closed {
                return None;
            }
            g = self
                .ready
                .wait(g)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Takes the oldest item if `take` says so after looking at it; never blocks. The
    /// consumer uses it to leave an item queued (and counted against the capacity) until it
    /// can be served.
    pub fn pop_if(&self, take: impl FnOnce(&T) -> bool) -> Option<T> {
        let mut g = self.lock();
        if take(g.items.front()?) {
            g.items.pop_front()
        } else {
            None
        }
    }

    /// Blocks while the queue is empty and open; `false` once it is closed and empty.
    pub fn wait_nonempty(&self) -> bool {
        let mut g = self.lock();
        loop {
            if !g.items.is_empty() {
                return true;
            }
            if g.closed {
                return false;
            }
            g = self
                .ready
                .wait(g)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Refuses further items; the consumer still gets those already queued.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    /// Removes and returns every queued item.
    pub fn drain(&self) -> Vec<T> {
        self.lock().items.drain(..).collect()
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        // A panic while the lock is held cannot leave the deque inconsistent (every
        // critical section is a single VecDeque call), so a poisoned lock is still usable.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn fifo_and_full() {
        let q = BoundedQueue::new(2);
        q.try_push(1, |_| false).unwrap();
        q.try_push(2, |_| false).unwrap();
        assert_eq!(
            q.try_push(3, |_| false),
            Err(PushError::Full {
                item: 3,
                capacity: 2
            })
        );
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop(), Some(1));
        q.try_push(3, |_| false).unwrap();
        assert_eq!(q.pop(), Some(2));
        assert_eq!(q.pop(), Some(3));
        assert!(q.is_empty());
    }

    #[test]
    fn dead_items_make_room_only_when_full() {
        let q = BoundedQueue::new(2);
        q.try_push(-1, |_| false).unwrap();
        // Not full yet: the dead item stays.
        q.try_push(2, |t: &i32| *t < 0).unwrap();
        assert_eq!(q.len(), 2);
        // Full: the dead item is dropped to make room.
        q.try_push(3, |t: &i32| *t < 0).unwrap();
        assert_eq!(q.drain(), vec![2, 3]);
    }

    #[test]
    fn a_group_is_queued_whole_or_not_at_all() {
        let q = BoundedQueue::new(3);
        q.try_push(-1, |_| false).unwrap();
        q.try_push_all(vec![1, 2], |_| false).unwrap();
        assert_eq!(
            q.try_push_all(vec![3, 4], |_| false),
            Err(PushError::Full {
                item: vec![3, 4],
                capacity: 3
            })
        );
        assert_eq!(q.len(), 3, "nothing of a refused group is queued");
        // Room made by dropping a dead item is not enough for two.
        assert!(q.try_push_all(vec![3, 4], |t: &i32| *t < 0).is_err());
        assert_eq!(q.drain(), vec![1, 2]);
        q.try_push_all(vec![5, 6, 7], |_| false).unwrap();
        q.close();
        assert_eq!(
            q.try_push_all(vec![8], |_| false),
            Err(PushError::Closed(vec![8]))
        );
        assert_eq!(q.drain(), vec![5, 6, 7]);
    }

    #[test]
    fn is_full_sheds_dead_items() {
        let q = BoundedQueue::new(2);
        q.try_push(-1, |_| false).unwrap();
        assert!(!q.is_full(|t: &i32| *t < 0));
        q.try_push(2, |_| false).unwrap();
        assert!(q.is_full(|_| false));
        assert!(!q.is_full(|t: &i32| *t < 0));
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn pop_if_leaves_a_refused_item_at_the_front() {
        let q = BoundedQueue::new(2);
        assert_eq!(q.pop_if(|_| true), None);
        q.try_push(1, |_| false).unwrap();
        q.try_push(2, |_| false).unwrap();
        assert_eq!(q.pop_if(|&x| x > 1), None);
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop_if(|&x| x == 1), Some(1));
        assert!(q.wait_nonempty());
        assert_eq!(q.pop(), Some(2));
        q.close();
        assert!(!q.wait_nonempty());
    }

    #[test]
    fn close_refuses_new_items_but_delivers_queued_ones() {
        let q = BoundedQueue::new(4);
        q.try_push(1, |_| false).unwrap();
        q.close();
        assert_eq!(q.try_push(2, |_| false), Err(PushError::Closed(2)));
        assert_eq!(q.pop(), Some(1));
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn pop_blocks_until_an_item_or_close() {
        let q = Arc::new(BoundedQueue::new(1));
        let q2 = Arc::clone(&q);
        let consumer = std::thread::spawn(move || {
            let a = q2.pop();
            let b = q2.pop();
            (a, b)
        });
        q.try_push(7, |_| false).unwrap();
        // The consumer may or may not have taken 7 yet; closing lets it finish either way.
        while !q.is_empty() {
            std::thread::yield_now();
        }
        q.close();
        assert_eq!(consumer.join().unwrap(), (Some(7), None));
    }
}
