// Package outbox relays the rows of a transactional outbox in PostgreSQL to
// SQS or Pub/Sub through sinkbatch: a service adds rows with Enqueue in the
// transaction that makes its business change, and any number of Relays
// deliver them, each row as its own caller, so that many rows go out in one
// request and each row learns its own message's result.
//
// # Setup
//
// CreateTable creates the table and its indexes. Build a Sender: Local over
// an actors.Instance and a map of destination names to codecs (give each
// codec Tuning.StrictGroups for the order below), or Cluster over a
// clustered.Node. New a Relay with a pgxpool.Pool and the Sender, and Run
// it until its context ends.
//
// # Delivery
//
// A relay claims rows in row order (id order), a batch at a time, with
// SELECT … FOR UPDATE SKIP LOCKED and a lease: the claim sets the row's
// owner, claim and lease_until (the end of the lease, Config.Lease),
// counts an attempt, and records in the side table table_leases a lease
// of each group it took rows of. Each claimed row is delivered as its own
// message (IdempotencyKey: the row's, or its id when empty) with a
// deadline before its lease ends, and its result is written, in batches
// (one statement per kind of result, in the next claim's round trip or
// after Config.FlushInterval or FlushRows), only once it is known:
//   - accepted: the row is deleted, or with Config.KeepSent marked sent
//     (state 1) with its message id, and deleted KeepSent later;
//   - permanent (codec.IsPermanent): the row is dead (state 2) with the
//     error in last_error, kept for a person to read; also after
//     Config.MaxAttempts retryable failures, when set;
//   - *messages.GroupPausedError, *messages.RetryAfterError: put back
//     without counting the attempt, after PausedDelay (jittered) or After;
//   - any other error (a deadline that passed included): put back after a
//     full-jitter backoff,
//     uniform in [0, min(MaxBackoff, Backoff·2^(attempts-1))).
//
// A result is written only while the claim that made it still holds the
// row; an acceptance is written whoever holds the row. Claims hold a
// transaction-level advisory lock on the table exclusively and result
// writes hold it shared, so a claim never sees half of a result write.
// Delivery is at least once: a row is sent again when its relay dies, or
// its lease ends, before its result is written. A row whose lease ended is
// claimed again by any relay, its attempts one higher.
//
// # Order
//
// The rows of one (destination, group) reach the destination in row order
// of their first appearances (a crash can repeat a row), across crashes
// and relays, provided the destination's codec has Tuning.StrictGroups and
// rows of one group are added through Enqueue (which serialises the
// transactions that add to one group, so ids follow commit order). Rows
// with an empty Group are unordered. How it holds:
//   - A claim takes a row only if no earlier unsent row of its group
//     waits out a backoff, and no other relay's live lease on the group
//     began at an earlier row; so one relay at a time holds a group's
//     unsent rows, and a row put back blocks the rows after it until it
//     is claimed again, first. A claim's lease on a group lasts until the
//     last of the claim's rows of the group is written (the same
//     transaction deletes it), or until the lease ends.
//   - A relay hands a group's rows to its OrderedSender in row order from
//     one goroutine, many at once, so a hot group still fills requests;
//     sinkbatch keeps admission order within a group and, with
//     StrictGroups, answers GroupPausedError to the group's later rows
//     after a retryable failure, until the failed row (by its idempotency
//     key) comes again, first.
//   - The rows of a group in flight share one deadline, so none is dropped
//     at its deadline while a later one is still sent; after any answer
//     other than success, the group's rows claimed since are put back
//     unsent until that answer, and every row of the group put back after
//     it, is written, and the relay's claims skip the group meanwhile. (A
//     relay sends its next claim while it begins the rows of the last, so
//     a claim can be under way as a group fails: the rows of the group it
//     brings are put back; were they not, or were later claims to take the
//     group's rows before they are written back, rows after them would go
//     first.)
//   - A relay that dies leaves the rows it held leased to it; they block
//     their groups until the lease ends, and are then claimed again in
//     row order. So do the rows of a claim the relay saw fail (the server
//     may have committed it): the relay takes a new owner id, and the
//     rows it does not know block its own later claims as another
//     relay's would.
//
// The destination sets one limit: in one SQS SendMessageBatch holding
// several entries of a group, an entry after a retryably failed one may
// be stored (see package actors, Flow). A Sender that is not an
// OrderedSender keeps one row of each group in flight.
//
// # Cost
//
// The database sees one claim per Config.ClaimBatch rows and up to three
// result writes per flush (sent, put back or dead, leases released),
// whatever the row count; under load the writes ride in the next claim's
// round trip, and the next claim is under way while the relay begins the
// rows of the last (one claim at a time). The claim walks a partial index of the unsent rows
// (state = 0) in id order and stops when it has its rows (its transaction
// turns off explicit sorts, so that a misjudged row count cannot turn the
// walk into a sort of every unsent row), so its cost follows what is
// unsent before it, not the table's size. It writes no indexed column, so
// that a claimed row's new version is a HOT update (the table keeps
// fillfactor 40 for it), and it finds the groups other relays hold in
// table_leases, not by reading their leased rows. Relay.ExplainClaim shows
// the claim's plan on a given table; Relay.Stats counts the statements.
//
// # Shutdown
//
// When Run's context ends the relay stops claiming, puts back the rows it
// had claimed but not handed to the Sender, waits for the answers of the
// rest (at most Lease), writes what it knows and returns. Rows still
// without an answer stay leased until their lease ends.
//
// # Metrics
//
// With Config.MeterProvider (never the global one), attribute table:
//
//	ankusa.sink_batch.outbox.claimed            int64 counter  {row}  rows claimed
//	ankusa.sink_batch.outbox.sent               int64 counter  {row}  rows accepted
//	ankusa.sink_batch.outbox.retried            int64 counter  {row}  rows put back
//	ankusa.sink_batch.outbox.dead               int64 counter  {row}  rows dead
//	ankusa.sink_batch.outbox.inflight           int64 gauge    {row}  rows being delivered
//	ankusa.sink_batch.outbox.oldest_unsent.age  float64 gauge  s      age of the oldest unsent row (read at collection)
//
// Relay.OldestUnsent reads the same age on demand.
//
// Package pgtest starts a throwaway PostgreSQL server for tests and demos.
package outbox
