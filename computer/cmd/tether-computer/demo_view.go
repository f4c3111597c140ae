package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/tetherdev/tether/admission/cli"
	"github.com/tetherdev/tether/computer/api"
	"github.com/tetherdev/tether/computer/client"
	"github.com/tetherdev/tether/computer/service"
	"github.com/tetherdev/tether/computer/vm"
	"github.com/tetherdev/tether/qmpinput/auditlog"
	"github.com/tetherdev/tether/qmpinput/statedir"
)

// runDemoView is `tether-computer demo-view`: a daemon in a temporary
// directory, one VM computer with a screen made by a plain create, its
// live view's links, and at the end its delete and the check of the
// view's audit log kept with the computer's records.
func runDemoView(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.NewFlagSet(prog+" demo-view", prog+" demo-view [--for DUR] [--vm tcg|kvm|auto] [--bin DIR]",
		"Starts the computer service in this process (state in a temporary directory, VM tier on),\n"+
			"creates a VM computer with a screen (create --tier vm --screen), and prints a control link and\n"+
			"a view-only link to its live view. Open one in a browser on this machine: watch the screen,\n"+
			"take over its input, hand it back. Ctrl-C (or --for) deletes the computer, checks the view's\n"+
			"audit log kept with its records, and removes everything. Needs root and QEMU.")
	fs.SetOutput(stderr)
	binDir := fs.String("bin", "", "directory holding tether-receiver and tether-vmguest (default: next to tether-computer)")
	accel := fs.String("vm", vm.AccelTCG, "the VM tier's accelerator: tcg, kvm or auto")
	kernel := fs.String("vm-kernel", "", "the guest kernel (default: the CI's vmsuite kernel)")
	forD := fs.Duration("for", 0, "end after this long (default: at Ctrl-C)")
	if code, done := cli.Parse(fs, args, stdout, stderr); done {
		return code
	}
	if fs.NArg() > 0 {
		return cli.UsageError(stderr, fs.Name(), "no arguments expected")
	}
	bd, err := binDirOf(*binDir)
	if err != nil {
		return fail(stderr, "demo-view", err)
	}
	o := viewDemo{binDir: bd, vm: vm.Config{Accel: *accel, KernelDir: *kernel}, forD: *forD, stdout: stdout, stderr: stderr}
	if err := o.run(ctx); err != nil {
		fmt.Fprintf(stderr, "%s demo-view: FAILED: %v\n", prog, err)
		return exitFail
	}
	return exitOK
}

// viewDemo is one demo-view.
type viewDemo struct {
	binDir         string
	vm             vm.Config
	forD           time.Duration
	stdout, stderr io.Writer
}

func (o viewDemo) run(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root: a VM computer's QEMU runs as a uid of its own")
	}
	dir, err := os.MkdirTemp("", "tether-computer-demo-view-")
	if err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		os.RemoveAll(dir)
		return err
	}
	logger := slog.New(slog.NewTextHandler(o.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sock := filepath.Join(dir, "api.sock")
	cfg := daemonConfig{Dir: filepath.Join(dir, "state"), Socket: sock, BinDir: o.binDir, Logger: logger, VM: o.vm,
		Service: service.Config{MaxComputers: 1, Logf: func(f string, a ...any) { logger.Warn(fmt.Sprintf(f, a...)) }}}
	// Ctrl-C ends the wait, not the daemon: the delete and the audit
	// check that follow it still need the service. Whatever happened
	// before, the daemon ends every computer it still has as it closes.
	var left error
	err = withDaemonEnd(context.WithoutCancel(ctx), cfg, sock, func(cl *client.Client, _ *daemon) error {
		return o.withComputer(ctx, cl, sock)
	}, func(ctx context.Context, d *daemon) error {
		left = endDemoDaemon(ctx, d, o.stdout)
		return left
	})
	return errors.Join(err, removeDemoDir(dir, left, "demo-view", o.stderr))
}

// withComputer creates the screen computer, prints its links, waits, and
// deletes it, then verifies the view's audit log in its records.
func (o viewDemo) withComputer(ctx context.Context, cl *client.Client, sock string) error {
	fmt.Fprintf(o.stdout, "%s demo-view: the computer service, embedded in this process (API socket %s)\n", prog, sock)
	fmt.Fprintf(o.stdout, "creating a VM computer with a screen (create --tier vm --screen; QEMU %s, %dx%d)...\n",
		o.vm.Accel, vm.ScreenWidth, vm.ScreenHeight)
	start := time.Now()
	c, err := cl.Create(ctx, api.CreateRequest{Tier: api.TierVM, Screen: true})
	if err != nil {
		return err
	}
	fmt.Fprintf(o.stdout, "%s is %s after %v\n", c.ID, c.State, time.Since(start).Round(time.Millisecond))
	err = o.show(ctx, cl, c.ID, sock)
	dctx := context.WithoutCancel(ctx)
	if derr := cl.Delete(dctx, c.ID); derr != nil {
		return errors.Join(err, fmt.Errorf("delete %s: %w", c.ID, derr))
	}
	fmt.Fprintf(o.stdout, "\ndeleted %s: its view stopped with it\n", c.ID)
	return errors.Join(err, o.verifyAudit(dctx, cl, c.ID))
}

// show mints and prints a control and a view-only link, then waits for
// Ctrl-C or --for.
func (o viewDemo) show(ctx context.Context, cl *client.Client, id, sock string) error {
	var links [2]api.Link
	for i, role := range []string{api.LinkRoleControl, api.LinkRoleView} {
		l, err := cl.Link(ctx, id, role, time.Hour)
		if err != nil {
			return fmt.Errorf("link %s: %w", role, err)
		}
		links[i] = l
	}
	fmt.Fprintf(o.stdout, "\nlive view of %s (each link opens once, within the hour):\n  control:   %s\n  view only: %s\n\n",
		id, links[0].Link, links[1].Link)
	fmt.Fprintf(o.stdout, "Open a link in a browser on this machine. Mint another with:\n  %s link --socket %s --role view %s\n",
		prog, sock, id)
	if o.forD > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.forD)
		defer cancel()
		fmt.Fprintf(o.stdout, "The demo ends in %v.\n", o.forD)
	} else {
		fmt.Fprintln(o.stdout, "Ctrl-C ends the demo.")
	}
	<-ctx.Done()
	return nil
}

// verifyAudit checks the hash chain of the view's audit log, which the
// delete kept in the computer's records (RECORDS/screen).
func (o viewDemo) verifyAudit(ctx context.Context, cl *client.Client, id string) error {
	c, err := cl.Get(ctx, id)
	if err != nil {
		return err
	}
	if c.Records == "" {
		return fmt.Errorf("%s ended (%s) without records", id, c.State)
	}
	p := filepath.Join(c.Records, "screen")
	if _, err := os.Stat(filepath.Join(p, auditlog.FileName)); err != nil {
		return fmt.Errorf("the view's audit log is not in the records: %w", err)
	}
	d, err := statedir.Open(p)
	if err != nil {
		return err
	}
	defer d.Close()
	sum, err := auditlog.VerifyDir(d, nil)
	if err != nil {
		return fmt.Errorf("the view's audit log: %w", err)
	}
	fmt.Fprintf(o.stdout, "the view's audit log, kept with the records: %d entries %v, head %.16s: the hash chain holds\n",
		sum.Entries, sum.Kinds, sum.Head)
	return nil
}
