//! A fake PJRT plugin for tests: it exports `GetPjrtApi` with a table that
//! claims PJRT C API 0.40 and holds no functions. Loading it must fail with
//! a "too old" error before any function pointer is used.

#[repr(C)]
pub struct FakeApi {
    struct_size: usize,
    extension_start: *mut u8,
    version_struct_size: usize,
    version_extension_start: *mut u8,
    major: i32,
    minor: i32,
    functions: [usize; 118],
}

struct Shared(FakeApi);

// SAFETY: the table is immutable.
unsafe impl Sync for Shared {}

static API: Shared = Shared(FakeApi {
    struct_size: std::mem::size_of::<FakeApi>(),
    extension_start: std::ptr::null_mut(),
    version_struct_size: 24,
    version_extension_start: std::ptr::null_mut(),
    major: 0,
    minor: 40,
    functions: [0; 118],
});

/// # Safety
/// Returns a pointer to a static table; nothing to uphold.
#[no_mangle]
pub unsafe extern "C" fn GetPjrtApi() -> *const FakeApi {
    &API.0
}
