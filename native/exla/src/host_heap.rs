//! Tuning of the C heap for the CPU plugins.
//!
//! The CPU plugins allocate device buffers, and each execution's temporary
//! buffer, with the C library's `malloc`. glibc serves blocks of at least
//! `M_MMAP_THRESHOLD` bytes with their own `mmap` and returns them with
//! `munmap` on free. It normally raises that threshold (up to 32 MiB) as
//! such blocks are freed, so a program that allocates the same sizes again
//! and again soon reuses warm heap memory. The Erlang VM disables that
//! adaptation at start-up (it sets `M_TRIM_THRESHOLD` and `M_TOP_PAD` with
//! `mallopt`), which leaves the threshold at 128 KiB: every execution then
//! maps, page-faults and unmaps all of its large buffers. For a
//! 784-512-512-10 MLP training step that is about 1,500 page faults and
//! 3 ms of kernel time per step.
//!
//! `host_heap_keep_freed_memory` sets the values glibc's own adaptation
//! would reach: blocks up to 32 MiB come from the heap, and the heap keeps
//! up to 64 MiB of free memory at its top. `EXLA.Client` calls it when it
//! creates a CPU client, unless `EXLA_HOST_MALLOC_TUNING` turns it off.

use std::sync::OnceLock;

use rustler::Atom;

/// glibc's largest adaptive mmap threshold on 64-bit targets.
const MMAP_THRESHOLD: i32 = 32 * 1024 * 1024;
/// glibc's adaptive trim threshold: twice the mmap threshold.
const TRIM_THRESHOLD: i32 = 2 * MMAP_THRESHOLD;

mod atoms {
    rustler::atoms! { ok }
}

/// Sets the thresholds, once per process (later calls do nothing). Returns
/// `:ok` either way: a refused value leaves glibc's own, which only costs
/// speed.
#[rustler::nif]
fn host_heap_keep_freed_memory() -> Atom {
    keep_freed_memory();
    atoms::ok()
}

/// Sets the thresholds on the first call; every call returns whether the
/// C library took them (true where there is nothing to set).
fn keep_freed_memory() -> bool {
    static TUNED: OnceLock<bool> = OnceLock::new();
    *TUNED.get_or_init(set_thresholds)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds() -> bool {
    use std::ffi::c_int;

    // From glibc's <malloc.h>.
    const M_TRIM_THRESHOLD: c_int = -1;
    const M_MMAP_THRESHOLD: c_int = -3;

    extern "C" {
        fn mallopt(param: c_int, value: c_int) -> c_int;
    }

    // SAFETY: mallopt only updates glibc's allocator parameters, under its
    // own lock. It returns 0 for a value out of its range.
    unsafe {
        let mmap = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        let trim = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD);
        mmap == 1 && trim == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// glibc takes both values (`mallopt` answers 1 for each), and later
    /// calls answer the same without setting them again.
    #[test]
    fn glibc_takes_the_thresholds_once() {
        assert!(keep_freed_memory());
        assert!(keep_freed_memory());
    }

    /// With the thresholds set, a block between glibc's default mmap
    /// threshold (128 KiB) and 32 MiB comes from the heap: its usable size
    /// is a few bytes over the request, where a block of its own mapping is
    /// rounded up to whole pages (this fails without the mmap threshold).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn blocks_below_the_threshold_come_from_the_heap() {
        extern "C" {
            fn malloc(size: usize) -> *mut std::ffi::c_void;
            fn malloc_usable_size(ptr: *mut std::ffi::c_void) -> usize;
            fn free(ptr: *mut std::ffi::c_void);
        }
        assert!(keep_freed_memory());
        let request = (4 << 20) + 1;
        // SAFETY: the block is only measured, then freed once.
        let usable = unsafe {
            let block = malloc(request);
            assert!(!block.is_null());
            let usable = malloc_usable_size(block);
            free(block);
            usable
        };
        assert!(usable >= request && usable < request + 64, "{usable}");
    }
}
