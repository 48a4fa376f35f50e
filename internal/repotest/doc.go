// Package repotest holds the repository-wide checks that are not about
// one package: what may be committed to the tree. It has no code of its
// own, only tests, and must never be imported.
package repotest
