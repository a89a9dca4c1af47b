//! Exports only the interposed symbols (and the constructor), so the shim never shadows anything
//! else; compiles the variadic exec functions, which stable Rust cannot define (src/execl.c).
fn main() {
    let dir = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let script = dir.join("exports.map");
    println!("cargo:rerun-if-changed={}", script.display());
    println!(
        "cargo:rustc-cdylib-link-arg=-Wl,--version-script={}",
        script.display()
    );
    let c = dir.join("src/execl.c");
    let sys = dir.join("src/syscall.c");
    println!("cargo:rerun-if-changed={}", c.display());
    println!("cargo:rerun-if-changed={}", sys.display());
    cc::Build::new()
        .file(&c)
        .file(&sys)
        .warnings(true)
        .extra_warnings(true)
        .cargo_metadata(false)
        .compile("roar_execl");
    // Nothing in Rust calls these functions: the whole archive is linked so they are kept.
    println!(
        "cargo:rustc-link-search=native={}",
        std::env::var("OUT_DIR").unwrap()
    );
    println!("cargo:rustc-link-lib=static:+whole-archive=roar_execl");
}
