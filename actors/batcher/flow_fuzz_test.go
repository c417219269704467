package batcher

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzFlow drives a dispatch with StrictGroups and WhenFull Block through
// operations decoded from the input (admit, launch, finish with or without
// a group's failure, sweep, resume, the clock) and checks, after each, the
// rules the reference model of FuzzQueue does not cover:
//   - every entry is in exactly one place (queued, waiting, in a request,
//     answered) and answered at most once;
//   - at most QueueMax entries wait, and the queue's counts match its lanes;
//   - the entries of one group leave in the order they arrived, and so do
//     one tenant's ungrouped entries (no waiter, pause or eviction lets a
//     later one overtake an earlier one that is still to be sent);
//   - a group is paused only while no entry of it is queued or waiting
//     ahead of the failed one's retry, and a delivery to a paused group is
//     answered GroupPausedError.
//
// Input: one byte of settings (bit 0: oneGroup), then one byte per
// operation: kind in the low 3 bits, argument v in the high 5.
//
//	0-2  admit    tenant v%3, group v/3%3 ("" twice as often), a new key;
//	              or, v>=27, the retry of the last failed entry; its
//	              deadline is 1 to 60 after now, by its position
//	3    launch   the batch due now, if any
//	4    finish   request v (mod their number); v odd: its first grouped
//	              entry failed retryably
//	5    sweep    at now
//	6    resume   group v%3
//	7    advance  the clock by 1+v
func FuzzFlow(f *testing.F) {
	for _, seed := range []string{
		"\x00\x00\x08\x10\x00\x08\x03\x23\x03\x04\x00",
		"\x01\x00\x08\x00\x08\x00\x08\x00\x08\x00\x08\x03\x2c\x03\xf8\x00\x03\x04",
		"\x00\x10\x10\x10\x10\x10\x10\x10\x03\x03\x24\x07\x05\x0c\x03\x04",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(ffRun)
}

type ffState int

const (
	ffQueued ffState = iota
	ffWaiting
	ffSent
	ffAnswered
)

type ffEntry struct {
	e     *entry
	seq   int
	state ffState
}

func ffRun(t *testing.T, data []byte) {
	if len(data) == 0 {
		return
	}
	s := settings{
		maxEntries: 2, maxBytes: 100, maxInflight: 2, linger: 1,
		queueMax: 4, queueMaxBytes: 1000, tenantMax: 3,
		oneGroup: data[0]&1 == 1, block: true, strict: true, pauseMax: 50,
	}
	d := handoffDispatch(s)
	now := int64(1)
	var all []*ffEntry
	byEntry := map[*entry]*ffEntry{}
	var running []*inflight
	lastSent := map[string]int{} // group, or "tenant/" for ungrouped: the last seq sent
	lastFailedKey := ""
	groups := [3]string{"", "g", "h"}
	answer := func(e *entry, why string) {
		fe := byEntry[e]
		require.NotNil(t, fe, "%s: an entry nobody admitted", why)
		require.NotEqual(t, ffAnswered, fe.state, "%s: entry %d answered twice", why, fe.seq)
		fe.state = ffAnswered
	}
	sent := func(f *inflight) {
		for _, e := range f.entries {
			fe := byEntry[e]
			require.NotEqual(t, ffAnswered, fe.state, "entry %d sent after its answer", fe.seq)
			require.NotEqual(t, ffSent, fe.state, "entry %d sent twice", fe.seq)
			fe.state = ffSent
			k := e.msg.Group
			if k == "" {
				k = e.msg.Tenant + "/"
			}
			if last, ok := lastSent[k]; ok {
				require.Greater(t, fe.seq, last, "%s: entry %d sent after entry %d", k, fe.seq, last)
			}
			lastSent[k] = fe.seq
		}
	}
	for i, op := range data[1:] {
		kind, v := op&7, int(op>>3)
		switch {
		case kind <= 2:
			key := fmt.Sprint("k", i)
			var e *entry
			if v >= 27 && lastFailedKey != "" {
				// The retry: a new delivery with the failed entry's key and
				// group; it arrives now, so it is a new seq.
				e = keyed("a", lastFailedKey[:1], i, lastFailedKey)
			} else {
				g := groups[(v/3)%3]
				if v%2 == 0 {
					g = ""
				}
				e = keyed(fmt.Sprint("t", v%3), g, i, key)
				if g != "" {
					e.to.deliver.Message.IdempotencyKey = g + key
				}
			}
			e.deadline = now + 1 + int64(i*7%60)
			fe := &ffEntry{e: e, seq: i}
			all = append(all, fe)
			byEntry[e] = fe
			a := d.admit(e, now, false)
			for _, x := range a.dropped {
				answer(x, "admit's sweep")
			}
			if a.evicted != nil {
				answer(a.evicted, "evicted")
			}
			switch {
			case a.ok:
				fe.state = ffQueued
			case a.waiting:
				fe.state = ffWaiting
			default:
				fe.state = ffAnswered
			}
			if g := e.msg.Group; g != "" && !a.ok && !a.waiting {
				_, paused := d.q.paused.m[g]
				require.True(t, paused, "a refusal of %s leaves it paused", g)
			}
		case kind == 3:
			f, dropped := launchAt(d, now)
			for _, x := range dropped {
				answer(x, "launch")
			}
			if f != nil {
				sent(f)
				running = append(running, f)
			}
		case kind == 4:
			if len(running) == 0 {
				continue
			}
			j := v % len(running)
			f := running[j]
			running = append(running[:j], running[j+1:]...)
			var o outcome
			if v%2 == 1 {
				for _, e := range f.entries {
					if e.msg.Group != "" {
						o = failing(f, e.msg.IdempotencyKey)
						lastFailedKey = e.msg.IdempotencyKey
						break
					}
				}
			}
			r := d.finishWith(f, now, o)
			for i, e := range f.entries {
				if r.won[i] {
					answer(e, "finish")
				}
			}
			for _, h := range r.held {
				answer(h, "paused")
				require.NotEmpty(t, h.heldBy)
			}
			for _, x := range r.dropped {
				answer(x, "finish's take")
			}
			if r.next != nil {
				sent(r.next)
				running = append(running, r.next)
			}
		case kind == 5:
			for _, x := range d.sweep(now) {
				answer(x, "sweep")
			}
			late, held := d.expire(now)
			for _, x := range append(late, held...) {
				answer(x, "expire")
			}
		case kind == 6:
			d.resumeGroup(groups[v%3])
		default:
			now += int64(1 + v)
			d.expirePauses(now)
		}
		// Places.
		checkCounts(t, d.q)
		require.LessOrEqual(t, d.q.waits.n, s.queueMax)
		queued, waiting := 0, 0
		for _, fe := range all {
			switch fe.state {
			case ffQueued:
				queued++
			case ffWaiting:
				waiting++
			}
		}
		// Promotions move entries from waiting to queued without telling
		// us: count them together.
		require.Equal(t, queued+waiting, d.q.queued+d.q.waits.n, "op %d: entries queued or waiting", i)
		for _, fe := range all {
			if fe.state == ffWaiting && !fe.e.waitGone {
				continue
			}
			if fe.state == ffWaiting {
				fe.state = ffQueued // promoted
			}
		}
	}
	// The end: every request finishes, everything left is drained; then
	// every entry was answered once or is still in exactly one place.
	for len(running) > 0 {
		f := running[0]
		running = running[1:]
		r := d.finishWith(f, now, outcome{})
		for i, e := range f.entries {
			if r.won[i] {
				answer(e, "end")
			}
		}
		for _, x := range r.dropped {
			answer(x, "end's take")
		}
		if r.next != nil {
			sent(r.next)
			running = append(running, r.next)
		}
	}
	for _, e := range d.abandon(now, false) {
		answer(e, "abandon")
	}
	for _, fe := range all {
		require.Equal(t, ffAnswered, fe.state, "entry %d neither answered nor held", fe.seq)
	}
}
