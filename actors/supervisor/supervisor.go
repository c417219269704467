package supervisor

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"go.opentelemetry.io/otel/trace"

	"github.com/ankusa/sinkbatch/actors/batcher"
	"github.com/ankusa/sinkbatch/codec"
	"github.com/ankusa/sinkbatch/internal/nilptr"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// maxKeysPerRoute bounds how many codec values one destination caches. A
// caller that builds a new codec value per delivery still works; its
// deliveries just digest the identity each time.
const maxKeysPerRoute = 64

// Config configures a Supervisor. Zero fields are not defaulted here: the
// front door (package actors) does that.
type Config struct {
	Name            string
	SinkConcurrency int
	DefaultTimeout  time.Duration
	Logger          *slog.Logger
	Recorder        telemetry.Recorder
	Tracer          trace.Tracer // nil: no spans
}

// Supervisor starts, routes to, restarts and retires one instance's
// batchers. Its PID is a process that runs on the sender's goroutine: a
// delivery to a known destination goes straight into that batcher's mailbox,
// so no single mailbox carries every destination's traffic.
type Supervisor struct {
	system   *actor.ActorSystem
	cfg      Config
	log      *slog.Logger
	key      [32]byte // keys the identity digest, so a name confirms no guessed secret
	pid      *actor.PID
	parent   *actor.PID
	counters batcher.Counters
	requests sync.WaitGroup
	stopping atomic.Bool
	stopped  chan struct{}
	stopOnce sync.Once
	stopErr  error
	cancels  atomic.Uint64 // Deliver callers that gave up before their deadline

	routes sync.Map // destination name → *route
	codecs sync.Map // codec value → *route

	// Touched only by the supervisor actor; kept here so that they survive
	// a restart of that actor.
	children map[string]*route // by batcher PID Id
	stopReq  chan struct{}
}

// Stats is a snapshot of an instance's batchers and queues.
type Stats struct {
	Batchers    int
	Queued      int
	QueuedBytes int64
	InFlight    int
	Waiting     int
}

// Start spawns the supervisor actor under the name "sinkbatch-"+cfg.Name and
// registers the routing process beside it.
func Start(system *actor.ActorSystem, cfg Config) (*Supervisor, error) {
	s := &Supervisor{
		system:   system,
		cfg:      cfg,
		log:      cfg.Logger.With(slog.String("instance", cfg.Name)),
		stopped:  make(chan struct{}),
		children: make(map[string]*route),
	}
	if _, err := rand.Read(s.key[:]); err != nil {
		return nil, fmt.Errorf("sinkbatch: start: %w", err)
	}
	props := actor.PropsFromProducer(func() actor.Actor { return (*supervisorActor)(s) },
		actor.WithSupervisor(&restartAlways{s: s}))
	parent, err := system.Root.SpawnNamed(props, "sinkbatch-"+cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("sinkbatch: start instance %q: %w", cfg.Name, err)
	}
	s.parent = parent
	id := parent.Id + "/deliver"
	pid, ok := system.ProcessRegistry.Add(&router{s: s}, id)
	if !ok {
		// A stopped instance of the same name leaves its router behind to
		// answer late senders with ErrStopped; a new instance takes over.
		if p, found := system.ProcessRegistry.GetLocal(id); found {
			if old, isRouter := p.(*router); isRouter && old.s.stopping.Load() {
				system.ProcessRegistry.Remove(&actor.PID{Address: system.Address(), Id: id})
				pid, ok = system.ProcessRegistry.Add(&router{s: s}, id)
			}
		}
	}
	if !ok {
		system.Root.StopFuture(parent).Wait()
		return nil, fmt.Errorf("sinkbatch: start instance %q: name taken", cfg.Name)
	}
	s.pid = pid
	return s, nil
}

// PID is where actors send *messages.Deliver.
func (s *Supervisor) PID() *actor.PID { return s.pid }

// Stats reads the counters; safe from any goroutine.
func (s *Supervisor) Stats() Stats {
	return Stats{
		Batchers:    int(s.counters.Batchers.Load()),
		Queued:      int(s.counters.Queued.Load()),
		QueuedBytes: s.counters.QueuedBytes.Load(),
		InFlight:    int(s.counters.InFlight.Load()),
		Waiting:     int(s.counters.Waiting.Load()),
	}
}

// ResumeGroup resumes group g of c's destination if it is paused
// (Tuning.StrictGroups) and reports whether it was. A destination with no
// batcher has nothing paused. The error is c's, if c is not a valid codec.
func (s *Supervisor) ResumeGroup(c codec.Codec, g string) (bool, error) {
	p, err := s.params(c)
	if p == nil {
		return false, err
	}
	return p.ResumeGroup(g), nil
}

// PausedGroups lists the paused groups of c's destination, sorted.
func (s *Supervisor) PausedGroups(c codec.Codec) ([]string, error) {
	p, err := s.params(c)
	if p == nil {
		return nil, err
	}
	return p.PausedGroups(), nil
}

// TakePauses removes the paused groups of c's destination and returns
// them, each with the time it has left. A destination with no batcher has
// none.
func (s *Supervisor) TakePauses(c codec.Codec) ([]messages.PausedGroup, error) {
	p, err := s.params(c)
	if p == nil {
		return nil, err
	}
	return p.TakePauses(), nil
}

// AdoptPauses pauses groups of c's destination (see batcher.Adopt),
// starting its batcher if it has none, and returns once the batcher has
// them, or ctx ended. The pauses are in place before any delivery routed
// after AdoptPauses is called (and returns, if it gave up) is admitted.
func (s *Supervisor) AdoptPauses(ctx context.Context, c codec.Codec, groups []messages.PausedGroup) error {
	if s.stopping.Load() {
		return messages.ErrStopped
	}
	msg := &batcher.Adopt{Groups: slices.Clone(groups), Done: make(chan error, 1)}
	for {
		rt, err := s.lookup(c)
		if err != nil {
			return err
		}
		if len(groups) == 0 {
			return nil
		}
		refused := false
		if rt.forward(msg, &s.stopping, func() { refused = true }) {
			if refused {
				return messages.ErrStopped
			}
			select {
			case err := <-msg.Done:
				return err
			case <-ctx.Done():
				return fmt.Errorf("sinkbatch: adopting paused groups: %w", ctx.Err())
			}
		}
		// The route was retired meanwhile: look the destination up again.
	}
}

// params finds the running batcher's Params of c's destination, without
// starting one: nil if it has none.
func (s *Supervisor) params(c codec.Codec) (*batcher.Params, error) {
	if cacheable(c) {
		if v, ok := s.codecs.Load(c); ok {
			return v.(*route).params.Load(), nil
		}
	}
	fresh, err := s.destination(c)
	if err != nil {
		return nil, err
	}
	if v, ok := s.routes.Load(fresh.name); ok {
		return v.(*route).params.Load(), nil
	}
	return nil, nil
}

// Stopping reports whether Stop has been called.
func (s *Supervisor) Stopping() bool { return s.stopping.Load() }

// Cancelled notes that a Deliver caller of c's destination gave up before
// its deadline, so that the room it held is found: at once if deliveries
// wait for room there (batcher.Params.CallerLeft), else by the next
// delivery that needs room (the count is per instance: a sweep a full queue
// does in vain costs less than room held by callers that left).
func (s *Supervisor) Cancelled(c codec.Codec) {
	s.cancels.Add(1)
	if p, err := s.params(c); err == nil && p != nil {
		p.CallerLeft()
	}
}

// Stop drains the instance: see actors.Instance.Stop.
func (s *Supervisor) Stop(ctx context.Context) error {
	first := false
	s.stopOnce.Do(func() { first = true })
	if !first {
		select {
		case <-s.stopped:
			return s.stopErr
		case <-ctx.Done():
			return fmt.Errorf("sinkbatch: stop: %w", ctx.Err())
		}
	}
	s.stopping.Store(true)
	start := time.Now()
	drained := make(chan struct{})
	s.system.Root.Send(s.parent, &stopAll{done: drained})
	var err error
	select {
	case <-drained:
	case <-ctx.Done():
		s.system.Root.Send(s.parent, &batcher.Abort{})
		err = fmt.Errorf("sinkbatch: stop: %w", ctx.Err())
		// An aborted batcher answers ErrStopped to what it holds and to
		// every delivery still on its way to its mailbox, which protoactor
		// would drop when it stops. That takes a moment, not a request.
		select {
		case <-drained:
		case <-time.After(abortGrace):
			s.log.Error("sinkbatch: stop: batchers did not answer their mailboxes in time; deliveries in them are lost", slog.Duration("grace", abortGrace))
		}
	}
	// protoactor's Shutdown does not stop actors: stop the batchers (a
	// batcher answers whatever it still holds with ErrStopped) and then
	// their supervisor.
	_ = s.system.Root.StopFuture(s.parent).Wait()
	waited := make(chan struct{})
	go func() { s.requests.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
		if err == nil {
			err = fmt.Errorf("sinkbatch: stop: requests still running: %w", ctx.Err())
		}
	}
	// The router stays registered so that late senders are answered with
	// ErrStopped rather than dead-lettered.
	if err != nil {
		s.log.Warn("sinkbatch: stopped before everything was answered", slog.Any("error", err), slog.Duration("took", time.Since(start)))
	} else {
		s.log.Info("sinkbatch: stopped; every delivery answered", slog.Duration("took", time.Since(start)))
	}
	s.stopErr = err
	close(s.stopped)
	return err
}

// abortGrace bounds how long Stop, once its context has ended, waits for the
// batchers to answer what is in their mailboxes. Only a batcher stuck in a
// codec call (Size, Validate) takes longer.
const abortGrace = 5 * time.Second

// route sends one delivery on its way from the sender's goroutine.
func (s *Supervisor) route(message any, d *messages.Deliver, sender *actor.PID) {
	refuse := func(err error) {
		if sender != nil {
			s.system.Root.Send(sender, &messages.Delivered{Ref: d.Ref, Err: err})
		}
	}
	// (The sender is alive: it is sending.)
	if s.stopping.Load() {
		refuse(messages.ErrStopped)
		return
	}
	if d.Codec == nil {
		refuse(messages.ErrNilCodec)
		return
	}
	for {
		rt, err := s.lookup(d.Codec)
		if err != nil {
			refuse(err)
			return
		}
		if rt.forward(message, &s.stopping, func() { refuse(messages.ErrStopped) }) {
			return
		}
	}
}

// lookup finds c's destination, creating its route (and asking for its
// batcher) on the first delivery. The digest is computed once per codec
// value, not per delivery.
func (s *Supervisor) lookup(c codec.Codec) (*route, error) {
	cache := cacheable(c)
	if cache {
		if v, ok := s.codecs.Load(c); ok {
			return v.(*route), nil
		}
	}
	fresh, err := s.destination(c)
	if err != nil {
		return nil, err
	}
	v, loaded := s.routes.LoadOrStore(fresh.name, fresh)
	rt := v.(*route)
	if !loaded {
		s.system.Root.Send(s.parent, &spawn{route: rt})
	}
	if cache {
		rt.mu.Lock()
		if !rt.retired && len(rt.keys) < maxKeysPerRoute {
			rt.keys = append(rt.keys, c)
			s.codecs.Store(c, rt)
		}
		rt.mu.Unlock()
	}
	return rt, nil
}

// destination checks c and returns a new, closed route for its destination,
// named by the codec kind and a keyed digest of everything that shapes its
// requests.
func (s *Supervisor) destination(c codec.Codec) (rt *route, err error) {
	defer func() {
		if r := recover(); r != nil {
			rt, err = nil, fmt.Errorf("sinkbatch: codec %T: %w", c, batcher.CodecPanic("Name, Identity, Limits or Tuning", r))
		}
	}()
	if nilptr.Is(c) {
		return nil, messages.ErrNilCodec
	}
	kind := c.Name()
	if err := checkName("codec Name()", kind); err != nil {
		return nil, codec.Permanent(err)
	}
	tuning, err := batcher.Resolve(c, s.cfg.SinkConcurrency)
	if err != nil {
		return nil, err
	}
	mac := hmac.New(sha256.New, s.key[:])
	mac.Write(c.Identity())
	// The resolved tuning is part of the identity even if the codec forgot
	// to include it: batchers run with one tuning.
	fmt.Fprintf(mac, "\x00%+v", tuning)
	rt = &route{
		name:     kind + "-" + hex.EncodeToString(mac.Sum(nil)[:12]),
		sink:     kind,
		codec:    c,
		tuning:   tuning,
		oneGroup: c.Limits().OneGroupPerRequest,
	}
	rt.state.Store(closed)
	return rt, nil
}

// cacheable reports whether c can key the codec cache: pointers hash by
// address, and no pointer can panic as a map key.
func cacheable(c codec.Codec) bool {
	return c != nil && reflect.TypeOf(c).Kind() == reflect.Pointer
}

// checkName accepts names that are safe in actor names and log lines.
func checkName(what, name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("sinkbatch: %s %q must have 1 to 64 characters", what, name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("sinkbatch: %s %q may hold only letters, digits, '-', '_' and '.'", what, name)
		}
	}
	return nil
}

// CheckName is checkName for the front door's instance name.
func CheckName(name string) error { return checkName("instance Name", name) }

// router is the process behind the instance's PID.
type router struct{ s *Supervisor }

func (r *router) SendUserMessage(pid *actor.PID, message any) {
	if r.s.stopping.Load() {
		// A new instance of the same name may have taken the PID over
		// (Start). protoactor caches the process a PID value resolved to
		// in the value, so a sender holding this instance's PID still
		// reaches this router: hand the message on.
		if p, ok := r.s.system.ProcessRegistry.GetLocal(r.s.pid.Id); ok && p != actor.Process(r) {
			p.SendUserMessage(pid, message)
			return
		}
	}
	_, msg, sender := actor.UnwrapEnvelope(message)
	d, ok := msg.(*messages.Deliver)
	if !ok || d == nil {
		// Answer the sender, if any: it would otherwise wait for its own
		// timeout. A Deliver sent by value keeps its Ref.
		r.s.log.Warn("sinkbatch: the instance takes only a non-nil *messages.Deliver", slog.String("type", fmt.Sprintf("%T", msg)))
		if sender != nil {
			var ref any
			if v, isValue := msg.(messages.Deliver); isValue {
				ref = v.Ref
			}
			r.s.system.Root.Send(sender, &messages.Delivered{Ref: ref, Err: messages.ErrNotDeliver})
		}
		return
	}
	r.s.route(message, d, batcher.SenderOf(sender, d))
}

func (r *router) SendSystemMessage(*actor.PID, any) {}

func (r *router) Stop(*actor.PID) {}

// errSpawn wraps a failure to start a batcher.
var errSpawn = errors.New("sinkbatch: could not start the destination's batcher")
