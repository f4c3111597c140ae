package strictjson

import (
	"encoding/json"
	"reflect"
	"strings"
	"sync"
	"unicode"
)

// fieldType is the type a key's value decodes into: the exact field of a
// struct (any other key is refused), a map's element type, or nil.
func fieldType(t reflect.Type, fields map[string]reflect.Type, key, path string) (reflect.Type, error) {
	switch {
	case fields != nil:
		ft, ok := fields[key]
		if !ok {
			return nil, refuseKey(ErrUnknownField, path, key)
		}
		return ft, nil
	case t != nil && t.Kind() == reflect.Map:
		return t.Elem(), nil
	}
	return nil, nil
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// deref strips pointers. A type that decodes itself (json.Unmarshaler,
// json.RawMessage among them) and an interface become nil: their shape is
// unknown here, so only keys and depth are checked.
func deref(t reflect.Type) reflect.Type {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() == reflect.Interface || reflect.PointerTo(t).Implements(unmarshalerType) {
		return nil
	}
	return t
}

func elemType(t reflect.Type) reflect.Type {
	t = deref(t)
	if t == nil || (t.Kind() != reflect.Slice && t.Kind() != reflect.Array) {
		return nil
	}
	return t.Elem()
}

var fieldCache sync.Map // reflect.Type -> map[string]reflect.Type

// structFields maps the exact JSON name of each field encoding/json would
// decode into t to the field's type. Fields of embedded structs are
// promoted as encoding/json promotes them: the shallowest wins, a tag
// breaks a tie, and a name still tied is dropped (so refused as unknown).
func structFields(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := make(map[string]reflect.Type)
	for name, cands := range collectFields(t) {
		if f, ok := dominant(cands); ok {
			m[name] = f.typ
		}
	}
	fieldCache.Store(t, m)
	return m
}

type field struct {
	typ    reflect.Type
	depth  int
	tagged bool
}

// collectFields walks t and its embedded structs breadth first, as
// encoding/json does, and returns every candidate field by JSON name.
func collectFields(t reflect.Type) map[string][]field {
	out := map[string][]field{}
	visited := map[reflect.Type]bool{}
	level := []reflect.Type{t}
	for depth := 0; len(level) > 0; depth++ {
		var next []reflect.Type
		for _, st := range level {
			if visited[st] {
				continue
			}
			visited[st] = true
			next = appendFields(out, st, depth, next)
		}
		level = next
	}
	return out
}

// appendFields adds st's own fields to out and returns next with the
// embedded structs whose fields are promoted.
func appendFields(out map[string][]field, st reflect.Type, depth int, next []reflect.Type) []reflect.Type {
	for i := range st.NumField() {
		f := st.Field(i)
		ft := f.Type
		if f.Anonymous && ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if !f.IsExported() && (!f.Anonymous || ft.Kind() != reflect.Struct) {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if !validTag(name) {
			name = ""
		}
		if name == "" && f.Anonymous && ft.Kind() == reflect.Struct {
			next = append(next, ft)
			continue
		}
		tagged := name != ""
		if !tagged {
			name = f.Name
		}
		out[name] = append(out[name], field{typ: f.Type, depth: depth, tagged: tagged})
	}
	return next
}

// dominant picks the field a name decodes into, as encoding/json does.
func dominant(cands []field) (field, bool) {
	minDepth := cands[0].depth
	for _, c := range cands {
		minDepth = min(minDepth, c.depth)
	}
	var top, tagged []field
	for _, c := range cands {
		if c.depth == minDepth {
			top = append(top, c)
			if c.tagged {
				tagged = append(tagged, c)
			}
		}
	}
	switch {
	case len(top) == 1:
		return top[0], true
	case len(tagged) == 1:
		return tagged[0], true
	}
	return field{}, false
}

// validTag is encoding/json's rule for a usable tag name.
func validTag(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		switch {
		case strings.ContainsRune("!#$%&()*+-./:;<=>?@[]^_{|}~ ", c):
		case !unicode.IsLetter(c) && !unicode.IsDigit(c):
			return false
		}
	}
	return true
}
