//! A minimal HTTP/1.1 client over plain sockets for the HTTP API's tests: one request per
//! connection (or raw bytes, for malformed and slow requests), chunked bodies decoded,
//! server-sent events split into their data lines.
#![allow(dead_code)]

use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A response read whole.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: status {} body {:?}", self.status, self.text()))
    }

    /// The data of each server-sent event.
    pub fn events(&self) -> Vec<String> {
        sse_data(&self.text())
    }
}

/// The data lines of a server-sent event stream.
pub fn sse_data(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|ev| {
            let data: Vec<&str> = ev
                .lines()
                .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
                .collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}

/// Parses a whole response (its connection closed after it).
pub fn parse_response(raw: &[u8]) -> HttpResponse {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no response head in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line in {head:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let rest = &raw[split + 4..];
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    HttpResponse {
        status,
        headers,
        body,
    }
}

/// Decodes a chunked body (as far as it goes).
fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let size_text = String::from_utf8_lossy(&raw[..eol]);
        let Ok(size) = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
        else {
            break;
        };
        if size == 0 || raw.len() < eol + 2 + size {
            break;
        }
        out.extend_from_slice(&raw[eol + 2..eol + 2 + size]);
        raw = &raw[(eol + 2 + size + 2).min(raw.len())..];
    }
    out
}

/// Connects with a generous read timeout (a hang guard).
pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    s
}

/// Sends raw bytes on a new connection and reads the response until the server closes it.
pub fn raw(addr: SocketAddr, bytes: &[u8]) -> HttpResponse {
    let mut s = connect(addr);
    s.write_all(bytes).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    parse_response(&out)
}

/// A request's bytes, `Connection: close`.
pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    raw(addr, &request_bytes(method, path, headers, body))
}

pub fn get(addr: SocketAddr, path: &str) -> HttpResponse {
    request(addr, "GET", path, &[], b"")
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> HttpResponse {
    post_with(addr, path, &[], body)
}

pub fn post_with(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> HttpResponse {
    let mut h = vec![("Content-Type", "application/json")];
    h.extend_from_slice(headers);
    request(addr, "POST", path, &h, body.to_string().as_bytes())
}

/// The same, off the async runtime's threads.
pub async fn post_async(addr: SocketAddr, path: &str, body: Value) -> HttpResponse {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || post(addr, &path, &body))
        .await
        .unwrap()
}

pub async fn get_async(addr: SocketAddr, path: &str) -> HttpResponse {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || get(addr, &path))
        .await
        .unwrap()
}

/// Opens a streamed request and reads until its first event whose data contains `marker`;
/// returns the open connection and what was read.
pub fn open_stream(
    addr: SocketAddr,
    path: &str,
    body: &Value,
    marker: &str,
) -> (TcpStream, String) {
    let mut s = connect(addr);
    let bytes = request_bytes(
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    s.write_all(&bytes).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).expect("the stream sends");
        assert!(
            n > 0,
            "the stream ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&seen);
        if text.contains(marker) {
            return (s, text.into_owned());
        }
    }
}
