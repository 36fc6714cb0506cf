//! A minimal HTTP/1.1 client for the server tests on loopback (`Connection: close`, chunked bodies
//! decoded), with the small part of `reqwest`'s surface the tests use.
//!
//! Why not `reqwest`: in this workspace, Burn's `remote-websocket` feature (through `iroh`) turns
//! on reqwest's `rustls-no-provider`, and every `reqwest::Client` then panics at construction
//! unless the process installs a rustls crypto provider, which needs the `rustls` crate as a
//! direct dependency.

use std::io::{Error, ErrorKind, Result};

use serde::de::DeserializeOwned;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Makes requests.
#[derive(Debug, Clone, Default)]
pub struct Client;

impl Client {
    pub fn new() -> Self {
        Self
    }

    pub fn get(&self, url: impl Into<String>) -> RequestBuilder {
        RequestBuilder { method: "GET", url: url.into(), headers: Vec::new(), body: Vec::new() }
    }

    pub fn post(&self, url: impl Into<String>) -> RequestBuilder {
        RequestBuilder { method: "POST", url: url.into(), headers: Vec::new(), body: Vec::new() }
    }
}

/// One request being built.
pub struct RequestBuilder {
    method: &'static str,
    url: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RequestBuilder {
    pub fn json(self, value: &serde_json::Value) -> Self {
        self.header("content-type", "application/json").body(value.to_string().into_bytes())
    }

    pub fn bearer_auth(self, key: &str) -> Self {
        self.header("authorization", &format!("Bearer {key}"))
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    pub fn body(mut self, body: Vec<u8>) -> Self {
        self.body = body;
        self
    }

    /// Sends the request and reads the status line and headers.
    pub async fn send(self) -> Result<Response> {
        let rest = self.url.strip_prefix("http://").ok_or_else(|| Error::new(ErrorKind::InvalidInput, "http only"))?;
        let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        let path = if path.is_empty() { "/" } else { path };
        let mut stream = TcpStream::connect(host).await?;
        let mut head = format!("{} {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n", self.method);
        for (name, value) in &self.headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str(&format!("content-length: {}\r\n\r\n", self.body.len()));
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(&self.body).await?;
        let mut buffer = Vec::new();
        let end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at;
            }
            let mut piece = [0u8; 4096];
            let n = stream.read(&mut piece).await?;
            if n == 0 {
                return Err(Error::new(ErrorKind::UnexpectedEof, "connection closed before the headers"));
            }
            buffer.extend_from_slice(&piece[..n]);
        };
        let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
        let mut lines = head.split("\r\n");
        let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).unwrap_or(0);
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        Ok(Response { status, headers, stream, pending: buffer[end + 4..].to_vec() })
    }
}

/// A status code.
#[derive(Debug, Clone, Copy)]
pub struct Status(u16);

impl Status {
    pub fn as_u16(self) -> u16 {
        self.0
    }
}

/// A response whose body has not been read yet.
pub struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    stream: TcpStream,
    pending: Vec<u8>,
}

impl Response {
    pub fn status(&self) -> Status {
        Status(self.status)
    }

    /// A header's value (empty when absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers.iter().find(|(k, _)| k == name).map_or("", |(_, v)| v.as_str())
    }

    /// The next bytes of the body as they arrive, still chunk-framed (`None` at the end).
    pub async fn next_raw(&mut self) -> Option<Vec<u8>> {
        if !self.pending.is_empty() {
            return Some(std::mem::take(&mut self.pending));
        }
        let mut piece = vec![0u8; 4096];
        match self.stream.read(&mut piece).await {
            Ok(0) | Err(_) => None,
            Ok(n) => {
                piece.truncate(n);
                Some(piece)
            }
        }
    }

    /// Decodes a whole raw body (chunked or not).
    pub fn decode(&self, raw: &[u8]) -> Vec<u8> {
        if !self.header("transfer-encoding").eq_ignore_ascii_case("chunked") {
            return raw.to_vec();
        }
        let mut out = Vec::new();
        let mut rest = raw;
        while let Some(at) = rest.windows(2).position(|w| w == b"\r\n") {
            let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..at]).trim(), 16).unwrap_or(0);
            rest = &rest[at + 2..];
            if size == 0 || rest.len() < size {
                break;
            }
            out.extend_from_slice(&rest[..size]);
            rest = rest.get(size + 2..).unwrap_or(&[]);
        }
        out
    }

    pub async fn bytes(mut self) -> Result<Vec<u8>> {
        let mut raw = std::mem::take(&mut self.pending);
        self.stream.read_to_end(&mut raw).await?;
        Ok(self.decode(&raw))
    }

    pub async fn text(self) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.bytes().await?).into_owned())
    }

    pub async fn json<T: DeserializeOwned>(self) -> Result<T> {
        serde_json::from_slice(&self.bytes().await?).map_err(|e| Error::new(ErrorKind::InvalidData, e))
    }
}
