//! Watches: the changes a watcher asked for, read from the feed, ending with an overflow
//! marker when the watcher fell behind the history kept. Every door that streams changes (SSE,
//! gRPC Watch) uses this; each only turns the items into its wire format.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::Stream;

use super::feed::{FeedEvent, FeedReader};

/// Which keys a watcher wants: any of `keys`, or any name matching one of `patterns`; every
/// key when both are empty.
#[derive(Debug, Clone, Default)]
pub struct Selector {
    keys: Vec<Bytes>,
    patterns: Vec<glob::Pattern>,
}

impl Selector {
    /// `keys` are engine keys; `patterns` are globs (SCAN's rules) over the names the door
    /// shows. A bad pattern is an error naming it.
    pub fn new(keys: Vec<Bytes>, patterns: &[String]) -> Result<Selector, String> {
        let patterns = patterns
            .iter()
            .map(|p| glob::Pattern::new(p).map_err(|e| format!("pattern {p:?}: {e}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Selector { keys, patterns })
    }

    /// Whether the watcher wants `key`, whose shown name `name` gives (computed only when a
    /// pattern needs it).
    pub fn wants<'a>(&self, key: &[u8], name: impl FnOnce() -> Cow<'a, str>) -> bool {
        if self.keys.is_empty() && self.patterns.is_empty() {
            return true;
        }
        if self.keys.iter().any(|k| k[..] == *key) {
            return true;
        }
        if self.patterns.is_empty() {
            return false;
        }
        let name = name();
        self.patterns.iter().any(|p| p.matches(&name))
    }
}

/// What a watch stream yields.
#[derive(Debug, Clone)]
pub enum WatchItem {
    Change(Arc<FeedEvent>),
    /// The watcher fell behind the history kept and missed `missed` changes; the stream ends.
    Overflow {
        missed: u64,
    },
}

/// The changes `reader` sees that `wanted` keeps, then an overflow marker if it falls behind.
pub fn stream(
    reader: FeedReader,
    wanted: impl FnMut(&FeedEvent) -> bool + Send + 'static,
) -> impl Stream<Item = WatchItem> + Send + 'static {
    futures_util::stream::unfold(Some((reader, wanted)), |state| async move {
        let (mut reader, mut wanted) = state?;
        loop {
            match reader.recv().await {
                Ok(e) if wanted(&e) => return Some((WatchItem::Change(e), Some((reader, wanted)))),
                Ok(_) => {}
                Err(lag) => return Some((WatchItem::Overflow { missed: lag.missed }, None)),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;
    use crate::engine::feed::{Feed, FeedLimits};
    use crate::engine::{Change, ChangeKind};
    use crate::hlc::Hlc;

    fn change(key: &str, ms: u64) -> Change {
        Change {
            key: Bytes::copy_from_slice(key.as_bytes()),
            version: Hlc::new(ms, 0, "n"),
            kind: ChangeKind::Delete,
        }
    }

    #[test]
    fn selectors() {
        let all = Selector::default();
        assert!(all.wants(b"x", || "x".into()));
        let s = Selector::new(vec![Bytes::from_static(b"k1")], &["a*".into()]).unwrap();
        assert!(s.wants(b"k1", || unreachable!("a listed key needs no name")));
        assert!(s.wants(b"p||ab", || "ab".into()));
        assert!(!s.wants(b"b", || "b".into()));
        assert!(Selector::new(vec![], &["[".into()]).unwrap_err().contains("\"[\""));
    }

    #[tokio::test]
    async fn filters_then_overflows_and_ends() {
        let feed = Arc::new(Feed::new(FeedLimits {
            max_events: 2,
            max_bytes: 1 << 20,
            max_age: std::time::Duration::from_secs(60),
        }));
        let s = stream(feed.reader(), |e| e.change.key.starts_with(b"a"));
        tokio::pin!(s);
        feed.push(change("b", 1));
        feed.push(change("a", 2));
        assert!(matches!(s.next().await, Some(WatchItem::Change(e)) if e.change.version.ms == 2));
        for i in 3..10 {
            feed.push(change("a", i));
        }
        assert!(matches!(s.next().await, Some(WatchItem::Overflow { missed: 5 })));
        assert!(s.next().await.is_none());
    }
}
