package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tetherdev/tether/admission/atomicfile"
	"github.com/tetherdev/tether/admission/cli"
	"github.com/tetherdev/tether/admission/signing"
	"github.com/tetherdev/tether/qmpinput"
	"github.com/tetherdev/tether/qmpinput/bundle"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailed  = 1
	exitUsage   = 2
	maxManifest = 1 << 20
)

const usage = `usage: tether-qmp <command> [flags]

commands:
  capture        --socket PATH --out FILE.png   screenshot of the pinned display; prints JSON
  run            --socket PATH --script FILE    run a script of actions; one JSON line each
  verify-bundle  --manifest FILE --pubkey FILE --root DIR
                                                check a signed VM bundle before a launch
  view           --socket PATH --vnc PATH --state DIR [--listen ADDR]
                                                serve the live view (watch, take over, pause)
  token          mint|revoke|list --state DIR   one-time links to the live view
  audit          verify --state DIR             check the live view's audit log

Run 'tether-qmp <command> --help' for a command's flags.
`

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return cli.UsageError(stderr, "tether-qmp", "no command given")
	}
	if cli.IsHelp(args[0]) || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	switch args[0] {
	case "capture":
		return cmdCapture(ctx, args[1:], stdout, stderr)
	case "run":
		return cmdRun(ctx, args[1:], stdin, stdout, stderr)
	case "verify-bundle":
		return cmdVerify(ctx, args[1:], stdout, stderr)
	case "view":
		return cmdView(ctx, args[1:], stdout, stderr)
	case "token":
		return cmdToken(args[1:], stdout, stderr)
	case "audit":
		return cmdAudit(args[1:], stdout, stderr)
	}
	return cli.UsageError(stderr, "tether-qmp", "unknown command %q", args[0])
}

// adapterFlags are the connection flags capture and run share.
type adapterFlags struct {
	socket, device, minQEMU, maxQEMU, captureDir string
	head, owner                                  int
	timeout                                      time.Duration
}

func (f *adapterFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.socket, "socket", "", "absolute path of QEMU's QMP unix socket (required; TCP is refused)")
	fs.StringVar(&f.device, "display", "video0", "QOM id of the pinned display device")
	fs.IntVar(&f.head, "head", 0, "head of the pinned display")
	fs.IntVar(&f.owner, "owner", -1, "uid that must own the socket and QEMU (default: the effective uid)")
	fs.StringVar(&f.minQEMU, "min-qemu", "7.1.0", "lowest accepted QEMU version")
	fs.StringVar(&f.maxQEMU, "max-qemu", "", "first refused QEMU version (default: no upper bound)")
	fs.StringVar(&f.captureDir, "capture-parent", "", "where the private capture directory is created (default: the temp dir)")
	fs.DurationVar(&f.timeout, "timeout", 30*time.Second, "deadline for connecting and for each capture or script action (a longer wait fails)")
}

func (f *adapterFlags) config() (qmpinput.Config, error) {
	cfg := qmpinput.Config{Socket: f.socket, Display: qmpinput.Display{Device: f.device, Head: f.head}, CaptureParent: f.captureDir}
	if f.socket == "" {
		return cfg, errors.New("--socket is required")
	}
	if f.owner > math.MaxUint32 || f.owner < -1 {
		return cfg, fmt.Errorf("--owner %d: a uid is 0..%d (-1 for the effective uid)", f.owner, uint32(math.MaxUint32))
	}
	if f.owner >= 0 {
		o := uint32(f.owner)
		cfg.Owner = &o
	}
	var err error
	if cfg.Versions.Min, err = parseVersion(f.minQEMU); err != nil {
		return cfg, err
	}
	if f.maxQEMU != "" {
		if cfg.Versions.Max, err = parseVersion(f.maxQEMU); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}

func parseVersion(s string) (qmpinput.Version, error) {
	parts := strings.Split(s, ".")
	var n [3]int
	if len(parts) < 1 || len(parts) > 3 {
		return qmpinput.Version{}, fmt.Errorf("version %q: want MAJOR.MINOR.MICRO", s)
	}
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 {
			return qmpinput.Version{}, fmt.Errorf("version %q: want MAJOR.MINOR.MICRO", s)
		}
		n[i] = v
	}
	return qmpinput.Version{Major: n[0], Minor: n[1], Micro: n[2]}, nil
}

// parse parses flags (admission/cli: --help prints the usage once on
// stdout; a usage error prints a hint on stderr); it returns an exit code
// when the caller must stop.
func parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (int, bool) {
	if code, done := cli.Parse(fs, args, stdout, stderr); done {
		return code, false
	}
	if fs.NArg() != 0 {
		return cli.UsageError(stderr, fs.Name(), "unexpected arguments %q", fs.Args()), false
	}
	return 0, true
}

// newFlagSet returns the flag set of "tether-qmp NAME".
func newFlagSet(name, synopsis string) *flag.FlagSet {
	return cli.NewFlagSet("tether-qmp "+name, "tether-qmp "+synopsis, "")
}

// emit prints a command's JSON result; a result that cannot be written is
// a failure, so the exit status never claims success nobody saw.
func emit(stdout, stderr io.Writer, v any) int {
	if err := json.NewEncoder(stdout).Encode(v); err != nil {
		fmt.Fprintf(stderr, "tether-qmp: writing the result: %v\n", err)
		return exitFailed
	}
	return exitOK
}

// fail prints a JSON error line naming the failed check and returns code.
func fail(w io.Writer, code int, err error) int {
	json.NewEncoder(w).Encode(map[string]any{"ok": false, "code": qmpinput.ErrorCode(err), "error": err.Error()})
	return code
}

func open(ctx context.Context, af *adapterFlags) (*qmpinput.Adapter, error) {
	cfg, err := af.config()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", qmpinput.ErrConfig, err)
	}
	octx, cancel := context.WithTimeout(ctx, af.timeout)
	defer cancel()
	return qmpinput.Open(octx, cfg)
}

func cmdCapture(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("capture", "capture --socket PATH --out FILE.png [flags]")
	var af adapterFlags
	af.register(fs)
	out := fs.String("out", "", "where to write the PNG (required; written atomically, mode 0600)")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if *out == "" {
		fmt.Fprintln(stderr, "capture: --out is required")
		return exitUsage
	}
	a, err := open(ctx, &af)
	if err != nil {
		return fail(stdout, exitFailed, err)
	}
	defer a.Close()
	cctx, cancel := context.WithTimeout(ctx, af.timeout)
	defer cancel()
	f, err := a.Capture(cctx)
	if err != nil {
		return fail(stdout, exitFailed, err)
	}
	if err := writeAtomic(*out, f.PNG); err != nil {
		return fail(stdout, exitFailed, err)
	}
	return emit(stdout, stderr, map[string]any{"width": f.Width, "height": f.Height, "sha256": f.SHA256, "time": f.Time})
}

// writeAtomic writes data to a temporary file beside path and renames it
// over path, so a reader never sees a partial PNG and a symlink at path is
// replaced, not followed.
func writeAtomic(path string, data []byte) error {
	return atomicfile.Write(path, data, 0o600, atomicfile.Options{Temp: ".tether-qmp-*"})
}

func cmdRun(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := newFlagSet("run", "run --socket PATH --script FILE [flags]\n\n"+
		"One action per line: capture | move X Y | click X Y | dclick X Y | scroll DY |\n"+
		"key COMBO | type TEXT | wait MS. Lines starting with # are comments.\n"+
		"Prints one JSON line per action; exits 1 if any action failed.")
	var af adapterFlags
	af.register(fs)
	script := fs.String("script", "", "the script file, or - for standard input (required)")
	via := fs.String("via", "", "run the script through a live view's agent socket (tether-qmp view --agent) instead of --socket")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	var r io.Reader = stdin
	if *script == "" {
		fmt.Fprintln(stderr, "run: --script is required")
		return exitUsage
	} else if *script != "-" {
		f, err := os.Open(*script)
		if err != nil {
			return fail(stdout, exitFailed, fmt.Errorf("%w: %w", qmpinput.ErrScript, err))
		}
		defer f.Close()
		r = f
	}
	if *via != "" {
		return runVia(ctx, *via, af.socket, r, stdout, stderr)
	}
	actions, err := qmpinput.ParseScript(r)
	if err != nil {
		return fail(stdout, exitFailed, err)
	}
	a, err := open(ctx, &af)
	if err != nil {
		return fail(stdout, exitFailed, err)
	}
	defer a.Close()
	bad, err := qmpinput.RunScript(ctx, a, actions, stdout, af.timeout)
	if err != nil {
		fmt.Fprintf(stderr, "run: %v\n", err)
		return exitFailed
	}
	if bad > 0 {
		return exitFailed
	}
	return exitOK
}

func cmdVerify(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("verify-bundle", "verify-bundle --manifest FILE --pubkey FILE --root DIR\n\n"+
		"Checks the DSSE signature by the pinned ed25519 key, the guest and accelerator pins\n"+
		"(tcg only), and the SHA-256 of QEMU, the firmware and the disk under DIR.")
	manifest := fs.String("manifest", "", "the signed bundle manifest (DSSE envelope JSON)")
	pubkey := fs.String("pubkey", "", "the pinned ed25519 public key (PEM)")
	root := fs.String("root", "", "the bundle root the manifest's paths are relative to")
	if code, ok := parse(fs, args, stdout, stderr); !ok {
		return code
	}
	if *manifest == "" || *pubkey == "" || *root == "" {
		fmt.Fprintln(stderr, "verify-bundle: --manifest, --pubkey and --root are required")
		return exitUsage
	}
	pub, err := signing.LoadPublicKey(*pubkey)
	if err != nil {
		return failBundle(stdout, err)
	}
	env, err := readBounded(*manifest)
	if err != nil {
		return failBundle(stdout, err)
	}
	m, err := bundle.Verify(ctx, env, pub, *root)
	if err != nil {
		return failBundle(stdout, err)
	}
	return emit(stdout, stderr, map[string]any{"ok": true, "keyid": pub.KeyID(), "accelerator": m.Accelerator,
		"guest": m.Guest, "qemu": m.QEMU, "firmware": m.Firmware, "disk": m.Disk, "machine_args": m.MachineArgs})
}

func readBounded(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxManifest+1))
	if err == nil && len(b) > maxManifest {
		err = fmt.Errorf("%w: manifest larger than %d bytes", bundle.ErrManifest, maxManifest)
	}
	return b, err
}

// bundleCodes names bundle failures for the JSON output.
var bundleCodes = []struct {
	err  error
	code string
}{
	{signing.ErrSignature, "signature"}, {signing.ErrPayloadType, "payload_type"}, {signing.ErrEnvelope, "envelope"},
	{signing.ErrNoSignature, "signature"}, {signing.ErrKeyFile, "key_file"}, {signing.ErrKeyPermissions, "key_permissions"},
	{signing.ErrKeyEncoding, "key_encoding"}, {bundle.ErrManifest, "manifest"}, {bundle.ErrGuest, "guest"},
	{bundle.ErrAccelerator, "accelerator"}, {bundle.ErrDisplay, "display"}, {bundle.ErrArtifact, "artifact"}, {bundle.ErrHashMismatch, "hash_mismatch"},
}

func failBundle(w io.Writer, err error) int {
	code := "error"
	for _, c := range bundleCodes {
		if errors.Is(err, c.err) {
			code = c.code
			break
		}
	}
	json.NewEncoder(w).Encode(map[string]any{"ok": false, "code": code, "error": err.Error()})
	return exitFailed
}
