package admission

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tetherdev/tether/admission/strictjson"
)

// issueInput is the publish input of docs/admission.md, verbatim.
const issueInput = `{"generation": 7, "not_after": "2026-12-01T00:00:00Z",
 "grants": [{"tuple": {"owner":"alice","allocation":"a1","session":"s1","workspace":"w1","sandbox":"sb1","generation":1,"executor":"e1","site":"local","root":"/srv/tether/w1"},
             "uid": 60001, "gid": 60001, "groups": [],
             "ops": ["read","write","list","exec","kill"],
             "limits": {"max_procs": 64, "max_runtime_s": 600, "max_output_bytes": 1048576, "max_file_bytes": 67108864},
             "not_after": "2026-12-01T00:00:00Z"}]}`

func TestDecodePublishInputIssueExample(t *testing.T) {
	in, err := DecodePublishInput([]byte(issueInput))
	if err != nil {
		t.Fatal(err)
	}
	want := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	if in.Generation == nil || *in.Generation != 7 || !in.NotAfter.Equal(want) || len(in.Grants) != 1 {
		t.Fatalf("decoded %+v", in)
	}
	g := in.Grants[0]
	if !g.Tuple.Equal(exampleTuple()) || g.UID != 60001 || g.GID != 60001 || len(g.Ops) != 5 ||
		g.Limits != (Limits{MaxProcs: 64, MaxRuntimeS: 600, MaxOutputBytes: 1048576, MaxFileBytes: 67108864}) || !g.NotAfter.Equal(want) {
		t.Fatalf("grant %+v", g)
	}
	withResources := strings.Replace(issueInput, `"max_procs": 64`, `"max_procs": 64, "max_pids": 256, `+
		`"max_memory_bytes": 1073741824, "max_disk_bytes": 2147483648, "max_open_files": 4096, "max_file_size_bytes": 1048576`, 1)
	in, err = DecodePublishInput([]byte(withResources))
	if err != nil || in.Grants[0].Limits != (Limits{MaxProcs: 64, MaxRuntimeS: 600, MaxOutputBytes: 1048576, MaxFileBytes: 67108864,
		MaxPids: 256, MaxMemoryBytes: 1 << 30, MaxDiskBytes: 2 << 30, MaxOpenFiles: 4096, MaxFileSizeBytes: 1 << 20}) {
		t.Fatalf("resource limits: %+v, %v", in.Grants[0].Limits, err)
	}
	omitted := strings.Replace(issueInput, `"generation": 7, `, "", 1)
	in, err = DecodePublishInput([]byte(omitted))
	if err != nil || in.Generation != nil {
		t.Fatalf("generation omitted: %+v, %v", in.Generation, err)
	}
}

// mutations of issueInput that must be refused, with the check they hit.
var refusedInputs = map[string][2]string{
	"uid 0":                   {`"uid": 60001`, `"uid": 0`},
	"gid 0":                   {`"gid": 60001`, `"gid": 0`},
	"group 0":                 {`"groups": []`, `"groups": [5, 0]`},
	"negative uid":            {`"uid": 60001`, `"uid": -1`},
	"uid too large":           {`"uid": 60001`, `"uid": 4294967296`},
	"unknown op":              {`"kill"]`, `"kill","sudo"]`},
	"duplicate op":            {`"kill"]`, `"kill","read"]`},
	"empty ops":               {`["read","write","list","exec","kill"]`, `[]`},
	"null ops":                {`["read","write","list","exec","kill"]`, `null`},
	"max_procs 0":             {`"max_procs": 64`, `"max_procs": 0`},
	"max_runtime_s negative":  {`"max_runtime_s": 600`, `"max_runtime_s": -1`},
	"max_output_bytes 0":      {`"max_output_bytes": 1048576`, `"max_output_bytes": 0`},
	"max_file_bytes 0":        {`"max_file_bytes": 67108864`, `"max_file_bytes": 0`},
	"max_pids negative":       {`"max_procs": 64`, `"max_procs": 64, "max_pids": -1`},
	"max_memory negative":     {`"max_procs": 64`, `"max_procs": 64, "max_memory_bytes": -1`},
	"max_disk negative":       {`"max_procs": 64`, `"max_procs": 64, "max_disk_bytes": -2`},
	"max_open_files negative": {`"max_procs": 64`, `"max_procs": 64, "max_open_files": -1`},
	"max_file_size negative":  {`"max_procs": 64`, `"max_procs": 64, "max_file_size_bytes": -1`},
	"limits missing":          {`"limits": {"max_procs": 64, "max_runtime_s": 600, "max_output_bytes": 1048576, "max_file_bytes": 67108864},`, ``},
	"grant after snapshot":    {`"not_after": "2026-12-01T00:00:00Z"}]`, `"not_after": "2026-12-01T00:00:01Z"}]`},
	"grant not_after missing": {`,
             "not_after": "2026-12-01T00:00:00Z"}]`, `}]`},
	"snapshot not_after zero": {`"not_after": "2026-12-01T00:00:00Z",
 "grants"`, `"not_after": "0001-01-01T00:00:00Z",
 "grants"`},
	"generation 0":          {`"generation": 7`, `"generation": 0`},
	"generation string":     {`"generation": 7`, `"generation": "7"`},
	"generation float":      {`"generation": 7`, `"generation": 7.5`},
	"unknown top field":     {`"generation": 7`, `"generation": 7, "inline": true`},
	"unknown grant field":   {`"uid": 60001`, `"uid": 60001, "caps": ["CAP_SYS_ADMIN"]`},
	"unknown tuple field":   {`"site":"local"`, `"site":"local","host":"x"`},
	"unknown limits field":  {`"max_procs": 64`, `"max_procs": 64, "max_mem": 1`},
	"duplicate key":         {`"uid": 60001`, `"uid": 60001, "uid": 0`},
	"duplicate key benign":  {`"uid": 60001`, `"uid": 60001, "uid": 60001`},
	"case-folded key":       {`"uid": 60001`, `"UID": 60001`},
	"case-folded dup":       {`"uid": 60001`, `"uid": 60001, "Uid": 0`},
	"tuple invalid":         {`"root":"/srv/tether/w1"`, `"root":"/srv/../etc"`},
	"tuple NUL":             {`"owner":"alice"`, `"owner":"al\u0000ice"`},
	"tuple generation 0":    {`"generation":1,`, `"generation":0,`},
	"trailing object":       {`"not_after": "2026-12-01T00:00:00Z"}]}`, `"not_after": "2026-12-01T00:00:00Z"}]}{}`},
	"trailing bracket":      {`"not_after": "2026-12-01T00:00:00Z"}]}`, `"not_after": "2026-12-01T00:00:00Z"}]}]`},
	"time not RFC3339":      {`"not_after": "2026-12-01T00:00:00Z",`, `"not_after": "1 Dec 2026",`},
	"top level array":       {`{"generation": 7,`, `[{"generation": 7,`},
	"grants not array":      {`"grants": [`, `"grants": {"a": `},
	"duplicate tuple grant": {`}]}`, `}, ` + issueGrant + `]}`},
}

const issueGrant = `{"tuple": {"owner":"alice","allocation":"a1","session":"s1","workspace":"w1","sandbox":"sb1","generation":1,"executor":"e1","site":"local","root":"/srv/tether/w1"},
             "uid": 60002, "gid": 60002, "groups": [],
             "ops": ["read"],
             "limits": {"max_procs": 1, "max_runtime_s": 1, "max_output_bytes": 1, "max_file_bytes": 1},
             "not_after": "2026-12-01T00:00:00Z"}`

func TestDecodePublishInputRefuses(t *testing.T) {
	for name, m := range refusedInputs {
		if !strings.Contains(issueInput, m[0]) {
			t.Fatalf("%s: mutation target %q not in the example", name, m[0])
		}
		in := strings.Replace(issueInput, m[0], m[1], 1)
		if _, err := DecodePublishInput([]byte(in)); !errors.Is(err, ErrInvalidSnapshot) {
			t.Errorf("%s: err = %v, want ErrInvalidSnapshot", name, err)
		}
	}
}

func TestDecodeSnapshotRequiresGeneration(t *testing.T) {
	omitted := strings.Replace(issueInput, `"generation": 7, `, "", 1)
	if _, err := DecodeSnapshot([]byte(omitted)); !errors.Is(err, ErrInvalidSnapshot) {
		t.Fatalf("snapshot without generation: err = %v, want ErrInvalidSnapshot", err)
	}
	s, err := DecodeSnapshot([]byte(issueInput))
	if err != nil || s.Generation != 7 {
		t.Fatalf("DecodeSnapshot = %+v, %v", s, err)
	}
}

func TestGrantValidateUIDZeroIsInvalidGrant(t *testing.T) {
	in := strings.Replace(issueInput, `"uid": 60001`, `"uid": 0`, 1)
	_, err := DecodePublishInput([]byte(in))
	if !errors.Is(err, ErrInvalidGrant) || !strings.Contains(err.Error(), "uid and gid 0") {
		t.Fatalf("err = %v, want ErrInvalidGrant naming uid 0", err)
	}
}

func TestSnapshotMaxGrants(t *testing.T) {
	na := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	s := Snapshot{Generation: 1, NotAfter: na}
	for i := 0; i <= MaxGrants; i++ {
		tu := exampleTuple()
		tu.Session = fmt.Sprintf("s%d", i)
		s.Grants = append(s.Grants, Grant{Tuple: tu, UID: 60001, GID: 60001, Ops: []Op{OpRead},
			Limits: Limits{MaxProcs: 1, MaxRuntimeS: 1, MaxOutputBytes: 1, MaxFileBytes: 1}, NotAfter: na})
	}
	if err := s.Validate(); !errors.Is(err, ErrInvalidSnapshot) {
		t.Fatalf("%d grants: err = %v", len(s.Grants), err)
	}
	s.Grants = s.Grants[:MaxGrants]
	if err := s.Validate(); err != nil {
		t.Fatalf("%d grants: %v", len(s.Grants), err)
	}
}

// TestStrictJSONDepth nests under known fields, which the schema would
// otherwise reach, so only the depth check can produce strictjson.ErrTooDeep; the
// documents one level shallower must get past it (and fail on type).
func TestStrictJSONDepth(t *testing.T) {
	arrays := func(n int) string {
		return `{"generation": 7, "not_after": "2026-12-01T00:00:00Z", "grants": ` +
			strings.Repeat("[", n) + strings.Repeat("]", n) + `}`
	}
	objects := func(n int) string { // grants[0].tuple.owner holds n-3 more objects
		return `{"generation": 7, "grants": [{"tuple": {"owner": ` +
			strings.Repeat(`{"a": `, n-3) + `1` + strings.Repeat("}", n-3) + `}}]}`
	}
	for name, doc := range map[string]func(int) string{"arrays": arrays, "objects": objects} {
		for _, n := range []int{strictjson.MaxDepth, 100, 10000} {
			_, err := DecodePublishInput([]byte(doc(n)))
			if !errors.Is(err, strictjson.ErrTooDeep) || !errors.Is(err, strictjson.ErrInvalid) {
				t.Errorf("%s nested %d deep: err = %v, want the depth check (strictjson.ErrInvalid, strictjson.ErrTooDeep)", name, n, err)
			}
		}
		_, err := DecodePublishInput([]byte(doc(strictjson.MaxDepth - 1)))
		if errors.Is(err, strictjson.ErrTooDeep) || !errors.Is(err, strictjson.ErrInvalid) {
			t.Errorf("%s nested %d deep: err = %v, want a type refusal, not the depth check", name, strictjson.MaxDepth-1, err)
		}
	}
}

// TestGrantEnv: a grant's env is a list of name/value pairs; a name given
// twice, with '=' or empty, a value with NUL, or a map are refused.
func TestGrantEnv(t *testing.T) {
	with := func(env string) string {
		return strings.Replace(issueInput, `"uid": 60001`, `"env": `+env+`, "uid": 60001`, 1)
	}
	s, err := DecodeSnapshot([]byte(with(`[{"name": "HOME", "value": "/w"}, {"name": "LANG", "value": "C.UTF-8"}]`)))
	if err != nil || len(s.Grants[0].Env) != 2 || s.Grants[0].Env[0] != (EnvVar{"HOME", "/w"}) {
		t.Fatalf("DecodeSnapshot = %+v, %v", s, err)
	}
	for name, env := range map[string]string{
		"twice":      `[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]`,
		"equals":     `[{"name": "A=B", "value": "1"}]`,
		"empty name": `[{"name": "", "value": "1"}]`,
		"NUL value":  `[{"name": "A", "value": "a\u0000b"}]`,
		"a map":      `{"a": "1"}`,
	} {
		if _, err := DecodeSnapshot([]byte(with(env))); !errors.Is(err, ErrInvalidSnapshot) {
			t.Errorf("%s: err = %v, want ErrInvalidSnapshot", name, err)
		}
	}
}
