package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rec makes an acknowledged record of group g, submitted at ms milliseconds
// and acknowledged at ack milliseconds after a common origin.
func rec(key, g string, submit, ack int) *record {
	t0 := time.Unix(1_000_000, 0)
	return &record{
		key: key, group: g, outcome: acked,
		submit: t0.Add(time.Duration(submit) * time.Millisecond),
		ackAt:  t0.Add(time.Duration(ack) * time.Millisecond),
	}
}

func TestOrderViolations(t *testing.T) {
	a := rec("a", "g", 0, 10)
	b := rec("b", "g", 20, 30) // submitted after a was acknowledged
	c := rec("c", "g", 5, 25)  // in flight together with a and b
	other := rec("x", "h", 40, 50)
	unacked := &record{key: "u", group: "g", outcome: gaveUp, submit: time.Unix(1_000_000, 0)}
	for _, tc := range []struct {
		name   string
		stored []*record
		want   int
	}{
		{"in order", []*record{a, c, b}, 0},
		{"acknowledged first, stored later", []*record{b, a}, 1},
		{"concurrent ones in either order", []*record{c, a, b}, 0},
		{"acknowledged first, stored after two", []*record{b, other, c, a}, 1},
		{"groups are independent", []*record{other, a, b}, 0},
		{"ungrouped messages are not checked", []*record{{key: "n", outcome: acked}, a}, 0},
		{"a message never acknowledged binds nothing", []*record{b, unacked, a}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, orderViolations(tc.stored))
		})
	}
}

func TestReadBack(t *testing.T) {
	a, b, c := rec("k/a", "g", 0, 10), rec("k/b", "g", 20, 30), rec("k/c", "g", 40, 50)
	failed := &record{key: "k/f", group: "g", outcome: gaveUp, submit: a.submit}
	d := &destination{name: "d", ordered: true, records: []*record{a, b, c, failed}}
	d.readBack = func(context.Context) ([]stored, error) {
		return []stored{
			{id: "1", key: "k/a"},
			{id: "2", key: "k/f"},                    // stored, though its caller gave up
			{id: "3", key: "k/a"},                    // a retry stored again
			{id: "4", key: "k/other"},                // sent by nobody here
			{id: "5", key: "k/c", redelivered: true}, // out of the order check
			// k/b is missing
		}, nil
	}
	c2 := readBack(context.Background(), d)
	require.True(t, c2.read)
	assert.Equal(t, check{read: true, stored: 5, lost: 1, duplicates: 1, unknown: 1, unacked: 1, redelivered: 1}, c2)
}
