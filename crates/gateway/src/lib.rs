//! The S3 gateway behind `roar gateway` (filled by the gateway issue).
