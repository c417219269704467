package main

// -outbox: the outbox relay (package outbox) end to end. The demo starts a
// throwaway PostgreSQL from the installed binaries (or uses -outbox-dsn),
// pstest and kumo on 127.0.0.1, creates an outbox table and adds
// outboxRows rows with outbox.Enqueue, in transactions of 100 (8 tenants,
// 32 groups: 24 to a Pub/Sub topic with ordering keys, 8 to a FIFO queue,
// both with StrictGroups). The relay runs in a child process (this
// program, started again); it is killed with SIGKILL once, at about 40 %
// sent, and started again. When every row is sent the demo reads both
// destinations back and prints
//
//	lost: N              rows at no destination
//	order violations: N  a group's first appearances out of row order
//	duplicates: N        messages stored more than once (the relay was killed
//	                     between a send and its mark); 0 on the FIFO queue,
//	                     which deduplicates by idempotency key
//
// and exits 1 if lost or order violations is not zero.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/asynkron/protoactor-go/actor"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	awssqs "github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sivchari/kumo"

	"github.com/ankusa/sinkbatch/actors"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/codec/pubsub"
	"github.com/ankusa/sinkbatch/codec/sqs"
	"github.com/ankusa/sinkbatch/outbox"
	"github.com/ankusa/sinkbatch/outbox/pgtest"
)

const (
	outboxRows   = 20_000
	outboxGroups = 32
	outboxFIFO   = 8 // groups of the FIFO queue; the rest go to Pub/Sub
	outboxTable  = "demo_outbox"
	outboxTopic  = "projects/demo/topics/outbox"
	outboxLease  = 2 * time.Second
	// outboxRelayEnv, set to an outboxRelayConfig, makes this program the
	// relay's child process (see main).
	outboxRelayEnv = "SINKBATCH_DEMO_OUTBOX_RELAY"
	// groupAttr carries a row's group to the reader (kumo does not return
	// a FIFO message's group).
	groupAttr = "group"
)

type outboxRelayConfig struct {
	DSN, PstestAddr, KumoURL, QueueURL string
}

// runOutbox is the -outbox demo.
func runOutbox(ctx context.Context, o options, logger *slog.Logger, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintln(stderr, "demo -outbox:", err)
		return 1
	}
	dsn := o.outboxDSN
	if dsn == "" {
		pg, err := pgtest.Start(ctx)
		if err != nil {
			return fail(fmt.Errorf("starting PostgreSQL (or give -outbox-dsn): %w", err))
		}
		defer pg.Stop()
		dsn = pg.DSN
		fmt.Fprintf(stdout, "PostgreSQL: a throwaway server at %s\n", dsn)
	}
	db, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return fail(err)
	}
	defer db.Close()

	ps := pstest.NewServerWithAddress("127.0.0.1:0")
	defer ps.Close()
	if _, err := ps.GServer.CreateTopic(ctx, &pubsubpb.Topic{Name: outboxTopic}); err != nil {
		return fail(err)
	}
	kq := kumo.NewServer()
	defer kq.Close()
	queueURL, err := createQueue(ctx, awssqs.NewFromConfig(outboxAWS(kq.URL)), "outbox.fifo")
	if err != nil {
		return fail(err)
	}
	fmt.Fprintf(stdout, "Pub/Sub: pstest at %s; SQS: kumo at %s\n", ps.Addr, kq.URL)

	if _, err := db.Exec(ctx, fmt.Sprintf("DROP TABLE IF EXISTS %[1]s, %[1]s_leases", outboxTable)); err != nil {
		return fail(err)
	}
	if err := outbox.CreateTable(ctx, db, outboxTable); err != nil {
		return fail(err)
	}
	for first := 0; first < outboxRows; first += 100 {
		tx, err := db.Begin(ctx)
		if err != nil {
			return fail(err)
		}
		rows := make([]outbox.Row, 0, 100)
		for i := first; i < min(first+100, outboxRows); i++ {
			g := i * 7919 % outboxGroups
			dest := "pubsub"
			if g < outboxFIFO {
				dest = "fifo"
			}
			group := "g" + strconv.Itoa(g)
			rows = append(rows, outbox.Row{Destination: dest, Tenant: "t" + strconv.Itoa(g%8), Group: group,
				Body: []byte("row " + strconv.Itoa(i)), Attributes: map[string]string{groupAttr: group}})
		}
		if err := outbox.Enqueue(ctx, tx, outboxTable, rows...); err != nil {
			_ = tx.Rollback(ctx)
			return fail(err)
		}
		if err := tx.Commit(ctx); err != nil {
			return fail(err)
		}
	}
	fmt.Fprintf(stdout, "outbox: %d rows in %s, 8 tenants, %d groups (%d to the FIFO queue)\n", outboxRows, outboxTable, outboxGroups, outboxFIFO)

	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}
	cfg, _ := json.Marshal(outboxRelayConfig{DSN: dsn, PstestAddr: ps.Addr, KumoURL: kq.URL, QueueURL: queueURL})
	start := func() (*exec.Cmd, io.Closer, chan error, error) {
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), outboxRelayEnv+"="+string(cfg))
		cmd.Stderr = stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, nil, nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, nil, nil, err
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		return cmd, in, done, nil
	}
	unsent := func() (int, error) {
		var n int
		err := db.QueryRow(ctx, "SELECT count(*) FROM "+outboxTable+" WHERE state = 0").Scan(&n)
		return n, err
	}
	waitUnsent := func(atMost int) error {
		for {
			n, err := unsent()
			if err != nil || n <= atMost {
				return err
			}
			if !sleep(ctx, 20*time.Millisecond) {
				return ctx.Err()
			}
		}
	}
	began := time.Now()
	cmd, in, done, err := start()
	if err != nil {
		return fail(err)
	}
	if err := waitUnsent(outboxRows * 6 / 10); err != nil {
		_ = cmd.Process.Kill()
		return fail(err)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
	left, _ := unsent()
	fmt.Fprintf(stdout, "relay (pid %d) killed with SIGKILL at %d rows unsent; starting another\n", cmd.Process.Pid, left)
	cmd, in, done, err = start()
	if err != nil {
		return fail(err)
	}
	if err := waitUnsent(0); err != nil {
		_ = cmd.Process.Kill()
		return fail(err)
	}
	in.Close()
	if err := <-done; err != nil {
		return fail(fmt.Errorf("relay: %w", err))
	}
	fmt.Fprintf(stdout, "every row sent in %v\n", time.Since(began).Round(time.Millisecond))

	// Read back.
	var msgs []outboxStored
	for _, m := range ps.Messages() {
		msgs = append(msgs, outboxStored{key: m.Attributes[pubsub.DefaultIdempotencyAttribute], group: m.OrderingKey})
	}
	fifo, err := drainFIFOInOrder(ctx, kq.URL, queueURL)
	if err != nil {
		return fail(err)
	}
	psCount, fifoCount := len(msgs), len(fifo)
	msgs = append(msgs, fifo...)
	seen := map[int64]bool{}
	last := map[string]int64{}
	duplicates, violations := 0, 0
	for _, m := range msgs {
		id, err := strconv.ParseInt(m.key, 10, 64)
		if err != nil {
			return fail(fmt.Errorf("a message with key %q", m.key))
		}
		if seen[id] {
			duplicates++
			continue
		}
		seen[id] = true
		if id < last[m.group] {
			violations++
		}
		last[m.group] = max(last[m.group], id)
	}
	lost := 0
	for id := int64(1); id <= outboxRows; id++ {
		if !seen[id] {
			lost++
		}
	}
	fmt.Fprintf(stdout, "read back: %d Pub/Sub messages, %d FIFO messages\n", psCount, fifoCount)
	fmt.Fprintf(stdout, "lost: %d\norder violations: %d\nduplicates: %d\n", lost, violations, duplicates)
	if lost > 0 || violations > 0 {
		return 1
	}
	return 0
}

func outboxAWS(endpoint string) aws.Config {
	return aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("demo", "demo-secret", ""),
		BaseEndpoint: aws.String(endpoint)}
}

// outboxRelayChild is the relay process: it relays until its stdin closes.
func outboxRelayChild(config string) int {
	var cfg outboxRelayConfig
	if err := json.Unmarshal([]byte(config), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 2
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 1
	}
	db, err := pgxpool.New(ctx, cfg.DSN)
	if err != nil {
		return fail(err)
	}
	defer db.Close()
	strict := codec.Tuning{StrictGroups: true}
	ps, err := pubsub.New(ctx, pubsub.Config{Topic: outboxTopic, Endpoint: cfg.PstestAddr, Insecure: true, Tuning: strict})
	if err != nil {
		return fail(err)
	}
	defer ps.Close()
	q, err := sqs.New(sqs.Config{QueueURL: cfg.QueueURL, AWS: outboxAWS(cfg.KumoURL), AttributeChecksumsOptional: true, Tuning: strict})
	if err != nil {
		return fail(err)
	}
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return logger }))
	defer system.Shutdown()
	inst, err := actors.Start(system, actors.Config{Name: "outbox-demo", Logger: logger})
	if err != nil {
		return fail(err)
	}
	defer stopInstance(inst)
	r, err := outbox.New(outbox.Config{DB: db, Table: outboxTable, Lease: outboxLease, Logger: logger,
		Sender: outbox.Local(inst, map[string]codec.Codec{"pubsub": ps, "fifo": q})})
	if err != nil {
		return fail(err)
	}
	if err := r.Run(ctx); err != nil {
		return fail(err)
	}
	return 0
}

type outboxStored struct{ key, group string }

// drainFIFOInOrder receives and deletes every message of a kumo FIFO queue
// and returns them in the order kumo stored them: by the sequence number
// it returns beside each message (the SDK does not read it, so receives
// are made in JSON). A receive whose answer was lost leaves its messages
// in flight for the visibility timeout, after which kumo hands them out
// again, in any order: sorting by sequence number undoes that.
func drainFIFOInOrder(ctx context.Context, endpoint, url string) ([]outboxStored, error) {
	type message struct {
		MessageID         string `json:"MessageId"`
		ReceiptHandle     string
		SequenceNumber    string
		MessageAttributes map[string]struct{ StringValue string }
	}
	type received struct {
		outboxStored
		seq int64
	}
	admin := awssqs.NewFromConfig(outboxAWS(endpoint))
	var all []received
	seen := map[string]bool{}
	var waitingSince time.Time
	for {
		body, _ := json.Marshal(map[string]any{"QueueUrl": url, "MaxNumberOfMessages": 10, "VisibilityTimeout": readVisibility,
			"WaitTimeSeconds": 0, "MessageAttributeNames": []string{"All"}})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+"/", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", "application/x-amz-json-1.0")
		req.Header.Set("X-Amz-Target", "AmazonSQS.ReceiveMessage")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		var out struct{ Messages []message }
		if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &out) != nil {
			return nil, fmt.Errorf("receive from %s: %s: %s", url, resp.Status, raw)
		}
		if len(out.Messages) == 0 {
			left, err := inQueue(ctx, admin, url)
			if err != nil {
				return nil, err
			}
			if left == 0 {
				break
			}
			if waitingSince.IsZero() {
				waitingSince = time.Now()
			}
			if time.Since(waitingSince) > 3*readVisibility*time.Second {
				return nil, fmt.Errorf("read back: %d messages of %s stay invisible", left, url)
			}
			if !sleep(ctx, 100*time.Millisecond) {
				return nil, ctx.Err()
			}
			continue
		}
		waitingSince = time.Time{}
		del := make([]types.DeleteMessageBatchRequestEntry, len(out.Messages))
		for i, m := range out.Messages {
			del[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(m.ReceiptHandle)}
			if seen[m.MessageID] {
				continue
			}
			seen[m.MessageID] = true
			seq, err := strconv.ParseInt(m.SequenceNumber, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("message %s: sequence number %q", m.MessageID, m.SequenceNumber)
			}
			all = append(all, received{outboxStored{key: m.MessageAttributes[sqs.DefaultIdempotencyAttribute].StringValue,
				group: m.MessageAttributes[groupAttr].StringValue}, seq})
		}
		if _, err := admin.DeleteMessageBatch(ctx, &awssqs.DeleteMessageBatchInput{QueueUrl: aws.String(url), Entries: del}); err != nil {
			return nil, fmt.Errorf("delete from %s: %w", url, err)
		}
	}
	slices.SortFunc(all, func(a, b received) int { return cmp.Compare(a.seq, b.seq) })
	res := make([]outboxStored, len(all))
	for i, r := range all {
		res[i] = r.outboxStored
	}
	return res, nil
}
