package service

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
)

// TestChurnKeepsCapacity: four owners create and delete at once, some
// clients going away while queued or while their computer is made; the
// provisioner never holds more machines than the capacity, no machine is
// handed out twice, and nothing is left at the end.
func TestChurnKeepsCapacity(t *testing.T) {
	s, prov := newTestService(t, Config{MaxComputers: 3, Pools: []Profile{{Name: "small", Limits: small, Size: 1}}})
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[string]bool{}
	for o := range 4 {
		caller := api.Caller{Owner: fmt.Sprintf("owner%d", o)}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				ctx, cancel := context.WithCancel(context.Background())
				if rand.IntN(4) == 0 {
					time.AfterFunc(time.Duration(rand.IntN(2000))*time.Microsecond, cancel)
				}
				req := api.CreateRequest{QueueTimeoutSeconds: 30}
				if i%2 == 0 {
					req.Limits = small
				}
				c, err := s.Create(ctx, caller, req)
				cancel()
				if err != nil {
					if !errors.Is(err, context.Canceled) {
						t.Errorf("create: %v", err)
					}
					continue
				}
				mu.Lock()
				if seen[c.Tuple.Allocation] {
					t.Errorf("machine %s handed out twice", c.Tuple.Allocation)
				}
				seen[c.Tuple.Allocation] = true
				mu.Unlock()
				if err := s.Delete(context.Background(), caller, c.ID); err != nil {
					t.Errorf("delete: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	if st := s.Stats(); st.Queued != 0 || st.Used > 1 || st.ByState[api.StateRunning] != 0 {
		t.Errorf("after churn: %+v", st)
	}
	s.Close()
	prov.mu.Lock()
	defer prov.mu.Unlock()
	t.Logf("%d computers made, at most %d machines at once", len(seen), prov.maxLive)
	if prov.maxLive > 3 {
		t.Fatalf("%d machines at once, capacity 3", prov.maxLive)
	}
	// The pool keeps at most its one machine after Close.
	if prov.live > 1 {
		t.Fatalf("%d machines left", prov.live)
	}
}

// TestPrepareFailure: a failed Prepare ends the create failed, destroys
// the directory and gives the capacity back.
func TestPrepareFailure(t *testing.T) {
	s, prov := newTestService(t, Config{MaxComputers: 1})
	prov.prepErr = errors.New("no uid left")
	_, err := s.Create(context.Background(), alice, api.CreateRequest{})
	wantCode(t, err, api.CodeInternal)
	l, _ := s.List(context.Background(), alice)
	if len(l) != 1 || l[0].State != api.StateFailed {
		t.Fatalf("after a failed prepare: %+v", l)
	}
	if ops := prov.allCalls(); len(ops) != 2 || ops[1] != "Destroy "+filepath.Join(s.cfg.Dir, "computers", l[0].ID) {
		t.Fatalf("calls %v, want Prepare then Destroy", ops)
	}
	prov.mu.Lock()
	prov.prepErr = nil
	prov.mu.Unlock()
	if _, err := s.Create(context.Background(), alice, api.CreateRequest{QueueTimeoutSeconds: 1}); err != nil {
		t.Fatalf("capacity not given back: %v", err)
	}
}
