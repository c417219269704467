// Package clusterpb holds the wire messages between the members of
// sinkbatch's cluster mode (package clustered). protoactor's remote sends
// only protobuf messages, and resolves them by name on arrival.
package clusterpb

//go:generate buf generate
