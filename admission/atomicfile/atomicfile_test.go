package atomicfile

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// steps are Write's steps in order; a crash before StepRename must leave
// the old bytes, one at or after it the new ones.
var steps = []string{StepCreate, StepWrite, StepSync, StepRename, StepSyncDir}

const (
	crashStepEnv = "ATOMICFILE_CRASH_STEP"
	crashPathEnv = "ATOMICFILE_CRASH_PATH"
)

var (
	oldBytes = bytes.Repeat([]byte("old!"), 1<<16)
	newBytes = bytes.Repeat([]byte("NEW."), 1<<18)
)

// TestCrashChild is the child of TestCrashLeavesOldOrNew: it runs Write
// and blocks at the named step until it is killed. Without the
// environment it returns at once.
func TestCrashChild(t *testing.T) {
	at, path := os.Getenv(crashStepEnv), os.Getenv(crashPathEnv)
	if at == "" {
		return
	}
	stepHook = func(s string) {
		if s == at {
			os.Stdout.WriteString("reached " + s + "\n")
			select {} // until SIGKILL
		}
	}
	_ = Write(path, newBytes, 0o640, Options{})
	t.Fatal("Write returned; the parent kills the child at a step")
}

// TestCrashLeavesOldOrNew kills a child process (this test binary) at
// each step of Write and reads the target: the old bytes before the
// rename, the new bytes from it on, never a mix or an empty file.
func TestCrashLeavesOldOrNew(t *testing.T) {
	for i, at := range steps {
		t.Run(at, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "target")
			if err := Write(path, oldBytes, 0o640, Options{}); err != nil {
				t.Fatal(err)
			}
			crashAt(t, at, path)
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			want, name := oldBytes, "old"
			if i >= slices.Index(steps, StepRename) {
				want, name = newBytes, "new"
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("killed at %s: target has %d bytes, not the %s %d", at, len(got), name, len(want))
			}
		})
	}
}

// crashAt runs the child until it reports step at, then SIGKILLs it.
func crashAt(t *testing.T, at, path string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashStepEnv+"="+at, crashPathEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "reached "+at {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("child did not reach %s: %q %v", at, line, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

// record makes the hooks log Write's steps and fsyncs until the test ends.
func record(t *testing.T) *[]string {
	var events []string
	of, od := FileSync, DirSync
	FileSync = func(f *os.File) error { events = append(events, "fsync-file"); return of(f) }
	DirSync = func(d *os.File) error { events = append(events, "fsync-dir"); return od(d) }
	stepHook = func(s string) { events = append(events, s) }
	t.Cleanup(func() { FileSync, DirSync, stepHook = of, od, nil })
	return &events
}

// durableOrder reports what is wrong with a recorded sequence: the file
// must be fsynced before the rename and the directory after it.
func durableOrder(events []string) error {
	file, rename, dir := slices.Index(events, "fsync-file"), slices.Index(events, StepRename), lastIndex(events, "fsync-dir")
	switch {
	case rename < 0:
		return errors.New("no rename")
	case file < 0 || file > rename:
		return errors.New("temp file not fsynced before the rename")
	case dir < rename:
		return errors.New("directory not fsynced after the rename")
	}
	return nil
}

func TestWriteFsyncsFileThenDirectory(t *testing.T) {
	events := record(t)
	path := filepath.Join(t.TempDir(), "f")
	if err := Write(path, []byte("x"), 0o600, Options{}); err != nil {
		t.Fatal(err)
	}
	want := []string{StepCreate, StepWrite, "fsync-file", StepSync, StepRename, "fsync-dir", StepSyncDir}
	if !slices.Equal(*events, want) {
		t.Fatalf("events %q, want %q", *events, want)
	}
	if err := durableOrder(*events); err != nil {
		t.Fatal(err)
	}
}

// TestDurableOrderCatchesAMissingFsync is the positive control: the
// sequence of a writer without the file fsync (the snapshot writer
// before this package) or without the directory fsync is refused.
func TestDurableOrderCatchesAMissingFsync(t *testing.T) {
	noFile := []string{StepCreate, StepWrite, StepSync, StepRename, "fsync-dir", StepSyncDir}
	noDir := []string{StepCreate, StepWrite, "fsync-file", StepSync, StepRename, StepSyncDir}
	for _, ev := range [][]string{noFile, noDir} {
		if durableOrder(ev) == nil {
			t.Errorf("sequence %q passed", ev)
		}
	}
}

func TestWriteModeTempNameAndFailure(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := Write(path, []byte("a"), 0o640, Options{Temp: "f.tmp"}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v %v, want 0640", fi.Mode().Perm(), err)
	}
	// An exact temp name is created exclusively: a leftover makes Write
	// fail and leaves the target as it was.
	if err := os.WriteFile(filepath.Join(dir, "f.tmp"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, []byte("b"), 0o640, Options{Temp: "f.tmp"}); err == nil {
		t.Fatal("Write over a leftover exact temp file succeeded")
	}
	if got, _ := os.ReadFile(path); string(got) != "a" {
		t.Fatalf("target %q after a failed Write, want a", got)
	}
	of := FileSync
	FileSync = func(*os.File) error { return errors.New("EIO") }
	t.Cleanup(func() { FileSync = of })
	if err := Write(path, []byte("c"), 0o640, Options{}); err == nil {
		t.Fatal("a failed fsync was not reported")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 { // f and the leftover f.tmp: the failed temp file is gone
		t.Fatalf("directory holds %d entries after a failed fsync, want 2", len(ents))
	}
	if got, _ := os.ReadFile(path); string(got) != "a" {
		t.Fatalf("target %q after a failed fsync, want a", got)
	}
}

func lastIndex(s []string, v string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == v {
			return i
		}
	}
	return -1
}
