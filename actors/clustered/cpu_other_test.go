//go:build !race && !unix

package clustered_test

import "time"

// cpuTime is zero where getrusage is missing: the benchmarks then report
// no CPU figures worth reading.
func cpuTime() time.Duration { return 0 }
