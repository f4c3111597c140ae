package receipt

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func good() *Receipt {
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r := &Receipt{
		Suite:    "receiver-isolation",
		Problems: []string{},
		Excluded: []Excluded{{Package: "receiver/conformance", Name: "TestIntegrationVirtioSerial", Reason: "boots its own VM"}},
		Tests: []Test{
			{Package: "receiver/spawn", Name: "TestChildMasks", Result: Pass, ElapsedS: 0.5},
			{Package: "receiver/spawn", Name: "TestChildMasks/thread", Result: Pass},
			{Package: "receiver/spawn", Name: "TestChildMasks/helper", Result: Pass},
			{Package: "receiver/caps", Name: "TestCheckPassesAsRoot", Result: Pass},
		},
		Go:       "go1.26.8",
		Kernel:   Kernel{Release: "6.12.95+deb12-amd64", Image: "6.12.95+deb12-amd64", VmlinuxSHA256: strings.Repeat("ab", 32)},
		QEMU:     QEMU{Version: "7.2.22 (Debian 1:7.2+dfsg-7)", Accelerator: "tcg", AccelReason: "kvm probe timed out"},
		Binaries: []Binary{{Path: "/suite/bin/spawn.test", Size: 10, SHA256: strings.Repeat("cd", 32)}},
		Source:   Source{GitTree: strings.Repeat("e", 40), GitHead: strings.Repeat("f", 40)},
		Started:  start,
		Ended:    start.Add(3 * time.Minute),
	}
	r.Declared = []string{"receiver/spawn TestChildMasks", "receiver/caps TestCheckPassesAsRoot"}
	r.Counts = Tally(r.Tests, r.Declared)
	r.Summary = r.Summarize()
	return r
}

func TestGoodReceiptPasses(t *testing.T) {
	r := good()
	if err := r.Check("receiver-isolation"); err != nil {
		t.Fatal(err)
	}
	if r.Counts != (Counts{Declared: 2, Executed: 4, Ignored: 0, Failed: 0}) {
		t.Fatalf("counts %+v: executed counts subtests too", r.Counts)
	}
	want := "receiver-isolation: PASS 4 executed / 0 ignored / 0 failed of 2 declared; tcg on qemu 7.2.22, kernel 6.12.95+deb12-amd64; 3m0s"
	if r.Summary != want {
		t.Fatalf("summary\n got %s\nwant %s", r.Summary, want)
	}
}

// TestCheckRefuses breaks a good receipt one way at a time; each must be
// refused with a reason that names what is wrong.
func TestCheckRefuses(t *testing.T) {
	for name, c := range map[string]struct {
		edit func(r *Receipt)
		want string
		raw  bool // keep the edited counts instead of recounting
	}{
		"other suite":      {func(r *Receipt) { r.Suite = "native-client" }, `names suite "native-client"`, false},
		"problem":          {func(r *Receipt) { r.Problems = []string{"guest did not boot\ndetails"} }, "problem: guest did not boot", false},
		"failed test":      {func(r *Receipt) { r.Tests[3].Result = Fail }, "1 failed: receiver/caps TestCheckPassesAsRoot", false},
		"failed subtest":   {func(r *Receipt) { r.Tests[1].Result = Fail }, "1 failed: receiver/spawn TestChildMasks/thread", false},
		"skipped test":     {func(r *Receipt) { r.Tests[3].Result = Skip }, "1 ignored (skipped)", false},
		"skipped subtest":  {func(r *Receipt) { r.Tests[2].Result = Skip }, "ignored (skipped): receiver/spawn TestChildMasks/helper", false},
		"declared not run": {func(r *Receipt) { r.Tests = r.Tests[:3] }, "1 declared tests did not run: receiver/caps TestCheckPassesAsRoot", false},
		"fewer executed": {func(r *Receipt) {
			r.Tests = r.Tests[:2]
			r.Declared = append(r.Declared, "receiver/spawn TestChildMasks/thread", "receiver/x TestY")
		}, "2 executed, fewer than the 4 declared", false},
		"declares nothing":      {func(r *Receipt) { r.Declared = nil }, "declares no tests", false},
		"no tests at all":       {func(r *Receipt) { r.Tests = nil }, "0 executed, fewer than the 2 declared", false},
		"declared count edited": {func(r *Receipt) { r.Counts.Declared = 1 }, "do not match", true},
		"tampered counts":       {func(r *Receipt) { r.Counts.Executed = 9 }, "do not match the tests listed", true},
		"hidden failure":        {func(r *Receipt) { r.Tests[0].Result = Fail; r.Counts.Failed = 0 }, "do not match", true},
		"unknown result":        {func(r *Receipt) { r.Tests[0].Result = "flaky" }, `unknown result "flaky"`, false},
		"duplicate test":        {func(r *Receipt) { r.Tests = append(r.Tests, r.Tests[0]) }, "listed twice", false},
		"no go version":         {func(r *Receipt) { r.Go = "" }, "missing go_version", false},
		"no kernel":             {func(r *Receipt) { r.Kernel.Release = "" }, "guest never reported", false},
		"no vmlinux hash":       {func(r *Receipt) { r.Kernel.VmlinuxSHA256 = "xyz" }, "vmlinux_sha256", false},
		"no qemu":               {func(r *Receipt) { r.QEMU.Version = "" }, "missing qemu.version", false},
		"bad accelerator":       {func(r *Receipt) { r.QEMU.Accelerator = "hvf" }, "qemu.accelerator", false},
		"no binaries":           {func(r *Receipt) { r.Binaries = nil }, "missing binaries", false},
		"bad binary hash":       {func(r *Receipt) { r.Binaries[0].SHA256 = strings.Repeat("AB", 32) }, "sha256 of binary", false},
		"no tree":               {func(r *Receipt) { r.Source.GitTree = "" }, "source.git_tree", false},
		"no start":              {func(r *Receipt) { r.Started = time.Time{} }, "started/ended", false},
		"ended first":           {func(r *Receipt) { r.Ended = r.Started.Add(-time.Second) }, "started/ended", false},
	} {
		t.Run(name, func(t *testing.T) {
			r := good()
			c.edit(r)
			if !c.raw {
				r.Counts = Tally(r.Tests, r.Declared)
			}
			err := r.Check("receiver-isolation")
			var re *RejectError
			if !errors.Is(err, ErrRejected) || !errors.As(err, &re) {
				t.Fatalf("Check = %v, want a RejectError", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("reasons %q do not mention %q", re.Reasons, c.want)
			}
			if r.Passed() && name != "other suite" {
				t.Fatal("Passed() is true for a refused receipt")
			}
			if s := r.Summarize(); !strings.Contains(s, ": FAIL ") && name != "other suite" {
				t.Fatalf("summary of a refused receipt: %s", s)
			}
		})
	}
}

func TestCheckFileMissingIsRefused(t *testing.T) {
	_, err := CheckFile(t.TempDir(), "native-client")
	if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("CheckFile of a missing receipt = %v", err)
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	r := good()
	r.Summary, r.Counts.Executed = "stale", 0 // Write recomputes both
	if err := Write(dir, r); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "receiver-isolation.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte("\n  \"suite\": \"receiver-isolation\",\n")) {
		t.Fatalf("receipt is not indented for a person:\n%s", data[:min(200, len(data))])
	}
	got, err := CheckFile(dir, "receiver-isolation")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, good()) {
		t.Fatalf("round trip changed the receipt:\n got %+v\nwant %+v", got, good())
	}
	if st, _ := os.Stat(filepath.Join(dir, "receiver-isolation.json")); st.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v", st.Mode())
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*tmp")); len(left) > 0 {
		t.Fatalf("temporary files left: %v", left)
	}
}

func TestDecodeRefuses(t *testing.T) {
	base, err := Encode(good())
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"unknown field": bytes.Replace(base, []byte(`"suite"`), []byte(`"verdict": "pass", "suite"`), 1),
		"duplicate key": bytes.Replace(base, []byte(`"suite"`), []byte(`"suite": "x", "suite"`), 1),
		"case folded":   bytes.Replace(base, []byte(`"suite"`), []byte(`"Suite"`), 1),
		"trailing":      append(append([]byte{}, base...), []byte("{}")...),
		"not an object": []byte(`[]`),
		"too large":     make([]byte, MaxBytes+1),
	} {
		if _, err := Decode(data); !errors.Is(err, ErrReceipt) {
			t.Errorf("%s: Decode = %v, want ErrReceipt", name, err)
		}
	}
}
