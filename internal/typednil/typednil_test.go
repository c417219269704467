package typednil

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

type e struct{}

func (*e) Error() string { return "e" }

func TestIsTellsTypedNilsFromValues(t *testing.T) {
	var p *e
	var err error = p
	assert.True(t, Is(nil))
	assert.True(t, Is(err), "a nil pointer in an interface")
	assert.False(t, Is(&e{}))
	assert.False(t, Is(errors.New("x")), "a non-nil pointer")
	assert.False(t, Is(struct{}{}), "a value that is not a pointer")
}
