package clustered

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"github.com/ankusa/sinkbatch/codec"
)

// directShards is how many locks the deliveries admitted directly are
// spread over: enough that a member's callers and its batcher, answering,
// seldom meet on one.
const directShards = 32

// directCalls are the deliveries this member's callers admitted directly
// (Node.here) that wait for their answer. A waiting call is in one shard,
// put there and taken out by its own caller; it is answered exactly once,
// by whoever first swaps its token out (directCalls.answer): the instance's
// answer, Leave giving up (fail), the member being cut off (fail), or its
// caller that stopped waiting (directCalls.abandon). Nobody looks a call up
// by number, so answering one takes no lock: the shards are there only for
// fail to find every call that waits. Safe for concurrent use.
type directCalls struct {
	// quit: Leave gave up (fail with quit). A call added then is not
	// admitted. Atomic.
	quit   atomic.Bool
	shards [directShards]directShard
}

type directShard struct {
	mu    sync.Mutex
	head  *directCall // a list through directCall.prev and directCall.next; guarded by mu
	added uint64      // calls ever added, for tests; guarded by mu
	_     [40]byte
}

// add puts c, a direct delivery about to be admitted, in a shard, with a
// token of its own that its answer must present. It returns the token, and
// false if Leave gave up before: c must not be admitted then; its caller
// abandons it (which may find it answered nodeQuit) and takes it out.
func (dc *directCalls) add(c *directCall) (token uint64, ok bool) {
	c.token++
	token = c.token
	c.pending.Store(token)
	c.shard = uint8(rand.Uint32N(directShards))
	s := &dc.shards[c.shard]
	s.mu.Lock()
	c.prev, c.next = nil, s.head
	if s.head != nil {
		s.head.prev = c
	}
	s.head = c
	s.added++
	s.mu.Unlock()
	// A fail with quit that ran before c was in its shard is seen here.
	return token, !dc.quit.Load()
}

// remove takes c out of its shard; its caller does, before it recycles c.
func (dc *directCalls) remove(c *directCall) {
	s := &dc.shards[c.shard]
	s.mu.Lock()
	if c.prev != nil {
		c.prev.next = c.next
	} else {
		s.head = c.next
	}
	if c.next != nil {
		c.next.prev = c.prev
	}
	s.mu.Unlock()
	c.prev, c.next = nil, nil
}

// answer answers c with r if it still waits under token: a call whose
// caller stopped waiting, or that was answered otherwise, or that now
// serves another delivery, is left alone.
func (dc *directCalls) answer(c *directCall, token uint64, r codec.Result) {
	if c.pending.CompareAndSwap(token, 0) {
		c.answer <- directAnswer{outcome: answered, result: r}
	}
}

// abandon is c's caller no longer waiting; it reports whether c still
// waited. If not, its answer is on its way, and the caller must take it
// before it recycles c.
func (dc *directCalls) abandon(c *directCall) bool {
	return c.pending.CompareAndSwap(c.token, 0)
}

// fail answers every call that waits with o; with quit, so is every call
// added from now on (add reports it).
func (dc *directCalls) fail(o outcome, quit bool) {
	if quit {
		dc.quit.Store(true)
	}
	for i := range dc.shards {
		s := &dc.shards[i]
		s.mu.Lock()
		for c := s.head; c != nil; c = c.next {
			if t := c.pending.Load(); t != 0 && c.pending.CompareAndSwap(t, 0) {
				c.answer <- directAnswer{outcome: o}
			}
		}
		s.mu.Unlock()
	}
}

// added is how many calls were ever added.
func (dc *directCalls) added() uint64 {
	var n uint64
	for i := range dc.shards {
		s := &dc.shards[i]
		s.mu.Lock()
		n += s.added
		s.mu.Unlock()
	}
	return n
}
