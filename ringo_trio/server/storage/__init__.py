"""Storage engines of the daemon behind one interface (`_base.Storage`)."""
