//! The attacks' own HTTP/1.1: one request written byte for byte on a fresh
//! loopback `TcpStream` (`Connection: close`), the whole response read. An
//! attack sends paths a client library would rewrite before sending
//! (`%2e%2e`, `..`, NUL escapes, 3,000 parameters); tracerd must refuse
//! them as they arrive. Everything else of xtask talks to tracerd through
//! `tracer_testkit::Client`.
use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

/// How long connecting may take (loopback: a refusal is immediate).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// `METHOD PATH` with `body`, exactly as given, on a fresh connection to
/// `addr`, answered within `timeout`: the status and the body's bytes
/// (de-chunked).
pub fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &[u8],
    timeout: Duration,
) -> std::io::Result<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_bytes(&raw)
}

/// Parses a whole HTTP/1.1 response: its status and body as text.
#[cfg(test)]
fn parse(raw: &[u8]) -> std::io::Result<(u16, String)> {
    let (status, body) = parse_bytes(raw)?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
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
        assert_eq!(r, (201, "{\"id\":1}".to_string()));
    }

    #[test]
    fn parses_a_chunked_response() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7;x=y\r\n, world\r\n0\r\n\r\n";
        let r = parse(raw).unwrap();
        assert_eq!(r, (200, "hello, world".to_string()));
    }

    #[test]
    fn rejects_a_response_without_headers_end() {
        assert!(parse(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse(b"garbage\r\n\r\n").is_err());
    }

    #[test]
    fn sends_the_path_as_given_and_reads_the_answer() {
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
        let (status, body) = send(
            addr,
            "PUT",
            "/snapshots/%2e%2e",
            &[],
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!((status, body.as_slice()), (200, b"ok".as_slice()));
        let request = server.join().unwrap();
        assert!(
            request.starts_with("PUT /snapshots/%2e%2e HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(request.contains("Content-Length: 0\r\n"));
    }
}
