//! Links `roar` as a position-dependent executable: a PIE of this size carries ~72,000 relative
//! relocations, which the loader applies at every start (hundreds of copy-on-write page faults,
//! about a millisecond of each `roar run`).
fn main() {
    println!("cargo:rustc-link-arg-bins=-no-pie");
}
