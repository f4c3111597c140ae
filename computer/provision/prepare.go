package provision

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tetherdev/tether/receiver/cgroup2"
	"github.com/tetherdev/tether/receiver/cgroupv1"
)

// newPrepared makes the computer Provisioner.Prepare hands out: the
// computer New makes with opts (namespaced, Options.NoGrant and
// Detach), the same steps with the same checks and the same records
// ahead of each resource, but not one after another (docs/performance.md
// "Computer service"):
//
//   - after the first state file, three groups run at once: the
//     directories, the disk's mount points, the stage and the files
//     (certificates, keys, the first snapshot, the custodian's audit
//     key); the disk (its image from the start, mounted once the mount
//     points exist); the cgroups. The cgroups and the disk's kind are
//     recorded all at once, in the first state file, before any is made
//     (one save instead of one per cgroup);
//   - the stage is started as soon as the directories exist, so its
//     start overlaps the rest: it waits for its spec on the pipe, and
//     the spec is written only once the disk, the cgroups, the files and
//     the state naming the stage are in place;
//   - the stage moves only the thread that becomes the receiver into the
//     v1 cgroups (stageSpec.JoinThread), which does not wait for an RCU
//     grace period as moving a whole process does;
//   - readiness is awaited on events (ready.go), not on a 25 ms poll.
//
// The stage starts before the disk is mounted, so its mount namespace
// is copied from the host's before the disk is there: the disk's two
// mount points (DIR/disk and the tuple root) are made shared mount
// points first (makeDiskMountPoints), and the stage's copies of them
// receive the disk and the project's bind by propagation. The stage
// makes its whole tree private before it mounts anything (stageNewRoot),
// as soon as it has read its spec, so from then on it is in the state a
// stage started after the disk was mounted would be in; before that it
// mounts nothing, as before. New, which `tether-demo up` runs, keeps its
// steps one after another: the baseline the benchmark compares with.
func newPrepared(ctx context.Context, opts Options) (*Local, error) {
	c := &Local{opts: opts}
	var cgroups []plannedCgroup
	points := make(chan struct{}) // closed once the disk's mount points are made
	err := RunSteps(ctx, "computer", []Step{
		{Name: "validate.Options", Run: c.validate},
		{Name: "allocate.IDs", Run: c.allocateIDs},
		{Name: "disk.Plan", Run: c.planDisk},
		{Name: "cgroup.Plan", Run: func(context.Context) (err error) { cgroups, err = c.planCgroups(); return err }},
		{Name: "layout.Dir", Run: c.makeDir},
		{Name: "state.Early", Run: c.saveState},
		Concurrently("layout+stage+files+disk+cgroups",
			[]Step{{Name: "layout.Directories", Run: c.makeLayout},
				{Name: "disk.MountPoints", Run: func(ctx context.Context) error { return c.makeDiskMountPoints(ctx, points) }},
				{Name: "receiver.Stage", Run: c.startStage},
				{Name: "pki.Certificates", Run: c.makePKI}, {Name: "admission.Key", Run: c.makeSigningKey},
				{Name: "admission.Publish", Run: c.publishInitial}, {Name: "custodian.Files", Run: c.writeCustodianFiles},
				// The stage's pid and the CA pin, while the disk is made;
				// the disk and the cgroups save their own changes.
				{Name: "state.Save", Run: c.saveState}},
			[]Step{{Name: "disk.Image", Run: c.makePlannedImage},
				{Name: "disk.Root", Run: func(ctx context.Context) error { return c.mountPlannedDisk(ctx, points) }}},
			[]Step{{Name: "cgroup.Make", Run: func(ctx context.Context) error { return c.makePlannedCgroups(ctx, cgroups) }}}),
		{Name: "receiver.Config", Run: c.writeReceiverConfig},
		{Name: "receiver.Start", Run: c.releaseStage},
	}, c.undoPrepared, 20*time.Second)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// Concurrently is one Step that runs each group of steps in its own
// goroutine, each group's steps in order, and returns once every group
// has ended: on the first failure the others' context is cancelled, and
// the error names each failed step ("disk.Root: ..."). Nothing of a group
// runs after it returns, so an undo that follows sees everything made.
func Concurrently(name string, groups ...[]Step) Step {
	return Step{Name: name, Run: func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		errs := make([]error, len(groups))
		var wg sync.WaitGroup
		for i, g := range groups {
			wg.Go(func() {
				for _, s := range g {
					if err := s.Run(ctx); err != nil {
						errs[i] = fmt.Errorf("%s: %w", s.Name, err)
						cancel()
						return
					}
				}
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}}
}

// planDisk decides the kind of the computer's disk and records it in the
// state before anything of it, its mount points included, is made:
// teardown then unmounts DIR/disk and the tuple root whatever step
// failed.
func (c *Local) planDisk(context.Context) error {
	if !c.state.namespaced() {
		return fmt.Errorf("%w: a prepared computer is namespaced", ErrOptions)
	}
	d := Disk{Kind: DiskTmpfs}
	if c.state.Resources.MaxDiskBytes >= tinyDisk {
		d = Disk{Kind: DiskExt4, Image: c.paths.disk}
	}
	c.mu.Lock()
	c.state.Disk = &d
	c.mu.Unlock()
	return nil
}

// makeDiskMountPoints makes DIR/disk and makes it and the tuple root
// shared mount points (sharedMountpoint), before the stage starts, so
// that the stage's copies of them receive the disk and the project's bind
// when they are mounted; then it closes done.
func (c *Local) makeDiskMountPoints(_ context.Context, done chan<- struct{}) error {
	p := c.paths
	if err := os.Mkdir(p.diskDir, 0o700); err != nil {
		return err
	}
	if err := sharedMountpoint(p.diskDir); err != nil {
		return err
	}
	if err := sharedMountpoint(p.root); err != nil {
		return err
	}
	close(done)
	return nil
}

// makePlannedImage makes a planned ext4 disk's image (makeImage), which
// needs nothing but DIR and the state naming it: it runs while the
// directories, the mount points and the stage are made.
func (c *Local) makePlannedImage(ctx context.Context) error {
	s := c.State()
	if s.Disk.Kind != DiskExt4 {
		return nil
	}
	return makeImage(ctx, c.paths.disk, s.Resources.MaxDiskBytes)
}

// mountPlannedDisk is makeDisk on the mount points makeDiskMountPoints
// makes, once points is closed: the planned file system on DIR/disk (an
// ext4 image's loop device recorded before it is mounted), its project
// and home directories, and the project bound at the tuple root.
func (c *Local) mountPlannedDisk(ctx context.Context, points <-chan struct{}) error {
	select {
	case <-points:
	case <-ctx.Done(): // the mount points' group failed
		return context.Cause(ctx)
	}
	p, s := c.paths, c.State()
	if err := c.mountPlanned(ctx, s.Disk.Kind, s.Resources.MaxDiskBytes); err != nil {
		return err
	}
	if err := MakeDirs(Dir{Path: p.diskDir, Mode: 0o700}, Dir{Path: p.diskProject, Mode: 0o700, UID: s.UID, GID: s.GID},
		Dir{Path: p.diskHome, Mode: 0o700, UID: s.UID, GID: s.GID}); err != nil {
		return err
	}
	if err := unix.Mount(p.diskProject, p.root, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind the disk's project at the tuple root: %w", err)
	}
	return nil
}

// mountPlanned mounts the file system of kind and size on DIR/disk, as
// mountDisk does (an ext4 image is made by then: makePlannedImage).
func (c *Local) mountPlanned(ctx context.Context, kind string, size int64) error {
	p := c.paths
	if kind == DiskTmpfs {
		opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0700", size, max(size/(16<<10), 256))
		if err := unix.Mount("tether-disk", p.diskDir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("mount the disk's tmpfs: %w", err)
		}
		return nil
	}
	loop, err := attachLoop(p.disk)
	if err != nil {
		return err
	}
	defer loop.Close() // the mount holds the device once made; unmounting releases it (autoclear)
	if err := c.recordDisk(ctx, Disk{Kind: DiskExt4, Image: p.disk, Loop: loop.Name()}); err != nil {
		return err
	}
	if err := unix.Mount(loop.Name(), p.diskDir, "ext4", unix.MS_NOSUID|unix.MS_NODEV, ext4Options); err != nil {
		return fmt.Errorf("mount %s on the disk directory: %w", loop.Name(), err)
	}
	return nil
}

// startStage starts the stage, which becomes the receiver once it has
// read its spec (releaseStage writes it), and records it as the
// computer's receiver. A stage whose spec never comes reads the end of
// the pipe when this process closes it, or dies with it, and exits.
func (c *Local) startStage(context.Context) error {
	log, err := os.OpenFile(c.paths.receiverLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd, r, w, err := stageProcess()
	if err != nil {
		return err
	}
	cmd.Env = []string{} // nothing from the caller's environment
	cmd.Dir = "/"
	cmd.Stderr = log
	err = startReduced(cmd, c.drop)
	r.Close()
	if err != nil {
		w.Close()
		return err
	}
	rp := &receiverProc{pid: cmd.Process.Pid, cmd: cmd, done: make(chan struct{})}
	rp.ticks, _ = StartTicks(rp.pid)
	go func() { rp.err = cmd.Wait(); close(rp.done) }()
	c.mu.Lock()
	c.recv, c.spec = rp, w
	c.state.ReceiverPID, c.state.ReceiverStart = rp.pid, rp.ticks
	c.mu.Unlock()
	return nil
}

// releaseStage writes the stage's spec (the state naming the stage is
// saved by then) and waits until the receiver it becomes answers, on
// events when inotify can watch its directory, else as waitReady polls.
func (c *Local) releaseStage(ctx context.Context) error {
	spec := c.stageSpec()
	spec.JoinThread = true
	data, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	watch, werr := watchReady(c.paths) // before the spec: no event is missed
	if watch != nil {
		defer watch.Close()
	}
	c.mu.Lock()
	w, r := c.spec, c.recv
	c.spec = nil
	c.mu.Unlock()
	_, err = w.Write(data)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write the stage's spec: %w", err)
	}
	if werr != nil {
		err = c.waitReady(ctx, r)
	} else {
		err = c.waitReadyWatched(ctx, r, watch)
	}
	if errors.Is(err, ErrReceiverExited) {
		c.mu.Lock()
		c.recv = nil
		c.mu.Unlock()
	}
	return err
}

// undoPrepared is teardown for newPrepared: a stage still waiting for
// its spec gets the pipe's end, and exits, before teardown stops it.
func (c *Local) undoPrepared(ctx context.Context) error {
	c.mu.Lock()
	w := c.spec
	c.spec = nil
	c.mu.Unlock()
	if w != nil {
		w.Close()
	}
	return c.teardown(ctx)
}

// plannedCgroup is one cgroup of a prepared computer: its parent cgroup
// in the cgroup2 mount (ctrl ""; limits when it holds the pids and memory
// limits), or its cgroup in the v1 hierarchy of ctrl.
type plannedCgroup struct {
	dir, ctrl string
	limits    bool
}

// planCgroups decides the cgroups makeCgroupParent and makeLimitCgroups
// would make, checks as they do that none exists yet, and records them
// all in the state (state.Early saves it) before any is made: as with
// makeRecordedCgroup, a maker killed before it made one leaves a state
// naming a cgroup that teardown finds absent, never a cgroup that no
// state names.
func (c *Local) planCgroups() ([]plannedCgroup, error) {
	var plan []plannedCgroup
	name := CgroupParentName(c.state.Tuple.Sandbox)
	v2Limits := false
	if c.state.Cgroup == CgroupRequired {
		v2Limits = cgroup2.HasControllers(c.cgroupMount, "pids", "memory") == nil
		plan = append(plan, plannedCgroup{dir: filepath.Join(c.cgroupMount, name), limits: v2Limits})
		c.state.CgroupParent = plan[0].dir // v1Extras reads it
	}
	var ctrls []string
	if !v2Limits {
		ctrls = []string{cgroupv1.Pids, cgroupv1.Memory}
	}
	for _, ctrl := range append(ctrls, c.v1Extras()...) {
		own, err := cgroupv1.Dir(ctrl)
		if err == nil {
			err = cgroupv1.Check(own, ctrl)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: neither cgroup2 nor a cgroup v1 hierarchy can limit the computer's %s: %w", ErrOptions, ctrl, err)
		}
		plan = append(plan, plannedCgroup{dir: filepath.Join(own, name), ctrl: ctrl})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, g := range plan {
		if _, err := os.Lstat(g.dir); !errors.Is(err, fs.ErrNotExist) {
			c.state.CgroupParent = ""
			return nil, fmt.Errorf("create the computer's cgroup: %s exists, or cannot be checked: %v", g.dir, err)
		}
		if g.ctrl != "" {
			c.state.LimitCgroups = append(c.state.LimitCgroups, g.dir)
		}
	}
	return plan, nil
}

// makePlannedCgroups makes the planned cgroups (root's, 0755) and sets
// their limits: on the cgroup2 parent when it holds the pids and memory
// controllers, else on each v1 computer cgroup's commands/. When one
// cannot be made, it and those not made yet stop being named in the
// state (saved), so teardown never removes a cgroup this computer did not
// make.
func (c *Local) makePlannedCgroups(ctx context.Context, plan []plannedCgroup) error {
	l := c.State().Resources
	for i, g := range plan {
		err := os.Mkdir(g.dir, 0o755)
		if err != nil {
			return errors.Join(fmt.Errorf("create the computer's cgroup: %w", err), c.forgetCgroups(ctx, plan[i:]))
		}
		switch {
		case g.ctrl != "":
			err = makeV1Computer(g.dir, g.ctrl, l.MaxPids, l.MaxMemoryBytes)
		case g.limits:
			err = cgroup2.SetLimits(g.dir, l.MaxPids, l.MaxMemoryBytes)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// forgetCgroups takes cgroups that were planned but not made out of the
// state, and saves it.
func (c *Local) forgetCgroups(ctx context.Context, gone []plannedCgroup) error {
	c.mu.Lock()
	for _, g := range gone {
		if c.state.CgroupParent == g.dir {
			c.state.CgroupParent = ""
		}
		c.state.LimitCgroups = slices.DeleteFunc(c.state.LimitCgroups, func(d string) bool { return d == g.dir })
	}
	c.mu.Unlock()
	return c.saveState(ctx)
}
