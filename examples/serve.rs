//! OpenAI-compatible HTTP server: `cargo run --release --example serve -- --model <dir|hub id|file.gguf>
//! [--host 127.0.0.1] [--port 8000] [--api-key KEY] [engine flags]` (see README, "Server").

fn main() -> std::process::ExitCode {
    burn_llm_server::launch::main()
}
