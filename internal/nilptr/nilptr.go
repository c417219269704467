// Package nilptr tells a nil interface, or an interface holding a nil
// pointer (Go's typed nil), from a usable value: a nil *sqs.Codec passed as a
// codec.Codec, or a nil *codec.EntryError returned as an error, is not nil to
// ==, and calling its methods panics. It is sinkbatch's one such check.
package nilptr

import "reflect"

// Is reports whether v is nil or an interface holding a nil pointer.
func Is(v any) bool {
	if v == nil {
		return true
	}
	r := reflect.ValueOf(v)
	return r.Kind() == reflect.Pointer && r.IsNil()
}
