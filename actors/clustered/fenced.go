package clustered

import (
	"context"
	"fmt"

	"github.com/ankusa/sinkbatch/codec"
)

// errLeaseLapsed answers every message of a batch whose request would have
// begun after the node's lease ran out: the request is not made, and
// admitted.Answer tells the callers so ("not the owner"): they try again.
var errLeaseLapsed = fmt.Errorf("%w: not sent: the member lost its ownership lease as the request was about to begin", ErrUnreachable)

// fenced is a destination's codec as the node hands it to its instance:
// the same codec (its Name and Identity, so the same batcher), whose
// SendBatch makes no request once the node's lease ran out. The batcher
// drops what it takes without the lease (admitted.Listening); this is the
// last check, as the request begins, for a process stopped between the
// two.
type fenced struct {
	codec.Codec
	lease *lease
}

func (f *fenced) SendBatch(ctx context.Context, batch []codec.Message) ([]codec.Result, error) {
	if !f.lease.holds() {
		return nil, errLeaseLapsed
	}
	return f.Codec.SendBatch(ctx, batch)
}

// The optional interfaces a codec may have, kept by its fenced form.
type (
	fencedV struct {
		fenced
		codec.Validator
	}
	fencedD struct {
		fenced
		codec.Describer
	}
	fencedVD struct {
		fenced
		codec.Validator
		codec.Describer
	}
)

// fence is c, fenced by l, with the optional interfaces c has. It is a
// pointer, as the instance caches what it computes of a codec by pointer.
func fence(c codec.Codec, l *lease) codec.Codec {
	f := fenced{Codec: c, lease: l}
	v, isV := c.(codec.Validator)
	d, isD := c.(codec.Describer)
	switch {
	case isV && isD:
		return &fencedVD{f, v, d}
	case isV:
		return &fencedV{f, v}
	case isD:
		return &fencedD{f, d}
	}
	return &f
}
