"""Worker groups: Ray actors per device slot, or one rank in-process."""
