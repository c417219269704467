package clustered

// SetAdoptHook makes every adoption of handed-over pauses run hook first,
// before it asks the instance; nil: none. Set it while no adoption runs.
func SetAdoptHook(hook func()) { testHookAdopt = hook }
