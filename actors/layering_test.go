package actors_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Nothing outside the front door (and the supervisor below it) imports
// actors/batcher: a layer built on sinkbatch goes through package actors,
// which offers what the batcher's direct path needs (direct.go).
func TestOnlyTheFrontDoorImportsTheBatcher(t *testing.T) {
	const batcher = "github.com/ankusa/sinkbatch/actors/batcher"
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || rel == filepath.Join("actors", "batcher") || rel == filepath.Join("actors", "supervisor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || filepath.Dir(rel) == "actors" {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		require.NoError(t, err)
		checked++
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			assert.NotEqual(t, batcher, p, "%s imports the batcher: go through package actors", rel)
		}
		return nil
	})
	require.NoError(t, err)
	assert.Greater(t, checked, 100, "the walk found the repository's files")
}
