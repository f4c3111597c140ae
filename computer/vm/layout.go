package vm

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/tetherdev/tether/admission/atomicfile"
	"github.com/tetherdev/tether/admission/strictjson"
	"github.com/tetherdev/tether/computer/provision"
)

// paths is where the host side of one VM computer lives:
//
//	DIR/               0755 root   the computer; vm.json, custodian.json
//	  wire.sock        0660 root:cust  the custodian's socket (TLS inside)
//	  custodian/       0700 cust   client certificate and key, audit key, state
//	  coordinator/     0700 root   the admission signing key
//	  admission/       0755 root   the snapshot, pushed to the guest over the control port
//	  qemu/            0700 qemu   initramfs, QMP, control and wire sockets, logs
//	                               (with a screen also view-qmp.sock and vnc.sock)
//	  screen/          0700 root   with a screen: the live view's tokens and audit log
type paths struct {
	dir, wire, state, custConfig             string
	custodian, auditKey, auditPub, custState string
	cust                                     provision.CustodianFiles
	coordinator                              string
	coord                                    provision.CoordinatorFiles
	admission                                string
	qemu, initramfs, qmp, control, guestWire string
	receiverLog                              string
	screen, viewQMP, vnc                     string
}

func layout(dir string) paths {
	j := func(p ...string) string { return filepath.Join(append([]string{dir}, p...)...) }
	return paths{dir: dir, wire: j("wire.sock"), state: j("vm.json"), custConfig: j("custodian.json"),
		custodian: j("custodian"), auditKey: j("custodian", "audit.key"), auditPub: j("custodian", "audit.pub"),
		custState: j("custodian", "state"), cust: provision.CustodianFilesIn(j("custodian")),
		coordinator: j("coordinator"),
		coord: provision.CoordinatorFiles{Key: j("coordinator", "admission.key"), PublicKey: j("coordinator", "admission.pub"),
			Input: j("coordinator", "grants.json"), Dir: j("admission")},
		admission: j("admission"),
		qemu:      j("qemu"), initramfs: j("qemu", "initramfs.cpio"), qmp: j("qemu", "qmp.sock"),
		control: j("qemu", "control.sock"), guestWire: j("qemu", "wire.sock"),
		receiverLog: j("qemu", "receiver.log"),
		screen:      j("screen"), viewQMP: j("qemu", "view-qmp.sock"), vnc: j("qemu", "vnc.sock"),
	}
}

// state is DIR/vm.json: what Destroy needs to find everything of the
// computer again after its service died.
type state struct {
	QEMUUID uint32 `json:"qemu_uid"`
	QEMUPID int    `json:"qemu_pid,omitempty"`
	Cgroup  string `json:"cgroup"` // the name of QEMU's cgroups in each hierarchy
	UID     uint32 `json:"uid"`    // the grant's uid (in the guest)
	// VsockCID is the guest's vsock context id, with the vsock link.
	VsockCID uint32 `json:"vsock_cid,omitempty"`
}

func (p paths) writeState(s state) error {
	data, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return atomicfile.Write(p.state, append(data, '\n'), 0o600, atomicfile.Options{})
}

func readState(dir string) (state, error) {
	data, err := os.ReadFile(filepath.Join(dir, "vm.json"))
	if err != nil {
		return state{}, err
	}
	var s state
	if err := strictjson.Decode(data, 4096, &s); err != nil {
		return state{}, fmt.Errorf("%s/vm.json: %w", dir, err)
	}
	if s.QEMUUID < provision.MinID || s.Cgroup == "" {
		return state{}, fmt.Errorf("%s/vm.json: not a VM computer's state", dir)
	}
	return s, nil
}
