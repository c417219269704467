package batcher

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ankusa/sinkbatch/messages"
)

// A Room holds the entry of the first admission of its Deliver only: a
// Deliver sent again (or a copy of it) gets an entry of its own, or two
// queue positions would share one entry.
func TestRoomServesOneDelivery(t *testing.T) {
	room := &Room{}
	d := &messages.Deliver{Ref: &Direct{Room: room}}
	first := entryFor(d)
	assert.Same(t, &room.e, first)
	again := entryFor(d)
	assert.NotSame(t, first, again)
	copied := *d
	assert.NotSame(t, first, entryFor(&copied))

	assert.NotNil(t, entryFor(&messages.Deliver{Ref: &Direct{}}), "no Room: a new entry")
	assert.NotNil(t, entryFor(&messages.Deliver{}), "no Direct: a new entry")
}
