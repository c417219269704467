package batcher

import "testing"

func TestZZScratch(t *testing.T) {
	q := newQueue(testSettings())
	a, b, c := mk("a", "", 1, 1), mk("a", "", 2, 1), mk("a", "", 3, 1)
	a.deadline = 10
	b.deadline = 5
	admitAll(t, q, a, b, c)
	q.sweep(6, everyoneAlive)  // b dies behind live head a
	q.sweep(11, everyoneAlive) // a dies at the head: settle nils b while sweep's loop is at a
}
