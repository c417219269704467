package nilptr

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
)

type entryError struct{}

func (*entryError) Error() string { return "entry" }

func TestIsTellsTypedNilsFromValues(t *testing.T) {
	var nilErr *entryError
	var asError error = nilErr
	assert.True(t, Is(nil), "a nil interface")
	assert.True(t, Is(asError), "a typed nil is nil here, though asError != nil")
	assert.True(t, Is((*int)(nil)))
	assert.False(t, Is(&entryError{}))
	assert.False(t, Is(errors.New("x")))
	assert.False(t, Is(entryError{}), "a value type is never nil")
	assert.False(t, Is(0))
}
