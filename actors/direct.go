package actors

import (
	"github.com/ankusa/sinkbatch/actors/batcher"
	"github.com/ankusa/sinkbatch/codec"
)

// This file is what a layer built on the front door (cluster mode's owner,
// which admits the deliveries of other members) needs of the batcher's
// direct path, so that nothing outside package actors imports
// actors/batcher. Each name is the batcher's own type; their contracts are
// documented there.

// Direct, as a messages.Deliver's Ref, names the Listener the batcher
// answers and asks whether the call still waits, with no process-registry
// lookup (see batcher.Direct).
type Direct = batcher.Direct

// Listener is a reply process that serves many calls (see
// batcher.Listener): Listening must be quick and must not block or panic.
type Listener = batcher.Listener

// Forgetter is a Listener told when a batcher drops a call's entry
// unanswered because its caller stopped listening (see batcher.Forgetter).
type Forgetter = batcher.Forgetter

// Room is memory for one delivery's entry, allocated with the call that
// sends it (see batcher.Room).
type Room = batcher.Room

// CheckCodec reports why no batcher would take c (its Limits or Tuning are
// invalid), as Deliver would answer its first delivery: a permanent error
// naming the value that is wrong. It may panic where c's Limits or Tuning
// do.
func CheckCodec(c codec.Codec) error {
	_, err := batcher.Resolve(c, DefaultSinkConcurrency)
	return err
}
