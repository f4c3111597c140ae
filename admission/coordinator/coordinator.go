package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/signing"
)

// Errors RunOnce returns; callers branch on them with errors.Is.
var (
	// ErrRenew: the lease was not renewed, so nothing was published.
	ErrRenew = errors.New("lease renewal failed; nothing published")
	// ErrInput: the grants file was refused, so nothing was renewed or
	// published.
	ErrInput = errors.New("grants input refused")
)

// Coordinator runs renew-then-publish rounds. It is the single writer of
// the admission directory (the publisher's flock also serialises it with
// any other publisher).
type Coordinator struct {
	renewer    Renewer
	publisher  *admission.Publisher
	grantsPath string
	interval   time.Duration
	now        func() time.Time
}

// Options assemble a Coordinator from parts; New builds them from a Config.
type Options struct {
	Renewer    Renewer
	Publisher  *admission.Publisher
	GrantsPath string        // publish input, re-read every round
	Interval   time.Duration // between rounds
	Now        func() time.Time
}

// Round is the outcome of one successful round.
type Round struct {
	Lease     Lease
	Published admission.Published
}

// New builds a Coordinator from cfg: an OpenBaoRenewer, the signing key and
// a Publisher on cfg.Dir.
func New(cfg Config) (*Coordinator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	key, err := signing.LoadPrivateKey(cfg.Key)
	if err != nil {
		return nil, fmt.Errorf("%w: key: %w", ErrConfig, err)
	}
	pub, err := admission.NewPublisher(admission.PublisherConfig{Dir: cfg.Dir, Key: key})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	r, err := NewOpenBaoRenewer(cfg.OpenBao, nil)
	if err != nil {
		return nil, err
	}
	return NewWithOptions(Options{Renewer: r, Publisher: pub, GrantsPath: cfg.Grants, Interval: cfg.Interval()})
}

// NewWithOptions builds a Coordinator from parts.
func NewWithOptions(o Options) (*Coordinator, error) {
	if o.Renewer == nil || o.Publisher == nil || o.GrantsPath == "" || o.Interval <= 0 {
		return nil, fmt.Errorf("%w: renewer, publisher, grants path and a positive interval are required", ErrConfig)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Coordinator{renewer: o.Renewer, publisher: o.Publisher, grantsPath: o.GrantsPath, interval: o.Interval, now: o.Now}, nil
}

// RunOnce reads the grants file, renews the lease, and only then publishes
// the grants with every not_after capped at min(requested, lease expiry).
// Any failure publishes nothing.
func (c *Coordinator) RunOnce(ctx context.Context) (Round, error) {
	in, err := c.readInput()
	if err != nil {
		return Round{}, err
	}
	lease, err := c.renewer.Renew(ctx)
	if err != nil {
		return Round{}, fmt.Errorf("%w: %w", ErrRenew, err)
	}
	capped := capInput(in, lease.Expiry)
	pub, err := c.publisher.Publish(ctx, capped)
	if err != nil {
		return Round{Lease: lease}, fmt.Errorf("publish after renewal: %w", err)
	}
	return Round{Lease: lease, Published: pub}, nil
}

// readInput reads and validates the grants file; a given generation is
// refused because every round must publish current+1.
func (c *Coordinator) readInput() (admission.PublishInput, error) {
	data, err := readBounded(c.grantsPath)
	if err != nil {
		return admission.PublishInput{}, fmt.Errorf("%w: %w", ErrInput, err)
	}
	in, err := admission.DecodePublishInput(data)
	if err != nil {
		return admission.PublishInput{}, fmt.Errorf("%w: %s: %w", ErrInput, c.grantsPath, err)
	}
	if in.Generation != nil {
		return admission.PublishInput{}, fmt.Errorf("%w: %s: generation must be omitted; the coordinator publishes current+1 each round", ErrInput, c.grantsPath)
	}
	return in, nil
}

// capInput returns in with the snapshot's and every grant's not_after
// capped at expiry.
func capInput(in admission.PublishInput, expiry time.Time) admission.PublishInput {
	out := in
	out.NotAfter = earlier(in.NotAfter, expiry)
	out.Grants = make([]admission.Grant, len(in.Grants))
	for i, g := range in.Grants {
		g.NotAfter = earlier(g.NotAfter, expiry)
		out.Grants[i] = g
	}
	return out
}

func earlier(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// Run runs a round now and then every interval until ctx ends, calling
// report (if not nil) after each round. A failed round is reported and the
// loop goes on: the grants already published expire on their own. Run
// returns ctx's cause.
func (c *Coordinator) Run(ctx context.Context, report func(Round, error)) error {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		r, err := c.RunOnce(ctx)
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if report != nil {
			report(r, err)
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
		}
	}
}
