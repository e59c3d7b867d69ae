//! Who is on the other end of a local connection, from the kernel: the
//! peer's credentials of a Unix socket (`SO_PEERCRED`), and the owner of
//! the client's socket of a loopback TCP connection (socket diagnostics,
//! `NETLINK_SOCK_DIAG` / inet_diag: the kernel's record of the client's own
//! socket, looked up by its four-tuple). Facts only: what a user may do
//! with that is the API's policy.
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};

/// The user of a local peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    /// Its user id (the socket's owner for TCP; the peer process's
    /// effective uid when it connected, for a Unix socket).
    pub uid: u32,
    /// Its group id (Unix sockets only: inet_diag gives none).
    pub gid: Option<u32>,
    /// Its process id (Unix sockets only).
    pub pid: Option<u32>,
}

/// `SO_PEERCRED` of the connected Unix socket `fd`.
///
/// # Errors
/// What `getsockopt(2)` says (`ENOTSOCK`, `ENOTCONN` ...).
pub fn unix_peer(fd: RawFd) -> io::Result<PeerCred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are valid for writes of their sizes; fd is only
    // read by the kernel.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast::<libc::c_void>(),
            &raw mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        uid: cred.uid,
        gid: Some(cred.gid),
        pid: u32::try_from(cred.pid).ok().filter(|&p| p != 0),
    })
}

/// `SOCK_DIAG_BY_FAMILY` of `<linux/sock_diag.h>`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `INET_DIAG_NOCOOKIE`: look the socket up by its addresses alone.
const NO_COOKIE: u32 = u32::MAX;

/// `struct inet_diag_sockid` (`<linux/inet_diag.h>`): ports and addresses
/// in network byte order.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SockId {
    sport: [u8; 2],
    dport: [u8; 2],
    src: [u8; 16],
    dst: [u8; 16],
    interface: u32,
    cookie: [u32; 2],
}

/// `struct nlmsghdr` followed by `struct inet_diag_req_v2`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Request {
    len: u32,
    kind: u16,
    flags: u16,
    seq: u32,
    port: u32,
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: SockId,
}

/// Size of `struct nlmsghdr`.
const NLMSG_HDR: usize = 16;
/// Offset of `idiag_uid` in `struct inet_diag_msg` (after family, state,
/// timer, retrans, the sockid, expires, rqueue and wqueue).
const DIAG_UID_OFFSET: usize = 4 + size_of::<SockId>() + 12;

/// The owner of the client's socket of the loopback TCP connection that
/// tracerd accepted at `local` from `remote`: the kernel's record of that
/// socket (inet_diag, looked up by its four-tuple as the client sees it).
///
/// # Errors
/// `NotFound` when the kernel has no such socket (the client closed it,
/// or it is not on this host); what the netlink socket says otherwise.
pub fn tcp_peer(local: SocketAddr, remote: SocketAddr) -> io::Result<PeerCred> {
    let mut id = SockId {
        cookie: [NO_COOKIE; 2],
        ..SockId::default()
    };
    // The client's socket: its source is the remote end, its destination
    // tracerd's listener.
    id.sport = remote.port().to_be_bytes();
    id.dport = local.port().to_be_bytes();
    let family = match (remote.ip(), local.ip()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => {
            id.src[..4].copy_from_slice(&src.octets());
            id.dst[..4].copy_from_slice(&dst.octets());
            libc::AF_INET
        }
        (IpAddr::V6(src), IpAddr::V6(dst)) => {
            id.src = src.octets();
            id.dst = dst.octets();
            libc::AF_INET6
        }
        _ => return Err(io::Error::from(io::ErrorKind::InvalidInput)),
    };
    let request = Request {
        len: size_of::<Request>() as u32,
        kind: SOCK_DIAG_BY_FAMILY,
        flags: libc::NLM_F_REQUEST as u16,
        seq: 1,
        port: 0,
        family: family as u8,
        protocol: libc::IPPROTO_TCP as u8,
        ext: 0,
        pad: 0,
        states: u32::MAX,
        id,
    };
    let socket = netlink()?;
    // SAFETY: request is a plain struct read for its size.
    let sent = unsafe {
        libc::send(
            socket.as_raw_fd(),
            (&raw const request).cast::<libc::c_void>(),
            size_of::<Request>(),
            0,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = [0u8; 8192];
    // SAFETY: buf is writable for its length.
    let n = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            buf.as_mut_ptr().cast::<libc::c_void>(),
            buf.len(),
            0,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    parse_reply(
        buf.get(..usize::try_from(n).unwrap_or(0))
            .unwrap_or_default(),
    )
}

/// A `NETLINK_SOCK_DIAG` socket, closed on drop.
fn netlink() -> io::Result<OwnedFd> {
    // SAFETY: socket takes three integers and returns a new descriptor or -1.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a descriptor socket just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// The uid of the first `inet_diag_msg` of a netlink reply, or the error
/// it carries (`NLMSG_ERROR`: a negative errno).
fn parse_reply(reply: &[u8]) -> io::Result<PeerCred> {
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(reply.get(at..at + 4)?.try_into().ok()?))
    };
    let kind = reply
        .get(4..6)
        .map(|b| u16::from_ne_bytes([b[0], b[1]]))
        .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
    if kind == libc::NLMSG_ERROR as u16 {
        let errno = word(NLMSG_HDR).map_or(0, |e| e as i32);
        return Err(match errno {
            0 => io::Error::from(io::ErrorKind::NotFound),
            e => io::Error::from_raw_os_error(-e),
        });
    }
    if kind != SOCK_DIAG_BY_FAMILY {
        return Err(io::Error::from(io::ErrorKind::InvalidData));
    }
    let uid = word(NLMSG_HDR + DIAG_UID_OFFSET)
        .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
    Ok(PeerCred {
        uid,
        gid: None,
        pid: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::net::UnixStream;

    fn own_uid() -> u32 {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() }
    }

    #[test]
    fn a_unix_peer_is_this_process() {
        let (a, _b) = UnixStream::pair().expect("pair");
        let peer = unix_peer(a.as_raw_fd()).expect("SO_PEERCRED");
        assert_eq!(peer.uid, own_uid());
        assert_eq!(peer.pid, Some(std::process::id()));
    }

    #[test]
    fn a_loopback_tcp_client_is_found_by_its_four_tuple() {
        for host in ["127.0.0.1:0", "[::1]:0"] {
            let Ok(listener) = TcpListener::bind(host) else {
                continue; // no IPv6 loopback here
            };
            let local = listener.local_addr().expect("local");
            let _client = TcpStream::connect(local).expect("connect");
            let (_conn, remote) = listener.accept().expect("accept");
            let peer = tcp_peer(local, remote).expect("inet_diag");
            assert_eq!(peer.uid, own_uid(), "{host}");
            // A four-tuple of no socket: not found.
            let gone = SocketAddr::new(remote.ip(), remote.port().wrapping_add(1));
            let err = tcp_peer(local, gone).expect_err("no such socket");
            assert_eq!(err.kind(), io::ErrorKind::NotFound, "{host}: {err}");
        }
    }

    #[test]
    fn short_and_foreign_replies_are_errors() {
        assert!(parse_reply(&[]).is_err());
        let mut foreign = vec![0u8; 64];
        foreign[4..6].copy_from_slice(&99u16.to_ne_bytes());
        assert_eq!(
            parse_reply(&foreign).expect_err("foreign").kind(),
            io::ErrorKind::InvalidData
        );
        let mut short = vec![0u8; 20];
        short[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        assert!(parse_reply(&short).is_err());
    }
}
