//! Native diagnostics: the NIF's `tracing` events, forwarded to Elixir's
//! `Logger` by the process `EXLA.NativeLog`.
//!
//! `Forwarder`, the process-wide subscriber, turns each enabled event into
//! a `Record` and puts it in a bounded queue; it never blocks the thread
//! that emits the event (a scheduler, a dirty scheduler, a compile or run
//! thread, a plugin's own thread): when the queue is full the event is
//! dropped and counted. The first event queued after the receiver last
//! drained the queue wakes it, through the `exla-log` thread (a scheduler
//! thread cannot send a message without its process's environment); the
//! receiver then takes the records with `native_log_drain` and logs them.
//!
//! Events below the level set by `native_log_level` are disabled at their
//! call site: `tracing` compares the event's level with a global maximum
//! (one relaxed atomic load) and goes no further, so a disabled event on
//! the per-call path costs no call, no allocation and no lock. The level
//! starts at warnings.
//!
//! Targets: `exla::plugin`, `exla::client`, `exla::compile`,
//! `exla::callback`, `exla::integrity`, `exla::run` (per call, trace) and
//! `exla::panic` (the panic hook, `report_panic`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{LazyLock, Mutex, OnceLock};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use rustler::{Atom, Encoder, Env, LocalPid, OwnedEnv, Term};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{span, Event, Level, Metadata, Subscriber};

/// Milliseconds since `started`, for diagnostics.
pub fn millis(started: std::time::Instant) -> f64 {
    // Whole microseconds read better in a log line than nanoseconds.
    started.elapsed().as_micros() as f64 / 1000.0
}

/// Records waiting for the receiver; beyond this, events are dropped.
const CAPACITY: usize = 1024;

/// Records handed to the receiver per drain: a short call on its scheduler.
const BATCH: usize = 256;

/// The level as a number: 0 off, 1 error, 2 warning, 3 info, 4 debug,
/// 5 trace.
static LEVEL: AtomicU8 = AtomicU8::new(2);

/// Events dropped because the queue was full, since the NIF was loaded.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Whether the receiver has been woken and has not drained since.
static WAKE_PENDING: AtomicBool = AtomicBool::new(false);

static RECEIVER: Mutex<Option<LocalPid>> = Mutex::new(None);

struct Queue {
    records: Sender<Record>,
    pending: Receiver<Record>,
}

static QUEUE: LazyLock<Queue> = LazyLock::new(|| {
    let (records, pending) = crossbeam_channel::bounded(CAPACITY);
    Queue { records, pending }
});

mod atoms {
    rustler::atoms! { ok, exla_native_log, error, warning, info, debug, trace }
}

/// A field's value as Elixir will see it.
enum Value {
    Int(i64),
    UInt(u64),
    Float(f64),
    Bool(bool),
    Text(String),
}

/// One event on its way to the receiver.
struct Record {
    level: Level,
    target: &'static str,
    message: String,
    fields: Vec<(&'static str, Value)>,
}

#[derive(Default)]
struct Fields {
    message: String,
    fields: Vec<(&'static str, Value)>,
}

impl Fields {
    fn push(&mut self, field: &Field, value: Value) {
        self.fields.push((field.name(), value));
    }
}

impl Visit for Fields {
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field, Value::Int(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push(field, Value::UInt(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.push(field, Value::Float(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field, Value::Bool(value));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.push(field, Value::Text(value.to_string()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.push(field, Value::Text(format!("{value:?}")));
        }
    }
}

fn level_filter(level: u8) -> LevelFilter {
    match level {
        0 => LevelFilter::OFF,
        1 => LevelFilter::ERROR,
        2 => LevelFilter::WARN,
        3 => LevelFilter::INFO,
        4 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

fn current_filter() -> LevelFilter {
    level_filter(LEVEL.load(Ordering::Relaxed))
}

/// The subscriber of the whole library; see the module documentation.
struct Forwarder;

impl Subscriber for Forwarder {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        // Cached per call site until the level changes (which rebuilds
        // every call site's interest).
        if self.enabled(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= current_filter()
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(current_filter())
    }

    fn event(&self, event: &Event<'_>) {
        let metadata = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        enqueue(Record {
            level: *metadata.level(),
            target: metadata.target(),
            message: fields.message,
            fields: fields.fields,
        });
    }

    // No spans are used; these keep the trait satisfied.
    fn new_span(&self, _span: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }

    fn record(&self, _span: &span::Id, _values: &span::Record<'_>) {}

    fn record_follows_from(&self, _span: &span::Id, _follows: &span::Id) {}

    fn enter(&self, _span: &span::Id) {}

    fn exit(&self, _span: &span::Id) {}
}

fn enqueue(record: Record) {
    match QUEUE.records.try_send(record) {
        Ok(()) => wake(false),
        Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Asks the `exla-log` thread to wake the receiver, unless a wake is
/// already on its way (`force` sends one anyway).
fn wake(force: bool) {
    if WAKE_PENDING.swap(true, Ordering::AcqRel) && !force {
        return;
    }
    // Full means a wake is already queued for the thread.
    let _ = waker().try_send(());
}

fn waker() -> &'static Sender<()> {
    static WAKER: OnceLock<Sender<()>> = OnceLock::new();
    WAKER.get_or_init(|| {
        let (wake, woken) = crossbeam_channel::bounded::<()>(1);
        let spawned = std::thread::Builder::new()
            .name("exla-log".into())
            .spawn(move || {
                while woken.recv().is_ok() {
                    wake_receiver();
                }
            });
        // Without the thread, records wait until the receiver drains them
        // on its own (see `EXLA.NativeLog.flush/0`).
        drop(spawned);
        wake
    })
}

fn wake_receiver() {
    let receiver = *RECEIVER.lock().unwrap_or_else(|e| e.into_inner());
    match receiver {
        Some(pid) => {
            let mut env = OwnedEnv::new();
            if env
                .send_and_clear(&pid, |env| atoms::exla_native_log().encode(env))
                .is_err()
            {
                WAKE_PENDING.store(false, Ordering::Release);
            }
        }
        // `native_log_attach` wakes the receiver once it exists.
        None => WAKE_PENDING.store(false, Ordering::Release),
    }
}

/// Reports a file or data that failed an integrity check (a warning on
/// target `exla::integrity`). `EXLA.NativeLog.integrity_failure/3` logs
/// the Elixir side's failures in the same shape.
pub fn integrity_failure(subject: &str, path: &str, reason: &str) {
    tracing::warn!(
        target: "exla::integrity",
        subject,
        path,
        reason,
        "integrity check failed"
    );
}

/// Installs the forwarder as the subscriber of every thread, and the panic
/// hook; called once, when the NIF library is loaded.
pub fn install() {
    // Fails only if a subscriber is set already, which keeps working.
    let _ = tracing::subscriber::set_global_default(Forwarder);
    std::panic::set_hook(Box::new(report_panic));
}

/// The panic hook of this library (each Rust library loaded in the VM has
/// its own copy of `std`, so this hook sees only EXLA's panics). Every
/// panic here is caught where it happens (a native thread's job, a host
/// callback's handler, rustler's wrapper of each NIF) and becomes an error
/// in Elixir; the hook reports it as an `exla::panic` error event, through
/// `Logger`, instead of writing it to the VM's stderr as Rust's default
/// hook does. It formats and queues one event, and writes nothing itself.
fn report_panic(info: &std::panic::PanicHookInfo<'_>) {
    let payload = info.payload();
    let reason = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a value that is not a string)");
    let location = info
        .location()
        .map(|l| format!("{}:{}", l.file(), l.line()))
        .unwrap_or_default();
    // Captured only where RUST_BACKTRACE (or RUST_LIB_BACKTRACE) asks.
    let backtrace = std::backtrace::Backtrace::capture();
    if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
        let backtrace = backtrace.to_string();
        tracing::error!(target: "exla::panic", reason, location, backtrace, "native code panicked");
    } else {
        tracing::error!(target: "exla::panic", reason, location, "native code panicked");
    }
}

impl Encoder for Value {
    fn encode<'a>(&self, env: Env<'a>) -> Term<'a> {
        match self {
            Value::Int(i) => i.encode(env),
            Value::UInt(u) => u.encode(env),
            Value::Float(f) => f.encode(env),
            Value::Bool(b) => b.encode(env),
            Value::Text(s) => s.encode(env),
        }
    }
}

fn level_atom(level: Level) -> Atom {
    match level {
        Level::ERROR => atoms::error(),
        Level::WARN => atoms::warning(),
        Level::INFO => atoms::info(),
        Level::DEBUG => atoms::debug(),
        Level::TRACE => atoms::trace(),
    }
}

impl Encoder for Record {
    fn encode<'a>(&self, env: Env<'a>) -> Term<'a> {
        // Field names are the static names written at the call sites: a
        // fixed set of atoms.
        let fields: Vec<Term<'a>> = self
            .fields
            .iter()
            .filter_map(|(name, value)| {
                let key = Atom::from_str(env, name).ok()?;
                Some((key, value).encode(env))
            })
            .collect();
        (
            level_atom(self.level),
            self.target,
            self.message.as_str(),
            fields,
        )
            .encode(env)
    }
}

/// Sets the level (0 off .. 5 trace) and re-evaluates every call site.
fn set_level(level: u8) {
    LEVEL.store(level.min(5), Ordering::Relaxed);
    tracing::callsite::rebuild_interest_cache();
}

/// Makes `receiver` the process that logs the events, at `level`, and
/// wakes it for the events queued meanwhile.
#[rustler::nif]
fn native_log_attach(receiver: LocalPid, level: u8) -> Atom {
    *RECEIVER.lock().unwrap_or_else(|e| e.into_inner()) = Some(receiver);
    set_level(level);
    wake(true);
    atoms::ok()
}

#[rustler::nif]
fn native_log_set_level(level: u8) -> Atom {
    set_level(level);
    atoms::ok()
}

#[rustler::nif]
fn native_log_dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Takes up to `BATCH` queued records: `{records, more?, dropped}`, where
/// `dropped` counts every event dropped so far.
#[rustler::nif]
fn native_log_drain() -> (Vec<Record>, bool, u64) {
    // Reset first: an event queued from here on wakes the receiver again.
    WAKE_PENDING.store(false, Ordering::Release);
    let records: Vec<Record> = QUEUE.pending.try_iter().take(BATCH).collect();
    let more = records.len() == BATCH;
    (records, more, DROPPED.load(Ordering::Relaxed))
}

/// Emits an event at `level` with `target` "exla::test" (test builds only):
/// the tests' way to reach every level and to fill the queue.
#[cfg(feature = "fault-injection")]
#[rustler::nif]
fn native_log_emit(level: u8, count: u64) -> Atom {
    for i in 0..count {
        match level {
            1 => tracing::error!(target: "exla::test", index = i, "test event"),
            2 => tracing::warn!(target: "exla::test", index = i, "test event"),
            3 => tracing::info!(target: "exla::test", index = i, "test event"),
            4 => tracing::debug!(target: "exla::test", index = i, "test event"),
            _ => tracing::trace!(target: "exla::test", index = i, "test event"),
        }
    }
    atoms::ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_to_filters() {
        assert_eq!(level_filter(0), LevelFilter::OFF);
        assert_eq!(level_filter(2), LevelFilter::WARN);
        assert_eq!(level_filter(5), LevelFilter::TRACE);
        assert_eq!(level_filter(9), LevelFilter::TRACE);
    }

    /// Events become records with their message apart from their fields;
    /// beyond the queue's capacity they are dropped and counted, and the
    /// emitting thread goes on.
    #[test]
    fn events_are_queued_then_dropped_when_the_queue_is_full() {
        tracing::subscriber::with_default(Forwarder, || {
            set_level(3);
            tracing::debug!(target: "exla::unit", "disabled");
            tracing::info!(target: "exla::unit", n = 3u64, path = "/x", ok = true, "hello {}", 1);
            let records: Vec<Record> = QUEUE.pending.try_iter().collect();
            assert_eq!(records.len(), 1);
            let record = &records[0];
            assert_eq!((record.level, record.target), (Level::INFO, "exla::unit"));
            assert_eq!(record.message, "hello 1");
            assert!(matches!(
                record.fields[..],
                [("n", Value::UInt(3)), ("path", Value::Text(ref p)), ("ok", Value::Bool(true))]
                    if p == "/x"
            ));

            let dropped = DROPPED.load(Ordering::Relaxed);
            for i in 0..CAPACITY + 10 {
                tracing::warn!(target: "exla::unit", i, "filling");
            }
            assert_eq!(DROPPED.load(Ordering::Relaxed), dropped + 10);
            assert_eq!(QUEUE.pending.try_iter().count(), CAPACITY);
            set_level(2);
        });
    }
}
