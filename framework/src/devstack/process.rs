//! One server process the dev stack started, with fault injection.
//!
//! Every server runs in a process group of its own that the dev stack creates
//! (`process_group(0)`), so signals reach the server and nothing else. Children
//! that leave that group (PostgreSQL backends call `setsid()`) are signalled
//! one by one as the direct children of the server. Servers are spawned through
//! `setpriv --pdeathsig KILL` from one long-lived spawner thread, so they die with
//! the process that started them even when it crashes and no `Drop` runs.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use super::DevStackError;

/// How to (re)start a server: program, arguments and the user to run it as.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) name: String,
    pub(crate) program: PathBuf,
    pub(crate) args: Vec<String>,
    /// Run as this user (`setpriv --reuid/--regid`); `None` keeps the current user.
    pub(crate) run_as: Option<(u32, u32)>,
    pub(crate) log: PathBuf,
}

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

/// The spawner thread lives as long as the process: `PR_SET_PDEATHSIG` fires when
/// the *thread* that forked a child exits, so children must not be forked from
/// short-lived test or blocking-pool threads.
fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("tenure-devstack-spawner".into())
            .spawn(move || {
                while let Ok((mut cmd, reply)) = rx.recv() {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .map(|_| ())
            .unwrap_or_else(
                |e| tracing::error!(error = %e, "cannot start the devstack spawner thread"),
            );
        Mutex::new(tx)
    })
}

fn spawn_on_spawner(cmd: Command) -> std::io::Result<Child> {
    let (tx, rx) = mpsc::channel();
    let sent = spawner()
        .lock()
        .map_err(|_| std::io::Error::other("devstack spawner lock poisoned"))?
        .send((cmd, tx));
    sent.map_err(|_| std::io::Error::other("devstack spawner thread is gone"))?;
    rx.recv()
        .map_err(|_| std::io::Error::other("devstack spawner thread is gone"))?
}

/// A server process owned by a [`DevStack`](super::DevStack).
///
/// Fault injection acts on the server's own process group only.
#[derive(Debug)]
pub struct ServerProcess {
    spec: Spec,
    child: Mutex<Option<Child>>,
}

impl ServerProcess {
    pub(crate) fn start(spec: Spec) -> Result<Self, DevStackError> {
        let proc = ServerProcess {
            spec,
            child: Mutex::new(None),
        };
        proc.spawn()?;
        Ok(proc)
    }

    fn spawn(&self) -> Result<(), DevStackError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.spec.log)
            .map_err(|e| DevStackError::io(format!("open log {}", self.spec.log.display()), e))?;
        let log2 = log
            .try_clone()
            .map_err(|e| DevStackError::io("clone log handle", e))?;
        let mut cmd = setpriv(self.spec.run_as);
        cmd.args(["--pdeathsig", "KILL", "--"])
            .arg(&self.spec.program)
            .args(&self.spec.args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log2));
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = spawn_on_spawner(cmd).map_err(|e| {
            DevStackError::io(
                format!("spawn {} ({})", self.spec.name, self.spec.program.display()),
                e,
            )
        })?;
        *self.lock() = Some(child);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        self.child.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The server's name in this stack, e.g. `etcd-1`, `nats`, `postgres`.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The pid of the running server (also its process group id), if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.lock().as_ref().map(Child::id)
    }

    /// Whether the process is still alive (not exited, not killed).
    pub fn is_running(&self) -> bool {
        let mut guard = self.lock();
        match guard.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The server's log file (stdout and stderr).
    pub fn log_path(&self) -> &std::path::Path {
        &self.spec.log
    }

    fn signal(&self, sig: Signal) -> Result<(), DevStackError> {
        let pid = self
            .pid()
            .ok_or_else(|| DevStackError::NotRunning(self.spec.name.clone()))?;
        let pgid = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
        killpg(pgid, sig).map_err(|e| {
            DevStackError::io(
                format!("signal {sig} to {}", self.spec.name),
                std::io::Error::from_raw_os_error(e as i32),
            )
        })
    }

    /// Freezes the server (SIGSTOP to its process group and to the processes it
    /// forked that left the group): it keeps its sockets open but answers
    /// nothing, not even on connections opened before, like a GC pause or a VM
    /// suspend.
    ///
    /// PostgreSQL's backends call `setsid()`, so a signal to the postmaster's
    /// group alone would leave every open connection answering.
    ///
    /// # Errors
    /// [`DevStackError::NotRunning`] if it was killed.
    pub fn pause(&self) -> Result<(), DevStackError> {
        // Group first: a stopped server forks no more children, so the list
        // read afterwards is complete.
        self.signal(Signal::SIGSTOP)?;
        self.signal_children(Signal::SIGSTOP);
        Ok(())
    }

    /// Thaws a paused server (SIGCONT to the processes [`pause`](Self::pause)
    /// stopped).
    ///
    /// # Errors
    /// [`DevStackError::NotRunning`] if it was killed.
    pub fn resume(&self) -> Result<(), DevStackError> {
        self.signal_children(Signal::SIGCONT);
        self.signal(Signal::SIGCONT)
    }

    /// Sends `sig` to the server's direct children; those that exited in the
    /// meantime are skipped.
    fn signal_children(&self, sig: Signal) {
        if let Some(pid) = self.pid() {
            for child in children_of(pid) {
                let _ = nix::sys::signal::kill(child, sig);
            }
        }
    }

    /// Kills the server at once (SIGKILL to its process group and to the
    /// processes it forked that left the group) and reaps it. Returns once those
    /// processes are gone, so a [`restart`](Self::restart) never meets them.
    /// Killing a server that is not running is a no-op.
    ///
    /// # Errors
    /// Only if the signal cannot be sent for another reason than "already gone".
    pub fn kill(&self) -> Result<(), DevStackError> {
        let mut guard = self.lock();
        if let Some(mut child) = guard.take() {
            let pgid = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
            // PostgreSQL's backends call setsid(): not in the server's process
            // group, they outlive a killpg for a moment and hold the shared memory
            // segment, and a restart in that moment fails with "pre-existing
            // shared memory block is still in use". Kill them too, and wait.
            let orphans = children_of(child.id());
            // A stopped process group still dies of SIGKILL.
            let _ = killpg(pgid, Signal::SIGKILL);
            for pid in &orphans {
                let _ = nix::sys::signal::kill(*pid, Signal::SIGKILL);
            }
            let _ = child.kill();
            let _ = child.wait();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while orphans.iter().any(|p| is_alive(*p)) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        Ok(())
    }

    /// Kills the server (if running) and starts it again with the same ports and
    /// data directory.
    ///
    /// # Errors
    /// If the process cannot be spawned again.
    pub fn restart(&self) -> Result<(), DevStackError> {
        self.kill()?;
        self.spawn()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// The direct children of `pid` (Linux `/proc/<pid>/task/<pid>/children`; empty
/// where that file is unavailable).
fn children_of(pid: u32) -> Vec<Pid> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|s| s.parse::<i32>().ok())
        .map(Pid::from_raw)
        .collect()
}

/// Whether `pid` exists and is not a zombie (a zombie holds no memory).
fn is_alive(pid: Pid) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// A `setpriv` command that runs what follows as `run_as` (`uid`, `gid`, with
/// its groups), or as the current user for `None`.
pub(super) fn setpriv(run_as: Option<(u32, u32)>) -> Command {
    let mut cmd = Command::new("setpriv");
    if let Some((uid, gid)) = run_as {
        cmd.args([
            "--reuid",
            &uid.to_string(),
            "--regid",
            &gid.to_string(),
            "--init-groups",
        ]);
    }
    cmd
}
