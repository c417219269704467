package sqs

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"hash"
	"io"
	"reflect"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

// identity builds a codec's Identity: a SHA-256 digest over everything that
// shapes its requests. Two codecs get equal identities only when the codec can
// tell that they send alike, since sinkbatch sends one's messages through the
// other when they are equal:
//
//   - data (region, endpoint, retry settings, the codec's own options) enters
//     by value;
//   - static credentials enter by value, so that codecs made from equal keys
//     share a batcher; the digest is all that is kept of the secret;
//   - a pointer, map or channel enters by the address it holds: the same
//     object. The codec keeps the aws.Config alive (Codec.keep), so no other
//     value can take that address while the codec exists;
//   - an interface enters as its dynamic type and value, by these rules;
//   - a func cannot be told apart: every closure of one literal shares its
//     code pointer, whatever keys it captured. One anywhere in the config
//     (a credentials func, a Retryer, APIOptions, ServiceOptions, an
//     endpoint resolver func, an interceptor func) makes the identity unique
//     to the codec value, by a random nonce.
type identity struct {
	h      hash.Hash
	opaque bool // something the codec cannot compare was seen
}

func newIdentity() *identity { return &identity{h: sha256.New()} }

// field adds one named part.
func (id *identity) field(name string, v any) {
	fmt.Fprintf(id.h, "%s=", name)
	if !fingerprint(id.h, reflect.ValueOf(v), 0) {
		id.opaque = true
		fmt.Fprint(id.h, "opaque")
	}
	fmt.Fprint(id.h, "\n")
}

// credentials adds a credentials provider: static ones (also inside an
// aws.CredentialsCache, as config.LoadDefaultConfig wraps them) by their
// values, since they answer at once from memory; others by the rules of
// field.
func (id *identity) credentials(p aws.CredentialsProvider) {
	if aws.IsCredentialsProvider(p, credentials.StaticCredentialsProvider{}) {
		if v, err := p.Retrieve(context.Background()); err == nil {
			s := sha256.Sum256([]byte(v.AccessKeyID + "\x00" + v.SecretAccessKey + "\x00" + v.SessionToken))
			id.field("credentials", fmt.Sprintf("static:%x", s))
			return
		}
	}
	id.field("credentials", p)
}

// digest returns the identity, made unique by a nonce when a part was
// opaque.
func (id *identity) digest() []byte {
	if id.opaque {
		fmt.Fprintf(id.h, "unique=%s\n", rand.Text())
	}
	return id.h.Sum(nil)
}

// maxDepth bounds fingerprint's walk: a value nested deeper is opaque. It
// also ends the walk of a value that holds itself through a slice.
const maxDepth = 12

// fingerprint writes v to w so that two values write alike only when they
// are interchangeable (see identity), and reports false when v holds
// something it cannot compare: a func, or a value nested deeper than
// maxDepth.
func fingerprint(w io.Writer, v reflect.Value, depth int) bool {
	if depth > maxDepth {
		return false
	}
	switch v.Kind() {
	case reflect.Invalid:
		fmt.Fprint(w, "nil")
	case reflect.Bool:
		fmt.Fprint(w, v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		fmt.Fprint(w, v.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		fmt.Fprint(w, v.Uint())
	case reflect.Float32, reflect.Float64:
		fmt.Fprint(w, v.Float())
	case reflect.Complex64, reflect.Complex128:
		fmt.Fprint(w, v.Complex())
	case reflect.String:
		fmt.Fprintf(w, "%q", v.String())
	case reflect.Pointer:
		if v.IsNil() {
			fmt.Fprint(w, "nil")
			return true
		}
		switch v.Elem().Kind() {
		case reflect.String, reflect.Bool, reflect.Int, reflect.Int64:
			// A plain value behind a pointer (aws.Config.BaseEndpoint)
			// counts by value: aws.String makes a new pointer each time.
			fmt.Fprint(w, "&")
			return fingerprint(w, v.Elem(), depth+1)
		}
		fmt.Fprintf(w, "%s@%#x", v.Type(), v.Pointer())
	case reflect.Map, reflect.Chan, reflect.UnsafePointer:
		if v.IsNil() {
			fmt.Fprint(w, "nil")
			return true
		}
		fmt.Fprintf(w, "%s@%#x", v.Type(), v.Pointer())
	case reflect.Func:
		if v.IsNil() {
			fmt.Fprint(w, "nil")
			return true
		}
		return false
	case reflect.Interface:
		if v.IsNil() {
			fmt.Fprint(w, "nil")
			return true
		}
		fmt.Fprintf(w, "%s:", v.Elem().Type())
		return fingerprint(w, v.Elem(), depth+1)
	case reflect.Slice, reflect.Array:
		if v.Kind() == reflect.Slice && v.IsNil() {
			fmt.Fprint(w, "nil")
			return true
		}
		fmt.Fprintf(w, "[%d:", v.Len())
		for i := range v.Len() {
			if !fingerprint(w, v.Index(i), depth+1) {
				return false
			}
			fmt.Fprint(w, ",")
		}
		fmt.Fprint(w, "]")
	case reflect.Struct:
		fmt.Fprintf(w, "%s{", v.Type())
		for i := range v.NumField() {
			fmt.Fprintf(w, "%s:", v.Type().Field(i).Name)
			if !fingerprint(w, v.Field(i), depth+1) {
				return false
			}
			fmt.Fprint(w, ",")
		}
		fmt.Fprint(w, "}")
	default:
		return false
	}
	return true
}
