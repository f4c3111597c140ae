package errcode

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"testing"
)

// TestCodesMatchProtocolDoc holds Codes and docs/protocol.md's table to the
// same closed set, in the same order: adding a code to one and not the
// other fails here.
func TestCodesMatchProtocolDoc(t *testing.T) {
	doc, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	section := regexp.MustCompile(`(?s)## Error codes\n(.*?)\n## `).FindSubmatch(doc)
	if section == nil {
		t.Fatal("docs/protocol.md has no \"## Error codes\" section")
	}
	var documented []Code
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|").FindAllSubmatch(section[1], -1) {
		documented = append(documented, Code(m[1]))
	}
	if !slices.Equal(documented, Codes) {
		t.Fatalf("docs/protocol.md lists %v, Codes is %v", documented, Codes)
	}
}

func TestValidIsClosed(t *testing.T) {
	for _, c := range Codes {
		if !c.Valid() {
			t.Errorf("%q not valid", c)
		}
	}
	for _, c := range []Code{"", "Invalid", "invalid ", "fenced\x00", "ok"} {
		if c.Valid() {
			t.Errorf("%q valid, want outside the closed set", c)
		}
	}
}

func TestErrorIsMatchesCode(t *testing.T) {
	err := fmt.Errorf("call: %w", Errorf(CodeFenced, "binding %s fenced", "b1"))
	switch {
	case !errors.Is(err, &Error{Code: CodeFenced}):
		t.Error("an empty-message target does not match the same code")
	case !errors.Is(err, &Error{Code: CodeFenced, Message: "binding b1 fenced"}):
		t.Error("the exact error does not match")
	case errors.Is(err, &Error{Code: CodeFenced, Message: "other"}):
		t.Error("a different message matches")
	case errors.Is(err, &Error{Code: CodeDenied}):
		t.Error("a different code matches")
	}
	var e *Error
	if !errors.As(err, &e) || e.Error() != "fenced: binding b1 fenced" {
		t.Fatalf("As/Error: %v", e)
	}
}
