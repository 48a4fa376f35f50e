package api

import (
	"errors"
	"fmt"
)

// MaxNameLen is the longest volume name or node ID, in bytes.
const MaxNameLen = 128

// ErrName is the error of a volume name or node ID outside the grammar
// (CheckName); match with errors.Is.
var ErrName = errors.New("not a valid name")

// NameGrammar says in words what CheckName accepts, for error messages
// and help texts.
const NameGrammar = "1 to 128 ASCII letters, digits, '.', '_' and '-', starting with a letter or a digit"

// CheckName checks that s is a volume name or node ID (what says which,
// for the message): 1 to MaxNameLen bytes of ASCII letters, digits, '.',
// '_' and '-', the first a letter or a digit.
//
// Such a name is one URL path segment exactly as written: never a dot
// segment ("." or ".."), never a slash, never anything a client escapes
// or a server, proxy or shell might decode or expand. Every name the API
// accepts can therefore be put in a path (/v1/volumes/{name}) without
// changing meaning on the way. Older registries may hold names outside
// the grammar; they are reported and can still be deleted (docs/blkctl.md).
func CheckName(what, s string) error {
	if s == "" {
		return fmt.Errorf("%s is empty: use %s: %w", what, NameGrammar, ErrName)
	}
	if len(s) > MaxNameLen {
		return fmt.Errorf("%s %q is %d bytes long: use %s: %w", what, s, len(s), NameGrammar, ErrName)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		switch {
		case alnum:
		case i == 0:
			return fmt.Errorf("%s %q starts with %q: use %s: %w", what, s, c, NameGrammar, ErrName)
		case c == '.' || c == '_' || c == '-':
		default:
			return fmt.Errorf("%s %q has %q at byte %d: use %s: %w", what, s, c, i, NameGrammar, ErrName)
		}
	}
	return nil
}
