package hftokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// orders holds the key order of the objects of the requests being turned
// into prompts, as the requests gave them: Python's dicts keep it, and a
// chat template's tojson, items() and keys() give it. An object is known
// by its map's address while its request is processed; a map the template
// made itself has none and comes out in sorted order.
var orders sync.Map // unsafe.Pointer -> []string

// keyOrder is one request's entries in orders; it keeps its maps alive
// (and so their addresses theirs) until release.
type keyOrder struct {
	maps []map[string]any
}

func (o *keyOrder) set(m map[string]any, keys []string) {
	o.maps = append(o.maps, m)
	orders.Store(reflect.ValueOf(m).UnsafePointer(), keys)
}

func (o *keyOrder) release() {
	for _, m := range o.maps {
		orders.Delete(reflect.ValueOf(m).UnsafePointer())
	}
	o.maps = nil
}

// keysOf returns m's keys in the order its request gave them, sorted when
// it has none (or the template changed its keys).
func keysOf(m map[string]any) []string {
	if v, ok := orders.Load(reflect.ValueOf(m).UnsafePointer()); ok {
		keys := v.([]string)
		same := len(keys) == len(m)
		for _, k := range keys {
			if _, ok := m[k]; !ok {
				same = false
			}
		}
		if same {
			return keys
		}
	}
	k := make([]string, 0, len(m))
	for key := range m {
		k = append(k, key)
	}
	slices.Sort(k)
	return k
}

// maxNesting is how deeply arrays and objects may nest in a decoded value,
// as in encoding/json: deeper, decoding fails instead of exhausting the
// stack.
const maxNesting = 10000

// decodeJSON decodes a JSON value as Python's json.loads would: objects as
// maps (their key order recorded in o; a repeated key keeps its first place
// and its last value), integers as int (as their json.Number, written back
// digit for digit, when too large for one), other numbers as float64.
// Anything but whitespace after the value is an error ("Extra data").
func decodeJSON(data []byte, o *keyOrder) (any, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	v, err := decodeValue(d, o, 0)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, fmt.Errorf("extra data after the JSON value")
	}
	return v, nil
}

// decodeValue decodes the next value, within depth arrays and objects.
func decodeValue(d *json.Decoder, o *keyOrder, depth int) (any, error) {
	tok, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if depth >= maxNesting {
			return nil, fmt.Errorf("arrays and objects nested more than %d deep", maxNesting)
		}
		switch t {
		case '{':
			m := make(map[string]any)
			var keys []string
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return nil, err
				}
				k := kt.(string)
				v, err := decodeValue(d, o, depth+1)
				if err != nil {
					return nil, err
				}
				if _, dup := m[k]; !dup {
					keys = append(keys, k)
				}
				m[k] = v
			}
			if _, err := d.Token(); err != nil {
				return nil, err
			}
			o.set(m, keys)
			return m, nil
		case '[':
			l := []any{}
			for d.More() {
				v, err := decodeValue(d, o, depth+1)
				if err != nil {
					return nil, err
				}
				l = append(l, v)
			}
			if _, err := d.Token(); err != nil {
				return nil, err
			}
			return l, nil
		}
		return nil, fmt.Errorf("unexpected %v", t)
	case json.Number:
		s := t.String()
		if !strings.ContainsAny(s, ".eE") {
			if i, err := strconv.Atoi(s); err == nil {
				return i, nil
			}
			return t, nil // an integer past int64: its digits, as Python keeps them
		}
		f, err := strconv.ParseFloat(s, 64)
		if err != nil && !math.IsInf(f, 0) {
			return nil, err
		}
		return f, nil
	default:
		return t, nil // string, bool, nil
	}
}

// dumpOptions are json.dumps's keyword arguments: indent (nil: None),
// separators (empty: None, that is ", " and ": " without an indent, ","
// and ": " with one), sort_keys and ensure_ascii.
type dumpOptions struct {
	indent          *string
	itemSep, keySep string
	sortKeys        bool
	ensureASCII     bool
}

// pyDumps writes v as Python's json.dumps does with those options: strings
// escaped as Python escapes them, without HTML escaping; floats as
// Python's repr; objects in their request's key order (keysOf).
func pyDumps(v any, o dumpOptions) (string, error) {
	w := pyWriter{indent: o.indent, ascii: o.ensureASCII, itemSep: o.itemSep, keySep: o.keySep, sortKeys: o.sortKeys}
	if w.itemSep == "" && w.keySep == "" {
		w.itemSep, w.keySep = ", ", ": "
		if w.indent != nil {
			w.itemSep = ","
		}
	}
	if err := w.value(v, 0); err != nil {
		return "", err
	}
	return w.b.String(), nil
}

type pyWriter struct {
	b               strings.Builder
	indent          *string
	ascii           bool
	itemSep, keySep string
	sortKeys        bool
}

func (w *pyWriter) newline(depth int) {
	w.b.WriteByte('\n')
	for range depth {
		w.b.WriteString(*w.indent)
	}
}

// open starts an item of a list or object at depth.
func (w *pyWriter) item(i, depth int) {
	if i > 0 {
		w.b.WriteString(w.itemSep)
	}
	if w.indent != nil {
		w.newline(depth)
	}
}

func (w *pyWriter) value(v any, depth int) error {
	if depth > 1000 {
		return fmt.Errorf("tojson: nested too deeply")
	}
	switch x := v.(type) {
	case nil:
		w.b.WriteString("null")
	case *exec.Value:
		if x.IsError() {
			return x
		}
		return w.value(x.Interface(), depth)
	case bool:
		w.b.WriteString(strconv.FormatBool(x))
	case string:
		w.str(x)
	case int:
		w.b.WriteString(strconv.Itoa(x))
	case int64:
		w.b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		w.b.WriteString(pyFloat(x))
	case json.Number:
		w.b.WriteString(x.String())
	case []any:
		if len(x) == 0 {
			w.b.WriteString("[]")
			return nil
		}
		w.b.WriteByte('[')
		for i, e := range x {
			w.item(i, depth+1)
			if err := w.value(e, depth+1); err != nil {
				return err
			}
		}
		if w.indent != nil {
			w.newline(depth)
		}
		w.b.WriteByte(']')
	case map[string]any:
		keys := keysOf(x)
		if w.sortKeys {
			keys = slices.Sorted(slices.Values(keys))
		}
		if len(keys) == 0 {
			w.b.WriteString("{}")
			return nil
		}
		w.b.WriteByte('{')
		for i, k := range keys {
			w.item(i, depth+1)
			w.str(k)
			w.b.WriteString(w.keySep)
			if err := w.value(x[k], depth+1); err != nil {
				return err
			}
		}
		if w.indent != nil {
			w.newline(depth)
		}
		w.b.WriteByte('}')
	case *exec.Dict: // a dict the template wrote: {"output": ...}
		if w.sortKeys {
			m := make(map[string]any, len(x.Pairs))
			for _, p := range x.Pairs {
				if !p.Key.IsString() {
					return fmt.Errorf("tojson: a key that is not a string: %s", p.Key.String())
				}
				m[p.Key.String()] = p.Value
			}
			return w.value(m, depth)
		}
		if len(x.Pairs) == 0 {
			w.b.WriteString("{}")
			return nil
		}
		w.b.WriteByte('{')
		for i, p := range x.Pairs {
			w.item(i, depth+1)
			if !p.Key.IsString() {
				return fmt.Errorf("tojson: a key that is not a string: %s", p.Key.String())
			}
			w.str(p.Key.String())
			w.b.WriteString(w.keySep)
			if err := w.value(p.Value, depth+1); err != nil {
				return err
			}
		}
		if w.indent != nil {
			w.newline(depth)
		}
		w.b.WriteByte('}')
	default:
		rv := reflect.ValueOf(v)
		if rv.Kind() == reflect.Slice {
			l := make([]any, rv.Len())
			for i := range l {
				l[i] = rv.Index(i).Interface()
			}
			return w.value(l, depth)
		}
		return fmt.Errorf("tojson: cannot write a %T", v)
	}
	return nil
}

// str writes s as Python's json encoder does.
func (w *pyWriter) str(s string) {
	w.b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			w.b.WriteString(`\"`)
		case '\\':
			w.b.WriteString(`\\`)
		case '\n':
			w.b.WriteString(`\n`)
		case '\r':
			w.b.WriteString(`\r`)
		case '\t':
			w.b.WriteString(`\t`)
		case '\b':
			w.b.WriteString(`\b`)
		case '\f':
			w.b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20:
				fmt.Fprintf(&w.b, `\u%04x`, r)
			case r > 0x7e && w.ascii:
				if r > 0xffff {
					r -= 0x10000
					fmt.Fprintf(&w.b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
				} else {
					fmt.Fprintf(&w.b, `\u%04x`, r)
				}
			default:
				w.b.WriteRune(r)
			}
		}
	}
	w.b.WriteByte('"')
}

// pyFloat is Python's repr of a float, as json.dumps writes it: the
// shortest digits that read back the same, in exponent form below 1e-4 and
// from 1e16, with ".0" on an integral value.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	if f == 0 {
		if math.Signbit(f) {
			return "-0.0"
		}
		return "0.0"
	}
	exp := int(math.Floor(math.Log10(math.Abs(f))))
	// Log10 may be off by one at powers of ten: take the exponent from
	// the shortest decimal form instead.
	e := strconv.FormatFloat(f, 'e', -1, 64)
	if i := strings.IndexByte(e, 'e'); i >= 0 {
		exp, _ = strconv.Atoi(e[i+1:])
	}
	if exp < -4 || exp >= 16 {
		mant, ex, _ := strings.Cut(e, "e")
		sign := ex[0]
		digits := strings.TrimLeft(ex[1:], "0")
		if len(digits) < 2 {
			digits = strings.Repeat("0", 2-len(digits)) + digits
		}
		return mant + "e" + string(sign) + digits
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}
