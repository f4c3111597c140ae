package provision

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/coordinator"
	"github.com/tetherdev/tether/admission/signedfile"
	"github.com/tetherdev/tether/admission/signing"
)

// CoordinatorFiles are where a computer's coordinator keeps its files on
// the host.
type CoordinatorFiles struct {
	Key       string // the admission signing key (0600)
	PublicKey string // its public half, which the receiver pins (0644)
	Input     string // the grants Coordinate hands to the coordinator
	Dir       string // the admission directory the snapshots go to
}

// Grants is the coordinator's side of one computer: it signs and
// publishes the computer's admission snapshots and remembers the grant
// most recently published for the computer's tuple. Local and
// fixtures/vmcomputer's VM each keep one on the host. Its methods may be
// called from several goroutines; it holds nothing that needs closing.
type Grants struct {
	tuple     admission.Tuple
	lease     time.Duration
	input     string
	publisher *signedfile.Publisher

	mu    sync.Mutex
	grant admission.Grant
}

// NewGrants makes the coordinator's admission signing key, writes it and
// its public half to f.Key and f.PublicKey (both created exclusively),
// and returns the Grants that publish t's snapshots into f.Dir. A
// snapshot published without grants ends lease from now.
func NewGrants(t admission.Tuple, lease time.Duration, f CoordinatorFiles) (*Grants, error) {
	k, err := signing.GenerateKey()
	if err != nil {
		return nil, err
	}
	if err := signing.WritePrivateKey(f.Key, k); err != nil {
		return nil, err
	}
	if err := signing.WritePublicKey(f.PublicKey, k.Public()); err != nil {
		return nil, err
	}
	p, err := signedfile.NewPublisher(signedfile.PublisherConfig{Dir: f.Dir, Key: k})
	if err != nil {
		return nil, err
	}
	return &Grants{tuple: t, lease: lease, input: f.Input, publisher: p}, nil
}

// Current returns the grant most recently published for the tuple.
func (g *Grants) Current() admission.Grant {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.grant
}

// Publish signs and atomically publishes a snapshot holding exactly
// grants (Computer.Publish). With notAfter zero the snapshot ends with its
// latest grant, or the lease from now when there is none.
func (g *Grants) Publish(ctx context.Context, notAfter time.Time, grants ...admission.Grant) (signedfile.Published, error) {
	if notAfter.IsZero() {
		notAfter = g.snapshotEnd(grants)
	}
	pub, err := g.publisher.Publish(ctx, admission.PublishInput{NotAfter: notAfter.UTC(), Grants: grants})
	if err != nil {
		return pub, err
	}
	for _, gr := range grants {
		if gr.Tuple.Equal(g.tuple) {
			g.remember(gr)
		}
	}
	return pub, nil
}

// snapshotEnd is the not_after of a snapshot holding grants: the latest
// grant's, or the lease from now without any.
func (g *Grants) snapshotEnd(grants []admission.Grant) time.Time {
	if len(grants) == 0 {
		return time.Now().Add(g.lease)
	}
	var end time.Time
	for _, gr := range grants {
		if gr.NotAfter.After(end) {
			end = gr.NotAfter
		}
	}
	return end
}

func (g *Grants) remember(gr admission.Grant) {
	g.mu.Lock()
	g.grant = gr
	g.mu.Unlock()
}

// Coordinate runs one round of the real coordinator (Computer.Coordinate):
// it writes the current grant with not_after = requested as the
// coordinator's input, renews the lease with r, then publishes capped at
// the lease. A failed renewal publishes nothing and keeps the current
// grant.
func (g *Grants) Coordinate(ctx context.Context, r coordinator.Renewer, requested time.Time) (coordinator.Round, error) {
	gr := g.Current()
	gr.NotAfter = requested.UTC().Truncate(time.Second)
	data, err := json.Marshal(admission.PublishInput{NotAfter: gr.NotAfter, Grants: []admission.Grant{gr}})
	if err != nil {
		return coordinator.Round{}, err
	}
	if err := replaceFile(g.input, data, 0o600); err != nil {
		return coordinator.Round{}, err
	}
	co, err := coordinator.NewWithOptions(coordinator.Options{Renewer: r, Publisher: g.publisher,
		GrantsPath: g.input, Interval: time.Second})
	if err != nil {
		return coordinator.Round{}, err
	}
	round, err := co.RunOnce(ctx)
	if err != nil {
		return round, err
	}
	if round.Lease.Expiry.Before(gr.NotAfter) {
		gr.NotAfter = round.Lease.Expiry
	}
	g.remember(gr)
	return round, nil
}
