package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission/signing"
	"github.com/tetherdev/tether/fixtures/guest"
	"github.com/tetherdev/tether/fixtures/testenv"
	"github.com/tetherdev/tether/qmpinput/bundle"
)

func runCLI(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestHelpEverywhere(t *testing.T) {
	for _, cmd := range []string{"capture", "run", "verify-bundle"} {
		code, out, _ := runCLI(t, "", cmd, "--help")
		if code != 0 || !strings.Contains(out, "usage: tether-qmp "+cmd) {
			t.Errorf("%s --help: code %d, out %q", cmd, code, out)
		}
	}
	if code, out, _ := runCLI(t, "", "--help"); code != 0 || !strings.Contains(out, "verify-bundle") {
		t.Errorf("--help: %d %q", code, out)
	}
	if code, _, _ := runCLI(t, "", "exec"); code != exitUsage {
		t.Errorf("unknown command: %d", code)
	}
	if code, _, _ := runCLI(t, "", "capture", "--bogus"); code != exitUsage {
		t.Errorf("unknown flag: %d", code)
	}
}

func TestCaptureRefusesTCP(t *testing.T) {
	code, out, _ := runCLI(t, "", "capture", "--socket", "127.0.0.1:4444", "--out", filepath.Join(t.TempDir(), "x.png"))
	if code != exitFailed || !strings.Contains(out, `"code":"not_unix_socket"`) {
		t.Fatalf("code %d out %s", code, out)
	}
}

// failWriter fails every write, as a closed stdout does.
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("stdout closed") }

func TestOwnerOutOfRange(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	for _, owner := range []string{"4294967296", "4294967297", "-2"} {
		code, out, _ := runCLI(t, "", "capture", "--socket", sock, "--owner", owner, "--out", filepath.Join(t.TempDir(), "x.png"))
		if code != exitFailed || !strings.Contains(out, `"code":"config"`) || !strings.Contains(out, "--owner") {
			t.Errorf("--owner %s: code %d out %s", owner, code, out)
		}
	}
}

func TestVerifyBundleCLI(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	m := bundle.Manifest{Schema: bundle.Schema, Guest: bundle.Guest{Arch: "x86_64", OS: "debian", Desktop: "hyprland"},
		Accelerator: "tcg", MachineArgs: []string{"-no-user-config", "-accel", "tcg"}}
	for name, a := range map[string]*bundle.Artifact{"qemu": &m.QEMU, "fw": &m.Firmware, "disk": &m.Disk} {
		os.MkdirAll(root, 0o755)
		os.WriteFile(filepath.Join(root, name), []byte(name), 0o644)
		sum := sha256.Sum256([]byte(name))
		*a = bundle.Artifact{Path: name, SHA256: hex.EncodeToString(sum[:])}
	}
	key, _ := signing.GenerateKey()
	env, err := bundle.Sign(context.Background(), m, key)
	if err != nil {
		t.Fatal(err)
	}
	man, pub := filepath.Join(dir, "bundle.dsse.json"), filepath.Join(dir, "bundle.pub")
	os.WriteFile(man, env, 0o644)
	if err := signing.WritePublicKey(pub, key.Public()); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := runCLI(t, "", "verify-bundle", "--manifest", man, "--pubkey", pub, "--root", root); code != 0 || !strings.Contains(out, `"ok":true`) {
		t.Fatalf("good bundle: %d %s %s", code, out, errs)
	}
	// A result nobody can read is a failure.
	var errb bytes.Buffer
	if code := run(context.Background(), []string{"verify-bundle", "--manifest", man, "--pubkey", pub, "--root", root}, strings.NewReader(""), failWriter{}, &errb); code != exitFailed {
		t.Fatalf("good bundle with a failing stdout: exit %d, want %d", code, exitFailed)
	}
	os.WriteFile(filepath.Join(root, "disk"), []byte("swapped"), 0o644)
	if code, out, _ := runCLI(t, "", "verify-bundle", "--manifest", man, "--pubkey", pub, "--root", root); code != exitFailed || !strings.Contains(out, `"code":"hash_mismatch"`) {
		t.Fatalf("swapped disk: %d %s", code, out)
	}
}

// TestIntegrationCLI boots a guest with a 1280x800 display and drives
// capture and run through the CLI.
func TestIntegrationCLI(t *testing.T) {
	testenv.Require(t, "qemu")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	k, err := guest.FindKernel()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "tether-qmp-cli-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	img, err := guest.Build(ctx, guest.Spec{Kernel: k, Modules: append(append([]string{}, guest.ModulesUSBTablet...), "bochs"), Script: "sleep 600"}, filepath.Join(dir, "i.cpio"))
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "qmp.sock")
	vm, err := guest.Start(ctx, guest.Config{Kernel: k, Initramfs: img.Path, Append: []string{"vt.global_cursor_default=0"},
		Args: []string{"-device", "VGA,id=video0,xres=1280,yres=800", "-device", "qemu-xhci", "-device", "usb-tablet",
			"-qmp", "unix:" + sock + ",server=on,wait=off"}})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Close()
	if err := vm.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "shot.png")
	code, stdout, stderr := runCLI(t, "", "capture", "--socket", sock, "--out", out)
	if code != 0 {
		t.Fatalf("capture: %d %s %s", code, stdout, stderr)
	}
	var res struct {
		Width, Height int
		SHA256        string
	}
	json.Unmarshal([]byte(stdout), &res)
	data, _ := os.ReadFile(out)
	cfg, err := png.DecodeConfig(bytes.NewReader(data))
	sum := sha256.Sum256(data)
	if err != nil || cfg.Width != 1280 || cfg.Height != 800 || res.Width != 1280 || res.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("capture output %s, file %dx%d %v", stdout, cfg.Width, cfg.Height, err)
	}
	script := "click 10 10\ncapture\nclick 1279 799\nkey ctrl+alt+t\ntype hi there\nclick 1280 1\nwait 1\n"
	code, stdout, _ = runCLI(t, script, "run", "--socket", sock, "--script", "-")
	want := []string{`"action":"click","ok":false,"code":"no_capture"`, `"action":"capture","ok":false,"skipped":true`}
	if code != exitFailed || !strings.Contains(stdout, want[0]) || !strings.Contains(stdout, want[1]) {
		t.Fatalf("run with an early click: %d\n%s", code, stdout)
	}
	var errb bytes.Buffer
	if code := run(ctx, []string{"capture", "--socket", sock, "--out", out}, strings.NewReader(""), failWriter{}, &errb); code != exitFailed {
		t.Fatalf("capture with a failing stdout: exit %d, want %d", code, exitFailed)
	}
	// --timeout bounds every action, a wait included.
	code, stdout, _ = runCLI(t, "wait 5000\nwait 1\n", "run", "--socket", sock, "--script", "-", "--timeout", "1s")
	if code != exitFailed || !strings.Contains(stdout, `"action":"wait","ok":false,"code":"action_deadline"`) || !strings.Contains(stdout, `"skipped":true`) {
		t.Fatalf("run with a wait past --timeout: %d\n%s", code, stdout)
	}
	code, stdout, _ = runCLI(t, script[len("click 10 10\n"):], "run", "--socket", sock, "--script", "-")
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	okRe := regexp.MustCompile(`"ok":true`)
	if code != exitFailed || len(lines) != 6 || !okRe.MatchString(lines[3]) || !strings.Contains(lines[4], `"code":"out_of_bounds"`) || !strings.Contains(lines[5], `"skipped":true`) {
		t.Fatalf("run: %d\n%s", code, stdout)
	}
}
