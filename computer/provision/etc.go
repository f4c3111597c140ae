package provision

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/sys/unix"
)

// A namespaced computer's /etc is its own (SECURITY.md, "Computer
// isolation"): a small tmpfs, read-only once built, holding the files
// written for the computer (etcFiles: passwd, group, hosts, hostname,
// resolv.conf, nsswitch.conf) and, bound read-only, the host /etc entries
// tools need to run (etcHostEntries: the alternatives links such as cc,
// the loader's cache, CA certificates, time zone, ...). Nothing else of
// the host's /etc is there: its secrets (shadow, gshadow, ssh host keys,
// sudoers, TLS private keys), its identity (machine-id, hostname) and the
// configs of its services are absent by construction, not by a deny list.

// etcHostEntries are the host /etc entries bound read-only into a
// namespaced computer's /etc (a symlink is recreated, not followed);
// missing ones are skipped. A path with a slash binds only that part of
// a directory: /etc/ssl/private (the host's TLS keys) stays out.
var etcHostEntries = []string{
	"alternatives",                              // Debian's cc, c++, editor, ... links
	"ld.so.cache", "ld.so.conf", "ld.so.conf.d", // the dynamic loader
	"ssl/certs", "ssl/openssl.cnf", // CA certificates, OpenSSL's config
	"ca-certificates", "ca-certificates.conf", // what ssl/certs is built from
	"localtime", "timezone", // time zone
	"os-release", "debian_version", // what system this is (not which host)
	"protocols", "services", "rpc", "host.conf", "gai.conf", // name lookups in files
	"mime.types", "magic", "magic.mime", "terminfo", "shells", "inputrc", "bash.bashrc", "mtab",
}

// etcBytes and etcInodes size the /etc tmpfs: the generated files and
// the mount points of the host entries.
const (
	etcBytes  = 1 << 20
	etcInodes = 1024
)

// stageEtcFile is one file written into the computer's /etc.
type stageEtcFile struct {
	Name string `json:"name"`
	Data string `json:"data"`
}

// stageEtc is the computer's own /etc: Files written, Host entries bound.
type stageEtc struct {
	Files []stageEtcFile `json:"files"`
	Host  []string       `json:"host"`
}

// hostnameRe is a host name fit for /etc/hosts (the tuple's sandbox,
// which may hold any character but NUL and newline, is the UTS name).
var hostnameRe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9.-]{0,62})$`)

// etcFiles are the files written for a computer whose grant runs as
// uid:gid and whose host name is hostname.
func etcFiles(uid, gid uint32, hostname string) []stageEtcFile {
	hosts := "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
	if hostnameRe.MatchString(hostname) {
		hosts += "127.0.1.1\t" + hostname + "\n"
	}
	return []stageEtcFile{
		{"passwd", fmt.Sprintf("root:x:0:0:root:/root:/usr/sbin/nologin\n%s:x:%d:%d:%s:%s:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
			User, uid, gid, User, Home)},
		{"group", fmt.Sprintf("root:x:0:\n%s:x:%d:\nnogroup:x:65534:\n", User, gid)},
		{"hosts", hosts},
		{"hostname", hostname + "\n"},
		{"resolv.conf", "# The computer's network namespace has only loopback: no name server.\noptions timeout:1 attempts:1\n"},
		{"nsswitch.conf", "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n"},
	}
}

// etcSpec is the /etc of this computer's stage.
func (s State) etcSpec() *stageEtc {
	return &stageEtc{Files: etcFiles(s.UID, s.GID, s.Tuple.Sandbox), Host: etcHostEntries}
}

// stageEtcMount builds the computer's /etc: a tmpfs, the files written,
// the host entries bound read-only, then the tmpfs made read-only.
func stageEtcMount(s stageSpec) error {
	if s.Etc == nil {
		return nil
	}
	etc := s.under("/etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return err
	}
	opts := fmt.Sprintf("size=%d,nr_inodes=%d,mode=0755", etcBytes, etcInodes)
	if err := unix.Mount("tether-etc", etc, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts); err != nil {
		return err
	}
	for _, f := range s.Etc.Files {
		if strings.Contains(f.Name, "/") || f.Name == ".." {
			return fmt.Errorf("file name %q is not a plain name", f.Name)
		}
		if err := os.WriteFile(filepath.Join(etc, f.Name), []byte(f.Data), 0o644); err != nil {
			return err
		}
	}
	for _, e := range s.Etc.Host {
		if err := stageEtcEntry(s, filepath.Join("/etc", e)); err != nil {
			return fmt.Errorf("%s: %w", e, err)
		}
	}
	return unix.Mount("", etc, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, opts)
}

// stageEtcEntry binds the host's p read-only at the same path, or
// recreates it when it is a symlink; a missing p is skipped.
func stageEtcEntry(s stageSpec, p string) error {
	if filepath.Clean(p) != p || !strings.HasPrefix(p, "/etc/") {
		return fmt.Errorf("%q is not a clean path beneath /etc", p)
	}
	fi, err := os.Lstat(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return err
	case fi.Mode()&os.ModeSymlink != 0:
		return stageSymlink(s, p)
	}
	return bindAt(p, s.under(p), unix.MS_RDONLY|unix.MS_NODEV)
}
