//! Devices of other processes and machines: a `worker` (`examples/worker.rs`) serves its local
//! device over Burn's remote backend (WebSocket), and [`remote_device`] turns the worker's
//! address and token into an ordinary [`Device`] that tensors, models and every engine use
//! unchanged (Burn ships each op to the worker; only reads come back).
//!
//! Address syntax: `ws://HOST:PORT` for the worker's first device, `ws://HOST:PORT#INDEX` for
//! device `INDEX` (from 0) of a worker hosting several. Write the host exactly as every other
//! worker can reach it: a tensor moved between two workers is downloaded by the target worker
//! from the source worker at that address, and Burn tells servers apart by the host string as
//! written (`localhost` and `127.0.0.1` count as two).

use std::time::Duration;

use burn::tensor::Device;

/// Environment variable read for the worker token when none is passed (`--worker-token` on the
/// client, `--token` on the worker).
pub const WORKER_TOKEN_ENV: &str = "BURN_LLM_WORKER_TOKEN";

/// How long [`remote_device`] waits for a worker's answer before giving up. Longer than the
/// ≈16 s Burn spends retrying a refused connection before it reports the worker unreachable
/// (`burn-remote-0.22.1/src/client/service/conn.rs`, `OPEN_RETRY_DELAYS`), so that answer comes
/// first; this bound catches a worker that accepts the connection and never answers.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a worker's device could not be connected. Each message names the worker and what to do.
#[derive(Debug, thiserror::Error)]
pub enum RemoteDeviceError {
    /// The address is not `ws://HOST:PORT[#INDEX]`.
    #[error(
        "`{address}` is not a worker address ({problem}): write ws://HOST:PORT, or ws://HOST:PORT#INDEX for device INDEX of the worker"
    )]
    Address {
        /// What was given.
        address: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// Nothing answered at the address.
    #[error(
        "worker {worker} is unreachable ({reason}): start it there (`cargo run --release --example worker -- --listen HOST:PORT --token TOKEN`) or fix the address"
    )]
    Unreachable {
        /// The worker's address.
        worker: String,
        /// Burn's reason.
        reason: String,
    },
    /// The worker refused the token (or its absence).
    #[error(
        "worker {worker} refused the token: pass the token the worker was started with (--worker-token or {WORKER_TOKEN_ENV})"
    )]
    Unauthorized {
        /// The worker's address.
        worker: String,
    },
    /// The worker does not host the device index asked for.
    #[error("worker {worker} has no device #{index}: it hosts {count} (#0 to #{})", count.saturating_sub(1))]
    NoSuchDevice {
        /// The worker's address.
        worker: String,
        /// Index asked for.
        index: usize,
        /// Devices the worker hosts.
        count: usize,
    },
    /// The worker accepted the connection but did not answer in time.
    #[error("worker {worker} did not answer within {}s: check that it is running and not stalled", CONNECT_TIMEOUT.as_secs())]
    Timeout {
        /// The worker's address.
        worker: String,
    },
    /// Any other refusal (protocol version, handshake).
    #[error("cannot connect to worker {worker}: {reason}")]
    Connect {
        /// The worker's address.
        worker: String,
        /// Burn's reason.
        reason: String,
    },
    /// This build has no remote backend.
    #[error("remote workers are not compiled into this build: rebuild with `--features remote`")]
    NotCompiled,
}

/// A parsed worker address: the WebSocket URL Burn dials and the device index on that worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerAddress {
    /// `ws://HOST:PORT`.
    pub url: String,
    /// Which of the worker's devices.
    pub index: usize,
}

impl WorkerAddress {
    /// Whether `s` is meant as a worker address (starts with `ws://`), to tell it from a local
    /// device name.
    pub fn is_worker(s: &str) -> bool {
        s.starts_with("ws://")
    }

    /// Parses `ws://HOST:PORT[#INDEX]`.
    pub fn parse(address: &str) -> Result<Self, RemoteDeviceError> {
        let bad = |problem| RemoteDeviceError::Address { address: address.to_owned(), problem };
        let rest = address.strip_prefix("ws://").ok_or_else(|| bad("it must start with ws://"))?;
        let (host_port, index) = match rest.split_once('#') {
            Some((hp, i)) => (hp, i.parse::<usize>().map_err(|_| bad("the device index after # must be a number"))?),
            None => (rest, 0),
        };
        let (host, port) = host_port.rsplit_once(':').ok_or_else(|| bad("the port is missing"))?;
        if host.is_empty() || host.contains(['/', '?', '@']) {
            return Err(bad("the host is empty or followed by a path"));
        }
        if !matches!(port.parse::<u16>(), Ok(p) if p > 0) {
            return Err(bad("the port must be a number from 1 to 65535"));
        }
        Ok(Self { url: format!("ws://{host_port}"), index })
    }
}

impl std::fmt::Display for WorkerAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.url, self.index)
    }
}

/// The device at `address` (`ws://HOST:PORT[#INDEX]`, see the [module docs](self)), connected
/// now with `token` (or, when `None`, the token in [`WORKER_TOKEN_ENV`]; no token at all is only
/// accepted by a worker started with `--insecure`).
///
/// Connecting checks the address, the token and the device index before any work, and gives
/// up after [`CONNECT_TIMEOUT`]. A device connected before is returned with its session.
pub fn remote_device(address: &str, token: Option<&str>) -> Result<Device, RemoteDeviceError> {
    let address = WorkerAddress::parse(address)?;
    let token = token.map(str::to_owned).or_else(|| std::env::var(WORKER_TOKEN_ENV).ok()).filter(|t| !t.is_empty());
    connect(&address, token)
}

#[cfg(feature = "remote")]
fn connect(address: &WorkerAddress, token: Option<String>) -> Result<Device, RemoteDeviceError> {
    use burn::remote::{ConnectError, RemoteHost};

    let worker = address.to_string();
    let mut host = RemoteHost::websocket(&address.url);
    if let Some(token) = token {
        host = host.with_credential(token);
    }
    let options = Device::remote_options(&host).device_index(address.index);
    // Connecting blocks on the network: run it on a thread of its own so a worker that accepts
    // the connection and never answers costs `CONNECT_TIMEOUT`, not forever.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || options.init()))
            .map_err(super::watch::panic_message);
        let _ = tx.send(result);
    });
    match rx.recv_timeout(CONNECT_TIMEOUT) {
        Ok(Ok(Ok(device))) => Ok(device),
        Ok(Ok(Err(err))) => Err(match err {
            ConnectError::Unreachable { reason } => RemoteDeviceError::Unreachable { worker, reason },
            ConnectError::Unauthorized => RemoteDeviceError::Unauthorized { worker },
            ConnectError::NoSuchDevice { device_count } => {
                RemoteDeviceError::NoSuchDevice { worker, index: address.index, count: device_count }
            }
            other => RemoteDeviceError::Connect { worker, reason: other.to_string() },
        }),
        Ok(Err(panic)) => Err(RemoteDeviceError::Connect { worker, reason: panic }),
        Err(_) => Err(RemoteDeviceError::Timeout { worker }),
    }
}

#[cfg(not(feature = "remote"))]
fn connect(_address: &WorkerAddress, _token: Option<String>) -> Result<Device, RemoteDeviceError> {
    Err(RemoteDeviceError::NotCompiled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_with_and_without_index() {
        let a = WorkerAddress::parse("ws://10.0.0.2:3001").unwrap();
        assert_eq!((a.url.as_str(), a.index), ("ws://10.0.0.2:3001", 0));
        let b = WorkerAddress::parse("ws://gpu-b:3001#2").unwrap();
        assert_eq!((b.url.as_str(), b.index), ("ws://gpu-b:3001", 2));
        for bad in ["http://h:1", "ws://h", "ws://:1", "ws://h:0", "ws://h:x", "ws://h:1#a", "ws://h/p:1", "gpu:1"] {
            assert!(matches!(WorkerAddress::parse(bad), Err(RemoteDeviceError::Address { .. })), "{bad}");
        }
    }
}
