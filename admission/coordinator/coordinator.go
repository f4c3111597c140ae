package coordinator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/backoff"
	"github.com/tetherdev/tether/admission/signedfile"
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
	publisher  *signedfile.Publisher
	grantsPath string
	interval   time.Duration
	now        func() time.Time
	elector    *Elector
	closeEtcd  func() error
}

// Options assemble a Coordinator from parts; New builds them from a Config.
type Options struct {
	Renewer    Renewer
	Publisher  *signedfile.Publisher
	GrantsPath string        // publish input, re-read every round
	Interval   time.Duration // between rounds
	Now        func() time.Time
	// Elector, when set, makes Run and RunOnce lead first: only a leader
	// renews and publishes, and each publish is fenced by its revision.
	Elector *Elector
}

// Round is the outcome of one successful round.
type Round struct {
	Lease     Lease
	Published signedfile.Published
	Leader    uint64 // the leader revision the round published under (0 without election)
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
	pub, err := signedfile.NewPublisher(signedfile.PublisherConfig{Dir: cfg.Dir, Key: key})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	r, err := NewOpenBaoRenewer(cfg.OpenBao, nil)
	if err != nil {
		return nil, err
	}
	o := Options{Renewer: r, Publisher: pub, GrantsPath: cfg.Grants, Interval: cfg.Interval()}
	if cfg.Etcd == nil {
		return NewWithOptions(o)
	}
	cli, err := cfg.Etcd.client()
	if err != nil {
		return nil, err
	}
	o.Elector = NewElector(cli, cfg.Etcd.Prefix, cfg.Etcd.Name, cfg.Etcd.ttl())
	c, err := NewWithOptions(o)
	if err != nil {
		cli.Close()
		return nil, err
	}
	c.closeEtcd = cli.Close
	return c, nil
}

// Close releases what New opened (the etcd client). Safe twice.
func (c *Coordinator) Close() error {
	if f := c.closeEtcd; f != nil {
		c.closeEtcd = nil
		return f()
	}
	return nil
}

// NewWithOptions builds a Coordinator from parts.
func NewWithOptions(o Options) (*Coordinator, error) {
	if o.Renewer == nil || o.Publisher == nil || o.GrantsPath == "" || o.Interval <= 0 {
		return nil, fmt.Errorf("%w: renewer, publisher, grants path and a positive interval are required", ErrConfig)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Coordinator{renewer: o.Renewer, publisher: o.Publisher, grantsPath: o.GrantsPath, interval: o.Interval,
		now: o.Now, elector: o.Elector}, nil
}

// RunOnce reads the grants file, renews the lease, and only then publishes
// the grants with every not_after capped at min(requested, lease expiry).
// Any failure publishes nothing. With an Elector it first waits to lead
// (bounded by ctx), publishes fenced by its revision, and resigns.
func (c *Coordinator) RunOnce(ctx context.Context) (Round, error) {
	if c.elector == nil {
		return c.round(ctx, 0)
	}
	l, err := c.elector.Lead(ctx)
	if err != nil {
		return Round{}, err
	}
	defer l.Resign()
	return c.round(l.Ctx, l.Revision)
}

// RunOnceAsLeader runs one round for a leader whose election revision is
// leader: the publish is refused (signedfile.ErrDeposed) if a later leader
// has published.
func (c *Coordinator) RunOnceAsLeader(ctx context.Context, leader uint64) (Round, error) {
	return c.round(ctx, leader)
}

// round is one read-renew-publish round; leader 0 publishes unfenced.
func (c *Coordinator) round(ctx context.Context, leader uint64) (Round, error) {
	in, err := c.readInput()
	if err != nil {
		return Round{}, err
	}
	if err := context.Cause(ctx); err != nil { // a deposed leader renews nothing
		return Round{}, fmt.Errorf("%w: %w", ErrRenew, err)
	}
	lease, err := c.renewer.Renew(ctx)
	if err != nil {
		return Round{}, fmt.Errorf("%w: %w", ErrRenew, err)
	}
	capped := capInput(in, lease.Expiry)
	var pub signedfile.Published
	if leader == 0 {
		pub, err = c.publisher.Publish(ctx, capped)
	} else {
		pub, err = c.publisher.PublishFenced(ctx, capped, leader)
	}
	if err != nil {
		return Round{Lease: lease, Leader: leader}, fmt.Errorf("publish after renewal: %w", err)
	}
	return Round{Lease: lease, Published: pub, Leader: leader}, nil
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
//
// With an Elector, Run campaigns; while it leads it runs rounds fenced by
// its revision, and when its term ends (lease lost) it stops renewing and
// publishing at once and campaigns again.
func (c *Coordinator) Run(ctx context.Context, report func(Round, error)) error {
	if c.elector == nil {
		return c.rounds(ctx, 0, report)
	}
	for {
		l, err := c.elector.Lead(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			if report != nil {
				report(Round{}, err)
			}
			if backoff.Sleep(ctx, c.interval) != nil {
				return context.Cause(ctx)
			}
			continue
		}
		_ = c.rounds(l.Ctx, l.Revision, report)
		l.Resign()
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
	}
}

// rounds runs a round now and every interval until ctx ends.
func (c *Coordinator) rounds(ctx context.Context, leader uint64, report func(Round, error)) error {
	t := time.NewTicker(c.interval)
	defer t.Stop()
	for {
		r, err := c.round(ctx, leader)
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
