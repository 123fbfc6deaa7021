//! Builds the attention bridge (`csrc/bridge.cpp`, a libtorch autograd Function) against the
//! libtorch headers torch-sys found, and keeps libtorch_cuda linked (with `--as-needed` the linker
//! drops it and tch then reports no CUDA).

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=csrc/bridge.cpp");
    let lib =
        PathBuf::from(std::env::var("DEP_TCH_LIBTORCH_LIB").expect("torch-sys exports DEP_TCH_LIBTORCH_LIB"));
    let include = lib.join("..").join("include");

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("csrc/bridge.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false);
    // A CUDA build of libtorch: the bridge asks libc10_cuda for the current stream (declared in
    // bridge.cpp itself, since the wheel lacks the toolkit headers CUDAStream.h needs).
    let has_cuda_lib = lib.join("libtorch_cuda.so").exists() && lib.join("libc10_cuda.so").exists();
    if has_cuda_lib {
        build.define("FLAMIA_WITH_CUDA", None);
    }
    build.compile("flamia_bridge");

    println!("cargo:rustc-link-search=native={}", lib.display());
    if has_cuda_lib {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,-lc10_cuda,--as-needed");
    }
}
