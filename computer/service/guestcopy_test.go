package service

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/archive"
)

// copyMachine is a strictMachine whose copies go through its guest
// (api.GuestCopier), as a VM computer's do; its guest keeps what a copy
// in sent and answers a copy out with out, or fails with err.
type copyMachine struct {
	*strictMachine
	got      []byte
	dir      string
	out      []byte
	err      error
	suspends bool // a frozen machine refuses, as a stopped guest does
}

func (m *copyMachine) CopyIn(ctx context.Context, dir string, r io.Reader) (api.Transfer, error) {
	m.use("CopyIn")
	if err := m.refuse(); err != nil {
		return api.Transfer{}, err
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return api.Transfer{}, err
	}
	m.got, m.dir = b, dir
	return api.Transfer{SHA256: digestHex(b), Bytes: int64(len(b)), Files: 2}, nil
}

func (m *copyMachine) CopyOut(ctx context.Context, path string, w io.Writer) (api.Transfer, error) {
	m.use("CopyOut")
	if err := m.refuse(); err != nil {
		return api.Transfer{}, err
	}
	if _, err := w.Write(m.out); err != nil {
		return api.Transfer{}, err
	}
	return api.Transfer{SHA256: digestHex(m.out), Bytes: int64(len(m.out)), Files: 1}, nil
}

func (m *copyMachine) refuse() error {
	m.p.mu.Lock()
	frozen := m.frozen
	m.p.mu.Unlock()
	if frozen {
		return api.Errorf(api.CodeConflict, "the guest is stopped")
	}
	return m.err
}

var _ api.GuestCopier = (*copyMachine)(nil)

// TestCopyThroughGuest: copy in and out of a machine that is an
// api.GuestCopier go to it, with the receipt of its transfer (bytes
// that are no tar reach it as they are: the root's extraction would
// refuse them); a suspended one
// answers the machine's conflict; the guest's refusals keep the codes a
// namespaced computer's copy gets.
func TestCopyThroughGuest(t *testing.T) {
	p := newStrictProv(t)
	var m *copyMachine
	p.wrap = func(sm *strictMachine) api.Machine {
		m = &copyMachine{strictMachine: sm, out: []byte("TAR OUT")}
		return m
	}
	s, _ := newTestService(t, Config{Provisioners: map[string]api.Provisioner{api.TierVM: p}})
	ctx := context.Background()
	c, err := s.Create(ctx, alice, api.CreateRequest{Tier: api.TierVM})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := s.CopyIn(ctx, alice, c.ID, "/work", bytes.NewReader([]byte("TAR IN")))
	if err != nil || string(m.got) != "TAR IN" || m.dir != "/work" || rec.SHA256 != digestHex([]byte("TAR IN")) || rec.Files != 2 {
		t.Fatalf("copy in: %+v %v; the guest got %q in %q", rec, err, m.got, m.dir)
	}
	rc, rec, err := s.CopyOut(ctx, alice, c.ID, "/work/x")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "TAR OUT" || rec.SHA256 != digestHex(b) || rec.Op != api.OpCopyOut {
		t.Fatalf("copy out %q, receipt %+v", b, rec)
	}
	for _, c2 := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: in the guest", archive.ErrUnsafeEntry), api.CodeBadRequest},
		{fmt.Errorf("%w: in the guest", archive.ErrTooLarge), api.CodeTooLarge},
		{fmt.Errorf("%w: in the guest", archive.ErrNotEmpty), api.CodeConflict},
	} {
		m.err = c2.err
		if _, err := s.CopyIn(ctx, alice, c.ID, "/", bytes.NewReader(nil)); api.CodeOf(err) != c2.want {
			t.Errorf("copy in refused with %v: %v, want %s", c2.err, err, c2.want)
		}
		if _, _, err := s.CopyOut(ctx, alice, c.ID, "/x"); api.CodeOf(err) != c2.want {
			t.Errorf("copy out refused with %v: %v, want %s", c2.err, err, c2.want)
		}
	}
	m.err = nil
	if _, err := s.Suspend(ctx, alice, c.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CopyIn(ctx, alice, c.ID, "/", bytes.NewReader(nil)); api.CodeOf(err) != api.CodeConflict {
		t.Errorf("copy in to a suspended guest: %v, want conflict", err)
	}
	if _, _, err := s.CopyOut(ctx, alice, c.ID, "/x"); api.CodeOf(err) != api.CodeConflict {
		t.Errorf("copy out of a suspended guest: %v, want conflict", err)
	}
	if n := len(p.machines); n != 1 {
		t.Fatalf("%d machines", n)
	}
}
