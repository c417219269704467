package outbox

import (
	"encoding/json"
	"unicode/utf8"
)

// decodeAttributes decodes a row's attributes column, a JSON object of
// strings, as json.Unmarshal into a map[string]string does. PostgreSQL
// writes jsonb as a flat object ({"k": "v", ...}); such an object whose
// strings have no escapes (the common case) is read here without
// reflection, and anything else goes to json.Unmarshal, which also makes
// every error.
func decodeAttributes(b []byte) (map[string]string, error) {
	if m, ok := plainObject(b); ok {
		return m, nil
	}
	var m map[string]string
	err := json.Unmarshal(b, &m)
	return m, err
}

// plainObject reads b if it is a JSON object whose keys and values are
// strings without escapes or control characters, in valid UTF-8; ok is
// false for anything else.
func plainObject(b []byte) (m map[string]string, ok bool) {
	if !utf8.Valid(b) {
		return nil, false
	}
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, false
	}
	i = skipSpace(b, i+1)
	m = map[string]string{}
	if i < len(b) && b[i] == '}' {
		return m, skipSpace(b, i+1) == len(b)
	}
	for {
		var k, v string
		if k, i, ok = plainString(b, i); !ok {
			return nil, false
		}
		if i = skipSpace(b, i); i >= len(b) || b[i] != ':' {
			return nil, false
		}
		if v, i, ok = plainString(b, skipSpace(b, i+1)); !ok {
			return nil, false
		}
		m[k] = v
		if i = skipSpace(b, i); i >= len(b) {
			return nil, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case '}':
			return m, skipSpace(b, i+1) == len(b)
		default:
			return nil, false
		}
	}
}

// plainString reads the string that starts at b[i] and returns it and the
// index after its closing quote; ok is false unless it is a string with no
// escape or control character.
func plainString(b []byte, i int) (s string, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return "", 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return string(b[i+1 : j]), j + 1, true
		case c == '\\' || c < 0x20:
			return "", 0, false
		}
	}
	return "", 0, false
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON white space.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
