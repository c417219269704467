// Package supervisor starts, routes to, restarts and retires one instance's
// batchers.
//
// Routing runs on the sender's goroutine: the instance's PID is a protoactor
// process (not an actor) whose SendUserMessage finds the destination from the
// codec value (a cache; the keyed digest is computed once per codec value)
// and posts the delivery straight into the batcher's mailbox.
//
// A route counts the deliveries it forwards to the current batcher. A batcher
// that has been idle for its IdleTimeout reports how many it received; the
// supervisor stops it only by a compare-and-swap from exactly that count to
// "closed", so no delivery can be on its way to a stopping batcher (protoactor
// drops those silently). While a route is closed, deliveries are held in
// arrival order; when the batcher's Terminated arrives (its name is free by
// then) the supervisor starts a replacement and hands it what was held, or
// retires the route if nothing was. Stop closes every route the same way and
// asks each batcher to drain exactly the count forwarded to it.
//
// The supervisor actor restarts a crashed batcher every time, and logs it at
// WARN with the destination and the reason. Its own state lives outside the
// actor, so a restart of the supervisor itself loses no route.
package supervisor
