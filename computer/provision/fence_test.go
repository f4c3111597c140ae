package provision

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission/errcode"
)

// fencedAttach is a fleet custodian's attach: with its fencing token.
func fencedAttach(ctx context.Context, c *Local, token uint64) error {
	_, err := AttachFencedVia(ctx, c, c.Tuple(), token)
	return err
}

// TestIntegrationComputerKeepsFences: a computer made as tether-demo up
// makes it (no option) honours a fleet custodian's fencing token at once,
// refuses a lower token, and still refuses it after a receiver restart
// (the state is durable). Positive control: the same computer with
// fence_state taken out of its receiver's config refuses the token, the
// failure issue 28 reported.
func TestIntegrationComputerKeepsFences(t *testing.T) {
	c := newLocal(t, Options{Bins: receiverBins(t)})
	ctx := ctxT(t, 2*time.Minute)
	if err := fencedAttach(ctx, c, 5); err != nil {
		t.Fatalf("fleet attach with token 5 on a fresh computer: %v", err)
	}
	wantCode(t, fencedAttach(ctx, c, 3), errcode.CodeFenced)
	fi, err := os.Lstat(fenceStatePath(c.paths))
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Fatalf("fence state %v, %v; want a 0600 file", fi, err)
	}
	if err := c.StopReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.StartReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	wantCode(t, fencedAttach(ctx, c, 4), errcode.CodeFenced)
	if err := fencedAttach(ctx, c, 6); err != nil {
		t.Fatalf("token 6 after a restart: %v", err)
	}

	// Control: no fence_state, as computers were made before.
	if err := c.StopReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	p := c.paths
	settings := c.receiverSettings()
	settings.FenceState = ""
	data, err := ReceiverConfig(settings)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.receiverConfig, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.StartReceiver(ctx); err != nil {
		t.Fatal(err)
	}
	wantCode(t, fencedAttach(ctx, c, 7), errcode.CodeDenied)
}
