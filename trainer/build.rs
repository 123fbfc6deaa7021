//! Keeps libtorch_cuda linked (tch reports no CUDA if `--as-needed` drops it).

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let lib = std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rustc-link-search=native={lib}");
    let lib_dir = std::path::Path::new(&lib);
    if lib_dir.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
