//! Native threads for work that must not run on a BEAM scheduler, and the
//! one way their results come back: a message to the calling process.
//!
//! * `compiles()` compiles programs. XLA and MLIR recurse per op and per
//!   nesting level, far deeper than a scheduler's stack allows (a 150-step
//!   chain overflowed the 320 KB of a dirty scheduler), so these threads
//!   have `COMPILE_STACK` of stack. Compiles are CPU-bound: at most one
//!   thread per core runs them, the rest queue.
//! * `serializes()` serializes and loads compiled programs (the compile
//!   cache's writes and reads). Each takes milliseconds, so it must not wait
//!   behind the compiles queued on `compiles()`: under a test suite that
//!   keeps both cores compiling, a write waited 0.2 s on average there, and
//!   a cold cache made the suite slower than no cache. The same big stacks
//!   (a module's HLO is rebuilt when it loads).
//! * `runs()` runs programs that may take unbounded time (loops, host
//!   callbacks, infeed) and waits for their results. Such a job may block
//!   for as long as a BEAM process makes it (a stream waits for its input),
//!   so it never waits for a busy thread: a new one is started instead.
//!
//! * `drops()` destroys what is slow to destroy (see `OffThread`): a
//!   compiled executable takes 0.03 to 0.6 ms to destroy, a buffer over
//!   the C heap's mapping threshold about 50 µs per MiB (12 ms for 256 MiB),
//!   and the last reference to either may go on a normal scheduler (the
//!   garbage collection of a term, the eviction of a cached program).
//!
//! Threads beyond `CORE_THREADS` exit after `KEEP_ALIVE` without work.
//!
//! The VM must not exit while a compile is under way: C++ exit handlers
//! free the compiler's global tables under it (a segfault in about one
//! script in five that ended during a compile). `compiles_wait_idle` lets
//! an orderly exit wait for the compile pool's jobs, queued or running,
//! and `on_halt` makes `erlang:halt/1` wait for them and for the run
//! pool's jobs (see `halt.rs`).

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use rustler::{Atom, Encoder, Env, OwnedEnv, Term};

use crate::error::{Error, NifResult};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Stack of a compile thread. Measured need (touched stack pages): 0.9 MiB
/// for a 3,000-step chain, 1.1 MiB for 100 nested `stablehlo.case`, 4.3 MiB
/// for 400 of them. It is reserved address space; only touched pages cost
/// memory.
const COMPILE_STACK: usize = 256 << 20;

/// Stack of a run thread: XLA:CPU runs small programs on the calling thread.
const RUN_STACK: usize = 16 << 20;

/// Stack of the drop thread: destructors do not recurse deeply.
const DROP_STACK: usize = 8 << 20;

/// Threads a pool keeps even when idle.
const CORE_THREADS: usize = 2;

/// How long a thread beyond `CORE_THREADS` waits for work before it exits.
const KEEP_ALIVE: Duration = Duration::from_secs(5);

mod atoms {
    rustler::atoms! { ok, error }
}

pub struct Pool {
    name: &'static str,
    stack_size: usize,
    max_threads: usize,
    /// Where its jobs are counted while queued or running (see the
    /// module's doc): `COMPILES_IN_FLIGHT` for the compile and
    /// serialization pools, `RUNS_IN_FLIGHT` for the run pool.
    in_flight: Option<&'static AtomicUsize>,
    jobs: Sender<Job>,
    queue: Receiver<Job>,
    counts: Mutex<Counts>,
}

/// `idle` threads are not running a job (waiting for one, or about to);
/// `queued` jobs are sent and not yet taken. All decisions to start or
/// stop a thread are taken under the one lock, so every queued job has a
/// thread that will take it, unless `max_threads` are busy.
#[derive(Default)]
struct Counts {
    threads: usize,
    idle: usize,
    queued: usize,
}

/// The pool for compiling programs.
pub fn compiles() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| compiler_pool("exla-compile"))
}

/// The pool for serializing and loading executables.
pub fn serializes() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| compiler_pool("exla-serialize"))
}

/// A pool of the compiler's work: big stacks, one thread per core (at
/// least two), and jobs that an orderly exit waits for.
fn compiler_pool(name: &'static str) -> Pool {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut pool = Pool::new(name, COMPILE_STACK, cores.max(2));
    pool.in_flight = Some(&COMPILES_IN_FLIGHT);
    pool
}

/// The pool for programs that may run long.
pub fn runs() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let mut pool = Pool::new("exla-run", RUN_STACK, usize::MAX);
        pool.in_flight = Some(&RUNS_IN_FLIGHT);
        pool
    })
}

/// The one thread that destroys values handed over by `OffThread`. One is
/// enough: it only frees memory, and the values wait in its queue meanwhile.
fn drops() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| Pool::new("exla-drop", DROP_STACK, 1))
}

/// Values that may be slow to destroy.
pub trait SlowToDrop: Send + 'static {
    /// Whether destroying this one is worth a trip to another thread (about
    /// a microsecond).
    fn slow_to_drop(&self) -> bool;
}

/// Owns a value and, when it is dropped, destroys the value on the drop
/// thread if it is slow to destroy, so that no scheduler thread waits for
/// it. The value is reached through `Deref`.
///
/// When the VM halts, values still queued are not destroyed: the process
/// ends, and the operating system takes their memory back; nothing runs
/// after exit but the destruction in progress, as for any native thread.
pub struct OffThread<T: SlowToDrop>(Option<T>);

impl<T: SlowToDrop> OffThread<T> {
    pub fn new(value: T) -> Self {
        OffThread(Some(value))
    }
}

impl<T: SlowToDrop> std::ops::Deref for OffThread<T> {
    type Target = T;

    fn deref(&self) -> &T {
        // Only `drop` takes the value out.
        self.0.as_ref().expect("a value is present until dropped")
    }
}

impl<T: SlowToDrop> Drop for OffThread<T> {
    fn drop(&mut self) {
        if let Some(value) = self.0.take() {
            if value.slow_to_drop() {
                // Should the thread fail to start, the job, and with it the
                // value, is dropped here instead.
                let _ = drops().submit(Box::new(move || drop(value)));
            }
        }
    }
}

impl Pool {
    fn new(name: &'static str, stack_size: usize, max_threads: usize) -> Pool {
        let (jobs, queue) = crossbeam_channel::unbounded();
        Pool {
            name,
            stack_size,
            max_threads,
            in_flight: None,
            jobs,
            queue,
            counts: Mutex::default(),
        }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job`, starting a thread for it when none is idle (and the
    /// pool may grow).
    pub fn submit(&'static self, job: Job) -> std::io::Result<()> {
        let job = match self.in_flight {
            Some(counter) => {
                let in_flight = InFlight::enter(counter);
                Box::new(move || {
                    let _in_flight = in_flight;
                    // The VM halts: no new work may start in the plugin,
                    // whose exit handlers are about to run.
                    if !exiting() {
                        job()
                    }
                }) as Job
            }
            None => job,
        };
        let mut counts = self.counts();
        if counts.queued >= counts.idle && counts.threads < self.max_threads {
            std::thread::Builder::new()
                .name(self.name.into())
                .stack_size(self.stack_size)
                .spawn(move || self.serve())?;
            counts.threads += 1;
            counts.idle += 1;
        }
        counts.queued += 1;
        // Cannot fail: the pool holds a receiver for as long as it lives.
        let _ = self.jobs.send(job);
        Ok(())
    }

    /// Runs `work` on this pool and hands its result to `deliver`, on the
    /// same thread. A panic in `work` becomes an internal error, so the
    /// waiting process always gets an answer. Returns at once.
    ///
    /// The thread counts itself idle before `deliver`: the process that
    /// gets the result may submit its next job at once, and this thread
    /// takes it (counted busy, it would start a new thread for it).
    pub fn run_then<T, F, D>(&'static self, work: F, deliver: D) -> NifResult<()>
    where
        F: FnOnce() -> NifResult<T> + Send + 'static,
        D: FnOnce(NifResult<T>) + Send + 'static,
    {
        self.submit(Box::new(move || {
            let result = catch_unwind(AssertUnwindSafe(work))
                .unwrap_or_else(|_| Err(Error::internal("the native work panicked")));
            self.counts().idle += 1;
            COUNTED_IDLE.set(true);
            deliver(result);
        }))
        .map_err(|e| Error::internal(format!("could not start a native thread: {e}")))
    }

    fn serve(&'static self) {
        loop {
            match self.queue.recv_timeout(KEEP_ALIVE) {
                Ok(job) => {
                    {
                        let mut counts = self.counts();
                        counts.idle -= 1;
                        counts.queued -= 1;
                    }
                    // A job catches its own panics; this keeps the thread
                    // alive should one escape.
                    let _ = catch_unwind(AssertUnwindSafe(job));
                    if !COUNTED_IDLE.replace(false) {
                        self.counts().idle += 1;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let mut counts = self.counts();
                    if counts.threads > CORE_THREADS && counts.idle > counts.queued {
                        counts.threads -= 1;
                        counts.idle -= 1;
                        return;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

thread_local! {
    /// Set by a pool thread's job once it has counted the thread idle
    /// (see `Pool::run_then`).
    static COUNTED_IDLE: Cell<bool> = const { Cell::new(false) };
}

/// Jobs of the compile and serialization pools queued or running.
static COMPILES_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Jobs of the run pool queued or running.
static RUNS_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Set once the VM halts (see `on_halt`).
static EXITING: AtomicBool = AtomicBool::new(false);

/// Whether the VM is halting: work not yet started is skipped, and host
/// callbacks stop waiting for the BEAM, which no longer answers.
pub fn exiting() -> bool {
    EXITING.load(Ordering::Acquire)
}

/// One job counted in a pool's counter until dropped (with the job, run
/// or not).
struct InFlight(&'static AtomicUsize);

impl InFlight {
    fn enter(counter: &'static AtomicUsize) -> InFlight {
        counter.fetch_add(1, Ordering::SeqCst);
        InFlight(counter)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Called as the VM halts, before the C++ exit handlers: no new job starts,
/// and the jobs running (compiles, serializations, runs) are waited for,
/// for at most `timeout`. A run waiting for a host callback ends at once
/// (its call site sees `exiting`), and so does a loop that checks its run
/// (see `cancel`). Returns whether all ended.
pub fn on_halt(timeout: Duration) -> bool {
    EXITING.store(true, Ordering::Release);
    wait_until_idle(&[&COMPILES_IN_FLIGHT, &RUNS_IN_FLIGHT], timeout)
}

/// Waits until no compile, serialization or deserialization is queued or
/// running, for at most `timeout_ms`; returns whether none is.
#[rustler::nif(schedule = "DirtyIo")]
fn compiles_wait_idle(timeout_ms: u64) -> bool {
    wait_until_idle(&[&COMPILES_IN_FLIGHT], Duration::from_millis(timeout_ms))
}

/// Polls: it only runs as the VM exits.
fn wait_until_idle(counters: &[&AtomicUsize], timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if counters.iter().all(|c| c.load(Ordering::SeqCst) == 0) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A result as the BEAM sees it: `{:ok, value}` or `{:error, {kind, message}}`.
pub fn encode_result<'a, T: Encoder>(env: Env<'a>, result: NifResult<T>) -> Term<'a> {
    match result {
        Ok(value) => (atoms::ok(), value).encode(env),
        Err(error) => (atoms::error(), error).encode(env),
    }
}

/// Runs `work` on `pool` and sends its result to the calling process as
/// `{reference, {:ok, value}}` or `{reference, {:error, {kind, message}}}`
/// (see `EXLA.NIF.async!/1`). Returns at once.
pub fn reply_later<T, F>(env: Env, pool: &'static Pool, reference: Term, work: F) -> NifResult<Atom>
where
    T: Encoder + Send + 'static,
    F: FnOnce() -> NifResult<T> + Send + 'static,
{
    let caller = env.pid();
    let mut owned = OwnedEnv::new();
    let reference = owned.save(reference);
    pool.run_then(work, move |result| {
        // A caller that died meanwhile drops the result (and so its buffers
        // or executable).
        let _ = owned.send_and_clear(&caller, |env| {
            (reference.load(env), encode_result(env, result)).encode(env)
        });
    })?;
    Ok(atoms::ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    fn leaked(max_threads: usize) -> &'static Pool {
        Box::leak(Box::new(Pool::new("exla-test", 1 << 20, max_threads)))
    }

    /// Waiting for a counted pool covers queued jobs and running ones, and
    /// gives up at the timeout.
    #[test]
    fn waits_for_counted_jobs_queued_or_running() {
        let counter: &'static AtomicUsize = Box::leak(Box::new(AtomicUsize::new(0)));
        let pool = Box::leak(Box::new(Pool::new("exla-test", 1 << 20, 1)));
        pool.in_flight = Some(counter);
        let done = Arc::new(AtomicUsize::new(0));
        for _ in 0..2 {
            let done = done.clone();
            pool.submit(Box::new(move || {
                std::thread::sleep(Duration::from_millis(100));
                done.fetch_add(1, Ordering::SeqCst);
            }))
            .unwrap();
        }
        assert!(!wait_until_idle(&[counter], Duration::from_millis(20)));
        assert!(wait_until_idle(&[counter], Duration::from_secs(10)));
        assert_eq!(done.load(Ordering::SeqCst), 2);
    }

    /// Sequential jobs, each submitted when the previous one's result has
    /// come, run on one thread: none starts while the last one delivers.
    #[test]
    fn sequential_jobs_reuse_one_thread() {
        let pool = leaked(usize::MAX);
        let (results, delivered) = crossbeam_channel::unbounded();
        for i in 0..200 {
            let results = results.clone();
            let submitted = pool.run_then(
                move || Ok(i),
                move |result| {
                    results.send(result).unwrap();
                },
            );
            assert!(submitted.is_ok());
            assert!(matches!(delivered.recv(), Ok(Ok(n)) if n == i));
        }
        assert_eq!(pool.counts().threads, 1);
    }

    /// Jobs that wait for each other all run: a busy pool starts threads.
    #[test]
    fn an_unbounded_pool_never_makes_a_job_wait() {
        let pool = leaked(usize::MAX);
        let barrier = Arc::new(Barrier::new(9));
        for _ in 0..8 {
            let barrier = barrier.clone();
            pool.submit(Box::new(move || {
                barrier.wait();
            }))
            .unwrap();
        }
        barrier.wait();
        assert_eq!(pool.counts().threads, 8);
    }

    /// A bounded pool runs at most `max_threads` jobs at once and queues
    /// the rest; every job runs.
    #[test]
    fn a_bounded_pool_queues_beyond_its_threads() {
        let pool = leaked(2);
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (done, finished) = crossbeam_channel::unbounded();
        for _ in 0..8 {
            let (running, most, done) = (running.clone(), most.clone(), done.clone());
            pool.submit(Box::new(move || {
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(20));
                running.fetch_sub(1, Ordering::SeqCst);
                done.send(()).unwrap();
            }))
            .unwrap();
        }
        for _ in 0..8 {
            finished.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        assert!(most.load(Ordering::SeqCst) <= 2);
        assert!(pool.counts().threads <= 2);
    }

    struct Tracked {
        slow: bool,
        dropped_on: Arc<std::sync::Mutex<Option<String>>>,
    }

    impl SlowToDrop for Tracked {
        fn slow_to_drop(&self) -> bool {
            self.slow
        }
    }

    impl Drop for Tracked {
        fn drop(&mut self) {
            let name = std::thread::current().name().unwrap_or("").to_string();
            *self.dropped_on.lock().unwrap() = Some(name);
        }
    }

    fn dropped_on(slow: bool) -> String {
        let dropped_on = Arc::new(std::sync::Mutex::new(None));
        let value = OffThread::new(Tracked {
            slow,
            dropped_on: dropped_on.clone(),
        });
        drop(value);
        for _ in 0..1000 {
            if let Some(name) = dropped_on.lock().unwrap().clone() {
                return name;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("the value was never dropped");
    }

    /// Slow values are destroyed on the drop thread, others in place.
    #[test]
    fn off_thread_destroys_slow_values_on_the_drop_thread() {
        assert_eq!(dropped_on(true), "exla-drop");
        assert_ne!(dropped_on(false), "exla-drop");
    }

    /// What `run_then` hands to `deliver` for `work`.
    fn delivered<T: Send + 'static>(
        work: impl FnOnce() -> NifResult<T> + Send + 'static,
    ) -> Result<T, pjrt::Error> {
        let (done, delivered) = crossbeam_channel::bounded(1);
        let started = leaked(1).run_then(work, move |result| {
            done.send(result.map_err(|e| e.0)).unwrap();
        });
        assert!(started.is_ok(), "the pool starts a thread");
        delivered.recv_timeout(Duration::from_secs(10)).unwrap()
    }

    /// A panic in the work reaches `deliver` as an internal error, a
    /// result as it is.
    #[test]
    fn run_then_delivers_a_panic_as_an_internal_error() {
        let panicked = delivered(|| -> NifResult<u32> { panic!("the work panicked") });
        assert!(matches!(panicked, Err(pjrt::Error::Pjrt { code: 13, .. })));
        assert_eq!(delivered(|| Ok(7)), Ok(7));
    }

    /// A job that panics leaves its thread serving.
    #[test]
    fn a_panicking_job_does_not_lose_its_thread() {
        let pool = leaked(1);
        pool.submit(Box::new(|| panic!("a job panicked"))).unwrap();
        let (done, finished) = crossbeam_channel::unbounded();
        pool.submit(Box::new(move || done.send(()).unwrap()))
            .unwrap();
        finished.recv_timeout(Duration::from_secs(10)).unwrap();
    }
}
