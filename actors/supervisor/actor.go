package supervisor

import (
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/ankusa/sinkbatch/actors/batcher"
	"github.com/ankusa/sinkbatch/messages"
	"github.com/ankusa/sinkbatch/telemetry"
)

// spawn asks the supervisor actor to start a route's batcher.
type spawn struct{ route *route }

// stopAll asks the supervisor actor to drain every batcher; it closes done
// once every delivery received before Stop is answered.
type stopAll struct{ done chan struct{} }

// supervisorActor is the Supervisor seen as the parent of the batchers. Its
// state lives in the Supervisor, so a restart of this actor loses nothing.
type supervisorActor Supervisor

// Receive never panics: a restart of the supervisor actor would stop every
// batcher, and protoactor drops what is in a stopping actor's mailbox. A
// panic (in user code it calls: a Recorder) is logged and the message's
// work is left as far as it got.
func (a *supervisorActor) Receive(ctx actor.Context) {
	s := (*Supervisor)(a)
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("sinkbatch: supervisor recovered from a panic", slog.Any("panic", r), slog.String("message", fmt.Sprintf("%T", ctx.Message())), slog.String("stack", string(debug.Stack())))
		}
	}()
	switch m := ctx.Message().(type) {
	case *spawn:
		s.spawn(ctx, m.route)
	case *batcher.Idle:
		s.idle(ctx, m)
	case *actor.Terminated:
		s.terminated(ctx, m.Who)
	case *stopAll:
		s.drainAll(ctx, m.done)
	case *batcher.Drained:
		if rt := s.children[m.Who.Id]; rt != nil {
			rt.draining = false
		}
		s.checkDrained()
	case *batcher.Abort:
		for _, rt := range s.children {
			if rt.draining {
				ctx.Send(rt.pid, m)
			}
		}
	}
}

// spawn starts rt's batcher and hands it the deliveries held meanwhile, in
// order, before opening the route.
func (s *Supervisor) spawn(ctx actor.Context, rt *route) {
	if s.stopping.Load() {
		s.retire(rt, messages.ErrStopped)
		s.checkDrained()
		return
	}
	p := &batcher.Params{
		Name:           rt.name,
		Sink:           rt.sink,
		Codec:          rt.codec,
		Tuning:         rt.tuning,
		OneGroup:       rt.oneGroup,
		DefaultTimeout: s.cfg.DefaultTimeout,
		Logger:         s.log.With(slog.String("sink", rt.sink), slog.String("destination", rt.name)),
		Recorder:       s.sinkRecorder(rt.sink),
		Counters:       &s.counters,
		Requests:       &s.requests,
		Cancels:        &s.cancels,
		Tracer:         s.cfg.Tracer,
	}
	pid, err := ctx.SpawnNamed(batcher.Props(p), rt.name)
	if err != nil {
		// Only a name still taken can fail here, and the old batcher's
		// Terminated has been seen: answer rather than hold forever.
		s.log.Error("sinkbatch: could not start a batcher", slog.String("destination", rt.name), slog.Any("error", err))
		s.retire(rt, fmt.Errorf("%w: %v", errSpawn, err))
		return
	}
	proc, _ := s.system.ProcessRegistry.Get(pid)
	s.children[pid.Id] = rt
	s.counters.Batchers.Add(1)
	rt.pid, rt.idleStopping = pid, false
	rt.params.Store(p)
	rt.mu.Lock()
	rt.target.Store(&target{pid: pid, proc: proc})
	for _, m := range rt.held {
		proc.SendUserMessage(pid, m)
	}
	rt.state.Store(uint64(len(rt.held)))
	rt.held = nil
	rt.mu.Unlock()
}

// sinkRecorder is the Recorder's SinkRecorder for sink, or one that records
// nothing if the Recorder panics: a metrics bug must not keep a destination
// from starting.
func (s *Supervisor) sinkRecorder(sink string) (r telemetry.SinkRecorder) {
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("sinkbatch: Recorder.Sink panicked; this destination records nothing", slog.String("sink", sink), slog.Any("panic", v))
			r = telemetry.Nop{}
		}
	}()
	return s.cfg.Recorder.Sink(sink)
}

// idle stops a batcher that reports idleness, if nothing was forwarded to it
// since: the compare-and-swap closes the route only from exactly the count
// the batcher received.
func (s *Supervisor) idle(ctx actor.Context, m *batcher.Idle) {
	rt := s.children[m.Who.Id]
	if rt == nil || s.stopping.Load() || rt.idleStopping {
		return
	}
	if rt.state.CompareAndSwap(m.Received, m.Received|closed) {
		rt.idleStopping = true
		// Not ctx.Stop: it caches the process on the PID, and protoactor's
		// child set keeps removed PIDs in its backing array, so every
		// stopped batcher (queue, mailbox, timer) would stay reachable.
		if p, ok := s.system.ProcessRegistry.Get(m.Who); ok {
			p.Stop(m.Who)
		}
	}
}

// terminated retires a stopped batcher's route, or starts its replacement
// when deliveries arrived while it stopped. protoactor frees the name before
// it sends Terminated, so the replacement can take it at once. The choice is
// made under the route's lock: a delivery held after it would be lost.
func (s *Supervisor) terminated(ctx actor.Context, who *actor.PID) {
	rt := s.children[who.Id]
	if rt == nil {
		return
	}
	delete(s.children, who.Id)
	rt.mu.Lock()
	if len(rt.held) > 0 && !s.stopping.Load() {
		rt.mu.Unlock()
		s.counters.Batchers.Add(-1)
		s.spawn(ctx, rt)
		return
	}
	held := s.retireLocked(rt)
	rt.mu.Unlock()
	if rt.idleStopping {
		s.log.Info("sinkbatch: batcher stopped idle", slog.String("destination", rt.name))
	} else {
		s.log.Debug("sinkbatch: batcher stopped", slog.String("destination", rt.name))
	}
	s.counters.Batchers.Add(-1)
	s.answer(held, messages.ErrStopped)
	s.checkDrained()
}

// retire removes rt for good and answers what it held with err.
func (s *Supervisor) retire(rt *route, err error) {
	rt.mu.Lock()
	held := s.retireLocked(rt)
	rt.mu.Unlock()
	s.answer(held, err)
}

// retireLocked marks rt retired and removes it from the routing maps, so
// that senders look the destination up anew. It returns what rt held.
func (s *Supervisor) retireLocked(rt *route) []any {
	held := rt.held
	rt.held, rt.retired = nil, true
	s.routes.CompareAndDelete(rt.name, rt)
	for _, k := range rt.keys {
		s.codecs.CompareAndDelete(k, rt)
	}
	rt.keys = nil
	return held
}

// answer answers held deliveries (and adoptions of paused groups) with
// err.
func (s *Supervisor) answer(held []any, err error) {
	for _, m := range held {
		_, msg, envelope := actor.UnwrapEnvelope(m)
		d, ok := msg.(*messages.Deliver)
		if !ok {
			if a, ok := msg.(*batcher.Adopt); ok && a.Done != nil {
				a.Done <- err
			}
			continue
		}
		sender := batcher.SenderOf(envelope, d)
		if sender == nil {
			continue
		}
		if p, ok := s.system.ProcessRegistry.Get(sender); ok {
			p.SendUserMessage(sender, &messages.Delivered{Ref: d.Ref, Err: err})
		}
	}
}

// drainAll closes every route and asks each batcher to send what it holds
// and report once it has answered every delivery forwarded to it.
func (s *Supervisor) drainAll(ctx actor.Context, done chan struct{}) {
	s.stopReq = done
	// A route whose batcher is not started yet (its spawn still in this
	// mailbox, which protoactor drops when the supervisor stops) answers
	// what it holds now.
	s.routes.Range(func(_, v any) bool {
		if rt := v.(*route); rt.pid == nil {
			s.retire(rt, messages.ErrStopped)
		}
		return true
	})
	for _, rt := range s.children {
		if rt.idleStopping {
			continue // its Terminated retires it
		}
		forwarded := rt.state.Or(closed) &^ closed
		rt.draining = true
		ctx.Send(rt.pid, &batcher.Drain{Expect: forwarded})
	}
	s.checkDrained()
}

func (s *Supervisor) checkDrained() {
	if s.stopReq == nil {
		return
	}
	for _, rt := range s.children {
		if rt.draining || rt.idleStopping {
			return
		}
	}
	close(s.stopReq)
	s.stopReq = nil
}

// restartAlways restarts a crashed batcher every time: giving up would stop
// it while deliveries may sit in its mailbox, and protoactor drops those
// silently. The crashed incarnation answers everything it held with
// ErrBatcherDown before the new one starts.
type restartAlways struct{ s *Supervisor }

func (r *restartAlways) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, _ *actor.RestartStatistics, reason any, _ any) {
	name, sink := child.Id, ""
	if rt := r.s.children[child.Id]; rt != nil {
		name, sink = rt.name, rt.sink
	}
	r.s.log.Warn("sinkbatch: batcher crashed; restarting it",
		slog.String("sink", sink), slog.String("destination", name), slog.String("reason", fmt.Sprint(reason)))
	sup.RestartChildren(child)
}
