package clusterpb

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// A member of a version before cancellations (whose DeliverBatch has no
// field 3) reads a DeliverBatch that carries them: it skips the field and
// keeps the requests. A message type it did not know would fail to decode,
// and protoactor would end the stream it came on, with everything on it.
func TestAnEarlierMemberSkipsTheCancelsOfADeliverBatch(t *testing.T) {
	fd := protodesc.ToFileDescriptorProto(File_clusterpb_proto)
	for _, m := range fd.MessageType {
		if m.GetName() == "DeliverBatch" {
			var kept []*descriptorpb.FieldDescriptorProto
			for _, f := range m.Field {
				if f.GetNumber() != 3 {
					kept = append(kept, f)
				}
			}
			require.Len(t, kept, len(m.Field)-1, "DeliverBatch's cancels are field 3")
			m.Field = kept
		}
	}
	earlier, err := protodesc.NewFile(fd, new(protoregistry.Files))
	require.NoError(t, err)
	old := dynamicpb.NewMessage(earlier.Messages().ByName("DeliverBatch"))

	b, err := proto.Marshal(&DeliverBatch{
		Destination: "d",
		Requests:    []*DeliverRequest{{Body: []byte("m"), Call: 7}},
		Cancels:     []*CancelDelivery{{Call: 5, BudgetNanos: 1e9}},
	})
	require.NoError(t, err)
	require.NoError(t, proto.Unmarshal(b, old))
	assert.Equal(t, "d", old.Get(old.Descriptor().Fields().ByName("destination")).String())
	reqs := old.Get(old.Descriptor().Fields().ByName("requests")).List()
	require.Equal(t, 1, reqs.Len())
	req := reqs.Get(0).Message()
	assert.Equal(t, protoreflect.ValueOfUint32(7).Interface(), req.Get(req.Descriptor().Fields().ByName("call")).Interface())
	assert.NotEmpty(t, old.GetUnknown(), "the cancels are kept as an unknown field")
}
