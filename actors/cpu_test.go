package actors_test

import (
	"syscall"
	"time"
)

// cpuClock reads the process's user+system CPU time.
type cpuClock struct{ at time.Duration }

func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (c *cpuClock) read()                { c.at = cpuNow() }
func (c *cpuClock) since() time.Duration { return cpuNow() - c.at }
