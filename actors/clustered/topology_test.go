package clustered

import (
	"fmt"
	"testing"

	"github.com/asynkron/protoactor-go/cluster"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func members(ports ...int) []*cluster.Member {
	out := make([]*cluster.Member, len(ports))
	for i, p := range ports {
		out[i] = &cluster.Member{Id: fmt.Sprint("m", p), Host: "127.0.0.1", Port: int32(p), Kinds: []string{Kind}}
	}
	return out
}

// ownerWithout names the owner a destination gets once a member has left:
// for the destinations that member owned, the owner the topology without it
// gives (where a leaving member hands its pauses over); for the others,
// their owner now. It never names the member that leaves.
func TestOwnerWithoutIsTheOwnerOnceTheMemberLeft(t *testing.T) {
	var now, after topology
	now.update(1, members(7001, 7002, 7003))
	after.update(2, members(7001, 7003))
	leaver := "127.0.0.1:7002"
	moved := 0
	for i := range 300 {
		d := fmt.Sprint("dest-", i)
		got := now.ownerWithout(d, leaver)
		require.Equal(t, after.owner(d), got, d)
		assert.NotEqual(t, leaver, got)
		if now.owner(d) == leaver {
			moved++
		} else {
			assert.Equal(t, now.owner(d), got, "%s moved although its owner stays", d)
		}
	}
	assert.Positive(t, moved)
	var alone topology
	alone.update(1, members(7002))
	assert.Empty(t, alone.ownerWithout("dest-0", leaver), "no member is left to own it")
}
