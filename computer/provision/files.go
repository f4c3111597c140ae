package provision

import (
	"context"
	"encoding/json"
	"time"

	"github.com/tetherdev/tether/custodian"
	"github.com/tetherdev/tether/custodian/audit"
	"github.com/tetherdev/tether/receiver/transport"
)

// makePKI mints a CA for this computer alone, the receiver's server
// certificate and the custodian's client certificate, and writes each
// side's files into its own private directory. The CA key never touches
// the disk.
func (c *Local) makePKI(context.Context) error {
	creds, err := NewCredentials("tether computer "+c.state.Tuple.Allocation, c.state.Tuple.Owner)
	if err != nil {
		return err
	}
	c.creds = creds
	c.mu.Lock() // Prepare writes the state file meanwhile
	c.state.CASPKISHA256 = creds.CA.SPKISHA256()
	c.mu.Unlock()
	if _, _, err := creds.Server.WriteFiles(c.paths.receiver, "receiver"); err != nil {
		return err
	}
	if err := creds.CA.WriteCert(c.paths.recv.CA); err != nil {
		return err
	}
	return creds.WriteCustodian(c.paths.cust, c.state.CustodianUID, c.state.CustodianGID)
}

// makeSigningKey makes the coordinator's admission signing key; the
// receiver pins its public half.
func (c *Local) makeSigningKey(context.Context) error {
	p := c.paths
	var err error
	c.grants, err = NewGrants(c.state.Tuple, c.opts.Lease,
		CoordinatorFiles{Key: p.signKey, PublicKey: p.admissionPub, Input: p.grantsInput, Dir: p.admission})
	return err
}

// writeCustodianFiles writes the custodian's audit key and, unless the
// computer admits nothing yet (Options.NoGrant), DIR/custodian.json.
func (c *Local) writeCustodianFiles(context.Context) error {
	p, s := c.paths, c.State()
	skey, vkey, err := audit.GenerateKey("tether.local/" + s.Tuple.Allocation)
	if err != nil {
		return err
	}
	if err := writeFile(p.auditKey, []byte(skey+"\n"), 0o600, s.CustodianUID, s.CustodianGID); err != nil {
		return err
	}
	if err := writeFile(p.auditPub, []byte(vkey+"\n"), 0o644, s.CustodianUID, s.CustodianGID); err != nil {
		return err
	}
	if c.opts.NoGrant {
		return nil
	}
	return c.writeCustodianConfig(c.Grant().NotAfter)
}

// writeCustodianConfig writes DIR/custodian.json for a lease ending at
// leaseNotAfter, replacing any earlier one.
func (c *Local) writeCustodianConfig(leaseNotAfter time.Time) error {
	p, s := c.paths, c.State()
	c.mu.Lock()
	ref := c.serviceRef
	c.mu.Unlock()
	cfg := custodian.Config{Tuple: s.Tuple, LeaseNotAfter: leaseNotAfter, Principal: s.Tuple.Owner,
		Receiver: c.Receiver(), StateDir: p.custState, AuditKeyFile: p.auditKey, Computer: ref}
	if err := cfg.Validate(); err != nil {
		return err
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return replaceOwnedFile(p.custodianConfig, append(data, '\n'), 0o600, s.CustodianUID, s.CustodianGID)
}

// Receiver implements Computer: the custodian's side of the listener,
// pinned to this computer's CA.
func (c *Local) Receiver() custodian.ReceiverConfig {
	p := c.paths
	switch {
	case c.state.Transport == TransportUnix:
		return custodian.ReceiverConfig{Kind: transport.KindUnix, Path: p.socket, HostOnly: true, PeerUIDs: []uint32{0}}
	case c.state.Socket != "":
		return c.creds.ReceiverUnix(c.state.Socket, p.cust)
	}
	return c.creds.Receiver(c.state.Address, p.cust)
}

// publishInitial publishes the first snapshot: the grant, Options.Lease
// from now, or with Options.NoGrant none.
func (c *Local) publishInitial(ctx context.Context) error {
	if c.opts.NoGrant {
		_, err := c.Publish(ctx, time.Time{})
		return err
	}
	g := c.grantFor(time.Now().Add(c.opts.Lease))
	_, err := c.Publish(ctx, time.Time{}, g)
	return err
}
