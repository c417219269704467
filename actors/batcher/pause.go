package batcher

import (
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/ankusa/sinkbatch/internal/mono"
	"github.com/ankusa/sinkbatch/messages"
)

// This file holds the strict-group rule (Tuning.StrictGroups), in one place:
//
// Every answer that leaves a message's fate to its caller — a retryable
// failure, an expiry in the queue or in flight, a caller that left, a
// refusal for fullness, a restart — pauses the message's group (interrupt).
// The group then waits for the retries of the interrupted messages, and of
// the group's later messages it takes out of the queue and the waiting list
// (held: answered *messages.GroupPausedError), in the order the group first
// delivered them; a delivery of the group that is not the retry it waits
// for next is answered GroupPausedError naming that retry's key. The group
// resumes once every retry it waits for is in, on ResumeGroup, or when
// GroupPauseMax passes since its last interruption.
//
// Order is kept by rank: each delivery of a group gets the next rank when
// it is admitted, and a retry the group waits for takes the rank of the
// delivery it repeats. So the keys a paused group waits for are its
// interrupted and held messages sorted by rank, which is the order the
// group first delivered them, whichever of them was interrupted first (an
// entry that expired in flight, then one behind it in the same request
// that failed when the request ended).
//
// A permanent failure does not pause: that message will never come back.
// A caller that retries each failed or paused message, in its own order,
// with the same key, therefore sees its group stored in first-delivery
// order. The one exception is the destination's: entries of one group in
// one request are answered each alone, so a later entry may be stored while
// an earlier one failed (see the actors package doc).

// waitKey is a retry a paused group waits for: the key and the rank of the
// delivery it repeats.
type waitKey struct {
	key  string
	rank uint64
}

// pause is one paused group.
type pause struct {
	keys  []waitKey           // sorted by rank, no key twice; keys[0] is admitted next
	has   map[string]struct{} // the keys of keys, so that owe costs O(1)
	until int64               // the clock's time at which the group resumes on its own
}

// pauses are a destination's paused groups. The map holds paused groups
// only: a resumed group is deleted.
type pauses struct {
	m        map[string]pause
	minUntil int64 // no pause ends earlier; MaxInt64 when none
}

// nextRank gives a new delivery its rank.
func (q *queue) newRank() uint64 {
	q.rank++
	return q.rank
}

// checkPaused says whether a delivery of group g with key may be admitted
// at now. If g is paused it may only if key is the retry g waits for next
// (retry: the delivery takes rank, and admitted must be called once it is
// queued or waiting); otherwise next is the key g waits for. A pause that
// has run out resumes g here.
func (q *queue) checkPaused(g, key string, now int64) (next string, paused, retry bool, rank uint64) {
	if g == "" || len(q.paused.m) == 0 {
		return "", false, false, 0
	}
	p, ok := q.paused.m[g]
	if !ok {
		return "", false, false, 0
	}
	if now >= p.until {
		delete(q.paused.m, g)
		return "", false, false, 0
	}
	if p.keys[0].key == key {
		return "", true, true, p.keys[0].rank
	}
	return p.keys[0].key, true, false, 0
}

// owe adds e, a delivery of a paused group answered GroupPausedError, to
// the retries the group waits for: that answer, too, leaves the message's
// fate to its caller. A key the group waits for already keeps its place.
// The pause's end does not move. It costs O(1): e's rank is the highest.
// The list grows with each new message a caller delivers to the paused
// group, and ends with the pause (GroupPauseMax at the latest).
func (q *queue) owe(e *entry) {
	g, key := e.msg.Group, e.msg.IdempotencyKey
	p := q.paused.m[g]
	if _, ok := p.has[key]; ok {
		return
	}
	p.keys = append(p.keys, waitKey{key, q.newRank()})
	p.has[key] = struct{}{}
	q.paused.m[g] = p
}

// admitted notes that the retry keyed key, the one g waited for next, is
// queued or waiting, and reports whether g has resumed (it waits for
// nothing more).
func (q *queue) admitted(g, key string) (resumed bool) {
	p := q.paused.m[g]
	if len(p.keys) > 0 && p.keys[0].key == key {
		p.keys = p.keys[1:]
	} else {
		p.keys = slices.DeleteFunc(p.keys, func(k waitKey) bool { return k.key == key })
	}
	delete(p.has, key)
	if len(p.keys) == 0 {
		delete(q.paused.m, g)
		return true
	}
	q.paused.m[g] = p
	return false
}

// interrupt applies the rule to es, entries of this destination (queued,
// waiting, in a request, or never admitted) whose callers are being
// answered without a final result: each of their groups pauses, or stays
// paused, waiting for their retries and for those of the group's later
// entries, which it takes out of the queue and the waiting list and returns
// as held, each with heldBy set to the key the group now waits for first.
// began lists the groups that were not paused before. Without StrictGroups
// it does nothing.
func (q *queue) interrupt(es []*entry, now int64) (held []*entry, began []string) {
	if !q.s.strict {
		return nil, nil
	}
	var done map[string]bool
	for i, e := range es {
		g := e.msg.Group
		if g == "" || done[g] {
			continue
		}
		if done == nil {
			done = make(map[string]bool)
		}
		done[g] = true
		var keys []waitKey
		first := e.rank
		for _, x := range es[i:] {
			if x.msg.Group == g {
				keys = append(keys, waitKey{x.msg.IdempotencyKey, x.rank})
				first = min(first, x.rank)
			}
		}
		from := len(held)
		if l := q.groups[g]; l != nil {
			for _, x := range l.entries[l.head:] {
				// remove may clear slots at the head as it goes.
				if x != nil && !x.dead && x.rank > first {
					q.remove(x)
					held = append(held, x)
				}
			}
		}
		for _, x := range q.waits.group(g) {
			if x.rank > first {
				q.waits.remove(x)
				held = append(held, x)
			}
		}
		for _, x := range held[from:] {
			keys = append(keys, waitKey{x.msg.IdempotencyKey, x.rank})
		}
		p, was := q.paused.m[g]
		if !was {
			began = append(began, g)
		}
		p.keys = mergeKeys(p.keys, keys)
		q.setPause(g, p.keys, now, q.s.pauseMax)
		for _, x := range held[from:] {
			x.heldBy = p.keys[0].key
		}
	}
	return held, began
}

// mergeKeys is a and b, one list sorted by rank with no key twice (the
// lower rank stays).
func mergeKeys(a, b []waitKey) []waitKey {
	out := append(slices.Clone(a), b...)
	slices.SortStableFunc(out, func(x, y waitKey) int {
		switch {
		case x.rank < y.rank:
			return -1
		case x.rank > y.rank:
			return 1
		}
		return 0
	})
	seen := make(map[string]bool, len(out))
	return slices.DeleteFunc(out, func(k waitKey) bool {
		if seen[k.key] {
			return true
		}
		seen[k.key] = true
		return false
	})
}

// setPause records g's pause, waiting for keys, from now for d.
func (q *queue) setPause(g string, keys []waitKey, now, d int64) {
	if q.paused.m == nil {
		q.paused.m = make(map[string]pause)
	}
	until := mono.AddSat(now, d)
	has := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		has[k.key] = struct{}{}
	}
	q.paused.m[g] = pause{keys: keys, has: has, until: until}
	q.paused.minUntil = min(q.paused.minUntil, until)
}

// takePauses removes the pauses still running at now and returns them,
// sorted by group, each with the keys it waits for and the time it has
// left: the destination moves to another instance (cluster mode's
// hand-off), which adopts them.
func (q *queue) takePauses(now int64) []messages.PausedGroup {
	q.expirePauses(now)
	if len(q.paused.m) == 0 {
		return nil
	}
	out := make([]messages.PausedGroup, 0, len(q.paused.m))
	for g, p := range q.paused.m {
		pg := messages.PausedGroup{Group: g, Key: p.keys[0].key, Left: time.Duration(p.until - now)}
		for _, k := range p.keys[1:] {
			pg.Then = append(pg.Then, k.key)
		}
		out = append(out, pg)
	}
	slices.SortFunc(out, func(a, b messages.PausedGroup) int { return strings.Compare(a.Group, b.Group) })
	q.paused = pauses{minUntil: math.MaxInt64}
	return out
}

// adoptPauses pauses the groups another instance handed over, from now for
// the time each had left there (at most GroupPauseMax), waiting for the same
// retries in the same order, ranked before anything admitted here later. A
// group paused here already keeps its own pause, and one with no time left
// is not paused. The groups' queued entries, if any, stay: they were
// admitted before the hand-over. A destination without StrictGroups pauses
// nothing.
func (q *queue) adoptPauses(ps []messages.PausedGroup, now int64) {
	if !q.s.strict {
		return
	}
	for _, p := range ps {
		if p.Group == "" || p.Left <= 0 {
			continue
		}
		if _, ok := q.paused.m[p.Group]; ok {
			continue
		}
		var keys []waitKey
		for _, k := range append([]string{p.Key}, p.Then...) {
			if k != "" { // no grouped delivery has an empty key to resume it
				keys = append(keys, waitKey{k, q.newRank()})
			}
		}
		if len(keys) == 0 {
			continue
		}
		q.setPause(p.Group, mergeKeys(nil, keys), now, min(int64(p.Left), q.s.pauseMax))
	}
}

// resume resumes group g; it reports whether g was paused.
func (q *queue) resume(g string) bool {
	if _, ok := q.paused.m[g]; !ok {
		return false
	}
	delete(q.paused.m, g)
	return true
}

// expirePauses resumes every group whose pause has run out at now and
// returns them, sorted.
func (q *queue) expirePauses(now int64) []string {
	if now < q.paused.minUntil {
		return nil
	}
	var out []string
	next := int64(math.MaxInt64)
	for g, p := range q.paused.m {
		if now >= p.until {
			delete(q.paused.m, g)
			out = append(out, g)
			continue
		}
		next = min(next, p.until)
	}
	q.paused.minUntil = next
	slices.Sort(out)
	return out
}

// pausedGroups lists the paused groups, sorted.
func (q *queue) pausedGroups() []string {
	out := make([]string, 0, len(q.paused.m))
	for g := range q.paused.m {
		out = append(out, g)
	}
	slices.Sort(out)
	return out
}

// clone copies p, for the incarnation that follows a crash: a restart must
// not let a paused group's followers overtake the retries it waits for.
func (p pauses) clone() pauses {
	c := pauses{minUntil: p.minUntil}
	if len(p.m) > 0 {
		c.m = make(map[string]pause, len(p.m))
		for g, v := range p.m {
			v.keys = slices.Clone(v.keys)
			v.has = maps.Clone(v.has)
			c.m[g] = v
		}
	}
	if c.m == nil {
		c.minUntil = math.MaxInt64
	}
	return c
}
