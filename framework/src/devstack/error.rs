//! The dev stack's error type.

use std::time::Duration;

/// Errors of the dev stack.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DevStackError {
    /// A server binary is not installed.
    #[error("`{binary}` not found ({package}); run `scripts/setup.sh` to install it")]
    MissingBinary {
        /// The binary that was looked for.
        binary: String,
        /// The Debian package that provides it.
        package: &'static str,
    },
    /// An I/O operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A server did not become ready in time.
    #[error(
        "{server} did not become ready within {timeout:?}: {last_error} (log: {log})\n\
         last lines of its log:\n{log_tail}"
    )]
    NotReady {
        /// Which server.
        server: String,
        /// How long we waited.
        timeout: Duration,
        /// The last error seen while probing it.
        last_error: String,
        /// The server's log file.
        log: String,
        /// The last lines of that log.
        log_tail: String,
    },
    /// A server exited while the stack waited for it to become ready.
    #[error("{server} exited while starting; last lines of its log:\n{log_tail}")]
    Exited {
        /// Which server process (`etcd-0`, `nats`, `postgres`).
        server: String,
        /// The last lines of its log.
        log_tail: String,
    },
    /// A command (initdb) failed.
    #[error("`{command}` failed: {output}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Its combined output.
        output: String,
    },
    /// An etcd membership change was refused, or asked for something the
    /// cluster cannot do.
    #[error("etcd {what}: {detail}")]
    Membership {
        /// The change (`member add`, `remove member 2`).
        what: String,
        /// etcd's last answer, or why the change cannot be made.
        detail: String,
    },
    /// Fault injection on a process that is not running.
    #[error("{0} is not running")]
    NotRunning(String),
    /// A combination of options the dev stack does not offer.
    #[error("the dev stack does not offer {0}")]
    Unsupported(String),
    /// A server was asked for whose client this build of tenure lacks.
    #[error("the dev stack's {server} needs tenure's `{feature}` feature")]
    MissingFeature {
        /// Which server.
        server: &'static str,
        /// The cargo feature of `tenure` that brings its client.
        feature: &'static str,
    },
}

impl DevStackError {
    /// Whether a server could not bind its port because another process took
    /// it after the stack chose it: starting again with new ports helps.
    pub fn is_port_clash(&self) -> bool {
        matches!(self, DevStackError::Exited { log_tail, .. }
            if log_tail.to_ascii_lowercase().contains("address already in use"))
    }

    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        DevStackError::Io {
            what: what.into(),
            source,
        }
    }
}
