package batcher

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/ankusa/sinkbatch/messages"
)

// This file holds the strict-group rules (Tuning.StrictGroups). A retryable
// failure of an entry of group G pauses G: G's queued and waiting entries
// are taken out, to be answered *messages.GroupPausedError, and so is every
// new delivery of G, until one of three things resumes it: a delivery whose
// IdempotencyKey is the failed entry's (the caller's retry, which is then
// admitted first), ResumeGroup, or GroupPauseMax passing. A permanent
// failure does not pause: that message will never come back. A delivery of
// G refused because the queue is full pauses G too, for new deliveries
// only: G's queued entries came before it. An entry that expires in the
// queue pauses nothing: its caller gave up, and may not come back.
//
// The pause is set by the request goroutine that saw the failure, in
// dispatch.finish, under the lock and before the group's gate opens, so no
// follower of the failed entry leaves in between. Like the rest of the
// queue, these rules read no clock: now comes in as an argument.

// pause is one paused group.
type pause struct {
	key   string // IdempotencyKey of the failed entry whose retry resumes the group; "" none
	until int64  // Unix nanoseconds at which the group resumes on its own
}

// pauses are a destination's paused groups. The map holds paused groups
// only: a resumed group is deleted.
type pauses struct {
	m        map[string]pause
	minUntil int64 // no pause ends earlier; MaxInt64 when none
}

// groupFailure is a group's first retryable failure in one request, in the
// request's order: its entry's IdempotencyKey resumes the group.
type groupFailure struct {
	group string
	key   string
}

// heldEntry is an entry taken out of the queue (or the waiting list)
// because its group paused, with the answer it gets.
type heldEntry struct {
	e   *entry
	err *messages.GroupPausedError
}

// pauseGroup pauses f.group after its entry keyed f.key failed at now, and
// returns the group's queued and waiting entries it took out, in order, to
// be answered GroupPausedError. If an entry carrying f.key is already
// queued or waiting (its caller retried before the failed request's end got
// here), the group does not pause: only the entries ahead of the retry are
// taken out, so that it goes first. paused says which happened.
func (q *queue) pauseGroup(f groupFailure, now int64) (held []heldEntry, paused bool) {
	answer := &messages.GroupPausedError{Group: f.group, Key: f.key}
	var ahead []*entry
	if l := q.groups[f.group]; l != nil {
		ahead = l.appendLive(nil)
	}
	ahead = append(ahead, q.waits.group(f.group)...)
	retry := -1
	if f.key != "" {
		retry = slices.IndexFunc(ahead, func(e *entry) bool { return e.msg.IdempotencyKey == f.key })
	}
	if retry >= 0 {
		ahead = ahead[:retry]
	}
	for _, e := range ahead {
		if e.lane != nil {
			q.remove(e)
		} else {
			q.waits.remove(e)
		}
		held = append(held, heldEntry{e: e, err: answer})
	}
	if retry >= 0 {
		return held, false
	}
	// A pause already set (by a refusal) names a message admitted after
	// this one: this one's retry must come first.
	q.setPause(f, now)
	return held, true
}

// pauseNew pauses f.group after its delivery keyed f.key was refused (the
// queue was full) at now, unless the group is paused already. The group's
// queued entries stay: they were admitted before the refused one and go
// first. Without the pause, a later delivery of the group that finds room
// would be stored before the refused one's retry.
func (q *queue) pauseNew(f groupFailure, now int64) bool {
	if _, ok := q.paused.m[f.group]; ok {
		return false
	}
	q.setPause(f, now)
	return true
}

// setPause records f.group's pause from now.
func (q *queue) setPause(f groupFailure, now int64) {
	q.setPauseFor(f, now, q.s.pauseMax)
}

// setPauseFor records f.group's pause from now, for d.
func (q *queue) setPauseFor(f groupFailure, now, d int64) {
	if q.paused.m == nil {
		q.paused.m = make(map[string]pause)
	}
	until := now + d
	if now > math.MaxInt64-d {
		until = math.MaxInt64
	}
	q.paused.m[f.group] = pause{key: f.key, until: until}
	q.paused.minUntil = min(q.paused.minUntil, until)
}

// takePauses removes the pauses still running at now and returns them,
// sorted by group, each with the time it has left: the destination moves
// to another instance (cluster mode's hand-off), which adopts them.
func (q *queue) takePauses(now int64) []messages.PausedGroup {
	q.expirePauses(now)
	if len(q.paused.m) == 0 {
		return nil
	}
	out := make([]messages.PausedGroup, 0, len(q.paused.m))
	for g, p := range q.paused.m {
		out = append(out, messages.PausedGroup{Group: g, Key: p.key, Left: time.Duration(p.until - now)})
	}
	slices.SortFunc(out, func(a, b messages.PausedGroup) int { return strings.Compare(a.Group, b.Group) })
	q.paused = pauses{minUntil: math.MaxInt64}
	return out
}

// adoptPauses pauses the groups another instance handed over, from now for
// the time each had left there (at most GroupPauseMax), so that their next
// deliveries wait for the failed messages' retries here too. A group
// paused here already keeps its own pause, and one with no time left is
// not paused. The groups' queued entries, if any, stay: they were admitted
// before the hand-over. A destination without StrictGroups pauses nothing.
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
		q.setPauseFor(groupFailure{group: p.Group, key: p.Key}, now, min(int64(p.Left), q.s.pauseMax))
	}
}

// checkPaused says whether e's group is paused at now: err is the answer
// e gets if it is. A delivery carrying the failed entry's key resumes the
// group and is admitted (resumed true), and so is any delivery once the
// pause has run out.
func (q *queue) checkPaused(e *entry, now int64) (err *messages.GroupPausedError, resumed bool) {
	g := e.msg.Group
	if g == "" || len(q.paused.m) == 0 {
		return nil, false
	}
	p, ok := q.paused.m[g]
	if !ok {
		return nil, false
	}
	if now >= p.until || (p.key != "" && e.msg.IdempotencyKey == p.key) {
		delete(q.paused.m, g)
		return nil, true
	}
	return &messages.GroupPausedError{Group: g, Key: p.key}, false
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
// not let a paused group's followers overtake the failed entry's retry.
func (p pauses) clone() pauses {
	c := pauses{minUntil: p.minUntil}
	if len(p.m) > 0 {
		c.m = make(map[string]pause, len(p.m))
		for g, v := range p.m {
			c.m[g] = v
		}
	}
	if c.m == nil {
		c.minUntil = math.MaxInt64
	}
	return c
}
