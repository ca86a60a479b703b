"""File-system primitives shared by both packages: the pid-recording inter-process file lock and the atomic file writer."""
