package outbox_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sivchari/kumo"
	"github.com/stretchr/testify/require"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
	"github.com/ankusa/sinkbatch/codec/sqs"
	"github.com/ankusa/sinkbatch/outbox"
)

var createTable = outbox.CreateTable

const (
	destPubSub = "pubsub"
	destFIFO   = "fifo"
	topicName  = "projects/outbox/topics/relay"
	// groupAttribute carries a test row's group, which kumo does not
	// return on receive.
	groupAttribute = "group"
)

// servers are the destinations' servers, on 127.0.0.1 in the test's own
// process, so that they outlive relays in child processes.
type servers struct {
	ps       *pstest.Server
	kumo     *kumo.Server
	queueURL string
}

// startServers starts pstest (with the given reactors) and, with fifo,
// kumo with one FIFO queue.
func startServers(t testing.TB, fifo bool, reactors ...pstest.ServerReactorOption) *servers {
	t.Helper()
	ctx := context.Background()
	s := &servers{ps: pstest.NewServerWithAddress("127.0.0.1:0", reactors...)}
	t.Cleanup(func() { _ = s.ps.Close() })
	_, err := s.ps.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: topicName})
	require.NoError(t, err)
	if fifo {
		s.kumo = kumo.NewServer()
		t.Cleanup(s.kumo.Close)
		out, err := sqsClient(s.kumo.URL).CreateQueue(ctx, &awssqs.CreateQueueInput{
			QueueName:  aws.String("outbox.fifo"),
			Attributes: map[string]string{"FifoQueue": "true"},
		})
		require.NoError(t, err)
		s.queueURL = aws.ToString(out.QueueUrl)
	}
	return s
}

func awsConfig(endpoint string) aws.Config {
	return aws.Config{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("outbox", "test", ""),
		BaseEndpoint: aws.String(endpoint),
		HTTPClient:   &http.Client{Timeout: 30 * time.Second},
	}
}

func sqsClient(endpoint string) *awssqs.Client { return awssqs.NewFromConfig(awsConfig(endpoint)) }

// codecs builds the destinations' codecs, StrictGroups on: "pubsub" always,
// "fifo" when kumoURL is set.
func codecs(ctx context.Context, pstestAddr, kumoURL, queueURL string) (map[string]codec.Codec, func(), error) {
	ps, err := pubsub.New(ctx, pubsub.Config{Topic: topicName, Endpoint: pstestAddr, Insecure: true,
		Tuning: codec.Tuning{StrictGroups: true}})
	if err != nil {
		return nil, nil, err
	}
	m := map[string]codec.Codec{destPubSub: ps}
	if kumoURL != "" {
		q, err := sqs.New(sqs.Config{QueueURL: queueURL, AWS: awsConfig(kumoURL), AttributeChecksumsOptional: true,
			Tuning: codec.Tuning{StrictGroups: true}})
		if err != nil {
			_ = ps.Close()
			return nil, nil, err
		}
		m[destFIFO] = q
	}
	return m, func() { _ = ps.Close() }, nil
}

// instance starts an actor system and a sinkbatch instance, stopped when
// the test ends.
func instance(t testing.TB) *actors.Instance {
	t.Helper()
	system := actor.NewActorSystem()
	inst, err := actors.Start(system, actors.Config{})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = inst.Stop(ctx)
		system.Shutdown()
	})
	return inst
}

// localSender is a Local sender to the test servers' destinations.
func localSender(t testing.TB, s *servers) outbox.Sender {
	t.Helper()
	kumoURL := ""
	if s.kumo != nil {
		kumoURL = s.kumo.URL
	}
	cs, closeCodecs, err := codecs(context.Background(), s.ps.Addr, kumoURL, s.queueURL)
	require.NoError(t, err)
	inst := instance(t) // registered after the codecs: stopped before they close
	t.Cleanup(closeCodecs)
	return outbox.Local(inst, cs)
}

// run runs r until the returned stop is called; stop returns Run's error.
func run(t testing.TB, r *outbox.Relay) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	stopped := false
	var err error
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			err = <-done
		}
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// insert adds rows in one transaction through Enqueue.
func insert(t testing.TB, db *pgxpool.Pool, table string, rows ...outbox.Row) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	require.NoError(t, outbox.Enqueue(ctx, tx, table, rows...))
	require.NoError(t, tx.Commit(ctx))
}

// copyRows adds n rows fast (COPY, one transaction): row i (from 1) goes
// to group i*7919 % groups, its tenant is its group % tenants, and
// groups below pubsubGroups go to Pub/Sub, the rest to the FIFO queue.
func copyRows(t testing.TB, db *pgxpool.Pool, table string, n, groups, tenants, pubsubGroups int) {
	t.Helper()
	src := make([][]any, n)
	for i := range src {
		id := i + 1
		g := id * 7919 % groups
		dest := destPubSub
		if g >= pubsubGroups {
			dest = destFIFO
		}
		group := "g" + strconv.Itoa(g)
		src[i] = []any{int64(id), dest, "t" + strconv.Itoa(g%tenants), group, []byte("row " + strconv.Itoa(id)),
			map[string]string{groupAttribute: group}}
	}
	_, err := db.CopyFrom(context.Background(), pgx.Identifier{table},
		[]string{"id", "destination", "tenant", "grp", "body", "attributes"}, pgx.CopyFromRows(src))
	require.NoError(t, err)
	_, err = db.Exec(context.Background(), fmt.Sprintf(`SELECT setval(pg_get_serial_sequence('%s', 'id'), %d)`, table, n))
	require.NoError(t, err)
}

// stored is one message as read back from a destination.
type stored struct {
	key, group string
}

// published is what pstest holds, in publish order.
func published(ps *pstest.Server) []stored {
	var out []stored
	for _, m := range ps.Messages() {
		out = append(out, stored{key: m.Attributes[pubsub.DefaultIdempotencyAttribute], group: m.OrderingKey})
	}
	return out
}

// drainFIFO receives and deletes every message of a FIFO queue and
// returns them in the order the queue stored them: by sequence number,
// which kumo assigns at storage (and returns beside the message, where the
// SDK does not read it, so receives are made in JSON here). The order in
// which receives hand messages out is not used: a receive whose answer was
// lost (the SDK retries it) leaves its messages in flight until the
// visibility timeout, and kumo then hands them out again in any order.
func drainFIFO(t testing.TB, endpoint, url string) []stored {
	t.Helper()
	const visibility = 2 // seconds
	ctx := context.Background()
	c := sqsClient(endpoint)
	type received struct {
		stored
		seq int64
	}
	var all []received
	seen := map[string]bool{}
	var waitingSince time.Time
	for {
		msgs := receiveJSON(t, endpoint, url, visibility)
		if len(msgs) == 0 {
			a, err := c.GetQueueAttributes(ctx, &awssqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
				AttributeNames: []types.QueueAttributeName{types.QueueAttributeNameApproximateNumberOfMessages,
					types.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
			require.NoError(t, err)
			visible := a.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessages)]
			hidden := a.Attributes[string(types.QueueAttributeNameApproximateNumberOfMessagesNotVisible)]
			if visible == "0" && hidden == "0" {
				break
			}
			if waitingSince.IsZero() {
				waitingSince = time.Now()
			}
			require.Less(t, time.Since(waitingSince), 3*visibility*time.Second, "%s visible, %s in flight, none received", visible, hidden)
			<-time.After(50 * time.Millisecond) // polling the queue, not waiting for an outcome of ours
			continue
		}
		waitingSince = time.Time{}
		del := make([]types.DeleteMessageBatchRequestEntry, len(msgs))
		for i, m := range msgs {
			del[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(m.ReceiptHandle)}
			if seen[m.MessageID] {
				continue
			}
			seen[m.MessageID] = true
			seq, err := strconv.ParseInt(m.SequenceNumber, 10, 64)
			require.NoError(t, err, "sequence number %q", m.SequenceNumber)
			all = append(all, received{stored{key: m.MessageAttributes[sqs.DefaultIdempotencyAttribute].StringValue,
				group: m.MessageAttributes[groupAttribute].StringValue}, seq})
		}
		d, err := c.DeleteMessageBatch(ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: del})
		require.NoError(t, err)
		require.Empty(t, d.Failed)
	}
	slices.SortFunc(all, func(a, b received) int { return cmp.Compare(a.seq, b.seq) })
	out := make([]stored, len(all))
	for i, r := range all {
		out[i] = r.stored
	}
	return out
}

// kumoMessage is a received message as kumo writes it in JSON.
type kumoMessage struct {
	MessageID         string `json:"MessageId"`
	ReceiptHandle     string
	SequenceNumber    string
	MessageAttributes map[string]struct{ StringValue string }
}

// receiveJSON is one ReceiveMessage call in the AWS JSON 1.0 protocol.
func receiveJSON(t testing.TB, endpoint, url string, visibility int) []kumoMessage {
	t.Helper()
	body, err := json.Marshal(map[string]any{"QueueUrl": url, "MaxNumberOfMessages": 10, "VisibilityTimeout": visibility,
		"WaitTimeSeconds": 0, "MessageAttributeNames": []string{"All"}})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, endpoint+"/", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-amz-json-1.0")
	req.Header.Set("X-Amz-Target", "AmazonSQS.ReceiveMessage")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
	var out struct{ Messages []kumoMessage }
	require.NoError(t, json.Unmarshal(raw, &out), "%s", raw)
	return out.Messages
}

// verdict is what a read back shows.
type verdict struct {
	distinct   map[int64]bool
	duplicates int
	violations int // a group's first appearances not in row order
	examples   []string
}

// check reads messages whose keys are row ids: per group, the ids in order
// of first appearance must rise.
func check(t testing.TB, msgs []stored) verdict {
	t.Helper()
	v := verdict{distinct: map[int64]bool{}}
	last := map[string]int64{}
	for _, m := range msgs {
		id, err := strconv.ParseInt(m.key, 10, 64)
		require.NoError(t, err, "key %q", m.key)
		if v.distinct[id] {
			v.duplicates++
			continue
		}
		v.distinct[id] = true
		if id < last[m.group] {
			v.violations++
			if len(v.examples) < 5 {
				v.examples = append(v.examples, fmt.Sprintf("group %s: row %d after row %d", m.group, id, last[m.group]))
			}
		}
		last[m.group] = max(last[m.group], id)
	}
	return v
}

// counts is how many rows of a table are in each state.
func counts(t testing.TB, db *pgxpool.Pool, table string) (unsent, sent, dead int) {
	t.Helper()
	err := db.QueryRow(context.Background(), fmt.Sprintf(
		`SELECT count(*) FILTER (WHERE state = 0), count(*) FILTER (WHERE state = 1), count(*) FILTER (WHERE state = 2) FROM %s`, table)).
		Scan(&unsent, &sent, &dead)
	require.NoError(t, err)
	return
}

// waitDrained waits until no row of table is unsent.
func waitDrained(t testing.TB, db *pgxpool.Pool, table string, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		u, _, _ := counts(t, db, table)
		return u == 0
	}, within, 20*time.Millisecond)
}
