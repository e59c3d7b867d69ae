//! The HTTP client of tracerd's API: reqwest's blocking client, keeping
//! its connections alive, for the tests and the harnesses.
use std::{io, net::SocketAddr, time::Duration};

use reqwest::Method;

/// tracerd's address, and how long an answer may take.
#[derive(Clone, Debug)]
pub struct Client {
    addr: SocketAddr,
    base: String,
    inner: reqwest::blocking::Client,
}

/// A status and a body (lossily UTF-8).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

impl Client {
    /// A client of `http://addr` whose requests give up after `timeout`.
    ///
    /// # Errors
    /// reqwest cannot build its client.
    pub fn new(addr: SocketAddr, timeout: Duration) -> io::Result<Self> {
        let inner = reqwest::blocking::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(io::Error::other)?;
        Ok(Self {
            addr,
            base: format!("http://{addr}"),
            inner,
        })
    }

    /// tracerd's address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, what a path is appended to.
    #[must_use]
    pub fn base(&self) -> &str {
        &self.base
    }

    /// reqwest's client, for what the methods here do not give (headers,
    /// streamed bodies).
    #[must_use]
    pub fn inner(&self) -> &reqwest::blocking::Client {
        &self.inner
    }

    /// # Errors
    /// As [`Client::send`].
    pub fn get(&self, path: &str) -> io::Result<Response> {
        self.request("GET", path)
    }

    /// # Errors
    /// As [`Client::send`].
    pub fn post(&self, path: &str) -> io::Result<Response> {
        self.request("POST", path)
    }

    /// # Errors
    /// As [`Client::send`].
    pub fn put(&self, path: &str) -> io::Result<Response> {
        self.request("PUT", path)
    }

    /// `METHOD PATH` with an empty body.
    ///
    /// # Errors
    /// As [`Client::send`].
    pub fn request(&self, method: &str, path: &str) -> io::Result<Response> {
        let (status, body) = self.send(method, path, &[])?;
        Ok(Response {
            status,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    }

    /// `METHOD PATH` with `body`: the status and the body's bytes.
    ///
    /// # Errors
    /// The method is not a token, or the request failed (refused, timed
    /// out, cut): the error names the request.
    pub fn send(&self, method: &str, path: &str, body: &[u8]) -> io::Result<(u16, Vec<u8>)> {
        let named = |e: &dyn std::fmt::Display| io::Error::other(format!("{method} {path}: {e}"));
        let method = Method::from_bytes(method.as_bytes()).map_err(|e| named(&e))?;
        let response = self
            .inner
            .request(method, format!("{}{path}", self.base))
            .body(body.to_vec())
            .send()
            .map_err(|e| named(&e))?;
        let status = response.status().as_u16();
        let bytes = response.bytes().map_err(|e| named(&e))?;
        Ok((status, bytes.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use std::{
        io::{Read as _, Write as _},
        net::TcpListener,
    };

    use super::*;

    #[test]
    fn sends_the_method_path_and_body_and_reads_a_chunked_answer() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().expect("accept");
            let mut request = Vec::new();
            let mut buf = [0u8; 512];
            while !request.ends_with(b"body") {
                let n = stream.read(&mut buf).expect("read");
                request.extend_from_slice(&buf[..n]);
            }
            stream
                .write_all(b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\nok\r\n0\r\n\r\n")
                .expect("write");
            String::from_utf8(request).expect("utf-8")
        });
        let client = Client::new(addr, Duration::from_secs(5)).expect("client");
        let (status, body) = client.send("PUT", "/scope?x=1", b"body").expect("answer");
        assert_eq!((status, body.as_slice()), (201, b"ok".as_slice()));
        let request = server.join().expect("server");
        assert!(
            request.starts_with("PUT /scope?x=1 HTTP/1.1\r\n"),
            "{request}"
        );
        assert!(request.contains("content-length: 4\r\n"), "{request}");
    }

    #[test]
    fn a_refused_connection_is_an_error_naming_the_request() {
        let port = crate::free_port().expect("port");
        let client = Client::new(
            SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::from_secs(5),
        )
        .expect("client");
        let err = client.get("/health").unwrap_err();
        assert!(err.to_string().starts_with("GET /health: "), "{err}");
    }
}
