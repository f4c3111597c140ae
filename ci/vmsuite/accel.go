package vmsuite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tetherdev/tether/fixtures/guest"
)

// Accelerator choices.
const (
	AccelAuto = "auto" // KVM if the probe guest boots under it, else TCG
	AccelTCG  = "tcg"
	AccelKVM  = "kvm" // required: fail if the probe does not boot
)

// KVMProbeTimeout bounds the probe boot. TCG boots the probe guest in
// about 2 s on the CI machine; a KVM that works does it faster, and the
// CI machine's KVM (PVM) crawls for minutes before failing.
const KVMProbeTimeout = 10 * time.Second

// ErrAccel is wrapped when the demanded accelerator is unusable.
var ErrAccel = errors.New("accelerator")

// Accel is the accelerator a suite runs under and why it was chosen.
type Accel struct {
	Name   string // "tcg" or "kvm"
	Reason string
}

// ChooseAccel decides the accelerator. In AccelAuto and AccelKVM it
// boots a probe guest (the suite's kernel, a busybox init that exits)
// under KVM: opening /dev/kvm proves nothing, since a KVM that opens can
// still fail to run a guest. workDir receives the probe image.
func ChooseAccel(ctx context.Context, mode string, k guest.Kernel, qemu, workDir string) (Accel, error) {
	switch mode {
	case AccelTCG:
		return Accel{Name: AccelTCG, Reason: "chosen by --accel tcg; KVM not probed"}, nil
	case AccelAuto, AccelKVM:
	default:
		return Accel{}, fmt.Errorf("%w: unknown mode %q (auto, tcg or kvm)", ErrAccel, mode)
	}
	took, err := probeKVM(ctx, k, qemu, workDir)
	if err == nil {
		return Accel{Name: AccelKVM, Reason: fmt.Sprintf("KVM probe guest booted and powered off in %s", took.Round(time.Millisecond))}, nil
	}
	if mode == AccelKVM {
		return Accel{}, fmt.Errorf("%w: --accel kvm, but %w", ErrAccel, err)
	}
	return Accel{Name: AccelTCG, Reason: "KVM unusable: " + err.Error()}, nil
}

// probeKVM boots a minimal guest under KVM and returns how long it took.
func probeKVM(ctx context.Context, k guest.Kernel, qemu, workDir string) (time.Duration, error) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return 0, fmt.Errorf("/dev/kvm: %w", err)
	}
	f.Close()
	img, err := guest.Build(ctx, guest.Spec{Kernel: k, Script: "exit 0"}, filepath.Join(workDir, "kvm-probe.cpio"))
	if err != nil {
		return 0, fmt.Errorf("probe image: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, KVMProbeTimeout)
	defer cancel()
	start := time.Now()
	vm, err := guest.Start(pctx, guest.Config{Kernel: k, Initramfs: img.Path, QEMU: qemu, Accel: AccelKVM})
	if err != nil {
		return 0, err
	}
	defer vm.Close()
	code, err := vm.Wait(pctx)
	took := time.Since(start)
	var ce *guest.ConsoleError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return 0, fmt.Errorf("the probe guest did not power off within %s under KVM", KVMProbeTimeout)
	case errors.As(err, &ce):
		return 0, fmt.Errorf("the probe guest failed under KVM: %s", lastLine(ce.Stderr+"\n"+ce.Tail))
	case err != nil:
		return 0, err
	case code != 0:
		return 0, fmt.Errorf("the probe guest exited %d under KVM", code)
	}
	return took, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
