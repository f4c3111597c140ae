package archive

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
)

const testBase = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

func testDisk() []byte {
	d := make([]byte, 64<<10)
	copy(d[4096:], "a file system's bytes")
	return d
}

func exportDisk(t testing.TB, disk []byte) ([]byte, Receipt) {
	t.Helper()
	var buf bytes.Buffer
	rc, err := ExportDisk(context.Background(), &buf, testBase, bytes.NewReader(disk), int64(len(disk)))
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), rc
}

// manifestEntry is a manifest entry for disk with fields changed by edit.
func manifestEntry(disk []byte, edit func(string) string) entry {
	h := sha256.Sum256(disk)
	m := fmt.Sprintf(`{"format":%q,"base_image":%q,"disk_bytes":%d,"disk_sha256":%q}`, DiskFormat, testBase, len(disk), hex.EncodeToString(h[:]))
	if edit != nil {
		m = edit(m)
	}
	return file(DiskManifestName, 0o644, m)
}

// TestDiskRoundTrip: ReadDisk gives back the exported disk's bytes, the
// manifest and the receipt's digest; the stream's digest is checked.
func TestDiskRoundTrip(t *testing.T) {
	disk := testDisk()
	data, rc := exportDisk(t, disk)
	if rc.SHA256 != digest(data) || rc.Bytes != int64(len(data)) || rc.Files != 1 {
		t.Fatalf("receipt %+v for %d bytes", rc, len(data))
	}
	var out bytes.Buffer
	man, got, err := ReadDisk(context.Background(), bytes.NewReader(data), DiskOptions{SHA256: rc.SHA256, MaxDiskBytes: 1 << 20}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), disk) || man.BaseImage != testBase || man.DiskBytes != int64(len(disk)) || got.SHA256 != rc.SHA256 {
		t.Fatalf("read back %d bytes, manifest %+v, receipt %+v", out.Len(), man, got)
	}
	var checked DiskManifest
	_, _, err = ReadDisk(context.Background(), bytes.NewReader(data), DiskOptions{MaxDiskBytes: 1 << 20,
		Check: func(m DiskManifest) error { checked = m; return errors.New("another base image") }}, io.Discard)
	if err == nil || checked.BaseImage != testBase {
		t.Fatalf("Check's refusal: %v (checked %+v)", err, checked)
	}
}

// TestReadDiskRefuses: every stream that is not exactly a manifest and a
// disk of its size and digest is refused with the check named; the
// untouched export is the positive control.
func TestReadDiskRefuses(t *testing.T) {
	disk := testDisk()
	good, rc := exportDisk(t, disk)
	raw := file(DiskName, 0o600, string(disk))
	flipped := bytes.Clone(disk)
	flipped[4096] ^= 1
	tampered := bytes.Clone(good)
	tampered[len(tampered)/2] ^= 0x40
	cases := []struct {
		name string
		data []byte
		want error
		max  int64
	}{
		{"the untouched export (control)", good, nil, 1 << 20},
		{"a tampered stream", tampered, nil, 1 << 20},
		{"a disk over the cap", good, ErrTooLarge, 32 << 10},
		{"the disk first", tarZst(t, []entry{raw, manifestEntry(disk, nil)}), ErrUnsafeEntry, 1 << 20},
		{"no disk", tarZst(t, []entry{manifestEntry(disk, nil)}), ErrUnsafeEntry, 1 << 20},
		{"an entry after the disk", tarZst(t, []entry{manifestEntry(disk, nil), raw, file("x", 0o644, "x")}), ErrUnsafeEntry, 1 << 20},
		{"a disk bytes the manifest does not hash", tarZst(t, []entry{manifestEntry(disk, nil), file(DiskName, 0o600, string(flipped))}), ErrDigestMismatch, 1 << 20},
		{"a disk longer than the manifest says", tarZst(t, []entry{manifestEntry(disk[:4096], nil), raw}), ErrTooLarge, 1 << 20},
		{"a manifest with an unknown field", tarZst(t, []entry{manifestEntry(disk, func(m string) string { return strings.Replace(m, "{", `{"x":1,`, 1) }), raw}), ErrUnsafeEntry, 1 << 20},
		{"another format", tarZst(t, []entry{manifestEntry(disk, func(m string) string { return strings.Replace(m, DiskFormat, "tether-vm-disk/9", 1) }), raw}), ErrUnsafeEntry, 1 << 20},
		{"a base image that is no digest", tarZst(t, []entry{manifestEntry(disk, func(m string) string { return strings.Replace(m, testBase, "../image", 1) }), raw}), ErrUnsafeEntry, 1 << 20},
		{"a symlink for the disk", tarZst(t, []entry{manifestEntry(disk, nil), symlink(DiskName, "/dev/sda")}), ErrUnsafeEntry, 1 << 20},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			want := digest(c.data)
			if c.name == "a tampered stream" {
				want = rc.SHA256 // the digest the export's receipt names
			}
			_, _, err := ReadDisk(context.Background(), bytes.NewReader(c.data), DiskOptions{SHA256: want, MaxDiskBytes: c.max}, &out)
			switch {
			case c.name == "the untouched export (control)":
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
			case err == nil:
				t.Fatal("accepted")
			case c.want != nil && !errors.Is(err, c.want):
				t.Fatalf("refused with %v, want %v", err, c.want)
			}
		})
	}
}

// FuzzReadDisk: whatever the stream, ReadDisk accepts only a manifest
// that validates and then exactly its disk's bytes.
func FuzzReadDisk(f *testing.F) {
	disk := testDisk()[:8192]
	good, _ := exportDisk(f, disk)
	f.Add(good)
	f.Add(tarZst(f, []entry{manifestEntry(disk, nil), file(DiskName, 0o600, string(disk))}))
	f.Fuzz(func(t *testing.T, data []byte) {
		var out bytes.Buffer
		man, _, err := ReadDisk(context.Background(), bytes.NewReader(data), DiskOptions{MaxDiskBytes: 1 << 20, MaxStreamBytes: 4 << 20}, &out)
		if err != nil {
			return
		}
		h := sha256.Sum256(out.Bytes())
		if man.validate(1<<20) != nil || int64(out.Len()) != man.DiskBytes || hex.EncodeToString(h[:]) != man.DiskSHA256 {
			t.Fatalf("accepted manifest %+v with %d disk bytes", man, out.Len())
		}
	})
}
