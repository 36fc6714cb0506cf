//! `cargo run --release --example worker -- --listen 127.0.0.1:3001 --device flex|wgpu|vulkan|cuda|metal
//! --token TOKEN [--insecure] [--threads N]`: serves this machine's device to burn-llm clients on other
//! processes or machines over Burn's remote backend (WebSocket), with burn-llm's kernels
//! (group quantization, PagedAttention) registered so quantized models and the paged engine run
//! there too. A client reaches it as `ws://HOST:PORT` (see `burn_llm::device::remote_device`).
//!
//! - Binds loopback unless told otherwise (`--listen 0.0.0.0:3001` for every interface); port 0
//!   picks a free port. Prints one line, `worker ready on ws://ADDRESS (DEVICE)`, once clients can
//!   connect.
//! - Refuses to start without a token (`--token` or `BURN_LLM_WORKER_TOKEN`) unless `--insecure`.
//!   The WebSocket transport is unencrypted, and its `/data` route (worker-to-worker tensor
//!   downloads) checks no token: keep workers on a private network.
//! - `--threads N` caps the CPU threads the worker computes with (its rayon pool, which the flex
//!   backend's matmuls and burn-llm's CPU kernels run on); default: one per core. Several workers
//!   on one machine, or unequal devices for the pipeline planner, are made this way.
//! - Stops cleanly on Ctrl+C or SIGTERM (Burn installs the handlers as serving starts, a moment
//!   after the ready line; a signal in between ends the process with the default action).

use std::io::Write;
use std::process::ExitCode;

use burn_llm::DeviceChoice;
use clap::Parser;

/// Serve this machine's device to burn-llm clients.
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on: loopback by default; `0.0.0.0:PORT` for every interface; port 0
    /// picks a free port (printed in the ready line).
    #[arg(long, default_value = "127.0.0.1:3001")]
    listen: String,
    /// Device backend to serve (default: the best one compiled in).
    #[arg(long, value_enum)]
    device: Option<DeviceChoice>,
    /// Token clients must present (theirs: `--worker-token`); default: $BURN_LLM_WORKER_TOKEN.
    #[arg(long)]
    token: Option<String>,
    /// Accept clients without a token (only where nobody else can reach the port).
    #[arg(long)]
    insecure: bool,
    /// CPU threads to compute with (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(threads) = args.threads {
        let pool = match threads {
            0 => Err("--threads must be at least 1".to_string()),
            n => rayon::ThreadPoolBuilder::new().num_threads(n).build_global().map_err(|e| e.to_string()),
        };
        if let Err(err) = pool {
            eprintln!("error: cannot use --threads {threads}: {err}");
            return ExitCode::FAILURE;
        }
    }
    match serve(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(all(feature = "remote", any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")))]
fn serve(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    use burn::server::{RemoteServer, TokenAuthorizer, WebSocketTransport};
    use burn_llm::device::WORKER_TOKEN_ENV;

    let token = args.token.clone().or_else(|| std::env::var(WORKER_TOKEN_ENV).ok()).filter(|t| !t.is_empty());
    if token.is_none() && !args.insecure {
        return Err(format!(
            "no token: pass --token TOKEN or set {WORKER_TOKEN_ENV} (clients pass the same with --worker-token), or --insecure to accept anyone who can reach the port"
        )
        .into());
    }
    let choice = args.device.unwrap_or_else(DeviceChoice::best_available);
    let device = choice.device()?;
    let listener = std::net::TcpListener::bind(&args.listen).map_err(|e| {
        format!("cannot listen on {}: {e} (is the port taken? pick another with --listen)", args.listen)
    })?;
    // Burn's WebSocket client turns Nagle's algorithm off but its server leaves it on for the
    // sockets it accepts, where a small reply after an unacknowledged one may wait for the
    // client's delayed ACK. Linux copies TCP_NODELAY from a listening socket to those it accepts.
    socket2::SockRef::from(&listener)
        .set_tcp_nodelay(true)
        .map_err(|e| format!("cannot turn off Nagle's algorithm on {}: {e}", args.listen))?;
    let address = listener.local_addr()?;
    let mut server = RemoteServer::new([device]);
    if let Some(token) = token {
        server = server.with_authorizer(TokenAuthorizer::new(token)?);
    }
    let server = match choice {
        #[cfg(feature = "flex")]
        DeviceChoice::Flex => server.with_custom_ops(kernels::<burn::backend::Flex>()),
        _ => server.with_custom_ops(kernels::<burn::backend::Cube>()),
    };
    let auth = if args.insecure && args.token.is_none() { "no token" } else { "token required" };
    println!("worker ready on ws://{address} ({}, {auth})", choice.name());
    std::io::stdout().flush()?;
    server.serve(WebSocketTransport::from_listener(listener))?;
    eprintln!("worker on ws://{address} stopped");
    Ok(())
}

/// burn-llm's kernels, registered for a server whose devices run backend `B`.
#[cfg(all(feature = "remote", any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal")))]
fn kernels<B>() -> burn::server::CustomOpRegistry<B>
where
    B: burn::backend::ir::BackendIr
        + burn_llm::kernels::ops::GroupQuantOps
        + burn_llm::kernels::paged::ops::PagedKvOps
        + burn_llm::kernels::matvec::MatvecOps
        + burn_llm::kernels::fused::ops::FusedOps,
{
    let mut registry = burn::server::CustomOpRegistry::<B>::new();
    burn_llm::kernels::remote::register_ops(&mut registry);
    registry
}

#[cfg(not(all(feature = "remote", any(feature = "wgpu", feature = "vulkan", feature = "cuda", feature = "metal"))))]
fn serve(_args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    Err("this build has no remote backend: rebuild with `--features remote` and a GPU feature (the default features have both)".into())
}
