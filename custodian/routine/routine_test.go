package routine

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/custodian/opstore"
)

const digestOK = "2689367b205c16ce32ed4200942b8b8b1e262dfc70d9bc9fbc77c49699a4f1df"

func verifiedExec() *opstore.Receipt {
	return &opstore.Receipt{OpKey: "k1", RequestSHA256: strings.Repeat("a", 64), Method: MethodTerminalCreate,
		SessionID: "s1", TupleSHA256: strings.Repeat("b", 64), Principal: "alice", Outcome: opstore.Verified,
		Files: []opstore.FileCheck{{Path: "out.txt", Expected: digestOK, Actual: digestOK}},
		Exec:  &opstore.ExecRequest{Argv: []string{"/bin/sh", "-c", "make"}, Cwd: "src", Env: map[string]string{"A": "1"}},
		Exit:  &opstore.ExitStatus{ExitCode: new(0)}}
}

func TestFromReceipt(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	tmpl, err := FromReceipt("build", "alice", verifiedExec(), now)
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.Verify["out.txt"] != digestOK || tmpl.Cwd != "src" || tmpl.Argv[2] != "make" || tmpl.Source.OpKey != "k1" {
		t.Fatalf("template %+v", tmpl)
	}
	refuse := map[string]struct {
		mod  func(*opstore.Receipt)
		want error
	}{
		"needs_review": {func(r *opstore.Receipt) { r.Outcome = opstore.NeedsReview }, ErrNotVerified},
		"failed":       {func(r *opstore.Receipt) { r.Outcome = opstore.Failed }, ErrNotVerified},
		"pending":      {func(r *opstore.Receipt) { r.Outcome = opstore.Pending }, ErrNotVerified},
		"write":        {func(r *opstore.Receipt) { r.Method = "fs/write_text_file" }, ErrNotExec},
		"no exec":      {func(r *opstore.Receipt) { r.Exec = nil }, ErrNotExec},
		"other owner":  {func(r *opstore.Receipt) { r.Principal = "bob" }, ErrOtherOwner},
		"escaping cwd": {func(r *opstore.Receipt) { r.Exec.Cwd = "../x" }, ErrCorrupt},
		"no files":     {func(r *opstore.Receipt) { r.Files = nil }, ErrCorrupt},
	}
	for name, tc := range refuse {
		r := verifiedExec()
		tc.mod(r)
		if _, err := FromReceipt("build", "alice", r, now); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
}

func TestNames(t *testing.T) {
	for _, n := range []string{"a", "build", "nightly-2", "x_y", strings.Repeat("a", 64)} {
		if !ValidName(n) {
			t.Errorf("%q refused", n)
		}
	}
	for _, n := range []string{"", ".", "..", "-a", "_a", "A", "a/b", "a.json", "a b", "a\x00", strings.Repeat("a", 65), "é"} {
		if ValidName(n) {
			t.Errorf("%q accepted", n)
		}
		if err := CheckName(n); !errors.Is(err, ErrBadName) {
			t.Errorf("CheckName(%q) = %v", n, err)
		}
	}
}

func TestStoreSaveLoad(t *testing.T) {
	state := t.TempDir()
	st, err := OpenStore(state)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := FromReceipt("build", "alice", verifiedExec(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Save(tmpl, false); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(state, Dir, "build.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("template file: %v, mode %v; want 0600", err, fi.Mode())
	}
	dfi, err := os.Stat(filepath.Join(state, Dir))
	if err != nil || dfi.Mode().Perm() != 0o700 {
		t.Fatalf("routines dir: %v, mode %v; want 0700", err, dfi.Mode())
	}
	got, err := st.Load("build")
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := tmpl.Digest()
	d2, _ := got.Digest()
	if d1 != d2 {
		t.Fatalf("loaded template digest %s, saved %s", d2, d1)
	}
	if err := st.Save(tmpl, false); !errors.Is(err, ErrExists) {
		t.Fatalf("save over an existing name: %v, want ErrExists", err)
	}
	if err := st.Save(tmpl, true); err != nil {
		t.Fatalf("save with replace: %v", err)
	}
	if _, err := st.Load("absent"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("absent: %v", err)
	}
	if _, err := st.Load("../x"); !errors.Is(err, ErrBadName) {
		t.Fatalf("bad name: %v", err)
	}
}

// TestStoreRefusesUntrustedFiles: a template that is group-readable, a
// symlink, or holds another name than its file's is refused; the
// positive control (the same bytes, 0600, right name) loads.
func TestStoreRefusesUntrustedFiles(t *testing.T) {
	state := t.TempDir()
	st, err := OpenStore(state)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, _ := FromReceipt("build", "alice", verifiedExec(), time.Now())
	data, _ := tmpl.Marshal()
	dir := filepath.Join(state, Dir)
	write := func(name string, mode os.FileMode) {
		p := filepath.Join(dir, name+".json")
		os.Remove(p)
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
	}
	write("build", 0o600)
	if _, err := st.Load("build"); err != nil {
		t.Fatalf("positive control: %v", err)
	}
	write("build", 0o644)
	if _, err := st.Load("build"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("group-readable template: %v, want ErrCorrupt", err)
	}
	write("renamed", 0o600)
	if _, err := st.Load("renamed"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("template under another file name: %v, want ErrCorrupt", err)
	}
	write("build", 0o600)
	if err := os.Symlink(filepath.Join(dir, "build.json"), filepath.Join(dir, "link.json")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Load("link"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("symlinked template: %v, want ErrCorrupt", err)
	}
}

func TestReadStoreWithoutDirectory(t *testing.T) {
	st, err := ReadStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Load("build"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("no routines directory: %v, want ErrNotFound", err)
	}
}

// FuzzUnmarshal: Unmarshal never panics, and what it accepts is a template
// that checks and marshals back to bytes it accepts again.
func FuzzUnmarshal(f *testing.F) {
	tmpl, _ := FromReceipt("build", "alice", verifiedExec(), time.Unix(0, 0))
	data, _ := tmpl.Marshal()
	f.Add(data)
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tm, err := Unmarshal(data)
		if err != nil {
			return
		}
		if err := tm.Check(); err != nil {
			t.Fatalf("accepted a template that does not check: %v", err)
		}
		again, err := tm.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Unmarshal(again); err != nil {
			t.Fatalf("re-marshalled template refused: %v", err)
		}
	})
}
