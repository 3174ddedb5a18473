//! Who sends each KEYNOTIFY notification, for replicas on shared storage.
//!
//! Every replica reads the same change log in the same order, with the registrations and the
//! membership (the replicas that send notifications, `J`/`L` entries) in it. So at every log
//! position all replicas agree on one owner per observing client:
//!
//! - a client that only one replica can reach (connected to that replica's embedded broker,
//!   its *home*) is notified by its home;
//! - any other client (behind a shared external broker) by the member that rendezvous hashing
//!   of the client id over the members picks: a join or a leave moves only the clients whose
//!   top member changed, and at exactly that log position.
//!
//! One sender per client, reading the log in order and publishing through one connection, sends
//! each change once, in log order, which is version order per key.
//!
//! When a member dies, what it owed but had not sent must not be lost. Each replica therefore
//! keeps the notifications that other members owe (the handover buffer, bounded like the
//! KEYNOTIFY queue), and each member records in storage, every heartbeat, the position up to
//! which it has sent everything it owed. That record lags one heartbeat behind what the door
//! handed to the MQTT client, so a notification still in the client's buffer when the process
//! dies counts as unsent. A member whose membership lapsed is dropped by whichever replica
//! notices first, with a logged `L` entry that carries its last record; at that entry every
//! replica hands the dead member's unsent notifications to their new owners, who send them.
//! So nothing owed is lost, and a notification is sent twice only when its sender died (or was
//! cut off from storage longer than the member timeout) within a heartbeat of sending it.
//! Buffered notifications are pruned as the members' records pass them.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use super::Engine;
use super::notify::Change;

/// What one replica knows of the membership and what the others owe.
#[derive(Debug, Default)]
pub(super) struct Routing {
    members: BTreeSet<u64>,
    /// The log position at which each member joined, for those that joined while this replica
    /// read the log (the others joined before anything it buffers). A member that joined after
    /// a notification was taken on never read it, so it cannot be handed it (see [`Routing::left`]).
    joined_at: HashMap<u64, u64>,
    /// Clients that only one replica can reach, and which.
    homes: HashMap<Arc<str>, u64>,
    /// Notifications other members owe, in the order they took them on.
    owed: VecDeque<Owed>,
    bytes: usize,
    /// Buffered notifications dropped because the buffer was full (lost if their owner dies).
    dropped: u64,
}

#[derive(Debug)]
struct Owed {
    /// The position at which `owner` took it on.
    at: u64,
    /// The position of the change itself (`at`, unless it was handed over since): only members
    /// that had joined by then read it, and so only they can be handed it.
    since: u64,
    owner: u64,
    client: Arc<str>,
    change: Change,
}

impl Owed {
    fn cost(&self) -> usize {
        let value = match &self.change.kind {
            super::ChangeKind::Set(v) => v.len(),
            super::ChangeKind::Delete | super::ChangeKind::Expire => 0,
        };
        96 + self.change.key.len() + value + self.client.len()
    }
}

/// Rendezvous hashing: the member with the highest score for the client owns it. A fixed hash
/// (FNV-1a, then a 64-bit finaliser), so that every replica, of any build, agrees.
fn score(client: &str, member: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in client.as_bytes().iter().chain(member.to_le_bytes().iter()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

impl Routing {
    pub(super) fn new(members: impl IntoIterator<Item = u64>) -> Routing {
        Routing {
            members: members.into_iter().collect(),
            ..Routing::default()
        }
    }

    /// Who notifies `client` at this position (`None`: nobody can, as no member is left).
    pub(super) fn owner(&self, client: &str) -> Option<u64> {
        if let Some(home) = self.homes.get(client) {
            return Some(*home);
        }
        self.members.iter().copied().max_by_key(|m| (score(client, *m), *m))
    }

    pub(super) fn set_home(&mut self, client: &str, home: Option<u64>) {
        match home {
            Some(h) => {
                self.homes.insert(Arc::from(client), h);
            }
            None => {
                self.homes.remove(client);
            }
        }
    }

    /// Whether only one replica can reach `client`.
    pub(super) fn is_home_bound(&self, client: &str) -> bool {
        self.homes.contains_key(client)
    }

    /// `member` joined at log position `at` (again, if it had left).
    pub(super) fn joined(&mut self, member: u64, at: u64) {
        self.members.insert(member);
        self.joined_at.insert(member, at);
    }

    /// Who sends a notification of `client` taken on at position `since` when its owner left:
    /// the top member among those that had joined by `since`. Every replica that holds the
    /// notification read the log at `since`, so they all agree; a member that joined later does
    /// not hold it, and picking it (as the current owner may be) would lose it.
    fn heir(&self, client: &str, since: u64) -> Option<u64> {
        if let Some(home) = self.homes.get(client) {
            return Some(*home);
        }
        self.members
            .iter()
            .copied()
            .filter(|m| self.joined_at.get(m).is_none_or(|j| *j <= since))
            .max_by_key(|m| (score(client, *m), *m))
    }

    /// `member` left at position `at`, having sent what it owed up to `progress`: its unsent
    /// notifications go to their new owners. Returns those that are now `me`'s to send.
    pub(super) fn left(&mut self, member: u64, progress: u64, at: u64, me: u64) -> Vec<(Arc<str>, Change)> {
        self.members.remove(&member);
        self.joined_at.remove(&member);
        let (theirs, others): (Vec<Owed>, Vec<Owed>) = self.owed.drain(..).partition(|o| o.owner == member);
        self.owed = others.into();
        self.bytes = self.owed.iter().map(Owed::cost).sum();
        let mut mine = Vec::new();
        for o in theirs.into_iter().filter(|o| o.at > progress) {
            match self.heir(&o.client, o.since) {
                Some(owner) if owner == me => mine.push((o.client, o.change)),
                // Another member sends it; keep it until that one has, in case it dies too.
                Some(owner) if !self.homes.contains_key(&o.client) => self.owe(
                    Owed {
                        at,
                        since: o.since,
                        owner,
                        client: o.client,
                        change: o.change,
                    },
                    usize::MAX,
                    usize::MAX,
                ),
                _ => {}
            }
        }
        mine
    }

    /// Keeps a notification another member owes, within `max_len` and `max_bytes` (the oldest
    /// go first).
    pub(super) fn owe_within(&mut self, at: u64, owner: u64, client: Arc<str>, change: Change, max: (usize, usize)) {
        self.owe(
            Owed {
                at,
                since: at,
                owner,
                client,
                change,
            },
            max.0,
            max.1,
        );
    }

    fn owe(&mut self, o: Owed, max_len: usize, max_bytes: usize) {
        self.bytes += o.cost();
        self.owed.push_back(o);
        while self.owed.len() > max_len || (self.bytes > max_bytes && self.owed.len() > 1) {
            let Some(old) = self.owed.pop_front() else { break };
            self.bytes -= old.cost();
            self.dropped += 1;
            if self.dropped.is_power_of_two() {
                tracing::warn!(
                    dropped_total = self.dropped,
                    "KEYNOTIFY handover buffer full: a notification another replica owes is no longer kept (lost if that replica dies before sending it)"
                );
            }
        }
    }

    /// What each member recorded as sent: forget what they no longer owe.
    pub(super) fn recorded(&mut self, progress: &[(u64, u64)]) {
        let sent: HashMap<u64, u64> = progress.iter().copied().collect();
        self.owed.retain(|o| sent.get(&o.owner).is_none_or(|p| o.at > *p));
        self.bytes = self.owed.iter().map(Owed::cost).sum();
    }

    /// The members, in order.
    #[cfg(test)]
    pub(super) fn members(&self) -> Vec<u64> {
        self.members.iter().copied().collect()
    }

    /// Notifications other members owe (kept in case they die).
    #[cfg(test)]
    pub(super) fn owed(&self) -> usize {
        self.owed.len()
    }
}

impl Engine {
    /// Renews this replica's membership every [`crate::storage::log::ChangeLog::heartbeat_every`]
    /// for as long as the engine lives: it joins on the first one. Runs once the MQTT door took
    /// the notifications, since only a replica that sends them may own observers.
    pub(super) async fn heartbeats(engine: super::WeakEngine) {
        let Some((log, every)) = engine
            .upgrade()
            .and_then(|e| e.shared().map(|s| (s.log.clone(), s.log.heartbeat_every())))
        else {
            return;
        };
        // What is recorded was sampled one heartbeat earlier: a notification handed to the
        // MQTT client within the last heartbeat may still sit in its buffer. It only grows.
        let mut recorded = engine.upgrade().map_or(0, |e| e.notified_through());
        let mut sampled = recorded;
        loop {
            let Some(e) = engine.upgrade() else { return };
            sampled = e.notified_through().max(sampled);
            match log.heartbeat(e.0.hlc.node(), recorded).await {
                Ok(progress) => {
                    if let Some(s) = e.shared() {
                        s.routing().recorded(&progress);
                        s.set_recorded(recorded);
                    }
                }
                Err(err) => tracing::warn!(cause = %err, "renewing this replica's membership failed; retrying"),
            }
            recorded = sampled;
            drop(e);
            tokio::time::sleep(every).await;
        }
    }

    /// Replicas other than this one that send notifications as of the last log position read
    /// (`None`: the storage is not shared).
    pub fn other_senders(&self) -> Option<usize> {
        let shared = self.shared()?;
        let me = shared.log.origin();
        Some(shared.routing().members.iter().filter(|m| **m != me).count())
    }

    /// The log position up to which every notification this replica owes was handed to the
    /// door (all of them, when nothing waits).
    pub(super) fn notified_through(&self) -> u64 {
        let Some(shared) = self.shared() else { return 0 };
        let applied = shared.applied_seq();
        match self.0.keynotify.get() {
            Some(tx) => tx.marks().sent_through(applied),
            None => applied,
        }
    }

    /// Stops sending notifications as a member and says so in the log, with the last position
    /// recorded as sent, so that the others take its observers over at once (not after the
    /// member timeout) and resend what it may not have delivered. Call after the MQTT door
    /// stopped.
    pub async fn leave(&self) {
        let Some(shared) = self.shared() else { return };
        if !shared.stop_heartbeats() {
            return;
        }
        let progress = shared.recorded_progress();
        match tokio::time::timeout(Duration::from_secs(2), shared.log.leave(progress)).await {
            Ok(Ok(())) => tracing::info!(progress, "left the replicas that send KEYNOTIFY notifications"),
            Ok(Err(e)) => {
                tracing::warn!(cause = %e, "leaving the membership failed; the others take over after the member timeout")
            }
            Err(_) => tracing::warn!("leaving the membership timed out; the others take over after the member timeout"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ChangeKind;
    use crate::hlc::Hlc;

    fn change(n: u64) -> Change {
        Change {
            key: bytes::Bytes::from_static(b"k"),
            version: Hlc::new(n, 0, "n"),
            kind: ChangeKind::Delete,
        }
    }

    #[test]
    fn ownership_is_shared_and_moves_only_for_the_clients_of_the_member_that_left() {
        let clients: Vec<String> = (0..300).map(|i| format!("client-{i}")).collect();
        let mut r = Routing::new([1, 2, 3]);
        let before: Vec<u64> = clients.iter().map(|c| r.owner(c).unwrap()).collect();
        for m in [1, 2, 3] {
            let n = before.iter().filter(|o| **o == m).count();
            assert!(n > 60, "member {m} owns {n} of 300");
        }
        r.left(2, 0, 10, 1);
        for (c, old) in clients.iter().zip(&before) {
            let new = r.owner(c).unwrap();
            if *old != 2 {
                assert_eq!(new, *old, "{c} moved although its owner stayed");
            } else {
                assert_ne!(new, 2);
            }
        }
        r.set_home("client-0", Some(9));
        assert_eq!(r.owner("client-0"), Some(9));
        r.set_home("client-0", None);
        assert_eq!(r.owner("client-0"), Routing::new([1, 3]).owner("client-0"));
        assert_eq!(Routing::new([]).owner("x"), None);
    }

    #[test]
    fn a_dead_members_unsent_notifications_go_to_the_new_owners() {
        let mut r = Routing::new([1, 2, 3]);
        // Clients owned by 2, one of which moves to 1 and one to 3 when 2 leaves.
        let owned_by_2: Vec<String> = (0..200)
            .map(|i| format!("c{i}"))
            .filter(|c| r.owner(c) == Some(2))
            .collect();
        let probe = Routing::new([1, 3]);
        let to_1 = owned_by_2.iter().find(|c| probe.owner(c) == Some(1)).unwrap().clone();
        let to_3 = owned_by_2.iter().find(|c| probe.owner(c) == Some(3)).unwrap().clone();
        let max = (100, 1 << 20);
        for (at, c) in [(5, &to_1), (6, &to_3), (7, &to_1), (8, &to_1)] {
            r.owe_within(at, 2, Arc::from(c.as_str()), change(at), max);
        }
        // 2 recorded 5 as sent, then died: at position 20 replica 1 takes 7 and 8.
        r.recorded(&[(2, 5)]);
        assert_eq!(r.owed(), 3);
        let mine = r.left(2, 5, 20, 1);
        let got: Vec<u64> = mine.iter().map(|(_, c)| c.version.ms).collect();
        assert_eq!(got, [7, 8]);
        // 6 is 3's now; kept at the handover position until 3 records it sent.
        assert_eq!(r.owed(), 1);
        r.recorded(&[(3, 19)]);
        assert_eq!(r.owed(), 1);
        r.recorded(&[(3, 20)]);
        assert_eq!(r.owed(), 0);
    }

    /// Found by the fault test bed (replicas behind one Mosquitto): a replica killed and
    /// restarted joined again as a new member before the dead one's membership lapsed; at the
    /// lapse its clients went to the new member, which had not read what the dead one owed
    /// before it started, so those notifications were lost.
    #[test]
    fn a_member_that_joined_after_a_notification_is_not_handed_it() {
        let max = (100, 1 << 20);
        let probe_before = Routing::new([1, 2]);
        let probe_after = Routing::new([1, 3]);
        let c = (0..1000)
            .map(|i| format!("c{i}"))
            .find(|c| probe_before.owner(c) == Some(2) && probe_after.owner(c) == Some(3))
            .expect("a client of 2 that moves to 3");
        // Replica 1 read everything: 2 owes the changes at 5 and 15; 3 joined at 10.
        let mut one = Routing::new([1, 2]);
        one.owe_within(5, 2, Arc::from(c.as_str()), change(5), max);
        one.joined(3, 10);
        one.owe_within(15, 2, Arc::from(c.as_str()), change(15), max);
        // Replica 3 started reading at 9: it never saw the change at 5.
        let mut three = Routing::new([1, 2]);
        three.joined(3, 10);
        three.owe_within(15, 2, Arc::from(c.as_str()), change(15), max);
        // 2 dies having sent nothing; its membership lapses at 20.
        let ones: Vec<u64> = one.left(2, 0, 20, 1).iter().map(|(_, c)| c.version.ms).collect();
        let threes: Vec<u64> = three.left(2, 0, 20, 3).iter().map(|(_, c)| c.version.ms).collect();
        assert_eq!(ones, [5], "1 sends what 3 never read");
        assert_eq!(threes, [15], "3 sends what it read, now that it owns the client");
        // 1 keeps 15 until 3 records it sent.
        assert_eq!(one.owed(), 1);
        assert_eq!(one.owner(&c), Some(3));
    }

    #[test]
    fn the_handover_buffer_is_bounded() {
        let mut r = Routing::new([1, 2]);
        for at in 0..10 {
            r.owe_within(at, 2, Arc::from("c"), change(at), (4, usize::MAX));
        }
        assert_eq!((r.owed(), r.dropped), (4, 6));
        let mine = r.left(2, 0, 11, 1);
        assert_eq!(mine.iter().map(|(_, c)| c.version.ms).collect::<Vec<_>>(), [6, 7, 8, 9]);
    }
}
