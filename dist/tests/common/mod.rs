//! Helpers shared by the multi-process tests of flamia-dist.

/// A TCP port on the loopback interface that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
