package custodian

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tetherdev/tether/admission/acperr"
	"github.com/tetherdev/tether/admission/errcode"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/custodian/binding"
	"github.com/tetherdev/tether/custodian/credfile"
	"github.com/tetherdev/tether/custodian/opstore"
)

// Op store kinds of OpStoreConfig.Kind.
const (
	OpStoreBbolt = "bbolt"
	OpStoreEtcd  = "etcd"
)

// OpStoreConfig selects where operation keys and receipts live (config
// "op_store"; docs/operations.md). The default, bbolt, is the state
// directory's own file: one machine. etcd shares them, with session
// ownership and its fencing token, among the custodians of a fleet.
type OpStoreConfig struct {
	// Kind is "bbolt" (default) or "etcd"; the other fields are etcd's.
	Kind string `json:"kind"`
	// Endpoints are the etcd client URLs: https (with CACert), or http
	// to a loopback host only.
	Endpoints []string `json:"endpoints,omitempty"`
	// Prefix is the root of the store's keys; custodians that may take
	// each other's sessions over share it (default opstore.DefaultEtcdPrefix).
	Prefix string `json:"prefix,omitempty"`
	// Name identifies this custodian in the owner keys it writes.
	Name string `json:"name,omitempty"`
	// LeaseTTLS is the ownership lease in seconds (default 10): a
	// custodian that dies, freezes or is cut off loses its sessions this
	// long after its last renewal, and a standby may then take them over.
	LeaseTTLS int64 `json:"lease_ttl_s,omitempty"`
	// UnavailableWaitS bounds, in seconds, how long `run` (and `run
	// --standby`) waits out etcd answering unavailable while it binds
	// the session (a member restarting, a leader election, quorum lost
	// for a while) before it gives up (default 60; Options.StoreWait).
	UnavailableWaitS int64 `json:"unavailable_wait_s,omitempty"`
	// CACert pins the CA of the etcd servers (required with https);
	// CertFile and KeyFile are the client certificate, both or neither.
	CACert   string `json:"ca_cert,omitempty"`
	CertFile string `json:"cert_file,omitempty"`
	KeyFile  string `json:"key_file,omitempty"`
}

// Etcd reports whether the config selects the etcd store.
func (o *OpStoreConfig) Etcd() bool { return o != nil && o.Kind == OpStoreEtcd }

func (o *OpStoreConfig) resolve(dir string) {
	for _, p := range []*string{&o.CACert, &o.CertFile, &o.KeyFile} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
}

// validate names the first missing or unsafe setting.
func (o *OpStoreConfig) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: op_store: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	switch o.Kind {
	case OpStoreBbolt:
		if len(o.Endpoints) > 0 || o.Prefix != "" || o.Name != "" || o.LeaseTTLS != 0 || o.UnavailableWaitS != 0 || o.CACert != "" || o.CertFile != "" || o.KeyFile != "" {
			return bad("bbolt takes no other field")
		}
		return nil
	case OpStoreEtcd:
	default:
		return bad("kind %q: want bbolt or etcd", o.Kind)
	}
	switch {
	case len(o.Endpoints) == 0:
		return bad("etcd needs endpoints")
	case o.Name == "":
		return bad("etcd needs name (this custodian's, in the owner keys)")
	case o.LeaseTTLS < 0 || o.LeaseTTLS == 1:
		return bad("lease_ttl_s %d: want 2 or more seconds (0: 10)", o.LeaseTTLS)
	case o.UnavailableWaitS < 0:
		return bad("unavailable_wait_s %d: want 1 or more seconds (0: 60)", o.UnavailableWaitS)
	case (o.CertFile == "") != (o.KeyFile == ""):
		return bad("cert_file and key_file go together")
	case o.CertFile != "" && o.CACert == "":
		return bad("a client certificate needs ca_cert")
	}
	for _, ep := range o.Endpoints {
		if err := checkEtcdEndpoint(ep, o.CACert != ""); err != nil {
			return bad("%v", err)
		}
	}
	return nil
}

// checkEtcdEndpoint requires https with a pinned CA, or http to loopback.
func checkEtcdEndpoint(ep string, pinned bool) error {
	u, err := url.Parse(ep)
	if err != nil || u.Host == "" || u.Path != "" && u.Path != "/" {
		return fmt.Errorf("endpoint %q is not a URL of a host", ep)
	}
	switch u.Scheme {
	case "https":
		if !pinned {
			return fmt.Errorf("endpoint %q: https needs ca_cert", ep)
		}
		return nil
	case "http":
		if ip := net.ParseIP(u.Hostname()); u.Hostname() == "localhost" || (ip != nil && ip.IsLoopback()) {
			return nil
		}
		return fmt.Errorf("endpoint %q: plain http is only allowed to a loopback host", ep)
	}
	return fmt.Errorf("endpoint %q: scheme must be https", ep)
}

// leaseTTL is the ownership lease.
func (o *OpStoreConfig) leaseTTL() time.Duration {
	if o.LeaseTTLS == 0 {
		return 10 * time.Second
	}
	return time.Duration(o.LeaseTTLS) * time.Second
}

// DefaultUnavailableWait is op_store.unavailable_wait_s when it is 0.
const DefaultUnavailableWait = 60 * time.Second

// UnavailableWait is how long a bind waits out etcd answering
// unavailable (Options.StoreWait): unavailable_wait_s, or
// DefaultUnavailableWait. It is 0 for a config without an etcd store.
func (o *OpStoreConfig) UnavailableWait() time.Duration {
	switch {
	case !o.Etcd():
		return 0
	case o.UnavailableWaitS == 0:
		return DefaultUnavailableWait
	}
	return time.Duration(o.UnavailableWaitS) * time.Second
}

// Fleet is an open etcd op store and the client it uses. Close closes
// both, after the custodian that used the store.
type Fleet struct {
	Store *opstore.EtcdStore
	cli   *clientv3.Client
}

// OpenFleet connects to etcd as o says (TLS 1.3 with the pinned CA and
// the client certificate read through credfile's checks, when set) and
// opens the op store, whose ownership lease is kept alive until Close.
// ctx bounds the lease grant.
func OpenFleet(ctx context.Context, o OpStoreConfig, retention time.Duration) (*Fleet, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.Kind != OpStoreEtcd {
		return nil, fmt.Errorf("%w: op_store kind %q is not etcd", ErrConfig, o.Kind)
	}
	cli, err := etcdClient(o)
	if err != nil {
		return nil, err
	}
	s, err := opstore.OpenEtcd(ctx, opstore.EtcdOptions{Client: cli, Prefix: o.Prefix, Name: o.Name,
		LeaseTTL: o.leaseTTL(), Retention: retention})
	if err != nil {
		cli.Close()
		return nil, err
	}
	return &Fleet{Store: s, cli: cli}, nil
}

// etcdClient connects to the etcd endpoints of o, a validated etcd
// op_store (TLS as etcdTLS builds it, when a CA is pinned). The caller
// closes it.
func etcdClient(o OpStoreConfig) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: o.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if o.CACert != "" {
		tc, err := etcdTLS(o)
		if err != nil {
			return nil, err
		}
		cfg.TLS = tc
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: op_store: etcd client: %w", ErrConfig, err)
	}
	return cli, nil
}

// FleetReceipts reads every receipt of the etcd op store o names, as
// `tether-custodian run` with the same op_store records them, without
// holding a lease or claiming anything (opstore.ReadEtcd). ctx bounds the
// read.
func FleetReceipts(ctx context.Context, o OpStoreConfig) ([]*opstore.Receipt, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.Kind != OpStoreEtcd {
		return nil, fmt.Errorf("%w: op_store kind %q is not etcd", ErrConfig, o.Kind)
	}
	cli, err := etcdClient(o)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	return opstore.ReadEtcd(ctx, cli, o.Prefix)
}

// etcdTLS builds the client TLS config: only the pinned CA, the client
// certificate if set, TLS 1.3.
func etcdTLS(o OpStoreConfig) (*tls.Config, error) {
	caPEM, err := credfile.ReadPublic(o.CACert)
	if err != nil {
		return nil, err
	}
	ca, err := parseOneCert(caPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: op_store: ca_cert %s: %w", ErrConfig, o.CACert, err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13}
	if o.CertFile == "" {
		return tc, nil
	}
	certPEM, err := credfile.Read(o.CertFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := credfile.Read(o.KeyFile)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: op_store: client certificate and key: %w", ErrConfig, err)
	}
	tc.Certificates = []tls.Certificate{pair}
	return tc, nil
}

// Close revokes the ownership lease (a standby may take every session
// over at once) and closes the client. Safe twice.
func (f *Fleet) Close() error {
	err := f.Store.Close()
	return errors.Join(err, f.cli.Close())
}

// TakeOver is what a standby runs before it binds a session: it waits
// until no live custodian owns sessionID (the owner's lease expired, or
// it ended), claims it, and so marks every op key the earlier owner left
// in flight interrupted (never dispatched again). The claim is recorded
// in the audit log (kind claim, and one interrupted result per key); the
// session's next bind on this custodian uses it. It needs Options.Fleet.
func (c *Custodian) TakeOver(ctx context.Context, sessionID string) (opstore.Claimed, error) {
	if c.fleet == nil {
		return opstore.Claimed{}, fmt.Errorf("%w: taking a session over needs the fleet's op store", ErrConfig)
	}
	cl, err := c.fleet.WaitClaim(ctx, sessionID)
	if err != nil {
		return cl, err
	}
	var digest, principal string
	if cl.Binding != nil {
		digest, principal = cl.Binding.TupleSHA256, cl.Binding.Principal
	}
	c.auditClaim(sessionID, digest, principal, cl)
	c.takenMu.Lock()
	c.taken[sessionID] = cl
	c.takenMu.Unlock()
	return cl, nil
}

// claim makes this custodian the owner of b's session in the fleet's op
// store, once per binding (nothing without a fleet): the claim (or what
// TakeOver claimed), a check that the binding recorded by an earlier
// owner names the same tuple, the binding recorded for the next owner,
// then the token every request of the session carries. A session
// another live custodian owns is refused fenced.
//
// While the op store answers unavailable, the whole claim is tried again
// for up to Options.StoreWait: the bind claims here, and so does the
// agent's attach (a tether agent attaches while it answers session/new,
// before the custodian's own claim). Every step is safe to repeat after
// a try whose outcome is unknown: Claim of a session this store owns
// returns its token again (and an owner key etcd created for this
// store's lease, whose answer was lost, is recognised as its own), a
// takeover that did not finish is run again from the start and only
// interrupts keys still open, and the binding record is a plain put
// fenced by the token. What TakeOver claimed is kept until a try
// succeeds, so the claim is audited once.
func (c *Custodian) claim(ctx context.Context, s *binding.Session) error {
	if c.fleet == nil {
		return nil
	}
	return s.Claimed(func() (uint64, error) {
		var cl opstore.Claimed
		var fresh bool
		err := c.waitStore(ctx, c.opts.StoreWait, "claim session "+s.ID+" in the fleet's op store", func(ctx context.Context) error {
			got, f, err := c.claimRecord(ctx, s)
			cl, fresh = mergeClaims(cl, got), fresh || f
			return err
		})
		if _, coded := acperr.CodeOf(err); err != nil && !coded {
			return 0, binding.ClaimRefusal(s.ID, err)
		}
		if err != nil {
			return 0, err
		}
		c.takenMu.Lock()
		delete(c.taken, s.ID)
		c.takenMu.Unlock()
		if fresh {
			c.auditClaim(s.ID, s.Digest, s.Principal, cl)
		}
		return cl.Token, nil
	})
}

// mergeClaims keeps what an earlier try of a claim learnt under the same
// token: a try that claimed and interrupted keys, then met an unavailable
// op store, is answered on the next try from the store's own claim (the
// token alone), and the keys it interrupted belong in the audit record.
func mergeClaims(prev, next opstore.Claimed) opstore.Claimed {
	if prev.Token == 0 || prev.Token != next.Token {
		return next
	}
	for _, k := range prev.Interrupted {
		if !slices.Contains(next.Interrupted, k) {
			next.Interrupted = append(next.Interrupted, k)
		}
	}
	if next.Binding == nil {
		next.Binding = prev.Binding
	}
	return next
}

// claimRecord is one try of a claim: claim (or reuse what TakeOver
// claimed), check the recorded binding's tuple, record b's binding.
func (c *Custodian) claimRecord(ctx context.Context, b *binding.Session) (opstore.Claimed, bool, error) {
	cl, fresh, err := c.claimSession(ctx, b.ID)
	if err != nil {
		return cl, fresh, err
	}
	if cl.Binding != nil && !cl.Binding.Tuple.Equal(b.Tuple) {
		return cl, fresh, acperr.NewError(errcode.CodeTupleMismatch, "session %s is recorded in the fleet store bound to tuple %s, not %s",
			b.ID, cl.Binding.TupleSHA256, b.Digest)
	}
	rec := opstore.BindingRecord{SessionID: b.ID, Tuple: b.Tuple, TupleSHA256: b.Digest,
		LeaseNotAfter: b.Lease().UTC(), Principal: b.Principal}
	return cl, fresh, c.fleet.PutBinding(ctx, rec)
}

// claimSession returns what TakeOver claimed for sid, if this store
// still holds it under that token, or claims sid now (fresh). What
// TakeOver claimed stays until the claim succeeded (claimWithin).
func (c *Custodian) claimSession(ctx context.Context, sid string) (cl opstore.Claimed, fresh bool, err error) {
	c.takenMu.Lock()
	taken, ok := c.taken[sid]
	c.takenMu.Unlock()
	if ok {
		if tok, err := c.fleet.Token(sid); err == nil && tok == taken.Token {
			return taken, false, nil
		}
	}
	cl, err = c.fleet.Claim(ctx, sid)
	return cl, true, err
}

// auditClaim records a claim and the keys it made interrupted.
func (c *Custodian) auditClaim(sid, digest, principal string, cl opstore.Claimed) {
	outcome := "claimed"
	if len(cl.Interrupted) > 0 {
		outcome = "taken_over"
	}
	c.audit(audit.Record{Kind: audit.KindClaim, SessionID: sid, TupleSHA256: digest, Principal: principal,
		FenceToken: cl.Token, Outcome: outcome})
	for _, k := range cl.Interrupted {
		c.audit(audit.Record{Kind: audit.KindResult, SessionID: sid, TupleSHA256: digest, Principal: principal,
			OpKey: k, Outcome: string(opstore.Interrupted), Code: "takeover"})
	}
}
