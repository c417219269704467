package sqstest

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"
)

// Received is a message as ReadBack received it from the server.
type Received struct {
	ID, Body   string
	Group      string            // MessageGroupId, as the server reports it
	Sequence   string            // SequenceNumber, on FIFO queues
	Attributes map[string]string // the message attributes' string values
}

// quiet is how long ReadBack waits for a message it has not seen yet while
// the queue still reports messages.
const quiet = 30 * time.Second

// ReadBack receives and deletes every message of queueURL, through admin,
// until the queue reports none left, visible or not, and returns each
// message once: on a FIFO queue in sequence-number order, elsewhere in
// order of first receipt. It fails tb if no new message comes for 30 s
// while the queue still reports some.
//
// A received message stays invisible for one second only: the SDK
// sometimes loses a ReceiveMessage answer on a connection it closes early
// (aws/aws-sdk-go-v2#2737) and retries, and the messages of the lost answer
// must come back for the read back to see them. A message whose delete
// fails comes back too, and is returned once.
func ReadBack(tb testing.TB, admin *awssqs.Client, queueURL string) []Received {
	tb.Helper()
	var all []Received
	seen := map[string]bool{}
	deadline := time.Now().Add(quiet)
	for {
		out, err := admin.ReceiveMessage(context.Background(), &awssqs.ReceiveMessageInput{
			QueueUrl:                    aws.String(queueURL),
			MaxNumberOfMessages:         10,
			VisibilityTimeout:           1,
			WaitTimeSeconds:             1,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []types.MessageSystemAttributeName{types.MessageSystemAttributeNameAll},
		})
		if err != nil {
			tb.Logf("read back: %v", err) // a lost answer: its messages come back
		}
		if err == nil && len(out.Messages) == 0 && left(tb, admin, queueURL) == 0 {
			break
		}
		require.True(tb, time.Now().Before(deadline), "queue %s: no new message for %v, but the queue is not empty", queueURL, quiet)
		if err != nil || len(out.Messages) == 0 {
			continue
		}
		del := make([]types.DeleteMessageBatchRequestEntry, 0, len(out.Messages))
		for i, m := range out.Messages {
			del = append(del, types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle})
			id := aws.ToString(m.MessageId)
			if seen[id] {
				continue
			}
			seen[id] = true
			deadline = time.Now().Add(quiet)
			r := Received{ID: id, Body: aws.ToString(m.Body), Group: m.Attributes["MessageGroupId"],
				Sequence: m.Attributes["SequenceNumber"], Attributes: map[string]string{}}
			for k, v := range m.MessageAttributes {
				r.Attributes[k] = aws.ToString(v.StringValue)
			}
			all = append(all, r)
		}
		if _, err := admin.DeleteMessageBatch(context.Background(), &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(queueURL), Entries: del}); err != nil {
			tb.Logf("read back: delete: %v", err) // they come back and are seen again
		}
	}
	if strings.HasSuffix(queueURL, ".fifo") {
		// Sequence numbers are decimal strings of up to 128 bits: the
		// shorter is the smaller.
		sort.SliceStable(all, func(i, j int) bool {
			a, b := all[i].Sequence, all[j].Sequence
			if len(a) != len(b) {
				return len(a) < len(b)
			}
			return a < b
		})
	}
	return all
}

// left is the number of messages queueURL holds, visible or not.
func left(tb testing.TB, admin *awssqs.Client, queueURL string) int {
	tb.Helper()
	out, err := admin.GetQueueAttributes(context.Background(), &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(queueURL),
		AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages, types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	require.NoError(tb, err)
	n, _ := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)])
	m, _ := strconv.Atoi(out.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)])
	return n + m
}
