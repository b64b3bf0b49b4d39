package hftokenizer

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A path that is not a model's directory says what it is instead, naming
// only what the caller gave.
func TestLoadDirNotAModel(t *testing.T) {
	empty := t.TempDir()
	file := filepath.Join("testdata", "qwen3", "tokenizer.json.gz")
	for _, c := range []struct {
		dir, want string
		notExist  bool
	}{
		{filepath.Join(empty, "nosuch"), "the model's directory: stat " + filepath.Join(empty, "nosuch"), true},
		{file, file + " is a file, not the model's directory", false},
		{empty, "no tokenizer.json or tokenizer.json.gz in " + empty, true},
	} {
		_, err := LoadDir(c.dir)
		if err == nil || !strings.Contains(err.Error(), c.want) || errors.Is(err, os.ErrNotExist) != c.notExist {
			t.Errorf("LoadDir(%s) = %v; want %q (not exist: %v)", c.dir, err, c.want, c.notExist)
		}
	}
}
