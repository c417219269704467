package adversary_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/ankusa/sinkbatch/messages"
)

// movePauses is the "pausemove" feature: while the traffic runs it takes a
// destination's paused groups and adopts them back, adopts pauses of its
// own (groups the callers use, keys they may or may not retry), resumes
// and lists groups, on random codec values, the bad ones included: as
// cluster mode does when a destination moves. Each call must return by its
// ctx (an adoption waits for the batcher to take it, through restarts and
// idle stops); the round's own checks (every caller answered once, Stop's
// drain, idle stops) see the adoptions travel the routes as deliveries.
func (r *round) movePauses(seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 77))
	for !r.trafficEnd.Load() {
		time.Sleep(time.Duration(rng.IntN(5000)) * time.Microsecond)
		d := r.dests[rng.IntN(len(r.dests))]
		c := d.values[rng.IntN(len(d.values))]
		const within = 2 * time.Second
		ctx, cancel := context.WithTimeout(context.Background(), within)
		start := time.Now()
		op := rng.IntN(4)
		switch op {
		case 0:
			taken, err := r.inst.TakePausedGroups(ctx, c)
			if err == nil && rng.IntN(2) == 0 {
				_ = r.inst.AdoptPausedGroups(ctx, c, taken)
			}
		case 1:
			var ps []messages.PausedGroup
			for range 1 + rng.IntN(3) {
				ps = append(ps, messages.PausedGroup{
					Group: fmt.Sprintf("r%d", rng.IntN(4)),
					Key:   fmt.Sprintf("k%d", rng.IntN(1000)),
					Left:  time.Duration(rng.IntN(50)) * time.Millisecond,
				})
			}
			_ = r.inst.AdoptPausedGroups(ctx, c, ps)
		case 2:
			_ = r.inst.ResumeGroup(ctx, c, fmt.Sprintf("r%d", rng.IntN(4)))
		default:
			_, _ = r.inst.PausedGroups(ctx, c)
		}
		cancel()
		if took := time.Since(start); took > within+r.slack {
			r.violate("pausemove-hangs", "pause operation %d on %s took %v, past its %v ctx", op, d.name, took, within)
		}
	}
}
