"""Reading and materializing the merge source."""
