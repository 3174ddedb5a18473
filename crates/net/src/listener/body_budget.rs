//! The bytes of request bodies a door holds at once, counted as bodies arrive (the HTTP and gRPC
//! doors' twin of the MQTT door's `--mqtt-max-inflight-bytes`). Without it, as many requests as
//! the in-flight limit allows can each buffer a body up to the body limit: 1,024 x 4 MiB.
//!
//! A request whose `Content-Length` is known reserves it whole when it is admitted, so a body
//! that cannot fit is refused at once (503 / RESOURCE_EXHAUSTED) before a byte of it is read.
//! A body of unknown length takes its bytes frame by frame, and one that finds the budget
//! exhausted ends with [`Exhausted`] (the door turns it into its refusal). Bytes go back when the
//! request's answer has been sent (the answer's body holds them, as it holds its slot), since a
//! handler keeps what it read of the body until then.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::Semaphore;

/// Bytes are counted in units of this size (a semaphore counts at most 2^61 permits, and one
/// unit per byte would make every frame a large acquire).
const UNIT: usize = 1024;

/// The budget is exhausted: retry later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("too many request body bytes in flight (limit {0} bytes); retry later")]
pub struct Exhausted(pub usize);

/// One door's budget. Clones share it.
#[derive(Debug, Clone)]
pub struct BodyBudget {
    units: Arc<Semaphore>,
    max_bytes: usize,
}

impl BodyBudget {
    pub fn new(max_bytes: usize) -> BodyBudget {
        let units = max_bytes.div_ceil(UNIT).clamp(1, Semaphore::MAX_PERMITS);
        BodyBudget {
            units: Arc::new(Semaphore::new(units)),
            max_bytes,
        }
    }

    /// Bytes free now (tests and metrics).
    pub fn available_bytes(&self) -> usize {
        self.units.available_permits() * UNIT
    }

    /// What one request holds; `known_len` (its `Content-Length`) is reserved now.
    pub fn admit(&self, known_len: Option<u64>) -> Result<Held, Exhausted> {
        let held = Held(Arc::new(HeldUnits {
            units: self.units.clone(),
            taken: AtomicU32::new(0),
            max_bytes: self.max_bytes,
            exhausted: AtomicBool::new(false),
        }));
        if let Some(len) = known_len {
            held.take(usize::try_from(len).unwrap_or(usize::MAX))?;
        }
        Ok(held)
    }
}

#[derive(Debug)]
struct HeldUnits {
    units: Arc<Semaphore>,
    taken: AtomicU32,
    max_bytes: usize,
    /// A frame found the budget exhausted (the door answers its refusal, whatever the handler
    /// made of the failed body).
    exhausted: AtomicBool,
}

impl Drop for HeldUnits {
    fn drop(&mut self) {
        self.units.add_permits(*self.taken.get_mut() as usize);
    }
}

/// The bytes one request holds; given back when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct Held(Arc<HeldUnits>);

impl Held {
    fn take(&self, bytes: usize) -> Result<(), Exhausted> {
        let units = bytes.div_ceil(UNIT);
        let n = u32::try_from(units).map_err(|_| Exhausted(self.0.max_bytes))?;
        match self.0.units.try_acquire_many(n) {
            Ok(permit) => {
                permit.forget();
                self.0.taken.fetch_add(n, Ordering::AcqRel);
                Ok(())
            }
            Err(_) => {
                self.0.exhausted.store(true, Ordering::Release);
                Err(Exhausted(self.0.max_bytes))
            }
        }
    }

    /// Whether the body ran out of budget as it arrived.
    pub fn exhausted(&self) -> Option<Exhausted> {
        self.0
            .exhausted
            .load(Ordering::Acquire)
            .then_some(Exhausted(self.0.max_bytes))
    }

    /// Bytes held now (tests).
    pub fn bytes(&self) -> usize {
        self.0.taken.load(Ordering::Acquire) as usize * UNIT
    }
}

/// A request body that takes its bytes from the budget as they arrive, beyond what was
/// reserved for it; `exhausted` makes the error the door wants its refusal to be.
pub struct BudgetedBody<B> {
    inner: B,
    held: Held,
    reserved: usize,
    seen: usize,
    exhausted: fn(Exhausted) -> Box<dyn std::error::Error + Send + Sync>,
}

impl<B> BudgetedBody<B> {
    pub fn new(
        inner: B,
        held: Held,
        reserved: Option<u64>,
        exhausted: fn(Exhausted) -> Box<dyn std::error::Error + Send + Sync>,
    ) -> BudgetedBody<B> {
        BudgetedBody {
            inner,
            held,
            reserved: reserved.map_or(0, |r| usize::try_from(r).unwrap_or(usize::MAX)),
            seen: 0,
            exhausted,
        }
    }
}

impl<B> Body for BudgetedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let before = this.seen.max(this.reserved);
                    this.seen += data.len();
                    let after = this.seen.max(this.reserved);
                    // Only what goes past the reservation, in whole units above it.
                    let need = after.div_ceil(UNIT) - before.div_ceil(UNIT);
                    if need > 0
                        && let Err(e) = this.held.take(need * UNIT)
                    {
                        return Poll::Ready(Some(Err((this.exhausted)(e))));
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn boxed(e: Exhausted) -> Box<dyn std::error::Error + Send + Sync> {
        Box::new(e)
    }

    #[test]
    fn a_known_length_is_reserved_whole_and_given_back_with_the_last_holder() {
        let b = BodyBudget::new(8 * UNIT);
        let a = b.admit(Some(5 * 1024)).unwrap();
        assert_eq!(b.available_bytes(), 3 * UNIT);
        assert_eq!(b.admit(Some(4 * 1024)).unwrap_err(), Exhausted(8 * UNIT));
        let clone = a.clone();
        drop(a);
        assert_eq!(b.available_bytes(), 3 * UNIT, "a clone still holds them");
        drop(clone);
        assert_eq!(b.available_bytes(), 8 * UNIT);
        assert!(
            b.admit(Some(u64::MAX)).is_err(),
            "a huge length is refused, not wrapped"
        );
    }

    #[tokio::test]
    async fn an_unknown_length_takes_bytes_as_they_arrive_and_fails_past_the_budget() {
        let b = BodyBudget::new(4 * UNIT);
        let small = http_body_util::Full::new(Bytes::from(vec![0u8; 3000]));
        let held = b.admit(None).unwrap();
        let got = BudgetedBody::new(small, held.clone(), None, boxed)
            .collect()
            .await
            .unwrap()
            .to_bytes();
        assert_eq!(got.len(), 3000);
        assert_eq!(held.bytes(), 3 * UNIT);
        let big = http_body_util::Full::new(Bytes::from(vec![0u8; 2 * UNIT]));
        let err = BudgetedBody::new(big, b.admit(None).unwrap(), None, boxed)
            .collect()
            .await
            .unwrap_err();
        assert!(err.to_string().contains("too many request body bytes"), "{err}");
        drop(held);
        assert_eq!(b.available_bytes(), 4 * UNIT, "everything is given back");
    }

    #[tokio::test]
    async fn a_reserved_body_takes_nothing_more_up_to_its_length() {
        let b = BodyBudget::new(4 * UNIT);
        let held = b.admit(Some(2048)).unwrap();
        let body = http_body_util::Full::new(Bytes::from(vec![0u8; 2048]));
        BudgetedBody::new(body, held.clone(), Some(2048), boxed)
            .collect()
            .await
            .unwrap();
        assert_eq!(held.bytes(), 2 * UNIT);
    }
}
