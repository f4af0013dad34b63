"""Storage engines of the daemon behind one interface (`base.Storage`)."""
