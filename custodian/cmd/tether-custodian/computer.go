package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/client"
)

// computerFlags ask the computer service (tether-computer serve) for a
// fresh computer for one run, instead of a --config naming one.
type computerFlags struct {
	socket string
	keep   bool
	ttl    time.Duration
}

// releaseGrace bounds the delete of the run's computer at the end, even
// when the run itself was cancelled.
const releaseGrace = 30 * time.Second

func addComputerFlags(fs *flag.FlagSet) *computerFlags {
	f := &computerFlags{}
	fs.StringVar(&f.socket, "computer-socket", "", "ask the computer service listening on this unix socket ("+client.DefaultSocket+" is its default) for a fresh computer for this run, instead of --config; it is deleted when the run ends")
	fs.BoolVar(&f.keep, "keep-computer", false, "with --computer-socket: keep the computer when the run ends (tether-computer rm ID ends it)")
	fs.DurationVar(&f.ttl, "computer-ttl", time.Hour, "with --computer-socket: the computer's lease")
	return f
}

// acquire creates the run's computer and returns the path of its
// custodian configuration and the release the caller defers: it deletes
// the computer, unless --keep-computer, and says which it did.
func (f *computerFlags) acquire(ctx context.Context, stderr io.Writer) (string, func(), error) {
	c := client.Unix(f.socket)
	req := api.CreateRequest{LeaseTTLSeconds: int64(f.ttl / time.Second), Labels: map[string]string{"by": "tether-custodian-run"}}
	comp, err := c.Create(ctx, req)
	if err != nil {
		return "", func() {}, fmt.Errorf("computer service %s: create: %w", f.socket, err)
	}
	if comp.CustodianConfig == "" {
		_ = c.Delete(context.WithoutCancel(ctx), comp.ID)
		return "", func() {}, fmt.Errorf("computer service %s: computer %s came without a custodian configuration", f.socket, comp.ID)
	}
	fmt.Fprintf(stderr, "tether-custodian: computer %s from the service (lease until %s)\n", comp.ID, comp.LeaseExpiresAt.Format(time.RFC3339))
	release := func() {
		if f.keep {
			fmt.Fprintf(stderr, "tether-custodian: kept computer %s (tether-computer rm %s ends it)\n", comp.ID, comp.ID)
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseGrace)
		defer cancel()
		if err := c.Delete(rctx, comp.ID); err != nil {
			fmt.Fprintf(stderr, "tether-custodian: delete computer %s: %v\n", comp.ID, err)
			return
		}
		fmt.Fprintf(stderr, "tether-custodian: deleted computer %s\n", comp.ID)
	}
	return comp.CustodianConfig, release, nil
}
