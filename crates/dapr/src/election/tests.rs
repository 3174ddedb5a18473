use std::sync::Arc;

use super::*;
use crate::engine::Limits;
use crate::hlc::ManualClock;
use crate::storage::Store;

const T0: u64 = 1_000_000;

async fn engine() -> (Engine, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let e = Engine::open(Store::memory(), "n", clock.clone(), Limits::default())
        .await
        .unwrap();
    (e, clock)
}

fn campaign_of(holder: &str, value: Option<&str>, wait: Duration) -> Campaign {
    Campaign {
        key: Bytes::from("job"),
        holder: Bytes::copy_from_slice(holder.as_bytes()),
        value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
        ttl: Duration::from_secs(10),
        wait,
    }
}

/// The AIO leased lock's write of the lease `job` (acquire and renew alike).
fn renewal(holder: &str) -> Set {
    Set {
        key: Bytes::from("job"),
        value: Bytes::copy_from_slice(holder.as_bytes()),
        condition: SetCondition::IfAbsentOrEqual,
        ttl_ms: Some(5000),
        timestamp: None,
        fencing: None,
        persist: false,
        sliding: false,
    }
}

async fn elect(e: &Engine, holder: &str, value: Option<&str>) -> Leader {
    match campaign(
        e,
        &DaprSettings::default(),
        &Grant::all(),
        &campaign_of(holder, value, Duration::ZERO),
    )
    .await
    .unwrap()
    {
        Campaigned::Elected(l) => l,
        other => panic!("{holder} not elected: {other:?}"),
    }
}

#[tokio::test]
async fn the_lease_is_the_leased_lock_record_and_the_value_its_companion() {
    let (e, _) = engine().await;
    let l = elect(&e, "a", Some("http://a")).await;
    let lease = e.read(&Bytes::from("job")).await.unwrap().unwrap();
    assert_eq!((&lease.value[..], &lease.version), (&b"a"[..], &l.token));
    assert_eq!(lease.expires_at_ms, Some(T0 + 10_000));
    let p = e.read(&proclaimed_key(b"job")).await.unwrap().unwrap();
    let expected = Proclamation {
        token: l.token.clone(),
        holder: Bytes::from("a"),
        value: Some(Bytes::from("http://a")),
    };
    assert_eq!(&p.value[..], &expected.encode()[..]);
    assert_eq!(Proclamation::parse(&p.value), Some(expected));
    assert_eq!(p.fencing.as_ref(), Some(&l.token));
    let now = leader(&e, &Grant::all(), &Bytes::from("job")).await.unwrap().unwrap();
    assert_eq!(now, l);
}

#[tokio::test]
async fn another_holder_is_not_elected_and_learns_who_leads() {
    let (e, _) = engine().await;
    let a = elect(&e, "a", Some("va")).await;
    let b = campaign(
        &e,
        &DaprSettings::default(),
        &Grant::all(),
        &campaign_of("b", Some("vb"), Duration::ZERO),
    )
    .await
    .unwrap();
    assert_eq!(b, Campaigned::NotElected(Some(a)));
}

/// A wait past the settings' cap ends at the cap, whatever door asked: a campaign holds a
/// request slot and a watch while it waits.
#[tokio::test(start_paused = true)]
async fn campaign_waits_no_longer_than_the_cap() {
    let (e, _) = engine().await;
    let a = elect(&e, "a", None).await;
    let settings = DaprSettings {
        max_campaign_wait: Duration::from_secs(5),
        ..DaprSettings::default()
    };
    let started = Instant::now();
    let b = campaign(
        &e,
        &settings,
        &Grant::all(),
        &campaign_of("b", None, Duration::from_secs(u64::MAX / 4)),
    )
    .await
    .unwrap();
    assert_eq!(b, Campaigned::NotElected(Some(a)));
    // Paused time: the wait is exactly the cap, not the client's.
    assert_eq!(started.elapsed(), Duration::from_secs(5));
}

#[tokio::test]
async fn proclaim_only_by_the_leader_with_a_token_of_its_leadership() {
    let (e, _) = engine().await;
    let key = Bytes::from("job");
    let a = elect(&e, "a", Some("v1")).await;
    let (ha, hb) = (Bytes::from("a"), Bytes::from("b"));
    let v2 = Bytes::from("v2");
    assert_eq!(
        proclaim(&e, &Grant::all(), &key, &hb, &a.token, &v2).await.unwrap(),
        Outcome::NotLeader
    );
    assert_eq!(
        proclaim(&e, &Grant::all(), &key, &ha, &a.token, &v2).await.unwrap(),
        Outcome::Done
    );
    assert_eq!(
        leader(&e, &Grant::all(), &key).await.unwrap().unwrap().value,
        Some(v2.clone())
    );
    // a resigns, b leads: a's token is deposed, even if a took the lease again meanwhile.
    assert_eq!(resign(&e, &Grant::all(), &key, &ha).await.unwrap(), Outcome::Done);
    assert_eq!(e.read(&proclaimed_key(&key)).await.unwrap(), None);
    assert_eq!(
        proclaim(&e, &Grant::all(), &key, &ha, &a.token, &v2).await.unwrap(),
        Outcome::NoLeader
    );
    let b = elect(&e, "b", Some("vb")).await;
    assert!(b.token > a.token);
    assert_eq!(resign(&e, &Grant::all(), &key, &ha).await.unwrap(), Outcome::NotLeader);
    assert_eq!(resign(&e, &Grant::all(), &key, &hb).await.unwrap(), Outcome::Done);
    elect(&e, "a", None).await;
    assert_eq!(
        proclaim(&e, &Grant::all(), &key, &ha, &b.token, &v2).await.unwrap(),
        Outcome::NotLeader
    );
}

#[tokio::test]
async fn a_lease_taken_over_another_door_shows_no_stale_value() {
    let (e, _) = engine().await;
    let key = Bytes::from("job");
    elect(&e, "a", Some("va")).await;
    // "a" dies without resigning; its lease goes; a leased-lock client takes the name.
    e.execute(Command::Del(Del {
        key: key.clone(),
        fencing: None,
        condition: DelCondition::Always,
    }))
    .await
    .unwrap();
    let version = e
        .execute(Command::Set(renewal("device-7")))
        .await
        .unwrap()
        .version
        .unwrap();
    let now = leader(&e, &Grant::all(), &key).await.unwrap().unwrap();
    assert_eq!(
        (&now.holder[..], now.value, now.token),
        (&b"device-7"[..], None, version)
    );
}

#[tokio::test(start_paused = true)]
async fn campaign_waits_for_the_release_in_the_change_history() {
    let (e, clock) = engine().await;
    let a = elect(&e, "a", None).await;
    let waiting = {
        let e = e.clone();
        tokio::spawn(async move {
            campaign(
                &e,
                &DaprSettings::default(),
                &Grant::all(),
                &campaign_of("b", None, Duration::from_secs(3600)),
            )
            .await
        })
    };
    // The lease runs out: the expiry (an event in the history) wakes the campaign.
    clock.advance(10_001);
    e.wake_expiry();
    let Campaigned::Elected(b) = waiting.await.unwrap().unwrap() else {
        panic!("b not elected");
    };
    assert!(b.token > a.token);
}

#[tokio::test(start_paused = true)]
async fn campaign_gives_up_at_its_deadline() {
    let (e, _) = engine().await;
    let a = elect(&e, "a", None).await;
    let b = campaign(
        &e,
        &DaprSettings::default(),
        &Grant::all(),
        &campaign_of("b", None, Duration::from_secs(2)),
    )
    .await
    .unwrap();
    assert_eq!(b, Campaigned::NotElected(Some(a)));
}

/// The next leader an observer is told of.
async fn next_leader(seen: &mut (impl Stream<Item = Observed> + Unpin)) -> Option<Leader> {
    match seen.next().await {
        Some(Observed::Leader(l)) => l,
        other => panic!("not a leader: {other:?}"),
    }
}

#[tokio::test]
async fn observe_reports_leaders_not_renewals() {
    use futures_util::FutureExt;
    let (e, _) = engine().await;
    let key = Bytes::from("job");
    let mut seen = Box::pin(observe(&e, &Grant::all(), key.clone()).unwrap());
    assert_eq!(next_leader(&mut seen).await, None);
    let a = elect(&e, "a", Some("va")).await;
    assert_eq!(next_leader(&mut seen).await, Some(a.clone()));
    // A renewal (the leased lock's SET NEX again, as `stategate elect` renews) is no new leader.
    e.execute(Command::Set(renewal("a"))).await.unwrap();
    assert!(seen.next().now_or_never().is_none());
    resign(&e, &Grant::all(), &key, &Bytes::from("a")).await.unwrap();
    let b = elect(&e, "b", Some("vb")).await;
    // Each wake-up reads the election as it is then: in between, nobody or b before its
    // proclamation may show, never a stale leader.
    loop {
        match next_leader(&mut seen).await {
            Some(l) if l == b => break,
            None => {}
            Some(l) if l.holder == "b" && l.value.is_none() => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    proclaim(&e, &Grant::all(), &key, &b.holder, &b.token, &Bytes::from("vb2"))
        .await
        .unwrap();
    let l = next_leader(&mut seen).await.unwrap();
    assert_eq!(
        (l.holder, l.value, l.token),
        (b.holder, Some(Bytes::from("vb2")), b.token)
    );
}

#[tokio::test]
async fn refuses_bad_holders_and_ttls() {
    let (e, _) = engine().await;
    for holder in ["", "a\nb"] {
        let bad = campaign_of(holder, None, Duration::ZERO);
        assert!(matches!(
            campaign(&e, &DaprSettings::default(), &Grant::all(), &bad).await,
            Err(DaprError::Malformed(_))
        ));
    }
    let mut zero = campaign_of("a", None, Duration::ZERO);
    zero.ttl = Duration::ZERO;
    assert!(matches!(
        campaign(&e, &DaprSettings::default(), &Grant::all(), &zero).await,
        Err(DaprError::Malformed(_))
    ));
}

/// A plain SET of `key`, as any client may write a key that happens to have the companion's name.
async fn set_plain(e: &Engine, key: &[u8], value: &str) {
    let set = Set {
        key: Bytes::copy_from_slice(key),
        value: Bytes::copy_from_slice(value.as_bytes()),
        condition: SetCondition::Always,
        ttl_ms: None,
        timestamp: None,
        fencing: None,
        persist: false,
        sliding: false,
    };
    e.execute(Command::Set(set)).await.unwrap();
}

async fn stored(e: &Engine, key: &[u8]) -> Option<Bytes> {
    e.read(&Bytes::copy_from_slice(key))
        .await
        .unwrap()
        .map(|entry| entry.value)
}

#[tokio::test]
async fn resign_leaves_a_companion_key_that_is_no_proclamation_of_the_lease_alone() {
    let (e, _) = engine().await;
    let (key, ha) = (Bytes::from("job"), Bytes::from("a"));
    let companion = proclaimed_key(&key);
    // Nobody holds the lease: resign changes nothing, whatever the key of that name holds.
    set_plain(&e, &companion, "a").await;
    assert_eq!(resign(&e, &Grant::all(), &key, &ha).await.unwrap(), Outcome::NoLeader);
    assert_eq!(stored(&e, &companion).await, Some(Bytes::from("a")));
    // "a" holds the lease as a leased lock (no proclamation): the lease goes, the key stays.
    set_plain(&e, &companion, "a\nnotes").await;
    e.execute(Command::Set(renewal("a"))).await.unwrap();
    assert_eq!(resign(&e, &Grant::all(), &key, &ha).await.unwrap(), Outcome::Done);
    assert_eq!(stored(&e, &key).await, None);
    assert_eq!(stored(&e, &companion).await, Some(Bytes::from("a\nnotes")));
}

#[tokio::test]
async fn a_campaign_never_overwrites_a_companion_key_that_is_no_proclamation() {
    let (e, _) = engine().await;
    let key = Bytes::from("job");
    let companion = proclaimed_key(&key);
    set_plain(&e, &companion, "someone's notes").await;
    let refused = campaign(
        &e,
        &DaprSettings::default(),
        &Grant::all(),
        &campaign_of("a", Some("va"), Duration::ZERO),
    )
    .await;
    assert!(
        matches!(&refused, Err(DaprError::Malformed(m)) if m.contains("job.proclaimed")),
        "{refused:?}"
    );
    assert_eq!(stored(&e, &companion).await, Some(Bytes::from("someone's notes")));
    assert_eq!(stored(&e, &key).await, None, "the lease was given back");
    // Once the key is gone, the election proclaims as usual.
    e.execute(Command::Del(Del {
        key: companion.clone(),
        fencing: None,
        condition: DelCondition::Always,
    }))
    .await
    .unwrap();
    let a = elect(&e, "a", Some("va")).await;
    assert_eq!(a.value, Some(Bytes::from("va")));
}

#[tokio::test]
async fn a_proclamation_counts_only_when_written_under_its_token_for_its_lease() {
    let (e, _) = engine().await;
    let key = Bytes::from("job");
    let version = e.execute(Command::Set(renewal("a"))).await.unwrap().version.unwrap();
    // The right form, written without the token it names: not the leader's.
    let forged = Proclamation {
        token: version.clone(),
        holder: Bytes::from("a"),
        value: Some(Bytes::from("forged")),
    };
    set_plain(
        &e,
        &proclaimed_key(&key),
        std::str::from_utf8(&forged.encode()).unwrap(),
    )
    .await;
    let now = leader(&e, &Grant::all(), &key).await.unwrap().unwrap();
    assert_eq!((now.value, now.campaigned), (None, false));
}
