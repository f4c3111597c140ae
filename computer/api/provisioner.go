package api

import (
	"context"
	"time"

	"github.com/tetherdev/tether/admission"
)

// Provisioner makes and ends the machines behind computers; the
// namespaced provisioner (computer/provision) implements it, and the
// service (computer/service) is its only caller. Every Machine it
// returns must be Closed by the caller.
type Provisioner interface {
	// Prepare makes a computer that is ready but admits nothing: a fresh
	// uid and gid, its disk, namespaces and cgroups, and a receiver
	// serving an admission snapshot that holds no grant. dir is a new
	// directory the provisioner creates and owns. The warm pool holds
	// such machines; Machine.Grant admits one.
	Prepare(ctx context.Context, dir string, limits Limits) (Machine, error)
	// Adopt takes back a machine a previous daemon made in dir. It fails
	// (and changes nothing) when the machine's receiver no longer runs;
	// the caller then calls Destroy.
	Adopt(ctx context.Context, dir string) (Machine, error)
	// Destroy ends whatever is left of the machine in dir (processes,
	// mounts, cgroups, loop devices, IPC, files), whether or not its
	// receiver runs, and proves nothing is left. Destroying a directory
	// that no longer exists succeeds.
	Destroy(ctx context.Context, dir string) error
}

// Machine is one prepared computer. Its methods may be called from
// several goroutines.
type Machine interface {
	// Dir is the directory Prepare made.
	Dir() string
	// Tuple is the allocation tuple the machine's grant admits.
	Tuple() admission.Tuple
	// Grant publishes a snapshot that admits the machine's tuple until
	// notAfter (the coordinator's cap), and returns once it is in place.
	Grant(ctx context.Context, notAfter time.Time) error
	// Withdraw publishes a snapshot without the grant; the receiver then
	// refuses every request (expired). It returns once it is in place.
	Withdraw(ctx context.Context) error
	// KillCommands kills every process running as the machine's uid,
	// and returns once none is left. The receiver keeps running.
	KillCommands(ctx context.Context) error
	// Freeze stops every command of the machine (cgroup freezer); the
	// receiver keeps answering. Thaw lets them run again.
	Freeze(ctx context.Context) error
	Thaw(ctx context.Context) error
	// Usage reads the machine's CPU, memory and pids from its cgroups.
	Usage(ctx context.Context) (Usage, error)
	// Busy says whether a command is running as the machine's uid.
	Busy(ctx context.Context) (bool, error)
	// CustodianConfig is the path of a custodian configuration that
	// reaches the machine's receiver.
	CustodianConfig() string
	// ReceiverAlive says whether the receiver process still runs.
	ReceiverAlive() bool
	// Close tears the machine down and proves nothing is left; safe to
	// call twice.
	Close(ctx context.Context) error
}

// Usage is one reading of a machine's cgroups.
type Usage struct {
	CPUSeconds  float64 `json:"cpu_s"`
	MemoryBytes int64   `json:"memory_bytes"`
	Pids        int64   `json:"pids"`
}

// Rooted is a Machine whose tuple root the service reaches on the host,
// which export, import and copy need. The namespaced provisioner's
// machines are Rooted.
type Rooted interface {
	// Root returns the host directory that is the tuple root, and the
	// uid and gid that must own everything written there.
	Root() (dir string, uid, gid int)
}

// RecordKeeper is implemented by machines whose custody records (the
// custodian's receipts and tamper-evident audit log, with the key that
// verifies it) outlive the machine. The service calls KeepRecords in a
// teardown after KillCommands and before Close: it moves the records
// into dst, a new directory, so that they stay readable after the
// computer is gone.
type RecordKeeper interface {
	KeepRecords(ctx context.Context, dst string) error
}

// ServiceRef names the service that made a computer: its unix socket and
// the computer's id there.
type ServiceRef struct {
	Socket string
	ID     string
}

// Referrer is implemented by machines that tell their custodian which
// service made them (so it can wake a suspended computer before it
// forwards a callback). The service calls SetServiceRef before Grant,
// and again after it adopts the machine; the next Grant writes it out.
type Referrer interface {
	SetServiceRef(ref ServiceRef)
}
