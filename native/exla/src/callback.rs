//! Host callbacks for the BEAM: sessions that connect the custom calls of a
//! running program (`pjrt::host_callback`) with Elixir processes.
//!
//! A session belongs to one *owner* process. A call site without results
//! (hooks, stream outputs) sends `{:exla_callback, id, site, [binary]}` to
//! the owner and returns at once. A call site with results (stream input)
//! waits for a chunk pushed with `callback_push/2` (from any process) or a
//! done marker (`callback_done/2`); it writes `1` (or `0` when done) in its
//! first result and the chunk's binaries in the others.
//!
//! Programs with callbacks never run on a scheduler thread: `callback_run`
//! hands them to the native threads of `pool::runs()`,
//! which runs them, waits for the outputs and sends
//! `{:exla_run, id, {:ok, buffers} | {:error, {kind, message}}}` to the
//! owner. A waiting call site checks every 50 ms whether the session was
//! closed (the owner died, or `callback_close/1`), so nothing waits forever.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use rustler::{Atom, Binary, Encoder, Env, LocalPid, Monitor, OwnedBinary, OwnedEnv, ResourceArc};

use crate::buffer::BufferResource;
use crate::client::ClientResource;
use crate::error::{Error, NifResult};
use crate::executable::ExecutableResource;

mod atoms {
    rustler::atoms! { ok, exla_callback, exla_run }
}

enum Chunk {
    Data(Vec<Vec<u8>>),
    Done,
}

struct BeamCallback {
    owner: LocalPid,
    id: Mutex<u64>,
    input: Receiver<Chunk>,
    closed: AtomicBool,
    /// A panic armed by `callback_inject_panic` (test builds only).
    #[cfg(feature = "fault-injection")]
    fault: crate::fault::Slot,
}

const POLL: Duration = Duration::from_millis(50);

impl BeamCallback {
    fn send_to_owner<F>(&self, build: F) -> Result<(), String>
    where
        F: for<'a> FnOnce(Env<'a>, u64) -> rustler::Term<'a>,
    {
        let id = *self.id.lock().unwrap_or_else(|e| e.into_inner());
        let mut env = OwnedEnv::new();
        env.send_and_clear(&self.owner, |env| build(env, id))
            .map_err(|_| {
                // No one is left to serve the session.
                self.closed.store(true, Ordering::Release);
                "the process receiving host callbacks is gone".to_string()
            })
    }

    fn receive(&self, rets: &mut [pjrt::host_callback::RetView<'_>]) -> Result<(), String> {
        let chunk = loop {
            if self.closed.load(Ordering::Acquire) {
                return Err("the stream was closed".into());
            }
            // No one will answer once the VM halts; the run must end for
            // the halt to go on (see `pool::on_halt`).
            if crate::pool::exiting() {
                return Err("the VM is halting".into());
            }
            match self.input.recv_timeout(POLL) {
                Ok(chunk) => break chunk,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return Err("the stream was closed".into()),
            }
        };
        let (flag, data) = rets
            .split_first_mut()
            .ok_or("a receiving call site needs a flag result")?;
        match chunk {
            Chunk::Done => {
                flag.bytes.fill(0);
                for ret in data {
                    ret.bytes.fill(0);
                }
            }
            Chunk::Data(parts) => {
                if parts.len() != data.len() {
                    return Err(format!(
                        "a stream chunk has {} tensors, the program expects {}",
                        parts.len(),
                        data.len()
                    ));
                }
                for (part, ret) in parts.iter().zip(data.iter_mut()) {
                    if part.len() != ret.bytes.len() {
                        return Err(format!(
                            "a stream chunk tensor has {} bytes, the program expects {}",
                            part.len(),
                            ret.bytes.len()
                        ));
                    }
                    ret.bytes.copy_from_slice(part);
                }
                flag.bytes.fill(0);
                if let Some(first) = flag.bytes.first_mut() {
                    *first = 1;
                }
            }
        }
        Ok(())
    }
}

impl pjrt::host_callback::HostCallback for BeamCallback {
    fn call(
        &self,
        site: u32,
        args: &[pjrt::host_callback::ArgView<'_>],
        rets: &mut [pjrt::host_callback::RetView<'_>],
    ) -> Result<(), String> {
        self.serve(site, args, rets).inspect_err(|error| {
            // The run fails with this error; a closed session (or a dead
            // owner, which closes it) is an expected end, anything else a
            // fault to see.
            if self.closed.load(Ordering::Acquire) {
                tracing::debug!(target: "exla::callback", site, error, "host callback refused: the session is closed");
            } else {
                tracing::warn!(target: "exla::callback", site, error, "host callback failed");
            }
        })
    }
}

impl BeamCallback {
    fn serve(
        &self,
        site: u32,
        args: &[pjrt::host_callback::ArgView<'_>],
        rets: &mut [pjrt::host_callback::RetView<'_>],
    ) -> Result<(), String> {
        #[cfg(feature = "fault-injection")]
        self.fault
            .fire(crate::fault::Fault::Handler, "the host callback handler");
        if !rets.is_empty() {
            return self.receive(rets);
        }
        if self.closed.load(Ordering::Acquire) {
            return Err("the host callback session was closed".into());
        }
        self.send_to_owner(|env, id| {
            let binaries: Vec<rustler::Term> = args
                .iter()
                .map(|arg| {
                    let mut bin = OwnedBinary::new(arg.bytes.len()).expect("binary allocation");
                    bin.as_mut_slice().copy_from_slice(arg.bytes);
                    bin.release(env).encode(env)
                })
                .collect();
            (atoms::exla_callback(), id, site, binaries).encode(env)
        })
    }
}

/// A session as the BEAM sees it. Dropping it (or its owner dying) closes
/// the session and unregisters it, so a running program fails at its next
/// callback instead of waiting.
pub struct SessionResource {
    callback: Arc<BeamCallback>,
    input: Mutex<Input>,
    session: Mutex<Option<pjrt::host_callback::Session>>,
}

/// The sending side of a session's input queue. One lock orders pushes and
/// the done marker, so `callback_done/2` sees every chunk queued before it
/// and no chunk is queued after it.
struct Input {
    /// `None` once the session is closed.
    queue: Option<Sender<Chunk>>,
    /// Data chunks queued so far.
    pushed: u64,
    /// Whether the done marker is queued.
    done: bool,
}

/// The error for a push to a session that no longer takes input: a failed
/// precondition of the runtime, not bad input.
fn no_input(why: &str) -> Error {
    Error(pjrt::Error::Pjrt {
        code: 9,
        message: format!("the stream {why}"),
    })
}

impl SessionResource {
    fn close(&self) {
        self.callback.closed.store(true, Ordering::Release);
        self.input().queue.take();
        self.session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
    }

    fn input(&self) -> std::sync::MutexGuard<'_, Input> {
        self.input.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, parts: Vec<Vec<u8>>) -> NifResult<Atom> {
        #[cfg(feature = "fault-injection")]
        self.callback.fault.fire(
            crate::fault::Fault::Reply,
            "the NIF replying to a host callback",
        );
        let mut input = self.input();
        if input.done {
            return Err(no_input("is done"));
        }
        match input.queue.as_ref().map(|tx| tx.send(Chunk::Data(parts))) {
            Some(Ok(())) => {
                input.pushed += 1;
                Ok(atoms::ok())
            }
            _ => Err(no_input("is closed")),
        }
    }

    /// Queues the done marker unless some of the chunks pushed so far have
    /// not been answered (`received` counts the answers the owner took);
    /// returns how many are still unanswered (0 when the marker is queued).
    fn done(&self, received: u64) -> NifResult<u64> {
        let mut input = self.input();
        let pending = input.pushed.saturating_sub(received);
        if input.done || pending > 0 {
            return Ok(pending);
        }
        match input.queue.as_ref().map(|tx| tx.send(Chunk::Done)) {
            Some(Ok(())) => {
                input.done = true;
                Ok(0)
            }
            _ => Err(no_input("is closed")),
        }
    }
}

#[rustler::resource_impl]
impl rustler::Resource for SessionResource {
    const IMPLEMENTS_DOWN: bool = true;

    fn down<'a>(&'a self, _env: Env<'a>, _pid: LocalPid, _monitor: Monitor) {
        self.close();
    }
}

impl Drop for SessionResource {
    fn drop(&mut self) {
        self.close();
    }
}

/// The FFI target of the host-callback custom calls `EXLA.Defn.Lowering.HostCalls` emits.
const TARGET: &str = "exla_host_callback";

/// Registers the callback handler with the client's plugin, for the
/// client's platform; must run before compiling a program that uses it.
#[rustler::nif]
fn callback_install(client: ResourceArc<ClientResource>) -> NifResult<Atom> {
    pjrt::host_callback::install(
        client.handle.plugin(),
        client.handle.platform_name(),
        TARGET,
    )?;
    Ok(atoms::ok())
}

/// Opens a session owned by `owner`; returns `{session, id}`.
#[rustler::nif]
fn callback_session(env: Env, owner: LocalPid) -> (ResourceArc<SessionResource>, u64) {
    let (tx, rx) = crossbeam_channel::unbounded();
    let callback = Arc::new(BeamCallback {
        owner,
        id: Mutex::new(0),
        input: rx,
        closed: AtomicBool::new(false),
        #[cfg(feature = "fault-injection")]
        fault: crate::fault::Slot::armed_for(owner),
    });
    let session = pjrt::host_callback::register_session(callback.clone());
    let id = session.id();
    *callback.id.lock().unwrap_or_else(|e| e.into_inner()) = id;
    let resource = ResourceArc::new(SessionResource {
        callback,
        input: Mutex::new(Input {
            queue: Some(tx),
            pushed: 0,
            done: false,
        }),
        session: Mutex::new(Some(session)),
    });
    let _ = resource.monitor(Some(env), &owner);
    (resource, id)
}

/// Queues one input chunk (one binary per tensor) for the session.
#[rustler::nif]
fn callback_push(session: ResourceArc<SessionResource>, chunk: Vec<Binary>) -> NifResult<Atom> {
    session.push(chunk.iter().map(|b| b.as_slice().to_vec()).collect())
}

/// Queues the done marker (the next receiving call site reports no data)
/// once the owner has taken an answer for each chunk pushed: `received`
/// is how many it took. Returns how many chunks are still unanswered; the
/// marker is queued only when that is 0.
#[rustler::nif]
fn callback_done(session: ResourceArc<SessionResource>, received: u64) -> NifResult<u64> {
    session.done(received)
}

#[rustler::nif]
fn callback_close(session: ResourceArc<SessionResource>) -> Atom {
    session.close();
    atoms::ok()
}

/// Number of open sessions in the process (for leak checks).
#[rustler::nif]
fn callback_session_count() -> usize {
    pjrt::host_callback::session_count()
}

/// Runs `executable` on a thread of the execution pool; the result comes
/// back as a message to the session's owner. With `checked`, the program
/// takes a run id last and stops once the calling process is gone (see
/// `cancel`).
#[rustler::nif]
fn callback_run(
    env: Env,
    executable: ResourceArc<ExecutableResource>,
    session: ResourceArc<SessionResource>,
    arguments: Vec<ResourceArc<BufferResource>>,
    donatable: Vec<usize>,
    checked: bool,
) -> NifResult<Atom> {
    let callback = session.callback.clone();
    let watched = crate::executable::watch_caller(env, checked);
    crate::pool::runs().run_then(
        move || {
            let watched = watched.as_ref();
            crate::executable::run_and_wait(&executable, &arguments, &donatable, watched)
        },
        move |result| {
            // The session stays alive until the result is delivered.
            let _keep = &session;
            let sent = callback.send_to_owner(|env, id| {
                let payload = crate::pool::encode_result(env, result);
                (atoms::exla_run(), id, payload).encode(env)
            });
            if let Err(error) = sent {
                tracing::debug!(target: "exla::callback", error, "the result of a run was dropped");
            }
        },
    )?;
    Ok(atoms::ok())
}
