//! Builds the C++ shim that keeps plugin exceptions out of Rust
//! (`cpp/guard.cc`, used by `src/guard.rs`).
//!
//! A normal build uses the platform's C++ compiler and standard library
//! (g++ and libstdc++ on Linux, clang and libc++ on macOS), the same ones
//! the plugins are built with, so an exception a plugin throws is one the
//! shim's `catch` clauses recognize.
//!
//! Release builds for an old glibc (`mix exla.precompile`) compile with zig,
//! whose C++ defaults to its own libc++, linked statically. A libstdc++
//! exception thrown by a GCC-built plugin cannot be caught by libc++ code
//! (a test process segfaults). Two variables switch the shim to the
//! target's libstdc++ instead:
//!
//! - `PJRT_GUARD_STDCXX_INCLUDE`: the libstdc++ header folders for the
//!   target (a path list), used instead of the compiler's own C++ headers;
//! - `PJRT_GUARD_STDCXX_LIBDIR`: the folder holding the target's
//!   `libstdc++.so.6` and `libgcc_s.so.1`, linked by file name so that no
//!   toolchain replaces them with its own runtime.
//!
//! The shim only needs the C++ ABI's oldest symbols (CXXABI_1.3,
//! GLIBCXX_3.4), which every libstdc++ since GCC 3.4 has.

use std::env;

fn main() {
    println!("cargo:rerun-if-changed=cpp/guard.cc");
    println!("cargo:rerun-if-env-changed=PJRT_GUARD_STDCXX_INCLUDE");
    println!("cargo:rerun-if-env-changed=PJRT_GUARD_STDCXX_LIBDIR");

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("cpp/guard.cc")
        .flag_if_supported("-std=c++17");

    if let Some(include) = env::var_os("PJRT_GUARD_STDCXX_INCLUDE") {
        build.flag("-nostdinc++");
        for dir in env::split_paths(&include) {
            build.flag("-isystem").flag(dir.as_os_str());
        }
    }

    if let Some(libdir) = env::var_os("PJRT_GUARD_STDCXX_LIBDIR") {
        build.cpp_link_stdlib(None);
        println!(
            "cargo:rustc-link-search=native={}",
            libdir.to_string_lossy()
        );
        // Verbatim names (`-l:libstdc++.so.6`): zig reads `-lstdc++` as its
        // own libc++ and cargo-zigbuild turns `-lgcc_s` into its libunwind.
        // Listed here, before the standard library's own `-lgcc_s`, they
        // also provide the unwinder Rust uses, as in a g++ build.
        println!("cargo:rustc-link-lib=dylib:+verbatim=libstdc++.so.6");
        println!("cargo:rustc-link-lib=dylib:+verbatim=libgcc_s.so.1");
    }

    build.compile("pjrt_guard");
}
