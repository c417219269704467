package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// report is everything the end of the run prints.
type report struct {
	dests    []*destination
	stats    map[string]*sinkStats
	load     *load
	plan     plan
	samples  []sample
	elapsed  time.Duration
	stopErr  error
	stopTook time.Duration
	// limits are the adaptive destinations' in-flight limits when the
	// load ended, by sink.
	limits map[string]int64
}

// check is the read back of one destination.
type check struct {
	read        bool
	stored      int // messages the destination holds
	lost        int // acknowledged, not stored
	duplicates  int // stored more than once
	unknown     int // stored, but no caller sent it (another run's?)
	unacked     int // stored, though its caller got no success
	violations  int
	redelivered int // handed out again after a receive whose answer was lost
	readErr     error
	poisonFound bool
}

// print writes the report and reports whether the run kept its guarantees.
func (r *report) print(ctx context.Context, w io.Writer) bool {
	fmt.Fprintf(w, "\nload ran %v; stop: ", r.elapsed.Round(time.Millisecond))
	if r.stopErr != nil {
		fmt.Fprintf(w, "FAILED after %v: %v\n", r.stopTook.Round(time.Millisecond), r.stopErr)
	} else {
		fmt.Fprintf(w, "every delivery answered, instance stopped in %v\n", r.stopTook.Round(time.Microsecond))
	}

	checks := make([]check, len(r.dests))
	for i, d := range r.dests {
		checks[i] = readBack(ctx, d)
	}

	fmt.Fprintln(w, "\nper destination (requests, entries/request, bisections and refused from the OpenTelemetry SDK; latency from first attempt to success):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "destination\tdelivered\trequests\tentries/req\tbisections\trefused\tretried\tfailed\tp50\tp99\tstored\tdups\tlost\torder\t")
	var total check
	for i, d := range r.dests {
		st := r.stats[d.name]
		if st == nil {
			st = &sinkStats{}
		}
		delivered, retried, failed, lat := tally(d.records)
		perReq := "-"
		if st.requests > 0 {
			perReq = fmt.Sprintf("%.1f", float64(st.entries)/float64(st.requests))
		}
		c := checks[i]
		stored, dups, lost, order := "-", "-", "-", "-"
		if c.read {
			stored, dups, lost = fmt.Sprint(c.stored), fmt.Sprint(c.duplicates), fmt.Sprint(c.lost)
			if d.ordered {
				order = fmt.Sprint(c.violations)
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			d.name, delivered, st.requests, perReq, st.bisections, st.refused, retried, failed,
			ms(percentile(lat, 0.50)), ms(percentile(lat, 0.99)), stored, dups, lost, order)
		total.lost += c.lost
		total.duplicates += c.duplicates
		total.violations += c.violations
		total.unknown += c.unknown
		total.unacked += c.unacked
		total.redelivered += c.redelivered
	}
	_ = tw.Flush()
	for _, d := range r.dests {
		fmt.Fprintf(w, "  %-16s %s", d.name, d.about)
		if d.wireRequests != nil {
			// Counted at the wire: a check on the SDK's count, which
			// is of requests as the batcher made them (a codec could
			// split a batch into several calls).
			fmt.Fprintf(w, "; the server got %d Publish calls", d.wireRequests())
		}
		fmt.Fprintln(w)
	}

	r.printTenants(w)
	fmt.Fprintln(w)
	r.printEvents(w, checks)

	fmt.Fprintln(w)
	var notRead []string
	for i, d := range r.dests {
		switch {
		case checks[i].readErr != nil:
			notRead = append(notRead, fmt.Sprintf("%s (read back failed: %v)", d.name, checks[i].readErr))
		case !checks[i].read:
			notRead = append(notRead, fmt.Sprintf("%s (%s)", d.name, d.noRead))
		}
	}
	if len(notRead) > 0 {
		fmt.Fprintf(w, "not read back, so not checked: %s\n", strings.Join(notRead, "; "))
	}
	if total.unacked > 0 {
		fmt.Fprintf(w, "stored without a success answer: %d (sent, but the caller's answer was an error: a crash, a deadline)\n", total.unacked)
	}
	if total.redelivered > 0 {
		fmt.Fprintf(w, "redelivered during the read back: %d (a receive whose answer was lost: counted once; left out of the order check)\n", total.redelivered)
	}
	if total.unknown > 0 {
		fmt.Fprintf(w, "stored but sent by no caller of this run: %d\n", total.unknown)
	}
	fmt.Fprintf(w, "duplicates: %d (at-least-once: a retry of a message that had in fact been stored)\n", total.duplicates)
	fmt.Fprintf(w, "lost: %d\n", total.lost)
	fmt.Fprintf(w, "order violations: %d\n", total.violations)
	readFailed := slices.ContainsFunc(checks, func(c check) bool { return c.readErr != nil })
	return total.lost == 0 && total.violations == 0 && r.stopErr == nil && !readFailed
}

// printTenants shows each tenant's share and latency over every
// destination: the flooding tenant must not slow the others down much.
func (r *report) printTenants(w io.Writer) {
	type row struct {
		acked, refused int
		lat            []time.Duration
	}
	rows := map[string]*row{}
	for _, d := range r.dests {
		for _, rec := range d.records {
			t := rows[rec.tenant]
			if t == nil {
				t = &row{}
				rows[rec.tenant] = t
			}
			if rec.outcome == acked {
				t.acked++
				t.lat = append(t.lat, rec.ackAt.Sub(rec.submit))
			}
		}
	}
	names := make([]string, 0, len(rows))
	for n := range rows {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "\nper tenant (every destination):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tenant\tdelivered\tp50\tp99\t")
	for _, n := range names {
		t := rows[n]
		slices.Sort(t.lat)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t\n", n, t.acked, ms(percentile(t.lat, 0.5)), ms(percentile(t.lat, 0.99)))
	}
	_ = tw.Flush()
}

// printEvents says how each scripted event went.
func (r *report) printEvents(w io.Writer, checks []check) {
	l := r.load
	l.mu.Lock()
	poison, crash := l.special[poisonKey], l.special[crashKey]
	l.mu.Unlock()

	var audit, events, burst, strict, block, adaptive *destination
	var strictCheck check
	var auditCheck check
	for i, d := range r.dests {
		switch d.name {
		case destAudit:
			audit, auditCheck = d, checks[i]
		case destEvents:
			events = d
		case destBurst:
			burst = d
		case destStrict:
			strict, strictCheck = d, checks[i]
		case destBlock:
			block = d
		case destAdaptive:
			adaptive = d
		}
	}
	switch {
	case poison == nil:
		fmt.Fprintln(w, "poison: not sent (only the embedded Pub/Sub server refuses it)")
	default:
		where := "not read back"
		if auditCheck.read {
			where = "not stored"
			if auditCheck.poisonFound {
				where = "STORED"
			}
		}
		fmt.Fprintf(w, "poison: %s after %d attempt(s), %s; the batcher bisected %d time(s) to single it out\n   answer: %v\n",
			describe(poison), poison.attempts, where, r.statsOf(audit).bisections, poison.err)
	}
	if crash == nil {
		fmt.Fprintln(w, "crash: not reached")
	} else {
		fmt.Fprintf(w, "codec panic: %s's codec panicked in Size for the marked message: %s after %d attempt(s) (codec.ErrCodecPanic); %d other answers were ErrBatcherDown\n",
			events.name, describe(crash), crash.attempts, events.batcherDown.Load())
	}
	fmt.Fprintf(w, "burst: %d callers at once on %s: %d refusals (RetryAfterError), each retried after its retry-after\n",
		r.plan.burstSize, burst.name, burst.refused.Load())
	fmt.Fprintf(w, "block: %d callers at once on %s (WhenFull Block): %d refusals; up to %d deliveries waited for room\n",
		r.plan.burstSize, block.name, block.refused.Load(), l.waitingPeak.Load())
	order := "not read back"
	if strictCheck.read {
		order = fmt.Sprintf("%d stored out of order", strictCheck.violations)
	}
	fmt.Fprintf(w, "strict groups: %s failed %d requests on purpose; %d deliveries answered GroupPausedError until their group's failed message was retried; %s\n",
		strict.name, strict.failing.Failed.Load(), strict.paused.Load(), order)
	if lim, ok := r.limits[adaptive.name]; ok {
		fmt.Fprintf(w, "adaptive: %s's in-flight limit was %d of MaxInflight 16 when the load ended\n", adaptive.name, lim)
	} else {
		fmt.Fprintf(w, "adaptive: %s's in-flight limit was not reported\n", adaptive.name)
	}

	// The batcher count before, during and after the audit destination's
	// pause.
	ps := l.pause
	if ps == nil || !ps.stopSeen {
		fmt.Fprintf(w, "idle: no idle stop of %s seen during its pause\n", audit.name)
		return
	}
	before, during, after := 0, -1, 0
	for _, s := range r.samples {
		switch {
		case s.at < ps.from:
			before = max(before, s.batchers)
		case s.at < ps.until:
			if during < 0 || s.batchers < during {
				during = s.batchers
			}
		default:
			after = max(after, s.batchers)
		}
	}
	again := "started again when it resumed"
	if after <= during {
		again = "had not started again by the end"
	}
	fmt.Fprintf(w, "idle: %s paused %v-%v; its batcher stopped after %v without traffic and %s (batchers %d -> %d -> %d)\n",
		audit.name, ps.from.Round(10*time.Millisecond), ps.until.Round(10*time.Millisecond), r.plan.idleTimeout, again, before, during, after)
}

func (r *report) statsOf(d *destination) *sinkStats {
	if s := r.stats[d.name]; s != nil {
		return s
	}
	return &sinkStats{}
}

func describe(rec *record) string {
	switch rec.outcome {
	case acked:
		return "delivered"
	case permanent:
		return "refused for good"
	case gaveUp:
		return "given up"
	}
	return "unanswered"
}

// tally counts d's callers' outcomes and returns the sorted latencies of the
// successes.
func tally(recs []*record) (delivered, retried, failed int, lat []time.Duration) {
	for _, r := range recs {
		switch r.outcome {
		case acked:
			delivered++
			lat = append(lat, r.ackAt.Sub(r.submit))
		case permanent, gaveUp:
			failed++
		}
		if r.attempts > 1 {
			retried++
		}
	}
	slices.Sort(lat)
	return delivered, retried, failed, lat
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(int(q*float64(len(sorted))), len(sorted)-1)]
}

func ms(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	if d >= time.Second {
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}

// readBack reads d and checks it against what its callers were told.
func readBack(ctx context.Context, d *destination) check {
	var c check
	if d.readBack == nil {
		return c
	}
	msgs, err := d.readBack(ctx)
	if err != nil {
		c.readErr = err
		return c
	}
	c.read = true
	c.stored = len(msgs)
	byKey := make(map[string]*record, len(d.records))
	for _, r := range d.records {
		byKey[r.key] = r
	}
	seen := make(map[string]bool, len(msgs))
	var first []*record // by first appearance, in the destination's order
	for _, m := range msgs {
		if m.key == poisonKey {
			c.poisonFound = true
		}
		if seen[m.key] {
			c.duplicates++
			continue
		}
		seen[m.key] = true
		r := byKey[m.key]
		switch {
		case r == nil:
			c.unknown++
			continue
		case r.outcome != acked:
			c.unacked++
		}
		if m.redelivered {
			// Its place in the group is where the queue put it back, not
			// where it was stored: leave it out of the order check.
			c.redelivered++
			continue
		}
		first = append(first, r)
	}
	for _, r := range d.records {
		if r.outcome == acked && !seen[r.key] {
			c.lost++
		}
	}
	if d.ordered {
		c.violations = orderViolations(first)
	}
	return c
}

// orderViolations counts the messages stored before a message of their
// group that had been acknowledged before they were first submitted. stored
// is in the destination's order of first appearance. Times are taken on the
// callers' side of Deliver (submit before the first call, ackAt after the
// successful one returned), so a violation found here is a real one.
func orderViolations(stored []*record) int {
	groups := map[string][]*record{}
	for _, r := range stored {
		if r.group != "" {
			groups[r.group] = append(groups[r.group], r)
		}
	}
	n := 0
	for _, list := range groups {
		// Walk from the end, keeping the earliest acknowledgement among
		// the messages stored later.
		var earliest time.Time
		for i := len(list) - 1; i >= 0; i-- {
			r := list[i]
			if !earliest.IsZero() && earliest.Before(r.submit) {
				n++
			}
			if r.outcome == acked && (earliest.IsZero() || r.ackAt.Before(earliest)) {
				earliest = r.ackAt
			}
		}
	}
	return n
}
