package outbox

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decodeAttributes must read every input exactly as json.Unmarshal into a
// map[string]string does: the same map, and an error exactly when it errs.
func sameAsJSON(t *testing.T, in []byte) {
	t.Helper()
	var want map[string]string
	wantErr := json.Unmarshal(in, &want)
	got, err := decodeAttributes(in)
	if wantErr != nil {
		require.Error(t, err, "input %q", in)
		return
	}
	require.NoError(t, err, "input %q", in)
	assert.Equal(t, want, got, "input %q", in)
}

func TestAttributesDecodeAsEncodingJSONDoes(t *testing.T) {
	for _, in := range []string{
		`{"group": "g1"}`, `{"a": "1", "b": "2"}`, `{}`, ` { } `, `{"a":"x","a":"y"}`, `{"é": "ü"}`,
		`{"a": "line\nbreak"}`, `{"a": "q\"uote"}`, `{"a": "\u00e9"}`, `null`, `{"a": 1}`, `{"a": null}`,
		`{"a": "b",}`, `{"a" "b"}`, `{"a": "b"} x`, `{"a": "b"`, `[]`, `"s"`, ``, `{"a": "b", }`,
		"{\"a\": \"\x01\"}", "{\"a\": \"\xff\"}", `{"a": "b"}{}`, `{"":""}`, "\t{\"a\":\"b\"}\n",
	} {
		sameAsJSON(t, []byte(in))
	}
}

func TestPlainAttributesSkipReflection(t *testing.T) {
	m, ok := plainObject([]byte(`{"group": "g1", "tenant": "t"}`))
	require.True(t, ok, "jsonb's own output takes the plain path")
	assert.Equal(t, map[string]string{"group": "g1", "tenant": "t"}, m)
}

func FuzzAttributesDecodeAsEncodingJSONDoes(f *testing.F) {
	for _, s := range []string{`{"group": "g1"}`, `{}`, `{"a": "\n"}`, `null`, `{"a": 1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) { sameAsJSON(t, in) })
}
