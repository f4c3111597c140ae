package caps

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

const sampleStatus = `Name:	sleep
Umask:	0022
State:	S (sleeping)
Tgid:	4242
Ngid:	0
Pid:	4242
PPid:	4200
TracerPid:	0
Uid:	60001	60001	60001	60001
Gid:	60002	60002	60002	60002
FDSize:	64
Groups:	60003 60004 
NStgid:	4242
CapInh:	0000000000000000
CapPrm:	0000000000000000
CapEff:	0000000000000000
CapBnd:	00000000000001eb
CapAmb:	0000000000000000
NoNewPrivs:	1
Seccomp:	0
`

func TestParseStatus(t *testing.T) {
	st, err := ParseStatus([]byte(sampleStatus))
	if err != nil {
		t.Fatal(err)
	}
	want := Status{Name: "sleep", State: "S", Tgid: 4242, Pid: 4242, PPid: 4200,
		UID: [4]uint32{60001, 60001, 60001, 60001}, GID: [4]uint32{60002, 60002, 60002, 60002},
		Groups: []uint32{60003, 60004}, CapBnd: 0x1eb, NoNewPrivs: 1}
	if !reflect.DeepEqual(st, want) {
		t.Fatalf("ParseStatus = %+v\nwant %+v", st, want)
	}
}

func TestParseStatusEmptyGroups(t *testing.T) {
	st, err := ParseStatus([]byte(strings.Replace(sampleStatus, "Groups:\t60003 60004 ", "Groups:\t", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if st.Groups == nil || len(st.Groups) != 0 {
		t.Fatalf("Groups = %#v, want empty non-nil", st.Groups)
	}
}

func TestParseStatusRefuses(t *testing.T) {
	cases := map[string]string{
		"missing CapAmb":   strings.Replace(sampleStatus, "CapAmb:\t0000000000000000\n", "", 1),
		"duplicate CapEff": sampleStatus + "CapEff:\t00000000000001eb\n",
		"short mask":       strings.Replace(sampleStatus, "CapBnd:\t00000000000001eb", "CapBnd:\t1eb", 1),
		"bad hex":          strings.Replace(sampleStatus, "CapBnd:\t00000000000001eb", "CapBnd:\t00000000000001eg", 1),
		"three uids":       strings.Replace(sampleStatus, "Uid:\t60001\t60001\t60001\t60001", "Uid:\t1 2 3", 1),
		"negative pid":     strings.Replace(sampleStatus, "PPid:\t4200", "PPid:\t-1", 1),
		"bad group":        strings.Replace(sampleStatus, "Groups:\t60003 60004 ", "Groups:\t60003 x", 1),
		"empty state":      strings.Replace(sampleStatus, "State:\tS (sleeping)", "State:\t", 1),
		"empty":            "",
		"oversize":         sampleStatus + strings.Repeat("x", maxStatusBytes),
	}
	for name, in := range cases {
		if _, err := ParseStatus([]byte(in)); !errors.Is(err, ErrStatus) {
			t.Errorf("%s: err = %v, want ErrStatus", name, err)
		}
	}
}

func TestReadStatusSelf(t *testing.T) {
	st, err := ReadStatus("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	if st.Tgid != os.Getpid() || st.UID[1] != uint32(os.Geteuid()) {
		t.Fatalf("own status = %+v, pid %d euid %d", st, os.Getpid(), os.Geteuid())
	}
	ths, err := ThreadStatuses(0)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ths[os.Getpid()]; !ok || len(ths) < 2 {
		t.Fatalf("thread statuses %d entries, main thread present %v", len(ths), ok)
	}
}

func FuzzParseStatus(f *testing.F) {
	f.Add([]byte(sampleStatus))
	f.Fuzz(func(t *testing.T, data []byte) {
		st, err := ParseStatus(data)
		if err != nil {
			if !errors.Is(err, ErrStatus) {
				t.Fatalf("error %v does not wrap ErrStatus", err)
			}
			return
		}
		if st.Groups == nil || st.State == "" {
			t.Fatalf("accepted status lacks required fields: %+v", st)
		}
	})
}
