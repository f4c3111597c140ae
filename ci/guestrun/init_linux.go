package guestrun

import (
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/computer/vm/pid1"
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
const ModuleList = pid1.ModuleList

// Main is the guest's PID 1: it prepares the system, runs the plan at
// PlanPath, reports to the plan's port and powers the guest off. It never
// returns. Any failure before the report port is open is printed on the
// console (ConsoleFailed), where the host finds it.
func Main() {
	console := pid1.Console()
	if err := run(console); err != nil {
		fmt.Fprintf(console, "%s%v\n", ConsoleFailed, err)
	}
	pid1.PowerOff()
}

func run(console io.Writer) error {
	if err := pid1.MountBasics(); err != nil {
		return err
	}
	if err := pid1.LinkUp("lo"); err != nil { // tests listen on 127.0.0.1
		return err
	}
	if err := pid1.SetHostname(Hostname); err != nil {
		return err
	}
	if err := pid1.LoadModules(pid1.ModuleList); err != nil {
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
	port, err := pid1.OpenPort(plan.Port, os.O_WRONLY, portWait)
	if err != nil {
		return err
	}
	defer port.Close()
	return runPlan(plan, NewWriter(port), console)
}

// uname returns the running kernel's release.
func uname() string { return pid1.Release() }

// signalName names the signal in a wait status.
func signalName(ws syscall.WaitStatus) string {
	if !ws.Signaled() {
		return ""
	}
	return unix.SignalName(ws.Signal())
}
