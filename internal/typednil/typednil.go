// Package typednil tells a nil interface, or one holding a nil pointer (a
// typed nil such as a nil *sqs.Codec or a nil *codec.EntryError), from a
// usable value: calling a method on the second kind may panic where the
// caller cannot recover it.
package typednil

import "reflect"

// Is reports whether v is nil or a nil pointer.
func Is(v any) bool {
	if v == nil {
		return true
	}
	r := reflect.ValueOf(v)
	return r.Kind() == reflect.Pointer && r.IsNil()
}
