//! The one HTTP client of xtask: HTTP/1.1 over a fresh loopback
//! `TcpStream` per request (`Connection: close`), enough for tracerd's API
//! (no client library for a few calls to a local daemon). Reads the whole
//! response; understands `Content-Length` and chunked bodies.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

/// How long connecting may take (loopback: a refusal is immediate).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// tracerd's address and how long a response may take.
#[derive(Clone, Copy, Debug)]
pub struct Client {
    addr: SocketAddr,
    timeout: Duration,
}

/// A status and a body (lossily UTF-8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

impl Client {
    /// A client of `addr` whose reads give up after `timeout`.
    pub fn new(addr: SocketAddr, timeout: Duration) -> Self {
        Self { addr, timeout }
    }

    /// tracerd's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn get(&self, path: &str) -> std::io::Result<Response> {
        self.request("GET", path)
    }

    pub fn post(&self, path: &str) -> std::io::Result<Response> {
        self.request("POST", path)
    }

    pub fn put(&self, path: &str) -> std::io::Result<Response> {
        self.request("PUT", path)
    }

    /// `METHOD PATH` with an empty body.
    pub fn request(&self, method: &str, path: &str) -> std::io::Result<Response> {
        let (status, body) = self.send(method, path, &[])?;
        Ok(Response {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }

    /// `METHOD PATH` with `body`; the status and the body's bytes
    /// (de-chunked).
    pub fn send(&self, method: &str, path: &str, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        let mut stream = TcpStream::connect_timeout(&self.addr, CONNECT_TIMEOUT)?;
        stream.set_read_timeout(Some(self.timeout))?;
        stream.set_write_timeout(Some(self.timeout))?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            self.addr,
            body.len()
        )?;
        stream.write_all(body)?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        parse_bytes(&raw)
    }
}

/// Parses a whole HTTP/1.1 response.
#[cfg(test)]
fn parse(raw: &[u8]) -> std::io::Result<Response> {
    let (status, body) = parse_bytes(raw)?;
    Ok(Response {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// The status and the body's bytes of a whole HTTP/1.1 response.
fn parse_bytes(raw: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers in the response"))?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = &raw[split + 4..];
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status in the response"))?;
    let chunked = lines.any(|l| {
        l.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding")
                && value.trim().eq_ignore_ascii_case("chunked")
        })
    });
    let body = if chunked {
        dechunk(body).ok_or_else(|| bad("a malformed chunked body"))?
    } else {
        body.to_vec()
    };
    Ok((status, body))
}

/// The payload of a chunked body (`SIZE[;ext]\r\nDATA\r\n` ... `0\r\n\r\n`).
fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = body.windows(2).position(|w| w == b"\r\n")?;
        let line = std::str::from_utf8(&body[..eol]).ok()?;
        let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
        body = &body[eol + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn parses_a_content_length_response() {
        let r = parse(b"HTTP/1.1 201 Created\r\ncontent-length: 8\r\n\r\n{\"id\":1}").unwrap();
        assert_eq!(
            r,
            Response {
                status: 201,
                body: "{\"id\":1}".into()
            }
        );
    }

    #[test]
    fn parses_a_chunked_response() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7;x=y\r\n, world\r\n0\r\n\r\n";
        let r = parse(raw).unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, "hello, world");
    }

    #[test]
    fn rejects_a_response_without_headers_end() {
        assert!(parse(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse(b"garbage\r\n\r\n").is_err());
    }

    #[test]
    fn sends_the_method_and_path_and_reads_the_answer() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 512];
            while !request.ends_with(b"\r\n\r\n") {
                let n = stream.read(&mut buf).unwrap();
                request.extend_from_slice(&buf[..n]);
            }
            stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                .unwrap();
            String::from_utf8(request).unwrap()
        });
        let client = Client::new(addr, Duration::from_secs(5));
        let response = client.put("/scope").unwrap();
        assert_eq!(response.status, 200);
        assert_eq!(response.body, "ok");
        let request = server.join().unwrap();
        assert!(request.starts_with("PUT /scope HTTP/1.1\r\n"), "{request}");
        assert!(request.contains("Content-Length: 0\r\n"));
    }
}
