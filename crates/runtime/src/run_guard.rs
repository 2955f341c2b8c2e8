//! Stops an ONNX Runtime run whose memory outgrows its limit while it runs.
//!
//! The memory plan is made before anything runs, from the reference's shapes. A candidate whose
//! data-dependent shapes grow (an FP16 overflow that lengthens a duration, so a sequence and every
//! tensor after it) computes more than was planned: a 3,614-node text-to-speech model grew 11x and
//! the kernel killed the process at 24 GB, with no report and no message. Here one watcher thread
//! reads the process's resident memory every few milliseconds while any run is under way, and asks
//! ONNX Runtime to end a run whose growth since it started passes the limit
//! (`RunOptions::terminate`: the run ends before its next node). A single node that allocates far
//! beyond the limit at once is not stopped inside that node; the up-front check (`check_memory`)
//! refuses what the plan already knows is too large.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use ort::session::{RunOptions, SelectedOutputMarker};

use crate::RuntimeError;

/// Memory that ONNX Runtime takes for itself in a run beyond the tensors it computes (arena chunks,
/// kernels' scratch, thread stacks touched for the first time), allowed above `--max-memory`.
pub const WORKING_MEMORY: u64 = 128 << 20;

/// The share of the memory available when a run starts that it may take where no limit is set.
const AVAILABLE_SHARE: f64 = 0.9;

/// How often the watcher reads the process's memory while a run is under way.
const POLL: Duration = Duration::from_millis(5);

/// Most growth of the process during one run, in bytes; 0: the share of the available memory.
static LIMIT: AtomicU64 = AtomicU64::new(0);

/// Sets the most a run may grow the process (`--max-memory` plus [`WORKING_MEMORY`]); `None`: 90%
/// of the memory available when each run starts.
pub fn set_limit(max_memory: Option<u64>) {
    LIMIT.store(max_memory.map_or(0, |m| m.saturating_add(WORKING_MEMORY).max(1)), Ordering::Relaxed);
}

/// Why a guarded run failed.
#[derive(Debug)]
pub(crate) enum RunError {
    Ort(ort::Error),
    /// Stopped by the watcher: its message says how far it grew and against what limit.
    Memory(String),
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Ort(e) => write!(f, "{e}"),
            RunError::Memory(why) => f.write_str(why),
        }
    }
}

impl From<ort::Error> for RunError {
    fn from(e: ort::Error) -> RunError {
        RunError::Ort(e)
    }
}

impl RunError {
    /// The runtime error of a run of `backend` (a stop for memory is named by the caller's side).
    pub(crate) fn into_runtime(self, backend: &str) -> RuntimeError {
        match self {
            RunError::Ort(e) => RuntimeError::Ort { backend: backend.to_string(), why: format!("run failed: {e}") },
            RunError::Memory(why) => RuntimeError::Memory(why),
        }
    }
}

/// A run being watched.
struct Watched {
    id: u64,
    start_rss: u64,
    limit: u64,
    /// Why the limit: for the message.
    limit_from: String,
    terminate: Terminate,
    /// The growth seen when the run was stopped (0 while it was not).
    stopped_at: u64,
}

/// What the watcher calls to end a run: the run's options, and the function that sets their
/// terminate flag (for the options' type).
struct Terminate {
    options: *const (),
    call: unsafe fn(*const ()),
}

/// Sets the terminate flag of the `RunOptions<O>` that `options` points to.
///
/// # Safety
/// `options` points to a live `RunOptions<O>`.
unsafe fn terminate<O: SelectedOutputMarker>(options: *const ()) {
    // An error here (none is documented) leaves the run to finish; nothing else can be done.
    let _ = unsafe { &*(options as *const RunOptions<O>) }.terminate();
}

// SAFETY: the pointer is only dereferenced by the watcher while the run is registered, and
// `guarded` removes the registration (under the same lock) before the run options are dropped;
// ONNX Runtime's terminate flag exists to be set from another thread.
unsafe impl Send for Terminate {}

static WATCHED: Mutex<Vec<Watched>> = Mutex::new(Vec::new());
static WATCHER: OnceLock<std::thread::Thread> = OnceLock::new();
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The process's resident memory in bytes (`/proc/self/statm`), where the system tells it.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096))
}

fn watcher() -> &'static std::thread::Thread {
    WATCHER.get_or_init(|| {
        std::thread::Builder::new()
            .name("layerwise-memory-watch".into())
            .spawn(|| loop {
                let idle = {
                    let mut watched = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
                    if !watched.is_empty() {
                        if let Some(rss) = resident_bytes() {
                            for w in watched.iter_mut().filter(|w| w.stopped_at == 0) {
                                let growth = rss.saturating_sub(w.start_rss);
                                if growth > w.limit {
                                    w.stopped_at = growth;
                                    // SAFETY: see `Terminate`.
                                    unsafe { (w.terminate.call)(w.terminate.options) };
                                }
                            }
                        }
                    }
                    watched.is_empty()
                };
                if idle {
                    std::thread::park();
                } else {
                    std::thread::sleep(POLL);
                }
            })
            .expect("the memory watcher thread starts")
            .thread()
            .clone()
    })
}

/// Runs `run` with `options`, stopping it where the process grows past the limit while it runs.
pub(crate) fn guarded<O: SelectedOutputMarker, R>(
    options: RunOptions<O>,
    run: impl FnOnce(&RunOptions<O>) -> ort::Result<R>,
) -> Result<R, RunError> {
    let Some(start_rss) = resident_bytes() else { return run(&options).map_err(RunError::Ort) };
    let (limit, limit_from) = match LIMIT.load(Ordering::Relaxed) {
        0 => match layerwise_model::tensor::available_memory() {
            Some(available) => (
                (available as f64 * AVAILABLE_SHARE) as u64,
                format!(
                    "{:.0}% of the {} of memory available when it started, when this process already held {}",
                    AVAILABLE_SHARE * 100.0,
                    layerwise_model::tensor::size(available),
                    layerwise_model::tensor::size(start_rss)
                ),
            ),
            None => return run(&options).map_err(RunError::Ort),
        },
        limit => (
            limit,
            format!(
                "--max-memory {} plus {} of ONNX Runtime's own working memory",
                layerwise_model::tensor::size(limit.saturating_sub(WORKING_MEMORY)),
                layerwise_model::tensor::size(WORKING_MEMORY)
            ),
        ),
    };
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    WATCHED.lock().unwrap_or_else(|e| e.into_inner()).push(Watched {
        id,
        start_rss,
        limit,
        limit_from,
        terminate: Terminate { options: &options as *const RunOptions<O> as *const (), call: terminate::<O> },
        stopped_at: 0,
    });
    watcher().unpark();
    let result = run(&options);
    let watched = {
        let mut all = WATCHED.lock().unwrap_or_else(|e| e.into_inner());
        let at = all.iter().position(|w| w.id == id).expect("a run stays registered until it ends");
        all.swap_remove(at)
    };
    drop(options);
    match result {
        // A run may end on its own just as it is stopped: its results are whole.
        Ok(r) => Ok(r),
        Err(_) if watched.stopped_at > 0 => Err(RunError::Memory(format!(
            "the run was stopped while it ran: it grew the process by {} (from {} resident), past its limit of {} ({}). The memory plan is made before anything runs, and tensors whose shapes depend on the data (a length or count computed from values) can outgrow it; give --max-memory more if this growth is expected. Nothing was written",
            layerwise_model::tensor::size(watched.stopped_at),
            layerwise_model::tensor::size(watched.start_rss),
            layerwise_model::tensor::size(watched.limit),
            watched.limit_from,
        ))),
        Err(e) => Err(RunError::Ort(e)),
    }
}
