//! Runs nobody waits for stop (on the host platform).
//!
//! XLA cannot stop a running program. So EXLA's lowering gives a program
//! with loops a last parameter, the *run id* (a `u64` scalar), and emits
//! at the head of each `while` body a custom call of this module's handler
//! (`exla_run_check`), which fails the execution once the run is no longer
//! wanted: the process that waits for its result died (each run monitors
//! it), or the VM is halting. The execution then ends with an error that
//! nobody receives, its donated arguments given up and its outputs freed.
//!
//! The id names a slot of a fixed table, and a generation: the handler
//! reads one atomic word and compares it (no lock, no lookup), and a stale
//! or made-up id reads as stopped. Id 0 is a run that cannot be stopped
//! (the table was full).
//!
//! A check costs about 70 ns, and a loop whose body is small ran 10 times
//! slower checked at every iteration (XLA:CPU runs such a loop in its own
//! code, which a custom call breaks). So the lowering strip-mines each
//! loop: an inner loop runs up to `stride` iterations without a check,
//! and the handler, which gets the time of the last check, picks the next
//! stride so that checks come about every `INTERVAL` (one iteration apart
//! when an iteration takes longer). See `EXLA.Defn.Lowering`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use pjrt::xla_ffi::{self, Call, ErrorCode, FfiError, Handler, Platform};
use rustler::{Env, LocalPid, Monitor, ResourceArc};

/// The FFI target of the checks `EXLA.Defn.Lowering` emits.
const TARGET: &str = "exla_run_check";

/// How far apart checks come in a loop of short iterations.
const INTERVAL: Duration = Duration::from_micros(50);

/// The most iterations between two checks.
const MAX_STRIDE: u64 = 1 << 24;

/// Slots of the table: runs that can be stopped at once.
const SLOTS: usize = 1 << 16;

/// `id & SLOT_MASK` is the slot of id; the rest is its generation.
const SLOT_MASK: u64 = SLOTS as u64 - 1;

struct Table {
    /// The id of the run holding each slot, 0 when free or stopped.
    ids: Box<[AtomicU64]>,
    free: Mutex<Vec<u32>>,
    generation: AtomicU64,
}

static TABLE: LazyLock<Table> = LazyLock::new(|| Table {
    ids: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
    free: Mutex::new((0..SLOTS as u32).rev().collect()),
    generation: AtomicU64::new(1),
});

/// A run that can be stopped, from its start to its end (`Drop`).
pub struct Run {
    id: u64,
}

impl Run {
    fn start() -> Run {
        let table = &*TABLE;
        let slot = table.free.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let Some(slot) = slot else {
            tracing::debug!(target: "exla::run", "too many runs at once: this one cannot be stopped");
            return Run { id: 0 };
        };
        let generation = table.generation.fetch_add(1, Ordering::Relaxed);
        let id = (generation << SLOTS.trailing_zeros()) | u64::from(slot);
        table.ids[slot as usize].store(id, Ordering::Release);
        Run { id }
    }

    /// The id the program is given.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Makes the run's next check fail.
    fn stop(&self) {
        if self.id != 0 {
            let slot = &TABLE.ids[(self.id & SLOT_MASK) as usize];
            let _ = slot.compare_exchange(self.id, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if self.id != 0 {
            let slot = self.id & SLOT_MASK;
            TABLE.ids[slot as usize].store(0, Ordering::Release);
            TABLE
                .free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(slot as u32);
        }
    }
}

/// Why the run `id` must stop, if it must.
fn unwanted(id: u64) -> Option<&'static str> {
    if crate::pool::exiting() {
        return Some("the VM is halting");
    }
    let stopped = id != 0 && TABLE.ids[(id & SLOT_MASK) as usize].load(Ordering::Acquire) != id;
    stopped.then_some("nobody waits for its result any more (its caller is gone)")
}

/// The monitor of the process a run answers to: when that process dies,
/// the run stops at its next check. Held by the run's job until it ends.
pub struct Watch {
    run: Arc<Run>,
}

#[rustler::resource_impl]
impl rustler::Resource for Watch {
    const IMPLEMENTS_DOWN: bool = true;

    fn down<'a>(&'a self, _env: Env<'a>, _pid: LocalPid, _monitor: Monitor) {
        self.run.stop();
    }
}

/// Starts a run that stops once `caller` is gone (the monitor lives as
/// long as the returned resource). A caller already gone stops it at once.
pub fn watch(env: Env, caller: &LocalPid) -> (Arc<Run>, ResourceArc<Watch>) {
    let run = Arc::new(Run::start());
    let watch = ResourceArc::new(Watch { run: run.clone() });
    if watch.monitor(Some(env), caller).is_none() {
        run.stop();
    }
    (run, watch)
}

/// The run id of a program as a buffer of `device` of `executable`'s
/// client, its last argument.
pub fn id_buffer(
    executable: &pjrt::LoadedExecutable,
    run: &Run,
    device: usize,
) -> pjrt::Result<pjrt::Buffer> {
    let shape = pjrt::Shape::new(pjrt::ElementType::U64, vec![])?;
    executable
        .client()
        .buffer_from_host(&run.id().to_ne_bytes(), &shape, device)
}

/// The monotonic nanoseconds the handler measures strides with (never 0:
/// a loop starts with 0 as its last check).
fn now() -> u64 {
    static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);
    EPOCH.elapsed().as_nanos() as u64 + 1
}

/// The next stride: as many iterations as fit in `INTERVAL` at the pace
/// since the last check (`stride` iterations over `elapsed`), growing at
/// most twofold per check; 1 for a loop's first check.
fn next_stride(last: u64, stride: u64, now: u64) -> u64 {
    if last == 0 || stride == 0 {
        return 1;
    }
    let per_iteration = (now.saturating_sub(last) / stride).max(1);
    let fit = INTERVAL.as_nanos() as u64 / per_iteration;
    fit.clamp(1, (2 * stride).min(MAX_STRIDE))
}

/// The check: operands the run id, the time of the loop's last check (0 at
/// first) and the stride since; results the time now and the next stride.
struct RunCheck;

impl Handler for RunCheck {
    const NAME: &'static str = "run check";

    fn execute(call: &mut Call<'_>) -> Result<(), FfiError> {
        let word = |i: usize| -> Result<u64, FfiError> {
            let bytes = call.args.get(i).ok_or("a run check takes 3 operands")?;
            let bytes: [u8; 8] = bytes
                .host_bytes()?
                .try_into()
                .map_err(|_| "not a 64-bit scalar")?;
            Ok(u64::from_ne_bytes(bytes))
        };
        let (id, last, stride) = (word(0)?, word(1)?, word(2)?);
        if let Some(why) = unwanted(id) {
            return Err(FfiError::new(
                ErrorCode::Cancelled,
                format!("the run was stopped: {why}"),
            ));
        }
        let now = now();
        let next = next_stride(last, stride, now);
        for (ret, value) in call.rets.iter_mut().zip([now, next]) {
            ret.host_bytes_mut()?.copy_from_slice(&value.to_ne_bytes());
        }
        Ok(())
    }
}

/// Registers the check with `plugin`, a host client's (the caller decides:
/// a check on a GPU would wait for the device at every iteration).
pub fn install(plugin: &pjrt::Plugin) -> pjrt::Result<()> {
    xla_ffi::register::<RunCheck>(plugin, Platform::Host, TARGET)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_aim_at_the_interval_and_grow_at_most_twofold() {
        let interval = INTERVAL.as_nanos() as u64;
        assert_eq!(next_stride(0, 1, 1000), 1);
        // 10 ns an iteration: grows twofold per check up to the interval
        assert_eq!(next_stride(1, 8, 1 + 80), 16);
        assert_eq!(next_stride(1, 4096, 1 + 40_960), interval / 10);
        // iterations longer than the interval: one at a time
        assert_eq!(next_stride(1, 4, 1 + 4 * interval), 1);
        // shorter than a nanosecond counts as one
        assert_eq!(next_stride(1, 1 << 20, 1 + 1000), (interval).min(1 << 21));
    }

    #[test]
    fn a_stopped_or_ended_run_reads_as_unwanted() {
        let run = Run::start();
        assert!(unwanted(run.id()).is_none());
        run.stop();
        assert!(unwanted(run.id()).is_some());
        let other = Run::start();
        let id = other.id();
        drop(other);
        assert!(unwanted(id).is_some());
        // made-up ids too; 0 never stops (but for a halt)
        assert!(unwanted(12345 << 16).is_some());
        assert!(unwanted(0).is_none());
    }
}
