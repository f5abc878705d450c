//! Links the system's libibverbs (Debian: libibverbs-dev). Nothing is built:
//! the bindings are hand-written (see src/sys.rs for why).
fn main() {
    println!("cargo:rustc-link-lib=dylib=ibverbs");
}
