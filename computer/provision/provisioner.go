package provision

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/admission/signedfile"
	"github.com/tetherdev/tether/admission/signing"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/bins"
	"github.com/tetherdev/tether/computer/pki"
)

// Config says how a Provisioner makes its computers; only Bins is
// required. Every computer it makes is namespaced (IsolationNamespaces).
type Config struct {
	// Bins holds tether-receiver.
	Bins bins.Set
	// Owner is the owner of every tuple (default "alice", as Options).
	// The tuple is fixed when the machine is prepared, before anyone
	// claims it.
	Owner string
	// Ops and GrantLimits are what a grant allows (defaults: AllOps and
	// DefaultLimits); the resource limits come from Prepare's limits.
	Ops         []admission.Op
	GrantLimits admission.Limits
	// Lease is how long a snapshot without a grant lasts (default one
	// hour); the receiver refuses everything after it, as before it.
	Lease time.Duration
	// CustodianUID and CustodianGID own DIR/custodian.json and the
	// custodian's credentials (default: root).
	CustodianUID, CustodianGID *uint32
	// Cgroup is Options.Cgroup: CgroupAuto (default), CgroupRequired or
	// CgroupOff. With CgroupOff the freezer and CPU time are the v1
	// hierarchies'.
	Cgroup string
}

// Provisioner makes namespaced computers for the computer service
// (computer/api.Provisioner). It holds no state of its own: everything it
// needs to find a machine again is in the machine's directory, and each
// receiver runs in its own session (Options.Detach), so it outlives a
// daemon that crashed and is adopted again by the next.
type Provisioner struct {
	cfg Config
}

var _ api.Provisioner = (*Provisioner)(nil)

// NewProvisioner returns a Provisioner making computers as cfg says.
func NewProvisioner(cfg Config) *Provisioner { return &Provisioner{cfg: cfg} }

// options are the Options of a computer in dir with resource limits r.
func (p *Provisioner) options(dir string, r admission.Limits) Options {
	l := p.cfg.GrantLimits
	l.MaxPids, l.MaxMemoryBytes, l.MaxDiskBytes = r.MaxPids, r.MaxMemoryBytes, r.MaxDiskBytes
	lease, ops := p.cfg.Lease, p.cfg.Ops
	if lease == 0 { // as Options.Defaults, which an adopted computer does not go through
		lease = time.Hour
	}
	if ops == nil {
		ops = AllOps
	}
	return Options{Dir: dir, Bins: p.cfg.Bins, Owner: p.cfg.Owner, Ops: ops, Limits: l,
		Isolation: IsolationNamespaces, Lease: lease, CustodianUID: p.cfg.CustodianUID,
		CustodianGID: p.cfg.CustodianGID, Cgroup: p.cfg.Cgroup, NoGrant: true, Detach: true}
}

// Prepare implements api.Provisioner: a namespaced computer in dir whose
// receiver serves a snapshot holding no grant, made with its independent
// steps at once (newPrepared).
func (p *Provisioner) Prepare(ctx context.Context, dir string, limits api.Limits) (api.Machine, error) {
	r := admission.Limits{MaxPids: limits.Pids, MaxMemoryBytes: limits.MemoryBytes, MaxDiskBytes: limits.DiskBytes}
	l, err := newPrepared(ctx, p.options(dir, r))
	if err != nil {
		return nil, err
	}
	return &Machine{l: l}, nil
}

// Adopt implements api.Provisioner: it reads dir's state file, checks
// that the receiver it names still runs (else ErrReceiverExited, and
// nothing is changed), and loads the admission signing key and the
// custodian's credentials from dir.
func (p *Provisioner) Adopt(ctx context.Context, dir string) (api.Machine, error) {
	d, err := checkExisting(dir)
	if err != nil {
		return nil, err
	}
	s, err := ReadState(d)
	if err != nil {
		return nil, err
	}
	if s.ReceiverPID == 0 || !Alive(s.ReceiverPID, s.ReceiverStart) {
		return nil, fmt.Errorf("%w: adopt %s: receiver pid %d no longer runs", ErrReceiverExited, d, s.ReceiverPID)
	}
	c := &Local{opts: p.options(d, s.Resources), paths: layout(d), state: s,
		recv: &receiverProc{pid: s.ReceiverPID, ticks: s.ReceiverStart}}
	if c.creds, err = loadCredentials(c.paths.cust); err != nil {
		return nil, fmt.Errorf("adopt %s: %w", d, err)
	}
	if c.creds.CA.SPKISHA256() != s.CASPKISHA256 {
		return nil, fmt.Errorf("%w: adopt %s: the custodian's CA is not the one the state pins", ErrNotComputer, d)
	}
	if c.grants, err = loadGrants(s.Tuple, c.opts.Lease, c.paths); err != nil {
		return nil, fmt.Errorf("adopt %s: %w", d, err)
	}
	return &Machine{l: c}, nil
}

// Destroy implements api.Provisioner: it tears down whatever of the
// computer in dir is left (as Down), then proves nothing is (NothingLeft).
// A directory that does not exist is already destroyed. Leftovers that
// teardown found and removed are not an error once the proof holds.
func (p *Provisioner) Destroy(ctx context.Context, dir string) error {
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	d, err := checkExisting(dir)
	if err != nil {
		return err
	}
	s, err := ReadState(d)
	if errors.Is(err, fs.ErrNotExist) {
		return removeUnstarted(d)
	}
	if err != nil {
		return err
	}
	downErr := Down(ctx, d)
	if err := NothingLeft(s); err != nil {
		return errors.Join(downErr, err)
	}
	return nil
}

// removeUnstarted removes the directory of a computer whose maker was
// killed before it wrote the state file: New writes it before anything
// else, so the directory holds nothing but, perhaps, the state file's
// temporary copy. Anything else is not the computer's: it is left in
// place and named (ErrLeftover).
func removeUnstarted(dir string) error {
	return RemoveDir(dir, layout(dir).state+".tmp")
}

// NothingLeft checks that nothing of the computer s describes remains on
// this host: no process of its uid, no System V IPC object of it, none
// of its cgroups, no mount beneath its directory, no loop device backing
// its disk image, and no directory. The error (ErrLeftover) names each.
func NothingLeft(s State) error {
	var errs []error
	if s.UID >= MinID {
		if ps, err := pidsOf(s.UID, false); err != nil || len(ps) != 0 {
			errs = append(errs, fmt.Errorf("%d processes of uid %d (%v)", len(ps), s.UID, err))
		}
		if objs, err := IPCObjectsOf(s.UID); err != nil || len(objs) != 0 {
			errs = append(errs, fmt.Errorf("%d IPC objects of uid %d (%v)", len(objs), s.UID, err))
		}
	}
	for _, d := range append([]string{s.CgroupParent}, s.LimitCgroups...) {
		if _, err := os.Lstat(d); d != "" && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("cgroup %s (%v)", d, err))
		}
	}
	if mi, err := os.ReadFile("/proc/self/mountinfo"); err != nil || bytes.Contains(mi, []byte(" "+s.Dir+"/")) {
		errs = append(errs, fmt.Errorf("a mount beneath %s (%v)", s.Dir, err))
	}
	if s.Disk != nil && s.Disk.Loop != "" && loopBacks(s.Disk.Loop, s.Disk.Image) {
		errs = append(errs, fmt.Errorf("%s still backs %s", s.Disk.Loop, s.Disk.Image))
	}
	if _, err := os.Lstat(s.Dir); !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("directory %s (%v)", s.Dir, err))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrLeftover, errors.Join(errs...))
	}
	return nil
}

// loadCredentials reads the custodian's client certificate and key and
// the CA certificate it pins, for dialing an adopted computer's receiver.
// The CA's key is gone with the process that made it; nothing new can be
// signed.
func loadCredentials(f CustodianFiles) (*Credentials, error) {
	pair, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("load the custodian's certificate: %w", err)
	}
	b, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, err
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s holds no PEM certificate", f.CA)
	}
	ca, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", f.CA, err)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s holds no signing key", f.Key)
	}
	return &Credentials{CA: &pki.CA{Cert: ca}, Client: &pki.Leaf{Cert: pair.Leaf, Key: key, Chain: pair.Certificate}}, nil
}

// loadGrants is NewGrants for a computer that exists: the signing key is
// read from its file (root's, 0600) instead of made, and the publisher
// continues from the generation on disk.
func loadGrants(t admission.Tuple, lease time.Duration, p paths) (*Grants, error) {
	k, err := signing.LoadPrivateKey(p.signKey)
	if err != nil {
		return nil, err
	}
	pub, err := signedfile.NewPublisher(signedfile.PublisherConfig{Dir: p.admission, Key: k})
	if err != nil {
		return nil, err
	}
	return &Grants{tuple: t, lease: lease, input: p.grantsInput, publisher: pub}, nil
}
