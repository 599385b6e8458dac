//! The floating-point environment the kernels need: IEEE subnormals.
//!
//! XLA's CPU runtime sets flush-to-zero and denormals-are-zero on the
//! threads that run programs (the README's "Denormals are flushed to zero
//! on the CPU"), and a handler runs on one of them. faer scales some
//! intermediate values into the subnormal range on purpose: its complex
//! reciprocal of a number of modulus about 1 multiplies by 2^512 and takes
//! the reciprocal of the squared norm, about 1e-308; flushed to zero, the
//! LU of a complex matrix put zeros in L (P . L . U was 0.95 from A on a
//! 5x5 c128 matrix). So a kernel runs with both modes off, and the
//! caller's are restored after it, also when it panics.

/// Runs `f` with flush-to-zero and denormals-are-zero off on this thread.
pub fn with_subnormals<R>(f: impl FnOnce() -> R) -> R {
    let _guard = Guard::enter();
    f()
}

/// Turns flush-to-zero and denormals-are-zero off on this thread for good:
/// for the threads of the kernels' own pool, which run nothing else.
pub fn allow_subnormals_on_this_thread() {
    std::mem::forget(Guard::enter());
}

/// Restores the control register it found when dropped.
struct Guard {
    #[allow(dead_code)]
    saved: usize,
}

#[cfg(target_arch = "x86_64")]
impl Guard {
    /// MXCSR's flush-to-zero (bit 15) and denormals-are-zero (bit 6).
    const MODES: u32 = (1 << 15) | (1 << 6);

    fn enter() -> Guard {
        let saved = read();
        if saved & Self::MODES != 0 {
            write(saved & !Self::MODES);
        }
        Guard {
            saved: saved as usize,
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for Guard {
    fn drop(&mut self) {
        write(self.saved as u32);
    }
}

#[cfg(target_arch = "x86_64")]
fn read() -> u32 {
    let mut value: u32 = 0;
    // SAFETY: stmxcsr stores the 32-bit MXCSR register (present on every
    // x86-64 CPU) into the 4 bytes at the pointer, a live local.
    unsafe {
        std::arch::asm!("stmxcsr [{}]", in(reg) &mut value, options(nostack, preserves_flags));
    }
    value
}

#[cfg(target_arch = "x86_64")]
fn write(value: u32) {
    // SAFETY: ldmxcsr loads MXCSR from the 4 bytes at the pointer; the value
    // is one read from MXCSR with mode bits cleared (or restored as read),
    // so no reserved bit is set.
    unsafe {
        std::arch::asm!("ldmxcsr [{}]", in(reg) &value, options(nostack, preserves_flags));
    }
}

#[cfg(target_arch = "aarch64")]
impl Guard {
    /// FPCR's flush-to-zero (bit 24).
    const MODES: usize = 1 << 24;

    fn enter() -> Guard {
        let saved: usize;
        // SAFETY: reading FPCR has no effect but the read.
        unsafe { std::arch::asm!("mrs {}, fpcr", out(reg) saved, options(nomem, nostack)) };
        if saved & Self::MODES != 0 {
            // SAFETY: writes back the value read with the FZ bit cleared.
            unsafe {
                std::arch::asm!("msr fpcr, {}", in(reg) saved & !Self::MODES, options(nomem, nostack))
            };
        }
        Guard { saved }
    }
}

#[cfg(target_arch = "aarch64")]
impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: restores the value read on entry.
        unsafe { std::arch::asm!("msr fpcr, {}", in(reg) self.saved, options(nomem, nostack)) };
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
impl Guard {
    fn enter() -> Guard {
        Guard { saved: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn subnormals_are_on_inside_and_the_modes_restored_after() {
        let before = read();
        write(before | Guard::MODES);
        let tiny = std::hint::black_box(f64::MIN_POSITIVE);
        let inside = with_subnormals(|| std::hint::black_box(tiny) / 4.0);
        let modes_after = read() & Guard::MODES;
        let outside = std::hint::black_box(tiny) / 4.0;
        write(before);
        // (compared as bits: denormals-are-zero would read them as zeros)
        assert_eq!(inside.to_bits(), (f64::MIN_POSITIVE / 4.0).to_bits());
        assert_eq!(modes_after, Guard::MODES);
        assert_eq!(outside.to_bits(), 0);
    }
}
