package coordinator

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// EtcdConfig makes coordinators elect one leader through etcd
// (concurrency.Election): only the leader renews and publishes, and every
// publish names the leader's revision, which the publisher fences on.
type EtcdConfig struct {
	// Endpoints are the etcd client URLs: https, or http to a loopback
	// host only.
	Endpoints []string `json:"endpoints"`
	// Prefix is the election's key prefix; coordinators of one admission
	// directory share it. Default DefaultElectionPrefix.
	Prefix string `json:"prefix,omitempty"`
	// Name is this coordinator's name, the value it campaigns with.
	Name string `json:"name"`
	// SessionTTLS is the election session's lease in seconds (default
	// 10): a leader that dies or is cut off loses leadership this long
	// after its last renewal, and another coordinator takes over.
	SessionTTLS int64 `json:"session_ttl_s,omitempty"`
	// CACert pins the CA of the etcd servers (required with https);
	// CertFile and KeyFile are the client certificate, both or neither.
	CACert   string `json:"ca_cert,omitempty"`
	CertFile string `json:"cert_file,omitempty"`
	KeyFile  string `json:"key_file,omitempty"`
}

// DefaultElectionPrefix is the default election prefix.
const DefaultElectionPrefix = "/tether/admission/coordinator/"

// ErrLeadershipLost ends a leader's rounds: its election session ended.
var ErrLeadershipLost = errors.New("coordinator: leadership lost")

func (e *EtcdConfig) resolve(base string) {
	for _, p := range []*string{&e.CACert, &e.CertFile, &e.KeyFile} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(base, *p)
		}
	}
}

// Validate reports the first missing or unsafe etcd setting.
func (e *EtcdConfig) Validate() error {
	switch {
	case len(e.Endpoints) == 0:
		return fmt.Errorf("%w: etcd.endpoints is required", ErrConfig)
	case e.Name == "":
		return fmt.Errorf("%w: etcd.name is required", ErrConfig)
	case e.SessionTTLS < 0:
		return fmt.Errorf("%w: etcd.session_ttl_s must not be negative", ErrConfig)
	case (e.CertFile == "") != (e.KeyFile == ""):
		return fmt.Errorf("%w: etcd.cert_file and etcd.key_file go together", ErrConfig)
	}
	for _, ep := range e.Endpoints {
		if err := checkEtcdEndpoint(ep, e.CACert != ""); err != nil {
			return err
		}
	}
	return nil
}

// checkEtcdEndpoint requires https with a pinned CA, or http to loopback.
func checkEtcdEndpoint(ep string, pinned bool) error {
	u, err := url.Parse(ep)
	if err != nil || u.Host == "" {
		return fmt.Errorf("%w: etcd endpoint %q is not a URL", ErrConfig, ep)
	}
	switch u.Scheme {
	case "https":
		if !pinned {
			return fmt.Errorf("%w: etcd endpoint %q: https needs etcd.ca_cert", ErrConfig, ep)
		}
		return nil
	case "http":
		if ip := net.ParseIP(u.Hostname()); u.Hostname() == "localhost" || (ip != nil && ip.IsLoopback()) {
			return nil
		}
		return fmt.Errorf("%w: etcd endpoint %q: plain http is only allowed to a loopback host", ErrConfig, ep)
	}
	return fmt.Errorf("%w: etcd endpoint %q: scheme must be https", ErrConfig, ep)
}

// ttl returns the session TTL.
func (e *EtcdConfig) ttl() time.Duration {
	if e.SessionTTLS == 0 {
		return 10 * time.Second
	}
	return time.Duration(e.SessionTTLS) * time.Second
}

// client dials etcd as configured.
func (e *EtcdConfig) client() (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if e.CACert != "" {
		tlsInfo := transport.TLSInfo{TrustedCAFile: e.CACert, CertFile: e.CertFile, KeyFile: e.KeyFile}
		tc, err := tlsInfo.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("%w: etcd TLS: %w", ErrConfig, err)
		}
		cfg.TLS = tc
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: etcd client: %w", ErrConfig, err)
	}
	return cli, nil
}

// Elector campaigns for the coordinator's leadership.
type Elector struct {
	cli    *clientv3.Client
	prefix string
	name   string
	ttl    time.Duration
}

// NewElector returns an Elector on cli (which the caller closes after
// the last Lead ends). An empty prefix means DefaultElectionPrefix.
func NewElector(cli *clientv3.Client, prefix, name string, ttl time.Duration) *Elector {
	if prefix == "" {
		prefix = DefaultElectionPrefix
	}
	return &Elector{cli: cli, prefix: prefix, name: name, ttl: ttl}
}

// Leadership is one term of this coordinator as leader.
type Leadership struct {
	// Revision is the leader key's create revision: higher for every
	// later term of any coordinator. Publishes carry it.
	Revision uint64
	// Ctx ends when the term ends (the session's lease was lost, or the
	// caller's ctx ended); its cause is ErrLeadershipLost on a loss.
	Ctx    context.Context
	cancel context.CancelCauseFunc
	sess   *concurrency.Session
	el     *concurrency.Election
}

// Lead blocks until this coordinator is the leader (or ctx ends) and
// returns the term. Resign must be called when the term is over.
func (e *Elector) Lead(ctx context.Context) (*Leadership, error) {
	sess, err := concurrency.NewSession(e.cli, concurrency.WithTTL(int((e.ttl+time.Second-1)/time.Second)),
		concurrency.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("election session: %w", err)
	}
	el := concurrency.NewElection(sess, e.prefix)
	if err := el.Campaign(ctx, e.name); err != nil {
		sess.Close()
		return nil, fmt.Errorf("campaign: %w", err)
	}
	lctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-sess.Done():
			cancel(ErrLeadershipLost)
		case <-lctx.Done():
		}
	}()
	return &Leadership{Revision: uint64(el.Rev()), Ctx: lctx, cancel: cancel, sess: sess, el: el}, nil
}

// Resign ends the term: the leader key is deleted (so another
// coordinator leads at once) and the session's lease revoked.
func (l *Leadership) Resign() {
	l.cancel(ErrLeadershipLost)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.el.Resign(ctx)
	_ = l.sess.Close()
}
