package guestrun

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Console markers, for a person reading the guest's console.
const (
	ConsolePrefix = "tether-suite: "
	ConsoleDone   = ConsolePrefix + "done"
	ConsoleFailed = ConsolePrefix + "init failed: "
)

// Hostname is the guest's host name.
const Hostname = "tether-guest"

// portWait bounds the wait for the report port to appear.
const portWait = 20 * time.Second

// ModuleList is the file the image builder (fixtures/guest) writes: the
// kernel modules to load, in dependency order, one guest path a line.
const ModuleList = "/etc/tether-guest/modules"

// Main is the guest's PID 1: it prepares the system, runs the plan at
// PlanPath, reports to the plan's port and powers the guest off. It never
// returns. Any failure before the report port is open is printed on the
// console (ConsoleFailed), where the host finds it.
func Main() {
	console := setupConsole()
	err := run(console)
	if err != nil {
		fmt.Fprintf(console, "%s%v\n", ConsoleFailed, err)
	}
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {} // PID 1 must not exit: that is a kernel panic
}

func run(console io.Writer) error {
	if err := mountAll(); err != nil {
		return err
	}
	if err := upLoopback(); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if err := loadModules(ModuleList); err != nil {
		return err
	}
	data, err := os.ReadFile(PlanPath)
	if err != nil {
		return err
	}
	plan, err := DecodePlan(data)
	if err != nil {
		return err
	}
	port, err := openPort(plan.Port, portWait)
	if err != nil {
		return err
	}
	defer port.Close()
	return runPlan(plan, NewWriter(port), console)
}

// setupConsole mounts devtmpfs and makes /dev/console fds 1 and 2, so the
// output of anything PID 1 prints reaches the serial console.
func setupConsole() io.Writer {
	_ = os.MkdirAll("/dev", 0o755)
	if err := unix.Mount("devtmpfs", "/dev", "devtmpfs", 0, "mode=0755"); err != nil && !errors.Is(err, unix.EBUSY) {
		return os.Stderr
	}
	c, err := os.OpenFile("/dev/console", os.O_RDWR, 0)
	if err != nil {
		return os.Stderr
	}
	_ = unix.Dup3(int(c.Fd()), 1, 0)
	_ = unix.Dup3(int(c.Fd()), 2, 0)
	return c
}

// mountAll mounts the pseudo file systems tests expect.
func mountAll() error {
	const plain = unix.MS_NOSUID | unix.MS_NODEV
	for _, m := range []struct {
		src, dst, fs string
		flags        uintptr
		data         string
	}{
		{"proc", "/proc", "proc", plain, ""},
		{"sysfs", "/sys", "sysfs", plain, ""},
		{"tmpfs", "/tmp", "tmpfs", plain, "mode=1777"},
		{"tmpfs", "/run", "tmpfs", plain, "mode=0755"},
		{"tmpfs", "/dev/shm", "tmpfs", plain, "mode=1777"},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "mode=0620,ptmxmode=0666"}, // device nodes: no nodev
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.fs, m.flags, m.data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fs, m.dst, err)
		}
	}
	return nil
}

// upLoopback brings lo up: tests listen on 127.0.0.1.
func upLoopback() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("loopback: socket: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback: get flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("loopback: set up: %w", err)
	}
	return nil
}

// loadModules loads each module listed in list, in order.
func loadModules(list string) error {
	data, err := os.ReadFile(list)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, p := range strings.Fields(string(data)) {
		if err := loadModule(p); err != nil {
			return err
		}
	}
	return nil
}

func loadModule(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("module %s: %w", p, err)
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: %w", p, err)
	}
	return nil
}

// openPort opens the virtio-serial port named name, waiting up to wait
// for its device to appear.
func openPort(name string, wait time.Duration) (*os.File, error) {
	deadline := time.Now().Add(wait)
	for {
		dev, err := findPort(name)
		if err == nil {
			return os.OpenFile(dev, os.O_WRONLY, 0)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("report port %q: %w", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// findPort maps a port name to its device through sysfs.
func findPort(name string) (string, error) {
	names, err := filepath.Glob("/sys/class/virtio-ports/*/name")
	if err != nil {
		return "", err
	}
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err == nil && strings.TrimSpace(string(b)) == name {
			dev := "/dev/" + filepath.Base(filepath.Dir(n))
			if _, err := os.Stat(dev); err != nil {
				return "", err
			}
			return dev, nil
		}
	}
	return "", fmt.Errorf("no virtio port named %q among %d ports", name, len(names))
}

// uname returns the running kernel's release.
func uname() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// signalName names the signal in a wait status.
func signalName(ws syscall.WaitStatus) string {
	if !ws.Signaled() {
		return ""
	}
	return unix.SignalName(ws.Signal())
}
