//! Exports only the interposed symbols (and the constructor), so the shim never shadows anything else.
fn main() {
    let script =
        std::path::Path::new(&std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("exports.map");
    println!("cargo:rerun-if-changed={}", script.display());
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        script.display()
    );
}
