package httpserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/egress/policy"
)

// strictBackend is an in-memory api.Backend that fails the test on any
// call it was not told to expect (expect), so an attack test that
// expects nothing proves the backend was never called. It keeps owner
// isolation as the service must: a computer of another owner is
// not_found unless the caller is an admin.
type strictBackend struct {
	t *testing.T

	mu        sync.Mutex
	want      map[string]int
	computers map[string]api.Computer
	next      int
	calls     []string
	// events feeds Events; eventsDone is closed when an Events context ends.
	events     chan api.Event
	eventsDone chan struct{}
	// importTier is the tier the last Import named.
	importTier string
	// fail, when set, is returned by every expected call.
	fail error
	// egress holds SetEgress's policies by id (egress_test.go).
	egress map[string]policy.Policy
}

func newStrictBackend(t *testing.T) *strictBackend {
	return &strictBackend{t: t, want: map[string]int{}, computers: map[string]api.Computer{},
		events: make(chan api.Event), eventsDone: make(chan struct{})}
}

var _ api.Backend = (*strictBackend)(nil)

// expect allows n more calls of method.
func (b *strictBackend) expect(method string, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.want[method] += n
}

// called records a call and reports whether it was expected; an
// unexpected call fails the test.
func (b *strictBackend) called(method string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, method)
	if b.want[method] == 0 {
		b.t.Errorf("backend: unexpected call %s", method)
		return api.Errorf(api.CodeInternal, "unexpected call %s", method)
	}
	b.want[method]--
	return b.fail
}

// callCount is how many calls the backend received.
func (b *strictBackend) callCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.calls)
}

// add stores a running computer of owner and returns it.
func (b *strictBackend) add(owner string) api.Computer {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.next++
	c := api.Computer{ID: fmt.Sprintf("c%d", b.next), Owner: owner, State: api.StateRunning, Tier: api.TierNamespaced,
		Limits: api.Limits{MemoryBytes: 256 << 20, Pids: 256, DiskBytes: 1 << 30}, IdleTimeoutSeconds: 900,
		CreatedAt: time.Date(2026, 12, 6, 19, 0, 0, 0, time.UTC), LeaseExpiresAt: time.Date(2026, 12, 6, 20, 0, 0, 0, time.UTC)}
	b.computers[c.ID] = c
	return c
}

// lookup returns id's computer if c may see it.
func (b *strictBackend) lookup(c api.Caller, id string) (api.Computer, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	comp, ok := b.computers[id]
	if !ok || (!c.Admin && comp.Owner != c.Owner) {
		return api.Computer{}, api.Errorf(api.CodeNotFound, "no computer %q", id)
	}
	return comp, nil
}

func (b *strictBackend) Create(ctx context.Context, c api.Caller, req api.CreateRequest) (api.Computer, error) {
	if err := b.called("Create"); err != nil {
		return api.Computer{}, err
	}
	comp := b.add(c.Owner)
	comp.Labels = req.Labels
	return comp, nil
}

func (b *strictBackend) Get(ctx context.Context, c api.Caller, id string) (api.Computer, error) {
	if err := b.called("Get"); err != nil {
		return api.Computer{}, err
	}
	return b.lookup(c, id)
}

func (b *strictBackend) List(ctx context.Context, c api.Caller) ([]api.Computer, error) {
	if err := b.called("List"); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []api.Computer
	for _, comp := range b.computers {
		if c.Admin || comp.Owner == c.Owner {
			out = append(out, comp)
		}
	}
	return out, nil
}

func (b *strictBackend) Delete(ctx context.Context, c api.Caller, id string) error {
	if err := b.called("Delete"); err != nil {
		return err
	}
	if _, err := b.lookup(c, id); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.computers, id)
	return nil
}

func (b *strictBackend) Renew(ctx context.Context, c api.Caller, id string, ttl time.Duration) (api.Computer, error) {
	if err := b.called("Renew"); err != nil {
		return api.Computer{}, err
	}
	comp, err := b.lookup(c, id)
	comp.LeaseExpiresAt = comp.CreatedAt.Add(ttl)
	return comp, err
}

func (b *strictBackend) Suspend(ctx context.Context, c api.Caller, id string) (api.Computer, error) {
	return b.setState("Suspend", c, id, api.StateSuspended)
}

func (b *strictBackend) Resume(ctx context.Context, c api.Caller, id string) (api.Computer, error) {
	return b.setState("Resume", c, id, api.StateRunning)
}

func (b *strictBackend) setState(method string, c api.Caller, id, state string) (api.Computer, error) {
	if err := b.called(method); err != nil {
		return api.Computer{}, err
	}
	comp, err := b.lookup(c, id)
	if err != nil {
		return comp, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	comp.State = state
	b.computers[id] = comp
	return comp, nil
}

// Events forwards b.events until ctx ends, then closes eventsDone.
func (b *strictBackend) Events(ctx context.Context, c api.Caller) (<-chan api.Event, error) {
	if err := b.called("Events"); err != nil {
		return nil, err
	}
	out := make(chan api.Event)
	go func() {
		defer close(b.eventsDone)
		defer close(out)
		for {
			select {
			case <-ctx.Done():
				return
			case ev := <-b.events:
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

func (b *strictBackend) TouchAs(ctx context.Context, c api.Caller, id string) (api.Computer, error) {
	return b.setState("TouchAs", c, id, api.StateRunning)
}

// Receipts lists one export receipt of id.
func (b *strictBackend) Receipts(ctx context.Context, c api.Caller, id string) ([]api.Receipt, error) {
	if err := b.called("Receipts"); err != nil {
		return nil, err
	}
	if _, err := b.lookup(c, id); err != nil {
		return nil, err
	}
	return []api.Receipt{receiptOf(id, "export", "", []byte(streamOf(id)))}, nil
}

// streamOf is what the strict backend exports or copies out of id.
func streamOf(id string) string { return "stream of " + id }

func receiptOf(id, op, path string, body []byte) api.Receipt {
	sum := sha256.Sum256(body)
	return api.Receipt{Computer: id, Op: op, Path: path, SHA256: hex.EncodeToString(sum[:]), Bytes: int64(len(body)),
		Files: 1, At: time.Date(2026, 12, 6, 19, 30, 0, 0, time.UTC)}
}

func (b *strictBackend) Export(ctx context.Context, c api.Caller, id string) (io.ReadCloser, api.Receipt, error) {
	return b.out("Export", c, id, api.OpExport, "")
}

func (b *strictBackend) CopyOut(ctx context.Context, c api.Caller, id, path string) (io.ReadCloser, api.Receipt, error) {
	return b.out("CopyOut", c, id, api.OpCopyOut, path)
}

func (b *strictBackend) out(method string, c api.Caller, id, op, path string) (io.ReadCloser, api.Receipt, error) {
	if err := b.called(method); err != nil {
		return nil, api.Receipt{}, err
	}
	if _, err := b.lookup(c, id); err != nil {
		return nil, api.Receipt{}, err
	}
	body := []byte(streamOf(id))
	return io.NopCloser(bytes.NewReader(body)), receiptOf(id, op, path, body), nil
}

func (b *strictBackend) CopyIn(ctx context.Context, c api.Caller, id, dir string, r io.Reader) (api.Receipt, error) {
	if err := b.called("CopyIn"); err != nil {
		return api.Receipt{}, err
	}
	if _, err := b.lookup(c, id); err != nil {
		return api.Receipt{}, err
	}
	body, err := io.ReadAll(r)
	if err != nil {
		return api.Receipt{}, fmt.Errorf("read the tar: %w", err)
	}
	return receiptOf(id, api.OpCopyIn, dir, body), nil
}

func (b *strictBackend) Import(ctx context.Context, c api.Caller, req api.CreateRequest, r io.Reader, want string) (api.ImportResult, error) {
	if err := b.called("Import"); err != nil {
		return api.ImportResult{}, err
	}
	body, err := io.ReadAll(r)
	if err != nil {
		return api.ImportResult{}, fmt.Errorf("read the stream: %w", err)
	}
	b.mu.Lock()
	b.importTier = req.Tier
	b.mu.Unlock()
	comp := b.add(c.Owner)
	rec := receiptOf(comp.ID, api.OpImport, "", body)
	if rec.SHA256 != want {
		return api.ImportResult{}, api.Errorf(api.CodeBadRequest, "digest mismatch")
	}
	return api.ImportResult{Computer: comp, Receipt: rec}, nil
}
