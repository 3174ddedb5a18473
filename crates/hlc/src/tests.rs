use super::*;

fn clock(ms: u64) -> (Arc<ManualClock>, HlcClock) {
    let c = Arc::new(ManualClock::new(ms));
    (c.clone(), HlcClock::new("n1", c))
}

#[test]
fn display_is_padded() {
    let h = Hlc::new(1_696_374_425_000, 1, "stategate-1");
    assert_eq!(h.to_string(), "001696374425000:00001:stategate-1");
}

#[test]
fn parse_is_lenient_about_padding() {
    let a: Hlc = "1696374425000:1:node".parse().unwrap();
    let b: Hlc = "001696374425000:00001:node".parse().unwrap();
    assert_eq!(a, b);
    assert_eq!(a.to_string(), "001696374425000:00001:node");
}

#[test]
fn parse_rejects_garbage() {
    for s in [
        "",
        "1",
        "1:2",
        "1:2:",
        "a:2:n",
        "1:b:n",
        "1:2:n:x",
        "-1:2:n",
        "1:-2:n",
        "1:100000:n",
        " 1:2:n",
        "99999999999999999999999:0:n",
        "+1:2:n",
        "1:2:line\nbreak",
        "1:2:\r",
        "1:2:nul\0",
    ] {
        assert_eq!(s.parse::<Hlc>(), Err(ParseHlcError), "{s:?}");
    }
}

#[test]
fn order_is_ms_then_counter_then_node() {
    let a = Hlc::new(1, 5, "z");
    let b = Hlc::new(2, 0, "a");
    let c = Hlc::new(2, 1, "a");
    let d = Hlc::new(2, 1, "b");
    assert!(a < b && b < c && c < d);
}

#[test]
fn local_events_are_strictly_increasing_on_a_stuck_clock() {
    let (_c, hlc) = clock(1000);
    let a = hlc.now();
    let b = hlc.now();
    assert_eq!((a.ms, a.counter), (1000, 0));
    assert_eq!((b.ms, b.counter), (1000, 1));
}

#[test]
fn counter_resets_when_the_millisecond_advances() {
    let (c, hlc) = clock(1000);
    hlc.now();
    hlc.now();
    c.advance(1);
    let h = hlc.now();
    assert_eq!((h.ms, h.counter), (1001, 0));
}

#[test]
fn receive_rule_goes_past_a_remote_timestamp_ahead_of_us() {
    let (_c, hlc) = clock(1000);
    let remote = Hlc::new(5000, 7, "client");
    let h = hlc.next_after(&[&remote]);
    assert_eq!((h.ms, h.counter), (5000, 8));
    assert_eq!(&*h.node, "n1");
    assert!(h > remote);
    // and stays ahead for the next local event too
    let h2 = hlc.now();
    assert_eq!((h2.ms, h2.counter), (5000, 9));
}

#[test]
fn merge_is_strictly_greater_than_every_floor_even_with_a_larger_node_id() {
    let (_c, hlc) = clock(1000);
    let stored = Hlc::new(1000, 3, "zzzz");
    let req = Hlc::new(900, 0, "a");
    let h = hlc.next_after(&[&stored, &req]);
    assert!(h > stored && h > req);
    assert_eq!((h.ms, h.counter), (1000, 4));
}

#[test]
fn remote_behind_us_is_ignored() {
    let (_c, hlc) = clock(10_000);
    let h = hlc.next_after(&[&Hlc::new(5, 5, "x")]);
    assert_eq!((h.ms, h.counter), (10_000, 0));
}

#[test]
fn counter_overflow_borrows_the_next_millisecond() {
    let (_c, hlc) = clock(1000);
    let h = hlc.next_after(&[&Hlc::new(1000, MAX_COUNTER, "x")]);
    assert_eq!((h.ms, h.counter), (1001, 0));
    assert!(h.to_string().starts_with("000000000001001:00000:"));
}

#[test]
fn observe_raises_the_floor_after_a_restart_with_a_clock_that_went_back() {
    let (_c, hlc) = clock(1000);
    hlc.observe(&Hlc::new(9000, 2, "old"));
    let h = hlc.now();
    assert_eq!((h.ms, h.counter), (9000, 3));
}

#[test]
fn concurrent_issuers_never_get_the_same_timestamp() {
    // Several threads issue at once on a stuck clock: the compare-and-swap must hand each one
    // its own tick, and each thread's ticks increase.
    let (_clock, hlc) = clock(1000);
    let hlc = Arc::new(hlc);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let hlc = hlc.clone();
            std::thread::spawn(move || {
                let mut mine = Vec::with_capacity(20_000);
                for _ in 0..20_000 {
                    mine.push(hlc.now());
                }
                mine
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in threads {
        let mine = t.join().expect("thread");
        assert!(mine.windows(2).all(|w| w[0] < w[1]));
        all.extend(mine);
    }
    let n = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), n, "a timestamp was issued twice");
}

#[test]
fn timestamps_beyond_the_packed_range_still_increase() {
    // 2^47 ms is where the packed word ends; a floor past it moves the clock to its wide form.
    let (clock, hlc) = clock(1000);
    let a = hlc.now();
    let far = Hlc::new(1 << 47, 5, "x");
    let b = hlc.next_after(&[&far]);
    assert!(b > far && b > a, "{b:?}");
    let c = hlc.now();
    assert!(c > b, "{c:?}");
    hlc.observe(&Hlc::new((1 << 47) + 10, 0, "x"));
    clock.set(2000);
    let d = hlc.now();
    assert_eq!((d.ms, d.counter), ((1 << 47) + 10, 1));
}
