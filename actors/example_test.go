package actors_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
)

// upper is a toy destination: it "stores" each message by upper-casing it.
type upper struct{}

func (upper) Name() string             { return "upper" }
func (upper) Identity() []byte         { return []byte("upper") }
func (upper) Limits() codec.Limits     { return codec.Limits{MaxEntries: 10, MaxBytes: 1 << 10} }
func (upper) Tuning() codec.Tuning     { return codec.Tuning{Linger: time.Millisecond} }
func (upper) Size(m codec.Message) int { return len(m.Body) }
func (upper) SendBatch(_ context.Context, batch []codec.Message) ([]codec.Result, error) {
	res := make([]codec.Result, len(batch))
	for i, m := range batch {
		res[i].ID = strings.ToUpper(string(m.Body))
	}
	return res, nil
}

func Example() {
	system := quietSystem()
	defer system.Shutdown()
	inst, err := actors.Start(system, actors.Config{Name: "example"})
	if err != nil {
		panic(err)
	}
	defer inst.Stop(context.Background())

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	id, err := inst.Deliver(ctx, upper{}, codec.Message{Tenant: "acme", Body: []byte("hello")})
	fmt.Println(id, err)
	// Output: HELLO <nil>
}
