package clustered_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/cluster/clusterproviders/automanaged"
	"github.com/asynkron/protoactor-go/cluster/identitylookup/disthash"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/actors/clustered"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
)

// One member of a cluster: every member runs the same code with its own
// certificate, address and credentials.
func Example() {
	ctx := context.Background()
	ca := x509.NewCertPool()       // the cluster's certificate authority
	var memberCert tls.Certificate // this member's certificate, signed by it
	hosts := []string{"10.0.0.1:6330", "10.0.0.2:6330", "10.0.0.3:6330"}

	system := actor.NewActorSystem()
	inst, err := actors.Start(system, actors.Config{})
	if err != nil {
		log.Fatal(err)
	}
	orders, err := pubsub.New(ctx, pubsub.Config{Topic: "projects/p/topics/orders"})
	if err != nil {
		log.Fatal(err)
	}
	node, err := clustered.New(system, clustered.Config{
		Instance:     inst,
		Destinations: clustered.Destinations{"orders": orders},
	})
	if err != nil {
		log.Fatal(err)
	}
	// TLSOptions includes GuardReceive: no peer's message ends the process.
	rc := remote.Configure("0.0.0.0", 8090, clustered.TLSOptions(clustered.MutualTLS(ca, memberCert, "sinkbatch-cluster"))...)
	// A member that does not answer must not hold deliveries for
	// MaxRetryCount × 2 s in protoactor's endpoint writer.
	rc.MaxRetryCount = 1
	c := cluster.New(system, cluster.Configure("orders-service",
		automanaged.NewWithConfig(2*time.Second, 6330, hosts...), disthash.New(), rc,
		cluster.WithKinds(node.Kind())))
	c.StartMember()
	if err := node.Attach(c); err != nil {
		log.Fatal(err)
	}
	go func() {
		// The cluster dropped this member (a pause past its health
		// timeout): it admits nothing more. Leave and start anew.
		<-node.Excluded()
		log.Println("excluded from the cluster: restarting")
	}()

	// From any member, to the one batcher of "orders" in the cluster.
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	id, err := node.Deliver(dctx, "orders", codec.Message{Group: "customer-42", IdempotencyKey: "order-1001", Body: []byte(`{"order":1001}`)})
	cancel()
	log.Println(id, err)

	// Hand off what this member owns, leave, then stop the instance.
	stop, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := node.Leave(stop); err != nil {
		log.Println(err)
	}
	if err := inst.Stop(stop); err != nil {
		log.Println(err)
	}
	_ = orders.Close()
}
