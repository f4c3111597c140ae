package signedfile

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission"
)

// TestPublishFencedRefusesDeposedLeader: a fenced publish records its
// leader revision in the directory; the same or a higher revision
// publishes, a lower one is refused with ErrDeposed and leaves the file,
// its generation and the record as they were, also for a new publisher
// (another process) on the same directory. A record that does not parse
// stops fenced publishing.
func TestPublishFencedRefusesDeposedLeader(t *testing.T) {
	dir, k := adminDir(t), testKey(t)
	p := newTestPublisher(t, dir, k, clockAt(t0))
	na := t0.Add(time.Hour)
	in := inputWith(0, na, grantFor(tupleN(1), na))
	ctx := context.Background()
	for _, rev := range []uint64{7, 7, 12} {
		if _, err := p.PublishFenced(ctx, in, rev); err != nil {
			t.Fatalf("leader %d: %v", rev, err)
		}
	}
	before, _ := os.ReadFile(filepath.Join(dir, admission.FileName))
	late := newTestPublisher(t, dir, k, clockAt(t0)) // the deposed leader's own publisher
	for _, rev := range []uint64{11, 7, 0} {
		_, err := late.PublishFenced(ctx, in, rev)
		var de *DeposedError
		if !errors.Is(err, ErrDeposed) || (rev != 0 && (!errors.As(err, &de) || de.Recorded != 12 || de.Leader != rev)) {
			t.Fatalf("leader %d after 12: %v, want ErrDeposed", rev, err)
		}
	}
	after, _ := os.ReadFile(filepath.Join(dir, admission.FileName))
	if string(before) != string(after) {
		t.Fatal("a deposed leader's publish changed the file")
	}
	if rec, _ := os.ReadFile(filepath.Join(dir, leaderName)); string(rec) != "12\n" {
		t.Fatalf("leader record = %q, want 12", rec)
	}
	if got, err := late.PublishFenced(ctx, in, 13); err != nil || got.Generation != 4 {
		t.Fatalf("leader 13: %+v, %v; want generation 4", got, err)
	}
	os.WriteFile(filepath.Join(dir, leaderName), []byte("x\n"), 0o644)
	if _, err := p.PublishFenced(ctx, in, 99); !errors.Is(err, ErrPublishDir) {
		t.Fatalf("unparseable leader record: %v, want ErrPublishDir", err)
	}
}
