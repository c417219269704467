package clusterpb

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
)

// Strings that are not UTF-8 are written and read as they are: protobuf's
// proto3 refused to write one, and with it the whole batch of deliveries
// or answers it was in (the file turns the check off).
func TestStringsNeedNotBeUTF8(t *testing.T) {
	bad := string([]byte{0xff, 0xfe, 'x'})
	for _, m := range []proto.Message{
		&DeliverBatch{Destination: "d", Requests: []*DeliverRequest{
			{Tenant: bad, Group: bad, IdempotencyKey: bad, Attributes: map[string]string{bad: bad}, TraceParent: bad, TraceState: bad},
			{Group: "fine", Call: 2},
		}},
		&DeliverReplies{Replies: []*DeliverReply{
			{Call: 1, Id: bad, Sequence: bad},
			{Call: 2, Error: &Error{Text: bad, Entry: &EntryError{Code: bad, Message: bad}, GroupPaused: &GroupPaused{Group: bad, Key: bad}}},
		}},
		&HandoffDone{Destination: "d", Member: "m", Paused: []*PausedGroup{{Group: bad, Key: bad, LeftNanos: 5}}},
		&GroupsRequest{Destination: "d", Group: bad, Resume: true},
		&GroupsReply{Paused: []string{bad, "fine"}, Error: &Error{Text: bad}},
	} {
		b, err := proto.Marshal(m)
		require.NoError(t, err)
		back := m.ProtoReflect().New().Interface()
		require.NoError(t, proto.Unmarshal(b, back))
		assert.True(t, proto.Equal(m, back), "read back %v, want %v", back, m)
	}
}
