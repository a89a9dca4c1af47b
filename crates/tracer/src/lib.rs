//! Tracer backends for `roar run`.
