package faults

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// The watchers' checks, run after Stop.
//
// Order: per key, a change (not a snapshot event) has a version above every version of that key
// delivered before it, and no key@version comes twice; a snapshot never shows a version older
// than one delivered. The one exception: a KEYNOTIFY observer behind a shared broker may get a
// change again, with its version, after the replica that sent it died (the handover resends
// from that replica's last recorded position): counted as redelivered, dropped as a client
// that compares versions drops it, and everything else still checked.
//
// Completeness: every acknowledged write (its ETag is its version) reaches every watcher, as a
// change or as the value a snapshot shows. The only documented way to miss one is a reset (the
// resume position was no longer in the history: a restarted replica, an overflow): the stream
// then sends the current value of every key, and the changes between the position and the
// snapshot are skipped. So a missing write is excused only when a reset's snapshot could have
// skipped it: it was invoked before that snapshot's synced event, and its version is above the
// last version of its key that the watcher had before the reset (anything at or below that was
// already due). Excused writes are counted and reported; every other missing write is a silent
// gap, a violation. Unique ack-* keys are written once, so a snapshot always shows them: they are
// never excused in practice. A fresh watch's initial snapshot counts as a reset at the start.

type watchReset struct {
	idx      int           // index of the reset event (-1: the initial snapshot)
	syncedAt time.Duration // when the synced that ended its snapshot arrived (end of run if never)
}

func (w *Watchers) check(h *History, out string) []Verdict {
	order := Verdict{Checker: "watchers: per key, versions increase, none twice", Valid: true}
	compl := Verdict{Checker: "watchers: every acknowledged write seen by every watcher", Valid: true}
	var acks []Op
	for _, o := range h.Ops(ackWorkload) {
		if o.Outcome == OK && o.ETag != "" {
			acks = append(acks, o)
		}
	}
	for _, o := range h.Ops(regWorkload) {
		if (o.Kind == "write" || o.Kind == "cas") && o.Outcome == OK && o.ETag != "" {
			acks = append(acks, o)
		}
	}
	var orderSum, complSum []string
	w.mu.Lock()
	ws := append([]*watcher(nil), w.ws...)
	w.mu.Unlock()
	for _, wt := range ws {
		wt.mu.Lock()
		events, conns, errs := wt.events, wt.conns, wt.errs
		wt.mu.Unlock()
		dumpJSON(filepath.Join(out, "watch-"+wt.name+".json"), map[string]any{"events": events, "errors": errs})
		counts := map[string]int{}
		lastV := map[string]string{} // key -> highest version delivered so far
		seen := map[string]bool{}    // key@version delivered as a change (not a snapshot)
		present := map[string]bool{} // key@version delivered in any form
		resets := []watchReset{{idx: -1, syncedAt: -1}}
		bad := 0
		for i, e := range events {
			counts[e.Kind]++
			switch e.Kind {
			case "reset":
				resets = append(resets, watchReset{idx: i, syncedAt: -1})
				continue
			case "synced":
				// Ends the snapshot of every reset still open: one whose stream broke before its
				// synced (a failed, a restart) is only made whole by a later reset's snapshot.
				for j := range resets {
					if resets[j].syncedAt < 0 {
						resets[j].syncedAt = e.At
					}
				}
				continue
			case "set", "delete":
			default:
				continue
			}
			if e.Snapshot {
				counts["snapshot"]++
				if prev, ok := lastV[e.Key]; ok && e.Version < prev {
					bad++
					order.violate(fmt.Sprintf("watcher %s: snapshot of %s has version %s older than the delivered %s (conn %d at %.3fs)",
						wt.name, e.Key, e.Version, prev, e.Conn, e.At.Seconds()))
				}
			} else {
				kv := e.Key + "@" + e.Version
				if seen[kv] && wt.atLeastOnce {
					counts["redelivered"]++
					continue
				}
				if seen[kv] {
					bad++
					order.violate(fmt.Sprintf("watcher %s: %s %s version %s delivered twice (conn %d at %.3fs)",
						wt.name, e.Kind, e.Key, e.Version, e.Conn, e.At.Seconds()))
				} else if prev, ok := lastV[e.Key]; ok && e.Version <= prev {
					bad++
					order.violate(fmt.Sprintf("watcher %s: %s %s version %s not above the delivered %s (conn %d at %.3fs)",
						wt.name, e.Kind, e.Key, e.Version, prev, e.Conn, e.At.Seconds()))
				}
				seen[kv] = true
			}
			if e.Version > lastV[e.Key] {
				lastV[e.Key] = e.Version
			}
			present[e.Key+"@"+e.Version] = true
		}
		for i := range resets {
			if resets[i].syncedAt < 0 {
				resets[i].syncedAt = h.Now() // a snapshot cut short: it may have skipped anything until the end
			}
		}
		missing, excused := 0, 0
		due := 0
		for _, o := range acks {
			if wt.covers != nil && !wt.covers(o) {
				continue
			}
			due++
			if present[o.Key+"@"+o.ETag] {
				continue
			}
			if r, ok := excusedBy(events, resets, o); ok {
				excused++
				if excused <= 5 {
					compl.Notes = append(compl.Notes, fmt.Sprintf("watcher %s: write not delivered, covered by the reset at event %d (snapshot synced at %.3fs): %s",
						wt.name, r.idx, r.syncedAt.Seconds(), o))
				}
				continue
			}
			missing++
			compl.violate(fmt.Sprintf("watcher %s (%d resets, %d overflows) never saw acknowledged write %s", wt.name,
				counts["reset"], counts["overflow"], o))
		}
		redelivered := ""
		if wt.atLeastOnce {
			redelivered = fmt.Sprintf(", %d redelivered", counts["redelivered"])
		}
		orderSum = append(orderSum, fmt.Sprintf("%s: %d events over %d connections, %d snapshot events, %d resets, %d overflows, %d failed, %d out of order%s",
			wt.name, counts["set"]+counts["delete"], conns, counts["snapshot"], counts["reset"], counts["overflow"], counts["failed"], bad, redelivered))
		complSum = append(complSum, fmt.Sprintf("%s: %d of %d missing, %d more skipped by a reset", wt.name, missing, due, excused))
	}
	order.Summary = strings.Join(orderSum, "; ")
	compl.Summary = strings.Join(complSum, "; ")
	return []Verdict{order, compl}
}

// excusedBy finds a reset whose snapshot may have skipped write o (see the top of this file).
func excusedBy(events []watchEvent, resets []watchReset, o Op) (watchReset, bool) {
	for _, r := range resets {
		if o.Invoke >= r.syncedAt {
			continue
		}
		before := "" // the key's highest version delivered before the reset
		for _, e := range events[:max(r.idx, 0)] {
			if e.Key == o.Key && (e.Kind == "set" || e.Kind == "delete") && e.Version > before {
				before = e.Version
			}
		}
		if o.ETag > before {
			return r, true
		}
	}
	return watchReset{}, false
}

// lockExpiries lists the expiries of the fencing lock's key between from and to, as the first
// watcher saw them: when, and the delete's version, whose node is the replica whose expiry
// driver removed it. Evidence for a two-holders violation.
func (w *Watchers) lockExpiries(from, to time.Duration) []string {
	if len(w.ws) == 0 {
		return nil
	}
	wt := w.ws[0]
	wt.mu.Lock()
	defer wt.mu.Unlock()
	var out []string
	for _, e := range wt.events {
		if e.Key == "fence" && e.Kind == "delete" && e.Reason == "expired" && e.At >= from && e.At <= to {
			out = append(out, fmt.Sprintf("%.3fs %s", e.At.Seconds(), e.Version))
		}
	}
	return out
}
