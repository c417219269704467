// Package clustered is sinkbatch's cluster mode: every delivery to a
// destination, from any member of a protoactor-go cluster, is batched by one
// batcher in the whole cluster, so batches fill from every member's traffic
// and a group's order holds cluster-wide.
//
// # Setup
//
// Each member starts an actors.Instance, builds its Destinations (the same
// names on every member, each codec built from that member's own config and
// credentials), calls New, passes Node.Kind to cluster.WithKinds, starts the
// cluster member with the disthash identity lookup, and calls Node.Attach.
// Deliver with Node.Deliver (or send *Deliver to Node.PID from an actor);
// leave with Node.Leave, then stop the instance.
//
// Give the remote a small initial queue per connection:
// remote.WithEndpointWriterQueueSize(1024). protoactor's default, 1,000,000,
// allocates a ring of 16 MB of pointers for every member a member talks to,
// which every garbage collection then scans; the ring grows when it fills.
//
// # How a delivery travels
//
// A destination's name is the identity of a grain of Kind. The member the
// rendezvous hash of the latest topology names (the same hash protoactor's
// disthash lookup uses) owns it: its grain hands each delivery to the
// member's own Instance, whose batcher batches it with everything else the
// grain admitted, and the answer goes back to the caller. Requests are
// protobuf messages (package clusterpb). A member's deliveries to one
// destination travel in batches, and so do an owner's answers to one
// member: the first delivery is sent at once, and those made while its
// message waits to be written go in the next one, in the order they were
// made. Each keeps its own answer (admitted, refused, or "not the owner"),
// as if it had travelled alone. A delivery made on the owner itself skips
// all that while the grain admits: its caller counts it in the member's
// ledger, as the grain would, and hands it to the Instance directly. A
// hand-off request, the grain yielding, a newer topology or Leave closes
// that door at once, and such callers go through the grain again.
//
// Every answer keeps its meaning across the wire: errors.Is matches the same
// sentinels (messages.ErrStopped, ErrBatcherDown, ErrNilCodec,
// ErrNotDeliver, actors.ErrNilContext, context errors, codec.ErrTooLarge,
// ErrRefused, ErrCodecPanic, ErrResultCount, ErrThrottled), errors.As finds
// *messages.RetryAfterError, *codec.EntryError and
// *messages.GroupPausedError with their fields, and codec.IsPermanent gives
// the same answer. The caller's deadline travels as the time left when its
// batch is written (clocks differ between members; durations do not), so the
// owner's batcher never sends a message after its caller's deadline, give or
// take the batch's transit. A delivery whose deadline passed before its
// batch was written is not sent. A cancellation travels too: a caller
// whose ctx is cancelled before its deadline is answered ErrUnreachable
// wrapping context.Canceled (its message may have been sent), and the owner
// drops its message unless the batcher sent it before the cancel arrived. The caller's span (the OpenTelemetry
// span in Deliver's ctx) travels too: when the owner's instance traces, the
// delivery's create span is its child. Strings need not be UTF-8 (the codec
// judges them, as in a local instance); an error's texts travel cut to 8 KiB.
//
// gRPC refuses a message above its receiver's limit (grpc.MaxRecvMsgSize,
// 4 MiB by default) by dropping the connection, and everything on it. So a
// member writes one batch of deliveries and one of answers at a time to
// each other member, a batch of deliveries takes at most half of
// Config.MaxWireBytes (the rest goes in the next), and a message too large
// for that alone is refused at once, from every member, with an error that
// wraps codec.ErrTooLarge. To carry larger messages (Pub/Sub takes 10 MB),
// give every member's remote ReceiveLimit(n) and set MaxWireBytes to n.
//
// A caller retries by itself only what was certainly not admitted: a grain
// that answered "not the owner", a grain that is gone (dead letter), a member
// it could not dial, a delivery still waiting to be written when its owner
// was cut off. It never retries past its deadline, and never retries a
// request that may have been admitted. Such a request's silence until the
// deadline, or its member leaving the cluster first, is answered
// ErrUnreachable (wrapping ctx.Err() when the deadline was the cause): the
// message may or may not have been sent, and delivering it again with the
// same idempotency key is safe.
//
// protoactor's own grain calls (Cluster.Request) are not used: they take no
// context, retry timeouts on their own and log every failure at Error. The
// grain is written by hand: generated grains answer inside Receive, which
// would let one request through at a time.
//
// # Guarantees
//
// Stable membership: one grain, hence one batcher, per destination in the
// whole cluster. Everything the single-instance batcher promises (tenant
// fairness, queue bounds, admission order within a group, at most one
// request of a group in flight) holds cluster-wide.
//
// A member joins or leaves gracefully: ownership moves by hand-off. protoactor
// activates a grain wherever it is asked and stops grains only after a
// topology change, so the grain checks ownership itself: it admits only
// while its member owns the destination in the latest topology it has seen,
// and a grain that finds it does not refuses ("not the owner", so callers
// look again) and stops. Before a new grain admits anything it asks every
// other member to hand the destination off; each one makes its grain (if
// any) stop admitting, waits until its instance has answered everything
// that grain admitted, and only then says it is done. So no group ever has
// two requests in flight and admission order holds across the move.
// The price is a pause for the destinations that move. On a join, their
// deliveries bounce between members until every member has seen the new
// topology, and the new owner then waits for the old one to drain what it
// holds. On a leave, the leaving member stops admitting, drains, and only
// then leaves the topology: its destinations' deliveries bounce from the
// moment it stops admitting until every member has seen it go. Before it
// leaves the topology, each other member has its answers and its word that
// it left (a member that takes part in leases confirms by answering a
// probe sent behind the word; Leave waits at most 2 s for that): a call
// still waiting for it then was never admitted, and goes to the next
// owner.
//
// Tuning.StrictGroups pauses move with their destination. A group paused
// on the old owner (a message of it failed retryably, and neither its
// retry, a resume nor GroupPauseMax has ended the pause) is paused on the
// new owner, for the time it had left, before the new owner admits
// anything: on a join, the old owner's HandoffDone carries its pauses; on a
// leave, the leaving member sends them to each destination's next owner
// before it says it left. The new owner's grain keeps taking deliveries
// (and holding them) while its instance takes the pauses, and admits once
// they are in; the destination is not handed off again before that. Pauses
// that reach a grain no longer waiting for them (it yielded to yet another
// owner, or gave up on their member) are passed on to the owner in its
// member's latest topology, not dropped. A pause is kept on the owner's
// instance: resume or list paused groups with Node.ResumeGroup and
// Node.PausedGroups, which ask the owner from any member
// (actors.Instance.ResumeGroup reaches only the member's own instance). A
// crashed member's pauses are lost with it, and so are those of a member
// whose Leave gave up (its ctx ended).
//
// A new owner does not wait for a member it cannot talk to: one that left
// its topology, one protoactor lost (or could not make) the connection to
// while it waited, or one that has said nothing at all (no HandoffDone, no
// answer to a lease probe: see Fencing) for handoffSilence (500 ms) since
// it began to wait, such as a stranger answering a health port the
// provider lists. Those 500 ms count from the first answer any member gave
// the new owner's node, if that came later: a member that has just joined
// and heard nobody yet cannot tell a silent member from its own
// connections still being made, and waits up to 5 s. A member that
// answers lease probes is waited for until it hands off, however long its
// batchers take to answer what it admitted. A connection that drops while
// a live old owner still has a request in flight can therefore let that
// request overlap the new owner's first one.
//
// A member crashes: what it held is answered ErrUnreachable as soon as the
// provider drops the member from the topology or protoactor loses its
// connection, at the callers' deadlines at the latest; it may have been
// sent. Nothing acknowledged is lost (an answer is sent only after the
// destination accepted the message), and a caller's acknowledged messages
// stay in its order. Deliveries to its destinations succeed again once the
// provider drops it: the new owner does not wait for a member that is no
// longer in its topology. A batch the crashed member had in
// flight may still reach the destination while the new owner sends the same
// group: a crash can break "one request of a group in flight" for the
// duration of that request, and a message answered ErrUnreachable can land
// after its caller's next one. A crashed member restarted at the same
// address (a fixed host and port) is a new caller: the answers the owners
// still send for its predecessor's deliveries reach no process of the new
// one (each node answers to an id of its own), and are dropped as dead
// letters, never taken for its own callers' answers.
//
// # Fencing
//
// protoactor drops a member whose health checks fail (its process stopped
// or starved, a long GC pause, a VM stall, a partition: anything longer
// than the provider's health timeout, 2 s for the automanaged provider),
// never takes it back, and never tells it: on its own member list it still
// owns what it owned. So a member also needs its peers' word. Every
// leaseProbeEvery (100 ms) a node asks each other member of its list
// hosting Kind whether that member's list still holds it under the same
// member id; a confirmation counts for leaseTTL (600 ms) from when the
// question was sent, by the node's monotonic clock, which runs on while the
// process is stopped. The node holds its lease while every other member of
// its list that takes part (one that has answered a probe) confirmed
// within that time. Only then does a grain admit a delivery, a caller
// hand one to its own instance, or a batcher send a batch of what the node
// admitted: without the lease, grains answer "not the owner" and batchers
// drop, unsent, what they take, and the callers try again within their
// deadlines. A member that cannot hear its peers stops in leaseTTL, well
// before they can drop it; a stopped one finds its lease expired as it
// wakes, before it sends anything it takes. The first answer from a member
// that dropped it says so: from then on the node admits nothing, its
// callers are answered ErrUnreachable, and Node.Excluded is closed. Leave,
// and start a new actor system, instance, node and member: it joins under
// a new member id.
//
// The bound: after a pause or a partition, two members publish one
// destination for at most leaseTTL and the round trip of one request to
// the destination, and never after it. The lease is checked as a batch is
// taken and again as its request begins (the codec the instance is given
// makes no request without it, and answers the batch's callers
// ErrUnreachable); a process stopped between that check and the request's
// bytes leaving it sends them when it wakes, since nothing on the
// destination's side can refuse a fenced writer.
//
// What the lease does not cover, because each member judges by its own
// view: a member of a version without leases neither answers nor is waited
// for, so fencing holds only between members that have it (a rolling
// deploy mixes them for a while); a partition that the members' lists do
// not show (each side still lists the other) leaves each side's owner
// without its lease, not two owners; a member that crashed holds every
// other member's lease until the provider drops it (with the automanaged
// provider, at its next poll, since a dead member's health port refuses),
// and the destinations the others own answer "not the owner" meanwhile,
// from leaseTTL after the crash.
//
// Where the provider has a store with leases (etcd, Consul, Kubernetes), a
// lease-backed mode would put ownership there: one lease per member (or
// per destination) in the store, renewed by its holder, which admits only
// while its lease is live; a new owner takes a destination over only once
// the old owner's lease expired in the store. That is one agreement rather
// than each member's view of its peers': it fences members of any version
// and partitions no member list shows, and a crash costs only the crashed
// member's destinations, for the lease's term, at the price of the store
// on every renewal's path.
//
// # Who may deliver
//
// A member's remote port accepts deliveries: anyone who can reach it can
// publish to every destination with this member's credentials. Require
// mutual TLS between members: MutualTLS and TLSOptions turn a certificate
// authority and a member certificate into protoactor remote's gRPC server
// and dial options, so that a peer without a certificate from the cluster's
// authority can neither join the conversation nor deliver, and a member dials only servers holding a certificate
// from it. TLSOptions refuses (panics at set-up) a config that names no CA
// to verify peers by, lacks a certificate to serve or to present when
// dialling, or skips verifying servers. Attach logs a WARN when the member
// listens beyond loopback and its remote serves without TLS, or with TLS
// that completes for a client without a certificate or with one it made
// itself. TLSOptions' server also requires the client's certificate to be
// valid for the config's ServerName (the cluster's name), so that a CA
// shared with other services does not let them in.
//
// Whatever a peer sends, the member's process stays up: GuardReceive
// (which TLSOptions and ReceiveLimit include) ends only the stream whose
// message panics protoactor's receive path. A node never sends a member a
// message type that member may not know: new requests ride as fields of
// types every version knows (cancels in a DeliverBatch, lease probes in a
// DeliverReplies), and ResumeGroup asks only an owner that answered a
// lease probe. Only configured destinations keep a grain: a delivery to a
// name this member does not configure is answered ErrUnknownDestination,
// and its grain stops after yieldLinger. Error texts quote at most 64
// bytes of a name.
//
// Set the remote's MaxRetryCount to 1: a message to a member that does not
// answer waits in protoactor's endpoint writer MaxRetryCount times 2 s
// before it is dropped, and Attach warns about more.
//
// The provider's own channel
// (the automanaged health port, Consul, etcd, Kubernetes) decides
// membership and needs protecting on its own terms: a stranger the provider
// lists gets nothing and sends nothing through TLS, but the destinations the
// hash gives it are unreachable (ErrUnreachable) until the provider drops it.
//
// # Concurrency
//
// A node's state is shared by these goroutines; each names what it may
// touch, and each piece of state has one guard, named again beside its
// field:
//   - callers (Deliver, DeliverResult, ResumeGroup, PausedGroups, and the
//     actor form's goroutines, which Node.deliverFor starts under
//     orderedQueues.mu): their own calls, one type per role (a
//     requestCall for an activation or a group request, a deliveryCall
//     for a delivery through a grain, a directCall for one admitted
//     directly), each answered once on a channel of its own answer type;
//     calls (calls.mu), outboxes (boxes.mu, taken before calls.mu, never
//     after), direct calls (each shard's mu; a call's token is atomic),
//     the ledger's admitHere (its atomic counts and copy-on-write view),
//     topology (its RWMutex), the PID cache (its mutex), the lease (holds:
//     atomics) and inflight (one atomic word);
//   - the endpoint (endpoint.SendUserMessage), run on its sender's
//     goroutine: a remote sender's is protoactor's endpoint reader for its
//     stream. It never waits: replies, responses and dead letters end
//     calls (calls.mu); hand-off requests go to the ledger (ledger.mu);
//     pauses handed over start an adoption; lease probes and answers go
//     to the lease (lease.mu);
//   - the event-stream subscriber (onTopology, onCut): topology, the PID
//     cache, cutMu (cut and leftOK), outboxes and reply boxes, calls,
//     direct calls, and the lease's member list (lease.mu);
//   - a grain's Receive: the grain's own fields, touched by nothing else;
//     the ledger, reply boxes, calls (abandoning posts) and lease.holds.
//     It never waits: pauses handed over are adopted on a goroutine of
//     their own, and the grain admits only once the ledger has none in
//     flight for its destination;
//   - protoactor's endpoint writer, calling Serialize on a post
//     (outgoing, outgoingReplies) as it writes it: boxes.mu, then calls.mu;
//   - timers: a grain's (time.AfterFunc) only send the grain a message; a
//     caller's timer is its own call's;
//   - batcher goroutines, answering an admitted record (Answer, Listening,
//     Forgotten, Release): the record's atomics, direct calls, reply
//     boxes, the ledger's counts (ledger.mu when a count settles an
//     entry), cancels (cancels.mu, behind an atomic count) and lease.holds;
//   - the probe loop that Attach starts: the lease's member list, and
//     sends; Leave stops it and waits for it;
//   - adoptions (Node.adoptPauses), a goroutine per set of pauses handed
//     over: the instance, then the ledger (ledger.mu), which counts the
//     adoption until it ends, and sends (adopted{} to the grains that
//     wait for it);
//   - Leave's goroutines: the ledger, inflight, reply boxes (boxes.mu,
//     waiting for its answers to be written), the lease (lease.mu, waiting
//     for its word to be taken), and, when its ctx ends, calls, outboxes,
//     reply boxes and direct calls, each under its guard.
//
// The node's own fields: its config, logger, kind, ids and event-stream
// subscription are set by New and read-only after it; cutMu guards cut
// and leftOK; the cluster, the endpoint's PIDs, leaving and withoutLeases
// are atomics; each channel is closed once by its one owner; and Leave's
// result is written before left is closed, and read after.
//
// # Logs
//
// protoactor logs each message it routes at Debug, bodies included: run the
// actor system's logger at Info or above in production. The node's own logs
// name destinations and members, never payloads.
package clustered
