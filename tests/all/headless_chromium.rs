//! Headless Chromium driven over the DevTools protocol, in real time.
//!
//! `--dump-dom` with `--virtual-time-budget` cannot wait for a streamed reply: virtual time runs
//! on while a response body is still arriving, so on a loaded machine the DOM is dumped mid-stream.
//! Instead Chromium is started with `--remote-debugging-pipe` (it reads NUL-terminated JSON
//! commands on fd 3 and writes replies and events on fd 4) and the test polls the page's DOM with
//! `Runtime.evaluate` until a condition holds or a wall-clock deadline passes.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The first Chromium-like browser on `PATH`, if any.
pub fn find() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().map(|o| o.status.success()).unwrap_or(false))
}

/// One headless browser with one attached page.
pub struct Browser {
    child: Child,
    commands: File,
    messages: Receiver<Value>,
    next_id: u64,
    session: String,
}

impl Browser {
    /// Starts `binary` headless with a fresh profile under `profile` and opens `url`.
    pub fn open(binary: &str, profile: &Path, url: &str) -> Result<Self, String> {
        let (command_read, command_write) = std::io::pipe().map_err(|e| e.to_string())?;
        let (reply_read, reply_write) = std::io::pipe().map_err(|e| e.to_string())?;
        let (child_in, child_out) = (OwnedFd::from(command_read), OwnedFd::from(reply_write));
        let (fd_in, fd_out) = (child_in.as_raw_fd(), child_out.as_raw_fd());
        let mut command = Command::new(binary);
        command
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"])
            .arg("--remote-debugging-pipe")
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: only async-signal-safe calls (fcntl, dup2) between fork and exec. The pipe ends
        // are first copied above fd 10 so that placing them on 3 and 4 cannot clobber each other;
        // dup2 clears close-on-exec on the targets.
        unsafe {
            command.pre_exec(move || {
                let high_in = libc::fcntl(fd_in, libc::F_DUPFD, 10);
                let high_out = libc::fcntl(fd_out, libc::F_DUPFD, 10);
                if high_in < 0 || high_out < 0 || libc::dup2(high_in, 3) < 0 || libc::dup2(high_out, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(|e| format!("cannot start {binary}: {e}"))?;
        drop((child_in, child_out));
        let (sender, messages) = channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(File::from(OwnedFd::from(reply_read)));
            let mut message = Vec::new();
            while reader.read_until(0, &mut message).map(|n| n > 0).unwrap_or(false) {
                message.pop_if(|b| *b == 0);
                if let Ok(value) = serde_json::from_slice(&message)
                    && sender.send(value).is_err()
                {
                    break;
                }
                message.clear();
            }
        });
        let mut browser = Browser {
            child,
            commands: File::from(OwnedFd::from(command_write)),
            messages,
            next_id: 0,
            session: String::new(),
        };
        let target = browser.call("Target.createTarget", json!({ "url": url }))?;
        let target = target["targetId"].as_str().ok_or("no targetId")?.to_string();
        let attached = browser.call("Target.attachToTarget", json!({ "targetId": target, "flatten": true }))?;
        browser.session = attached["sessionId"].as_str().ok_or("no sessionId")?.to_string();
        Ok(browser)
    }

    /// Sends one command (to the page once attached) and waits up to 60 s for its result.
    fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            message["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&message).map_err(|e| e.to_string())?;
        bytes.push(0);
        self.commands.write_all(&bytes).map_err(|e| format!("{method}: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let reply = self.messages.recv_timeout(left).map_err(|e| format!("{method}: no reply ({e})"))?;
            if reply["id"].as_u64() == Some(id) {
                if let Some(error) = reply.get("error") {
                    return Err(format!("{method}: {error}"));
                }
                return Ok(reply["result"].clone());
            }
        }
    }

    /// The page's current DOM as HTML (empty while the page has no document yet).
    pub fn dom(&mut self) -> Result<String, String> {
        let expression = "document.documentElement ? document.documentElement.outerHTML : ''";
        let params = json!({ "expression": expression, "returnByValue": true });
        let result = self.call("Runtime.evaluate", params)?;
        result["result"]["value"].as_str().map(str::to_string).ok_or_else(|| format!("no DOM in {result}"))
    }

    /// Polls the DOM every 100 ms until `done` accepts it or `timeout` (wall clock) passes; returns
    /// the last DOM either way.
    pub fn wait_for(&mut self, timeout: Duration, done: impl Fn(&str) -> bool) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        loop {
            let dom = self.dom()?;
            if done(&dom) || Instant::now() >= deadline {
                return Ok(dom);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.session.clear();
        let _ = self.call("Browser.close", json!({}));
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
