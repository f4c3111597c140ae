package bundle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/tetherdev/tether/admission/signing"
)

func fixture(t *testing.T) (Manifest, string, signing.PrivateKey) {
	t.Helper()
	root := t.TempDir()
	m := Manifest{Schema: Schema, Guest: Guest{GuestArch, GuestOS, GuestDesktop}, Accelerator: AccelTCG,
		MachineArgs: []string{"-no-user-config", "-machine", "q35", "-accel", "tcg", "-m", "4096", "-device", "virtio-vga,id=video0"}}
	for name, a := range map[string]*Artifact{"bin/qemu-system-x86_64": &m.QEMU, "share/OVMF.fd": &m.Firmware, "disk/debian-hyprland.qcow2": &m.Disk} {
		p := filepath.Join(root, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		data := []byte("contents of " + name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		*a = Artifact{Path: name, SHA256: hex.EncodeToString(sum[:])}
	}
	key, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return m, root, key
}

func TestVerifyAcceptsAGoodBundle(t *testing.T) {
	m, root, key := fixture(t)
	env, err := Sign(context.Background(), m, key)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Verify(context.Background(), env, key.Public(), root)
	if err != nil || got.Disk != m.Disk {
		t.Fatalf("Verify = %+v, %v", got, err)
	}
}

func TestVerifyRefuses(t *testing.T) {
	ctx := context.Background()
	m, root, key := fixture(t)
	other, _ := signing.GenerateKey()
	// signRaw signs a payload without Sign's validation, as an attacker or
	// a buggy producer could.
	signRaw := func(v any) []byte {
		b, _ := json.Marshal(v)
		env, err := signing.Sign(ctx, PayloadType, b, key)
		if err != nil {
			t.Fatal(err)
		}
		return env
	}
	with := func(f func(*Manifest)) []byte {
		c := m
		c.MachineArgs = append([]string(nil), m.MachineArgs...)
		f(&c)
		return signRaw(c)
	}
	good, _ := Sign(ctx, m, key)
	var tampered map[string]any
	json.Unmarshal(good, &tampered)
	tampered["payloadType"] = "application/json"
	tamperedType, _ := json.Marshal(tampered)

	cases := map[string]struct {
		env  []byte
		pub  signing.PublicKey
		want error
	}{
		"wrong key":         {good, other.Public(), signing.ErrSignature},
		"wrong payloadType": {tamperedType, key.Public(), signing.ErrPayloadType},
		"kvm accelerator":   {with(func(c *Manifest) { c.Accelerator = "kvm" }), key.Public(), ErrAccelerator},
		"hvf accelerator":   {with(func(c *Manifest) { c.Accelerator = "hvf" }), key.Public(), ErrAccelerator},
		"-accel kvm":        {with(func(c *Manifest) { c.MachineArgs[4] = "kvm" }), key.Public(), ErrAccelerator},
		"-accel whpx":       {with(func(c *Manifest) { c.MachineArgs[4] = "whpx" }), key.Public(), ErrAccelerator},
		"accel=hvf":         {with(func(c *Manifest) { c.MachineArgs[2] = "virt,accel=hvf" }), key.Public(), ErrAccelerator},
		"-enable-kvm":       {with(func(c *Manifest) { c.MachineArgs = append(c.MachineArgs, "-enable-kvm") }), key.Public(), ErrAccelerator},
		"arm64 guest":       {with(func(c *Manifest) { c.Guest.Arch = "aarch64" }), key.Public(), ErrGuest},
		"other desktop":     {with(func(c *Manifest) { c.Guest.Desktop = "gnome" }), key.Public(), ErrGuest},
		"escaping path":     {with(func(c *Manifest) { c.Disk.Path = "../etc/passwd" }), key.Public(), ErrArtifact},
		"absolute path":     {with(func(c *Manifest) { c.QEMU.Path = "/usr/bin/qemu-system-x86_64" }), key.Public(), ErrArtifact},
		"bad digest":        {with(func(c *Manifest) { c.Firmware.SHA256 = "ABC" }), key.Public(), ErrManifest},
		"hash mismatch":     {with(func(c *Manifest) { c.Disk.SHA256 = c.QEMU.SHA256 }), key.Public(), ErrHashMismatch},
		"unknown field":     {signRaw(map[string]any{"schema": Schema, "extra": 1}), key.Public(), ErrManifest},
		"no machine args":   {with(func(c *Manifest) { c.MachineArgs = nil }), key.Public(), ErrManifest},
	}
	// Every other way QEMU has of picking its accelerator: each list is the
	// whole of machine_args.
	for name, args := range map[string][]string{
		"--accel xen":              {"-no-user-config", "-machine", "q35", "--accel", "xen"},
		"--accel=kvm":              {"-no-user-config", "-machine", "q35", "--accel=kvm"},
		"-accel hax":               {"-no-user-config", "-machine", "q35", "-accel", "hax"},
		"-accel qtest":             {"-no-user-config", "-machine", "q35", "-accel", "qtest"},
		"-accel tcg --accel qtest": {"-no-user-config", "-machine", "q35", "-accel", "tcg", "--accel", "qtest"},
		"-accel tcg twice":         {"-no-user-config", "-machine", "q35", "-accel", "tcg", "-accel", "tcg"},
		"-accel tcg,accel=kvm":     {"-no-user-config", "-machine", "q35", "-accel", "tcg,accel=kvm"},
		"-accel tcg,,kvm":          {"-no-user-config", "-machine", "q35", "-accel", "tcg,,k"},
		"-accel tcg,unknown=1":     {"-no-user-config", "-machine", "q35", "-accel", "tcg,unknown=1"},
		"-accel with no value":     {"-no-user-config", "-machine", "q35", "-accel"},
		"-machine xenfv":           {"-no-user-config", "-machine", "xenfv", "-accel", "tcg"},
		"-M type=xenpv":            {"-no-user-config", "-M", "type=xenpv", "-accel", "tcg"},
		"-machine accel=tcg":       {"-no-user-config", "-machine", "q35,accel=tcg"},
		"--machine accel=tcg":      {"-no-user-config", "--machine", "q35,accel=tcg", "-accel", "tcg"},
		"--enable-kvm":             {"-no-user-config", "-machine", "q35", "-accel", "tcg", "--enable-kvm"},
		"-readconfig":              {"-no-user-config", "-machine", "q35", "-accel", "tcg", "-readconfig", "vm.cfg"},
		"-set":                     {"-no-user-config", "-machine", "q35", "-accel", "tcg", "-set", "machine.type=pc"},
		"-accel eaten as value":    {"-no-user-config", "-machine", "q35", "-name", "-accel", "tcg"},
		"no accelerator":           {"-no-user-config", "-machine", "q35", "-m", "4096"},
		"no -no-user-config":       {"-machine", "q35", "-accel", "tcg"},
		"-no-user-config=x":        {"-no-user-config=x", "-machine", "q35", "-accel", "tcg"},
	} {
		cases[name] = struct {
			env  []byte
			pub  signing.PublicKey
			want error
		}{with(func(c *Manifest) { c.MachineArgs = args }), key.Public(), ErrAccelerator}
	}
	// No accelerator argument and a binary named qemu-kvm: QEMU would then
	// prefer kvm.
	cases["qemu-kvm with no -accel"] = struct {
		env  []byte
		pub  signing.PublicKey
		want error
	}{with(func(c *Manifest) {
		c.QEMU.Path = "bin/qemu-kvm"
		c.MachineArgs = []string{"-no-user-config", "-machine", "q35"}
	}), key.Public(), ErrAccelerator}
	for name, c := range cases {
		if _, err := Verify(ctx, c.env, c.pub, root); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	var he *HashError
	if _, err := Verify(ctx, cases["hash mismatch"].env, key.Public(), root); !errors.As(err, &he) || he.Artifact != "disk" {
		t.Errorf("hash mismatch does not name the disk: %v", err)
	}
}

func TestVerifyRefusesSwappedOrEscapingFiles(t *testing.T) {
	ctx := context.Background()
	m, root, key := fixture(t)
	env, _ := Sign(ctx, m, key)
	disk := filepath.Join(root, m.Disk.Path)
	// A changed disk image.
	os.WriteFile(disk, []byte("evil"), 0o644)
	if _, err := Verify(ctx, env, key.Public(), root); !errors.Is(err, ErrHashMismatch) {
		t.Fatalf("changed disk: %v", err)
	}
	// A symlink to an identical file outside the root.
	outside := filepath.Join(t.TempDir(), "disk")
	os.WriteFile(outside, []byte("contents of "+m.Disk.Path), 0o644)
	os.Remove(disk)
	os.Symlink(outside, disk)
	if _, err := Verify(ctx, env, key.Public(), root); !errors.Is(err, ErrArtifact) {
		t.Fatalf("symlink out of the root: %v", err)
	}
	// A missing firmware.
	os.Remove(filepath.Join(root, m.Firmware.Path))
	if _, err := Verify(ctx, env, key.Public(), root); !errors.Is(err, ErrArtifact) {
		t.Fatalf("missing firmware: %v", err)
	}
}

func TestAccelArgsAccepted(t *testing.T) {
	for _, args := range [][]string{
		{"-accel", "tcg", "-no-user-config"},
		{"-machine", "q35", "-accel", "tcg,thread=multi,tb-size=256", "--no-user-config"},
		{"-no-user-config", "-nographic", "-accel", "accel=tcg", "-m", "1024"},
		{"-M", "pc", "--accel", "tcg", "-no-user-config"},
	} {
		if err := checkAccelArgs(args); err != nil {
			t.Errorf("%q: %v", args, err)
		}
	}
}

func TestSignRefusesInvalid(t *testing.T) {
	m, _, key := fixture(t)
	m.Accelerator = "kvm"
	if _, err := Sign(context.Background(), m, key); !errors.Is(err, ErrAccelerator) {
		t.Fatalf("Sign with kvm: %v", err)
	}
}

// FuzzDecode: the manifest decoder never panics and accepts only
// manifests that pin tcg, the guest and in-root artifact paths.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"schema":"tether.qmp-bundle/v1","guest":{"arch":"x86_64","os":"debian","desktop":"hyprland"},"accelerator":"tcg","qemu":{"path":"q","sha256":"` + hex.EncodeToString(make([]byte, 32)) + `"},"firmware":{"path":"f","sha256":"` + hex.EncodeToString(make([]byte, 32)) + `"},"disk":{"path":"d","sha256":"` + hex.EncodeToString(make([]byte, 32)) + `"},"machine_args":["-accel","tcg"]}`))
	f.Add([]byte(`{"schema":"x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			return
		}
		if m.Accelerator != AccelTCG || m.Guest != (Guest{GuestArch, GuestOS, GuestDesktop}) {
			t.Fatalf("accepted %+v", m)
		}
		for _, a := range m.artifacts() {
			if filepath.IsAbs(a.art.Path) || !filepath.IsLocal(a.art.Path) {
				t.Fatalf("accepted path %q", a.art.Path)
			}
		}
	})
}

// TestVNCArgs: the only display a bundle may serve is one VNC server on
// an absolute unix socket, shared by force; anything else is refused.
func TestVNCArgs(t *testing.T) {
	m, _, _ := fixture(t)
	base := append([]string{}, m.MachineArgs...)
	for _, ok := range [][]string{
		{"-vnc", "unix:/run/tether/vm1/vnc.sock,share=force-shared"},
		{"-vnc=unix:/run/vnc.sock,share=force-shared,lossy=off,non-adaptive=on"},
	} {
		m.MachineArgs = append(append([]string{}, base...), ok...)
		if err := m.Validate(); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range [][]string{
		{"-vnc", "127.0.0.1:0,share=force-shared"},
		{"-vnc", ":0"},
		{"-vnc", "unix:run/vnc.sock,share=force-shared"},
		{"-vnc", "unix:/run/../tmp/vnc.sock,share=force-shared"},
		{"-vnc", "unix:/run/vnc.sock"},
		{"-vnc", "unix:/run/vnc.sock,share=allow-exclusive"},
		{"-vnc", "unix:/run/vnc.sock,share=force-shared,websocket=5700"},
		{"-vnc", "unix:/run/vnc.sock,share=force-shared,password=on"},
		{"-vnc", "unix:/run/vnc.sock,share=force-shared,power-control=on"},
		{"-vnc", "unix:/run/vnc.sock,share=force-shared,,websocket=on"},
		{"-vnc", "unix:/a.sock,share=force-shared", "-vnc", "unix:/b.sock,share=force-shared"},
		{"--display", "vnc=:0"},
		{"-spice", "port=5930"},
	} {
		m.MachineArgs = append(append([]string{}, base...), bad...)
		if err := m.Validate(); !errors.Is(err, ErrDisplay) {
			t.Errorf("%q: %v, want ErrDisplay", bad, err)
		}
	}
}
