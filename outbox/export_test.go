package outbox

// ClaimLock is the advisory lock key that claims of table hold, for tests
// that hold claims back.
func ClaimLock(table string) int64 { return claimLock(table) }
