package service

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

type result struct {
	c   api.Computer
	err error
}

// createAsync starts a create and waits until it is queued; it returns
// the computer's id and where the create's result will come.
func createAsync(t *testing.T, s *Service, evs <-chan api.Event, ctx context.Context, c api.Caller,
	req api.CreateRequest) (string, <-chan result) {
	t.Helper()
	out := make(chan result, 1)
	go func() {
		got, err := s.Create(ctx, c, req)
		out <- result{got, err}
	}()
	ev := waitFor(t, evs, 5*time.Second, func(ev api.Event) bool {
		return ev.Owner == c.Owner && ev.From == "" && ev.To == api.StateQueued
	})
	return ev.Computer, out
}

// TestQueueFairAcrossOwners: with room for one computer, alice queues a
// burst of four, then bob one; bob's request is served second, not
// fifth, and the positions reported say so.
func TestQueueFairAcrossOwners(t *testing.T) {
	s, _ := newTestService(t, Config{MaxComputers: 1})
	evs := subscribe(t, s, admin)
	ctx := context.Background()
	first, err := s.Create(ctx, alice, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, evs, 5*time.Second, to(first.ID, api.StateRunning))
	var aliceIDs []string
	for range 4 {
		id, _ := createAsync(t, s, evs, ctx, alice, api.CreateRequest{})
		aliceIDs = append(aliceIDs, id)
	}
	bobID, bobDone := createAsync(t, s, evs, ctx, bob, api.CreateRequest{})
	pos := waitFor(t, evs, 5*time.Second, func(ev api.Event) bool { return ev.Computer == bobID && ev.QueuePosition > 0 })
	if pos.QueuePosition != 2 {
		t.Fatalf("bob's position %d, want 2 (behind alice's first only)", pos.QueuePosition)
	}
	// Free the slot twice: alice's first waiter, then bob.
	running := []string{first.ID}
	var order []string
	for len(order) < 2 {
		if err := s.Delete(ctx, admin, running[len(running)-1]); err != nil {
			t.Fatal(err)
		}
		ev := waitFor(t, evs, 5*time.Second, func(ev api.Event) bool { return ev.To == api.StateRunning && ev.From == api.StateCreating })
		order = append(order, ev.Computer)
		running = append(running, ev.Computer)
	}
	if order[0] != aliceIDs[0] || order[1] != bobID {
		t.Fatalf("served %v, want alice's first %s then bob's %s", order, aliceIDs[0], bobID)
	}
	if r := <-bobDone; r.err != nil || r.c.State != api.StateRunning {
		t.Fatalf("bob's create: %+v %v", r.c, r.err)
	}
}

// TestQueueFIFOWouldStarve is the control of the fairness test: with
// every request under one owner (what a single FIFO is), the late
// request's position is behind the whole burst.
func TestQueueFIFOWouldStarve(t *testing.T) {
	q := fairQueue{subs: map[string][]*waiter{}}
	ws := make([]*waiter, 5)
	for i := range ws {
		ws[i] = &waiter{owner: "one"}
		q.push(ws[i])
	}
	if p := q.positions()[ws[4]]; p != 5 {
		t.Fatalf("single-owner position %d, want 5", p)
	}
	fair := fairQueue{subs: map[string][]*waiter{}}
	for i := range 4 {
		ws[i].owner = "alice"
		fair.push(ws[i])
	}
	ws[4].owner = "bob"
	fair.push(ws[4])
	if p := fair.positions()[ws[4]]; p != 2 {
		t.Fatalf("round-robin position %d, want 2", p)
	}
}

// TestQueueDropOnCancel: a queued create whose client goes away leaves
// the queue (queued → deleted) and is never made.
func TestQueueDropOnCancel(t *testing.T) {
	s, prov := newTestService(t, Config{MaxComputers: 1})
	evs := subscribe(t, s, admin)
	first, err := s.Create(context.Background(), alice, api.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	id, done := createAsync(t, s, evs, ctx, bob, api.CreateRequest{})
	cancel()
	r := <-done
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled create: %v", r.err)
	}
	ev := waitFor(t, evs, 5*time.Second, to(id, api.StateDeleted))
	if ev.From != api.StateQueued {
		t.Fatalf("dropped from %s", ev.From)
	}
	// Freeing the slot makes nothing for the dropped request.
	if err := s.Delete(context.Background(), alice, first.ID); err != nil {
		t.Fatal(err)
	}
	if n := prov.count("Prepare"); n != 1 {
		t.Fatalf("%d Prepare calls, want 1 (the dropped create was made)", n)
	}
	s.mu.Lock()
	n := s.queue.len()
	s.mu.Unlock()
	if n != 0 {
		t.Fatalf("queue holds %d", n)
	}
}

func TestQueueTimeout(t *testing.T) {
	s, prov := newTestService(t, Config{MaxComputers: 1})
	if _, err := s.Create(context.Background(), alice, api.CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := s.Create(context.Background(), bob, api.CreateRequest{QueueTimeoutSeconds: 1})
	wantCode(t, err, api.CodeQueueTimeout)
	if d := time.Since(start); d < time.Second || d > 3*time.Second {
		t.Fatalf("timed out after %s", d)
	}
	if n := prov.count("Prepare"); n != 1 {
		t.Fatalf("%d Prepare calls", n)
	}
}

// TestQueueMemoryCapacity: committed memory is a limit of its own.
func TestQueueMemoryCapacity(t *testing.T) {
	s, _ := newTestService(t, Config{MaxMemoryBytes: 1 << 30})
	ctx := context.Background()
	if _, err := s.Create(ctx, alice, api.CreateRequest{Limits: api.Limits{MemoryBytes: 768 << 20}}); err != nil {
		t.Fatal(err)
	}
	_, err := s.Create(ctx, bob, api.CreateRequest{Limits: api.Limits{MemoryBytes: 512 << 20}, QueueTimeoutSeconds: 1})
	wantCode(t, err, api.CodeQueueTimeout)
	if _, err := s.Create(ctx, bob, api.CreateRequest{Limits: api.Limits{MemoryBytes: 256 << 20}}); err != nil {
		t.Fatalf("a create that fits: %v", err)
	}
}

func TestDeleteWhileQueued(t *testing.T) {
	s, prov := newTestService(t, Config{MaxComputers: 1})
	evs := subscribe(t, s, admin)
	if _, err := s.Create(context.Background(), alice, api.CreateRequest{}); err != nil {
		t.Fatal(err)
	}
	id, done := createAsync(t, s, evs, context.Background(), bob, api.CreateRequest{})
	if err := s.Delete(context.Background(), bob, id); err != nil {
		t.Fatal(err)
	}
	wantCode(t, (<-done).err, api.CodeConflict)
	if c, _ := s.Get(context.Background(), bob, id); c.State != api.StateDeleted {
		t.Fatalf("state %s", c.State)
	}
	if n := prov.count("Prepare"); n != 1 {
		t.Fatalf("%d Prepare calls", n)
	}
}

// TestFairQueueRoundRobin: owners are served in turn, each owner's
// requests in order, and the positions reported match the order served.
func TestFairQueueRoundRobin(t *testing.T) {
	q := fairQueue{subs: map[string][]*waiter{}}
	var all []*waiter
	for _, o := range []string{"a", "a", "a", "b", "c", "c"} {
		w := &waiter{owner: o, c: &computer{rec: record{ID: o + string(rune('0'+len(all)))}}}
		all = append(all, w)
		q.push(w)
	}
	pos := q.positions()
	var got []string
	for i := 1; ; i++ {
		w := q.pick(func(*waiter) bool { return true })
		if w == nil {
			break
		}
		if pos[w] != i {
			t.Errorf("%s served %d, reported position %d", w.c.rec.ID, i, pos[w])
		}
		got = append(got, w.c.rec.ID)
	}
	want := []string{"a0", "b3", "c4", "a1", "c5", "a2"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("served %v, want %v", got, want)
	}
	if q.len() != 0 || len(q.owners) != 0 {
		t.Fatalf("queue not empty: %d, owners %v", q.len(), q.owners)
	}
}
