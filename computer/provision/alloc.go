package provision

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/tetherdev/tether/admission"
	"github.com/tetherdev/tether/computer/bins"
	"github.com/tetherdev/tether/computer/ports"
)

// Defaults checks what every kind of computer needs of o (the receiver
// binary in Bins, a lease that is not negative) and fills in the
// defaults: Owner "alice", AllOps and a lease of one hour. Its errors
// wrap ErrOptions and name the check.
func (o *Options) Defaults() error {
	if err := o.Bins.Require(bins.Receiver); err != nil {
		return fmt.Errorf("%w: %w", ErrOptions, err)
	}
	if o.Lease < 0 {
		return fmt.Errorf("%w: lease %s is negative", ErrOptions, o.Lease)
	}
	if o.Owner == "" {
		o.Owner = "alice"
	}
	if o.Ops == nil {
		o.Ops = AllOps
	}
	if o.Lease == 0 {
		o.Lease = time.Hour
	}
	return nil
}

// GrantFor returns the grant o describes for tuple t: children run as
// uid and gid with no supplementary groups, o.Ops are allowed, o.Limits
// bound them (a zero field takes DefaultLimits' value), and it ends at
// notAfter (UTC, whole seconds).
func (o Options) GrantFor(t admission.Tuple, uid, gid uint32, notAfter time.Time) admission.Grant {
	l, d := o.Limits, DefaultLimits
	if l.MaxProcs == 0 {
		l.MaxProcs = d.MaxProcs
	}
	if l.MaxRuntimeS == 0 {
		l.MaxRuntimeS = d.MaxRuntimeS
	}
	if l.MaxOutputBytes == 0 {
		l.MaxOutputBytes = d.MaxOutputBytes
	}
	if l.MaxFileBytes == 0 {
		l.MaxFileBytes = d.MaxFileBytes
	}
	return admission.Grant{Tuple: t, UID: uid, GID: gid, Groups: []uint32{},
		Ops: append([]admission.Op(nil), o.Ops...), Limits: l, NotAfter: notAfter.UTC().Truncate(time.Second)}
}

// Allocation is who takes part in a new computer: the fresh uid and gid
// its children run as, the uid and gid that own the custodian's files,
// and the tuple.
type Allocation struct {
	UID, GID                   uint32
	CustodianUID, CustodianGID uint32
	Tuple                      admission.Tuple
}

// Allocate picks a fresh id (FreshID) for the children and a random
// suffix that names the allocation, the session and the sandbox
// (kind-SUFFIX); site and root complete the tuple, which must be valid.
// The custodian's ids are o's, else the caller's. o has been through
// Defaults.
func Allocate(o Options, kind, site, root string) (Allocation, error) {
	id, err := FreshID()
	if err != nil {
		return Allocation{}, err
	}
	suffix, err := randomHex(4)
	if err != nil {
		return Allocation{}, err
	}
	a := Allocation{UID: id, GID: id, CustodianUID: uint32(os.Geteuid()), CustodianGID: uint32(os.Getegid()),
		Tuple: admission.Tuple{Owner: o.Owner, Allocation: "alloc-" + suffix, Session: "tether-" + suffix,
			Workspace: "workspace", Sandbox: kind + "-" + suffix, Generation: 1, Executor: "tether-receiver",
			Site: site, Root: root}}
	if o.CustodianUID != nil {
		a.CustodianUID = *o.CustodianUID
	}
	if o.CustodianGID != nil {
		a.CustodianGID = *o.CustodianGID
	}
	return a, a.Tuple.Validate()
}

// ChooseLandlock resolves the Landlock mode of a computer's receiver:
// LandlockAuto becomes LandlockRequired when supported reports that the
// computer's kernel has the receiver's minimum Landlock ABI, else
// LandlockOff; LandlockRequired and LandlockOff stay; anything else is
// refused (ErrOptions).
func ChooseLandlock(mode string, supported func() bool) (string, error) {
	switch mode {
	case LandlockAuto:
		if supported() {
			return LandlockRequired, nil
		}
		return LandlockOff, nil
	case LandlockRequired, LandlockOff:
		return mode, nil
	}
	return "", fmt.Errorf("%w: landlock %q is not %q, %q or empty (auto)", ErrOptions, mode, LandlockRequired, LandlockOff)
}

// FreeLoopbackAddress returns 127.0.0.1:PORT with a port below the
// kernel's ephemeral range that was free a moment ago (package ports), for
// a receiver's listener or a forward to it.
func FreeLoopbackAddress() (string, error) {
	p, err := ports.Pick()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(int(p))), nil
}
