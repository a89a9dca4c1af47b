//! roarfs: the FUSE passthrough filesystem behind `roar mount` (filled by the mount issue).
